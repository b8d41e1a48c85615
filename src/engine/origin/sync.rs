//! What an origin flush must cover, and what a failed one may have lost.
//!
//! Writeback makes its own origin writes durable before it marks their
//! blocks clean: a flush after a batch's writes, and the blocks stay dirty
//! (to be written again) unless it succeeded with the origin's loss epoch
//! unchanged since before the writes (writeback/run.rs, `BlockDevice::
//! loss_epoch`). No commit depends on the origin for them.
//!
//! Foreground origin writes (writethrough, writearound, passthrough, a
//! write admission sent around the cache, a failed-over cache) are made
//! durable by the next commit: it flushes the origin only when such writes
//! ended since the last origin flush (`flush_foreground`). So in writeback
//! and writeonly a client's FLUSH waits for the origin only when that
//! client's data went there; a frozen origin hangs no other FLUSH.
//!
//! A flush that failed, or one after which the loss epoch had moved (a
//! reconnect, a failed fsync), may have lost the foreground writes it
//! covered. Their ranges are kept, and every later foreground flush fails
//! until each has been written again (after a failed fsync the kernel may
//! drop the pages and report success next time: "fsyncgate"; qemu makes
//! any such failure permanent). At most `RANGES_MAX` ranges are kept; past
//! that the whole volume counts, which only a restart clears.

use std::ops::Range;

use crate::engine::{EngineError, EngineResult};
use crate::sync::{Mutex, Rank};

/// Ranges kept per list before the list stands for the whole volume.
const RANGES_MAX: usize = 4096;

/// Byte ranges, merged where they touch; or everything.
#[derive(Default, Debug)]
struct Ranges {
    v: Vec<Range<u64>>,
    all: bool,
}

impl Ranges {
    fn is_empty(&self) -> bool {
        self.v.is_empty() && !self.all
    }

    fn add(&mut self, r: Range<u64>) {
        if self.all || r.is_empty() {
            return;
        }
        // Writes mostly arrive in ascending runs: the last range first.
        if let Some(last) = self.v.last_mut() {
            if last.end == r.start {
                last.end = r.end;
                return;
            }
        }
        if self.v.len() >= RANGES_MAX {
            self.v.clear();
            self.all = true;
            return;
        }
        self.v.push(r);
    }

    fn extend(&mut self, other: Ranges) {
        if other.all {
            self.v.clear();
            self.all = true;
            return;
        }
        other.v.into_iter().for_each(|r| self.add(r));
    }

    /// Takes `r` out of every range (a write that covers it again).
    fn remove(&mut self, r: &Range<u64>) {
        if self.v.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(self.v.len() + 1);
        for x in self.v.drain(..) {
            if x.end <= r.start || x.start >= r.end {
                out.push(x);
                continue;
            }
            if x.start < r.start {
                out.push(x.start..r.start);
            }
            if x.end > r.end {
                out.push(r.end..x.end);
            }
        }
        self.v = out;
    }

    fn describe(&self) -> String {
        if self.all {
            return "more ranges than are tracked: the whole volume".into();
        }
        let bytes: u64 = self.v.iter().map(|r| r.end - r.start).sum();
        let first = self.v.first().map_or(0, |r| r.start);
        format!(
            "{} range(s), {bytes} bytes, the first at byte {first}",
            self.v.len()
        )
    }
}

#[derive(Default)]
struct State {
    /// Foreground writes ended since the last flush took them.
    pending: Ranges,
    /// The origin's loss epoch before the first of `pending` was sent.
    epoch: Option<u64>,
    /// Ranges an unsuccessful flush covered, not written since.
    failed: Ranges,
}

/// The foreground writes the next origin flush must cover.
pub(crate) struct OriginSync {
    state: Mutex<State>,
    /// Serialises foreground flushes: a flush that finds nothing pending
    /// must not return while another one still makes its writes durable.
    flushing: Mutex<()>,
}

impl Default for OriginSync {
    fn default() -> Self {
        OriginSync {
            state: Mutex::new(Rank::OriginWrites, State::default()),
            flushing: Mutex::new(Rank::OriginFlush, ()),
        }
    }
}

impl OriginSync {
    /// A foreground write of `range` succeeded; `epoch` is the origin's
    /// loss epoch read before it was sent.
    pub(crate) fn wrote(&self, range: Range<u64>, epoch: u64) {
        let mut st = self.state.lock();
        st.failed.remove(&range);
        st.pending.add(range);
        st.epoch = Some(st.epoch.map_or(epoch, |e| e.min(epoch)));
    }

