//! Nothing but tests (`tests/`): see `Cargo.toml`.
