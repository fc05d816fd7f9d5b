//! Nothing here: the example (`quickstart.rs`) is the package. See `Cargo.toml` for why it is one.
