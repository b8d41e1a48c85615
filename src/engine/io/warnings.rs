//! Warnings that repeat every background round while their cause lasts:
//! while the origin is unreachable and written-back data awaits its flush,
//! every background commit fails the same way, ten times a second. Such a
//! warning is logged the first time, then at most once every
//! [`INTERVAL_MS`], saying how many like it were held back (those go to
//! the debug log). One per call site, shared by the engines of a process
//! (the daemon has one).

use std::sync::atomic::{AtomicU64, Ordering};

/// Least time between two warnings of one call site.
const INTERVAL_MS: u64 = 10_000;

/// Failed background writeback rounds (`writeback/run.rs`).
pub(crate) static BACKGROUND_WRITEBACK: RepeatedWarning = RepeatedWarning::new();
/// Failed background commits (`writeback/run.rs`).
pub(crate) static BACKGROUND_COMMIT: RepeatedWarning = RepeatedWarning::new();

pub(crate) struct RepeatedWarning {
    /// The engine clock's milliseconds at the last warning logged, plus 1
    /// (0: none yet).
    last_ms: AtomicU64,
    /// Warnings sent to the debug log since.
    held_back: AtomicU64,
}

impl RepeatedWarning {
    pub(crate) const fn new() -> RepeatedWarning {
        RepeatedWarning {
            last_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// Logs `msg` as a warning if none was logged in the last
    /// `INTERVAL_MS`, else at debug level. True if it was a warning.
    pub(crate) fn warn(&self, now_ms: u64, msg: std::fmt::Arguments<'_>) -> bool {
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last - 1) >= INTERVAL_MS;
        if due
            && self
                .last_ms
                .compare_exchange(last, now_ms + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            match self.held_back.swap(0, Ordering::Relaxed) {
                0 => log::warn!("{msg}"),
                n => log::warn!("{msg} ({n} more like it since the last warning)"),
            }
            return true;
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        log::debug!("{msg}");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_logged_once_per_interval() {
        let w = RepeatedWarning::new();
        let logged: Vec<u64> = (0..300u64)
            .map(|i| i * 100) // a background round every 100 ms for 30 s
            .filter(|&t| w.warn(t, format_args!("round failed")))
            .collect();
        assert_eq!(logged, [0, 10_000, 20_000]);
        assert_eq!(w.held_back.load(Ordering::Relaxed), 99);
    }
}
