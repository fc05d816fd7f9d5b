//! The consumer example (`../consumer.rs`) as a binary: the same file, so that the
//! package's tests run exactly what `cargo run --example consumer` runs, built by cargo
//! before the tests (see this package's Cargo.toml).

#[path = "../consumer.rs"]
mod consumer;

fn main() -> std::process::ExitCode {
    consumer::main()
}
