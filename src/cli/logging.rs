//! The one line format of everything tiercache logs: `tiercache: LEVEL:
//! message`, the shape of its error lines. Under systemd (JOURNAL_STREAM
//! set: stderr is the journal's stream) each line starts with the syslog
//! priority, `<3>` to `<7>` (sd-daemon(3)), so `journalctl -p warning`
//! finds the warnings; the journal adds the time and the unit itself.
//!
//! The daemon logs at info and up by default (its audit lines: every
//! change an operator asked for, and who asked); other commands log
//! warnings and up (their own output is what they print). RUST_LOG
//! overrides both.

use std::io::Write;

/// Starts the logger; `daemon` for `serve`.
pub fn init(daemon: bool) {
    let default = if daemon { "info" } else { "warn" };
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, record| {
            let (priority, level) = level_words(record.level());
            if journal {
                write!(buf, "<{priority}>")?;
            }
            writeln!(buf, "tiercache: {level}: {}", record.args())
        })
        .init();
}

/// The line a command ends with when it fails: `tiercache: error: ...`,
/// or `tiercache: notice: ...` for an expected outcome; with its syslog
/// priority first under the journal, as the logger's lines.
pub fn final_line(message: &str, notice: bool) -> String {
    let (priority, word) = if notice { (5, "notice") } else { (3, "error") };
    match std::env::var_os("JOURNAL_STREAM").is_some() {
        true => format!("<{priority}>tiercache: {word}: {message}"),
        false => format!("tiercache: {word}: {message}"),
    }
}

/// The syslog priority and the word of a log level.
fn level_words(level: log::Level) -> (u8, &'static str) {
    match level {
        log::Level::Error => (3, "error"),
        log::Level::Warn => (4, "warning"),
        log::Level::Info => (6, "info"),
        log::Level::Debug => (7, "debug"),
        log::Level::Trace => (7, "trace"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_syslogs() {
        assert_eq!(level_words(log::Level::Error), (3, "error"));
        assert_eq!(level_words(log::Level::Warn), (4, "warning"));
        assert_eq!(level_words(log::Level::Info), (6, "info"));
    }
}
