//! The `moonkv` executable; the command itself is the library's [`moonkv::main_with_args`].

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(moonkv::main_with_args(std::env::args_os()))
}
