//! The relay example (`../relay.rs`) as a binary, for the package's tests (see the
//! consumer's binary, `main.rs`, for why).

#[path = "../relay.rs"]
mod relay;

fn main() -> std::process::ExitCode {
    relay::main()
}
