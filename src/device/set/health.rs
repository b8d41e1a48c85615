//! When a member is retired for the data it returns.
//!
//! A member whose copy of a block fails its checksum (`sums.rs`) was
//! repaired from another copy, or the block came from the origin; the
//! member kept answering, so nothing else would ever fail it. A device
//! that returns garbage once is damaged; one that does it again and again
//! is failing, and its copies are a liability: the day the other copy is
//! lost, they are all that is left. OpenZFS's fault manager takes a vdev
//! out of service (degraded) after 10 checksum errors within 600 s
//! (`zfs_checksum_n`, `zfs_checksum_t` in `cmd/zed/agents/zfs_diagnosis.c`;
//! the vdev properties `checksum_n`, `checksum_t` of vdevprops(7)). The set
//! does the same: past [`CHECKSUM_ERRORS_MAX`] errors within
//! [`CHECKSUM_WINDOW`], the member is failed as if a request had failed on
//! it (the labels of the others say so), and the set says it is degraded.
//!
//! What counts: a block whose sum the set knows (written whole since
//! open) read back different, on any member, at any time: that cannot
//! come from a crash. Metadata pages that fail their own checks count only
//! once no crash can explain them: after a clean shutdown, and from the end
//! of the engine's open on (after a crash one member may hold a journal
//! commit that the other never received: the open repairs those pages,
//! counts them, but does not hold them against the member).
//!
//! The last copy is never retired: a member 0 or 1 whose partner is not
//! healthy keeps serving what checks out (a block with no good copy is a
//! read error), and the log says so once.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{CacheSet, MemberState};

/// Checksum errors within [`CHECKSUM_WINDOW`] that fail a member (ZFS's
/// `zfs_checksum_n`).
pub const CHECKSUM_ERRORS_MAX: u32 = 10;
/// The window of [`CHECKSUM_ERRORS_MAX`] (ZFS's `zfs_checksum_t`).
pub const CHECKSUM_WINDOW: Duration = Duration::from_secs(600);
/// The most errors a window can be asked to count (the ring's size).
pub const CHECKSUM_ERRORS_LIMIT_MAX: u32 = 64;

/// The times of a member's latest checksum errors, in a ring of
/// [`CHECKSUM_ERRORS_LIMIT_MAX`]: enough to count any limit's worth within
/// a window. Lock-free: two errors noted at once may take the same entry,
/// which undercounts by one at worst.
pub(crate) struct ErrorWindow {
    /// Milliseconds since the set was assembled, plus one (0: empty).
    times_ms: [AtomicU64; CHECKSUM_ERRORS_LIMIT_MAX as usize],
    next: AtomicUsize,
}

impl Default for ErrorWindow {
    fn default() -> Self {
        ErrorWindow {
            times_ms: std::array::from_fn(|_| AtomicU64::new(0)),
            next: AtomicUsize::new(0),
        }
    }
}

impl ErrorWindow {
    /// An error at `now_ms`.
    pub(crate) fn note(&self, now_ms: u64) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.times_ms.len();
        self.times_ms[i].store(now_ms + 1, Ordering::Relaxed);
    }

    /// Forgets every error.
    pub(crate) fn clear(&self) {
        for t in &self.times_ms {
            t.store(0, Ordering::Relaxed);
        }
    }

    /// Errors within `window_ms` before `now_ms`.
    pub(crate) fn recent(&self, now_ms: u64, window_ms: u64) -> u32 {
        self.times_ms
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .filter(|&t| t != 0 && now_ms.saturating_sub(t - 1) < window_ms)
            .count() as u32
    }
}

/// The set's rule for retiring members, and its clock.
pub(crate) struct Rule {
    born: Instant,
    /// Errors within the window that fail a member; 0: never.
    errors_max: AtomicU32,
    window_ms: AtomicU64,
    /// Metadata damage counts toward the rule (see the module comment).
    meta_counts: AtomicBool,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            born: Instant::now(),
            errors_max: AtomicU32::new(CHECKSUM_ERRORS_MAX),
            window_ms: AtomicU64::new(CHECKSUM_WINDOW.as_millis() as u64),
            meta_counts: AtomicBool::new(false),
        }
    }
}

