//! What commands print for people and scripts goes through `out!` and
//! `outln!`: a reader that goes away early (`tiercache list | head -1`)
//! ends the command quietly, with success, as a closed pipe ends `ls`.
//! `println!` would panic there: Rust ignores SIGPIPE so that the daemon's
//! sockets see EPIPE as an error, and so does every command's stdout.

use std::io::Write;

/// Writes to stdout; a closed pipe exits quietly (0), another error
/// with a message (1).
pub fn write_out(args: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("tiercache: error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// `print!`, a closed pipe ending the command quietly.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::write_out(format_args!($($arg)*))
    };
}

/// `println!`, a closed pipe ending the command quietly.
macro_rules! outln {
    () => {
        $crate::cli::out::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::out::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}
