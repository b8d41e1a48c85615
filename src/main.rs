//! The `tiercache` command. Everything lives in `cli/`; this file only hands
//! over to it.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