    /// True if no foreground write waits for a flush and none was lost.
    #[cfg(test)]
    fn clean(&self) -> bool {
        let st = self.state.lock();
        st.pending.is_empty() && st.failed.is_empty()
    }

    /// Makes the foreground writes that ended before it durable with
    /// `flush_since` (not called when there are none), handed the origin's
    /// loss epoch from before the first of them was sent: it fails if the
    /// flush failed or that epoch moved. Then they may be lost: their
    /// ranges are kept for `check_lost`, and this fails.
    pub(crate) fn flush_pending(
        &self,
        flush_since: impl FnOnce(u64) -> EngineResult<()>,
    ) -> EngineResult<()> {
        let _turn = self.flushing.lock();
        let (taken, since) = {
            let mut st = self.state.lock();
            (std::mem::take(&mut st.pending), st.epoch.take())
        };
        let Some(since) = since.filter(|_| !taken.is_empty()) else {
            return Ok(());
        };
        let Err(e) = flush_since(since) else {
            return Ok(());
        };
        let what = taken.describe();
        self.state.lock().failed.extend(taken);
        Err(match e {
            EngineError::OriginWritesLost(_) => EngineError::OriginWritesLost(format!(
                "the origin was reconnected or failed a flush after writes were sent to it \
                 ({what}): it may have lost them"
            )),
            e => e,
        })
    }

    /// Fails while a foreground write that a failed flush covered has not
    /// been written again: a client's FLUSH must not report its data
    /// durable then.
    pub(crate) fn check_lost(&self) -> EngineResult<()> {
        let st = self.state.lock();
        if st.failed.is_empty() {
            return Ok(());
        }
        Err(EngineError::OriginWritesLost(format!(
            "the origin may have lost writes it acknowledged (a failed flush, or a reconnect \
             after they were sent): {}; every flush fails until they are written again",
            st.failed.describe()
        )))
    }

    /// `flush_pending` with `flush`, the loss epoch read from `epoch`
    /// after it, then `check_lost`.
    #[cfg(test)]
    fn flush_foreground(
        &self,
        flush: impl FnOnce() -> EngineResult<()>,
        epoch: impl Fn() -> u64,
    ) -> EngineResult<()> {
        self.flush_pending(|since| {
            flush()?;
            if epoch() != since {
                return Err(EngineError::OriginWritesLost("moved".into()));
            }
            Ok(())
        })?;
        self.check_lost()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn fail() -> EngineResult<()> {
        Err(EngineError::Config("injected".into()))
    }

    #[test]
    fn nothing_written_flushes_nothing() {
        let s = OriginSync::default();
        let called = Cell::new(false);
        let flush = || {
            called.set(true);
            Ok(())
        };
        s.flush_foreground(flush, || 0).unwrap();
        assert!(!called.get());
        assert!(s.clean());
    }

    #[test]
    fn a_failed_flush_fails_later_ones_until_the_ranges_are_rewritten() {
        let s = OriginSync::default();
        s.wrote(0..4096, 0);
        s.wrote(8192..16384, 0);
        assert!(s.flush_foreground(fail, || 1).is_err());
        // Nothing pending, but the lost ranges are not written again.
        let e = s.flush_foreground(|| Ok(()), || 1).unwrap_err();
        assert!(e.to_string().contains("2 range(s), 12288 bytes"), "{e}");
        s.wrote(0..4096, 1);
        s.wrote(8192..12288, 1);
        let e = s.flush_foreground(|| Ok(()), || 1).unwrap_err();
        assert!(e.to_string().contains("1 range(s), 4096 bytes"), "{e}");
        s.wrote(12288..16384, 1);
        s.flush_foreground(|| Ok(()), || 1).unwrap();
        assert!(s.clean());
    }

    #[test]
    fn a_flush_after_a_loss_of_the_origin_fails() {
        let s = OriginSync::default();
        s.wrote(0..512, 3);
        // The flush itself succeeded, on a new connection.
        assert!(s.flush_foreground(|| Ok(()), || 4).is_err());
        s.wrote(0..512, 4);
        s.flush_foreground(|| Ok(()), || 4).unwrap();
    }

    #[test]
    fn too_many_ranges_stand_for_the_whole_volume() {
        let s = OriginSync::default();
        for k in 0..(RANGES_MAX as u64 + 1) {
            s.wrote(k * 1024..k * 1024 + 512, 0);
        }
        assert!(s.flush_foreground(fail, || 0).is_err());
        s.wrote(0..1 << 40, 0);
        let e = s.flush_foreground(|| Ok(()), || 0).unwrap_err();
        assert!(e.to_string().contains("whole volume"), "{e}");
    }
}