impl Rule {
    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }
}

/// Where a checksum error was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// A block whose sum the set knew.
    Data,
    /// A metadata page that failed its own checks.
    Meta,
}

impl CacheSet {
    /// Sets the rule that retires a member: `errors` checksum errors within
    /// `window` (0: never). The default is ZFS's, 10 in 600 s. Errors are
    /// still counted and shown either way.
    pub fn set_checksum_limit(&self, errors: u32, window: Duration) {
        let errors = errors.min(CHECKSUM_ERRORS_LIMIT_MAX);
        self.rule.errors_max.store(errors, Ordering::Relaxed);
        let ms = window.as_millis().min(u64::MAX as u128) as u64;
        self.rule.window_ms.store(ms, Ordering::Relaxed);
    }

    /// The rule: (errors, window); errors 0 means never.
    pub fn checksum_limit(&self) -> (u32, Duration) {
        (
            self.rule.errors_max.load(Ordering::Relaxed),
            Duration::from_millis(self.rule.window_ms.load(Ordering::Relaxed)),
        )
    }

    /// From now on a damaged metadata page counts toward retiring the
    /// member that returned it: the engine calls this once its open is
    /// done, or before it reads metadata after a clean shutdown (no crash
    /// can then have left copies that differ).
    pub fn count_meta_damage(&self) {
        self.rule.meta_counts.store(true, Ordering::Release);
    }

    /// Checksum errors of member `i` within the rule's window.
    pub(super) fn recent_checksum_errors(&self, i: usize) -> u32 {
        let window_ms = self.rule.window_ms.load(Ordering::Relaxed);
        self.members[i]
            .checksum_window
            .recent(self.rule.now_ms(), window_ms)
    }

    /// Member `i` returned a damaged block or page (already served from
    /// elsewhere, or failed): counted, and the member failed once the rule
    /// says so.
    pub(super) fn checksum_error(&self, i: usize, found: Found) {
        let m = &self.members[i];
        m.bad_blocks.fetch_add(1, Ordering::Relaxed);
        if found == Found::Meta && !self.rule.meta_counts.load(Ordering::Acquire) {
            return;
        }
        m.checksum_window.note(self.rule.now_ms());
        let max = self.rule.errors_max.load(Ordering::Relaxed);
        let recent = self.recent_checksum_errors(i);
        if max == 0 || recent < max || m.state() != MemberState::Healthy {
            return;
        }
        let window_s = self.rule.window_ms.load(Ordering::Relaxed) / 1000;
        if i < 2 && self.members[1 - i].state() != MemberState::Healthy {
            if !m.last_copy_warned.swap(true, Ordering::Relaxed) {
                log::error!(
                    "{}: member {i} returned {recent} damaged blocks within {window_s} s, but it \
                     holds the last copy of the metadata and dirty data: it keeps serving what \
                     checks out; replace the other member, then this one",
                    self.name
                );
            }
            return;
        }
        self.fail_member(
            i,
            &format!(
                "{recent} checksum errors within {window_s} s: it returns data other than what \
                 was written"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_counts_only_recent_errors() {
        let w = ErrorWindow::default();
        assert_eq!(w.recent(0, 1000), 0);
        for t in [0, 100, 200, 900] {
            w.note(t);
        }
        assert_eq!(w.recent(950, 1000), 4);
        assert_eq!(w.recent(1050, 1000), 3, "the error at 0 is out");
        assert_eq!(w.recent(1950, 1000), 0);
        // The ring keeps the latest ones.
        for t in 0..(CHECKSUM_ERRORS_LIMIT_MAX as u64 * 2) {
            w.note(5000 + t);
        }
        assert_eq!(w.recent(5200, 1000), CHECKSUM_ERRORS_LIMIT_MAX);
    }
}
