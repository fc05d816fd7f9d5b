//! Nothing here: the tests (`tests/`) and the example (`examples/`) are the package. See `Cargo.toml` for why it is one.
