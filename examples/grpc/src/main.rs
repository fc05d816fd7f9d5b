//! The gRPC example (`../grpc.rs`) as a binary: the same file, so that the package's
//! tests run exactly what `cargo run --example grpc` runs, built by cargo before the
//! tests (it hands them `CARGO_BIN_EXE_idemcache-grpc-example`, which it does not do for
//! examples).

#[path = "../grpc.rs"]
mod grpc;

fn main() -> std::process::ExitCode {
    grpc::main()
}
