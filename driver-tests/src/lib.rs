//! Nothing here: the tests (`tests/`) are the package. See `Cargo.toml` for why it exists.
