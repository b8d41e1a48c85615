//! Writeback in flush order (`WritebackOrder::Flush`): the groups of
//! table/groups.rs reach the origin oldest first, each followed by an
//! origin flush before the next one starts.
//!
//! At every moment the origin then holds every group below some k, and
//! some of group k's writes: a state a crash of a real disk could have
//! left (writes acknowledged before a flush are there, none acknowledged
//! after the next flush is, and any subset of those in between). Within a
//! group blocks go in ascending order, coalesced, as in address order;
//! the open group's data may go too (any part of the open group is such a
//! subset). One thread writes back at a time (the order turn).
//!
//! Foreground origin writes (a write around a full cache, a block beyond
//! the cached ones) are writes of the open group: they wait until every
//! closed group is on the origin (`order_foreground_write`).

use std::time::{Duration, Instant};

use super::run::{wait_if_stalled, Pace};
use crate::engine::format::Record;
use crate::engine::sectors::SECTOR_BYTES;
use crate::engine::stats::bump;
use crate::engine::{Engine, EngineError, EngineResult, WritebackOrder};

/// Shadows or blocks one step writes back at most.
const STEP_ITEMS: usize = 1024;
/// Longest a foreground origin write waits for the closed groups while
/// none of them makes progress (a slow origin that keeps taking writes
/// only slows it down: a full writeback cache stalls writes, it does not
/// fail them).
const STALL_LIMIT: Duration = Duration::from_secs(60);

impl Engine {
    /// Writeback goes group by group.
    pub(crate) fn ordered(&self) -> bool {
        self.writeback_order == WritebackOrder::Flush
    }

    /// Writeback in flush order has a closed group not yet on the origin.
    pub(crate) fn older_groups_pending(&self) -> bool {
        self.ordered() && self.meta.closed_pending().is_some()
    }

    /// A client flush (or `write_back_all`) closes the open group, if it
    /// took a write: a `Close` record, journalled with the flush's commit.
    pub(crate) fn close_group(&self) {
        let mut m = self.meta.lock();
        if let Some(group) = m.groups().and_then(|g| g.next_close()) {
            self.append(&mut m, Record::Close { group });
        }
    }

    /// One step of writeback in flush order: part of the oldest group not
    /// done (its older versions first, then its mapped blocks), and, once a
    /// closed group is all written, an origin flush and its `Done` record,
    /// after which the next group may start. Returns the blocks written
    /// back.
    pub(crate) fn ordered_step(&self, pace: Pace) -> EngineResult<usize> {
        let mut cursor = self.writeback.order_turn.lock();
        let (g, open) = self.meta.next_group();
        let Some(g) = g else {
            return Ok(0);
        };
        let mut written = self.write_back_shadows(g)?;
        let mut blocks = self
            .meta
            .lock()
            .groups()
            .map(|gr| gr.blocks_of(g, *cursor, STEP_ITEMS))
            .unwrap_or_default();
        blocks.sort_unstable();
        if let Some(&b) = blocks
            .iter()
            .rev()
            .find(|&&b| b >= *cursor)
            .or(blocks.last())
        {
            *cursor = b + 1;
        }
        if !blocks.is_empty() {
            written += self.writeback_blocks_in(&blocks, pace, Some(g))?;
        }
        if g < open && self.meta.group_written(g) {
            // Flushed, group g is done, and the next group may start.
            self.origins.flush(&self.stats)?;
            let mut m = self.meta.lock();
            self.append(&mut m, Record::Done { group: g });
            bump(&self.stats.groups_written_back, 1);
        }
        Ok(written)
    }

    /// Writes group `g`'s older versions back (up to a step's worth). They
    /// stay, written, until the group's `Done`. Nothing locks them: nothing
    /// else uses them.
    fn write_back_shadows(&self, g: u64) -> EngineResult<usize> {
        let Some(shadows) = self.meta.shadows_of(g, STEP_ITEMS) else {
            return Ok(0);
        };
        let sb = SECTOR_BYTES as usize;
        let epochs = self.origins.loss_epochs();
        for &(block, shadow) in &shadows {
            for run in shadow.dirty.runs() {
                let mut buf = crate::device::AlignedBuf::zeroed(run.count as usize * sb);
                let at = run.first as u64 * SECTOR_BYTES;
                self.cache_read(shadow.slot, at, &mut buf)?;
                self.origin_write_now(&buf, block * self.block_bytes + at)?;
            }
        }
        if shadows.is_empty() {
            return Ok(0);
        }
        // Written only once the origin has them for good, as blocks are
        // marked clean (run.rs): the group's `Done` drops them.
        self.origins.flush_since(&self.stats, &epochs)?;
        let mut m = self.meta.lock();
        for &(block, _) in &shadows {
            m.shadow_written(g, block);
        }
        drop(m);
        bump(&self.stats.shadows_written_back, shadows.len() as u64);
        Ok(shadows.len())
    }

    /// `write_back_all` in flush order: closes the open group (a group may
    /// always be split in two), then writes back group after group until
    /// every group up to it is on the origin. Writes that arrive meanwhile
    /// join later groups and are left for later, so it ends.
    pub(crate) fn write_back_groups(&self, progress: &mut dyn FnMut(u64, u64)) -> EngineResult<()> {
        self.close_group();
        let target = self.meta.open_group();
        self.write_back_groups_below(target, progress)
    }

    /// Writes back every closed group, leaving the open one: before a
    /// checkpoint that would otherwise lose their order (at open after a
    /// crash, at close; see journal/commit.rs).
    pub(crate) fn write_back_closed_groups(&self) -> EngineResult<()> {
        let open = self.meta.open_group();
        self.write_back_groups_below(open, &mut |_, _| {})
    }

    fn write_back_groups_below(
        &self,
        target: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        let left = |e: &Engine| e.meta.writeback_left();
        let total = left(self);
        progress(0, total);
        let mut stalled = 0;
        loop {
            let pending = self.meta.closed_pending();
            match pending {
                Some(g) if g < target => {}
                _ => break,
            }
            let written = self.ordered_step(Pace::Full)?;
            wait_if_stalled(&mut stalled, written > 0)?;
            progress(total.saturating_sub(left(self)), total);
        }
        Ok(())
    }

    /// A write of the cache route that must go to the origin while an
    /// older flush group is not there yet gives up its block locks first:
    /// `DrainFirst` (pipeline.rs writes the closed groups back, then the
    /// request again).
    pub(crate) fn drain_first(&self) -> EngineResult<()> {
        if self.older_groups_pending() {
            return Err(EngineError::DrainFirst);
        }
        Ok(())
    }

    /// Before a foreground write to the origin, with its blocks' locks
    /// held: every closed group must be on the origin first. This thread
    /// writes groups back itself meanwhile (step by step, so that two such
    /// writers each write the blocks they hold), the blocks it holds with
    /// them (`writeback_blocks_in`). Fails once the groups made no progress
    /// for `STALL_LIMIT` (the origin is gone); the write is then not made.
    pub(crate) fn order_foreground_write(&self) -> EngineResult<()> {
        let closed = || self.meta.closed_pending();
        if !self.ordered() {
            return Ok(());
        }
        let mut pending = closed();
        let mut progress_at = Instant::now();
        while let Some(g) = pending {
            let written = self.ordered_step(Pace::Full)?;
            let now = closed();
            if written > 0 || now != Some(g) {
                progress_at = Instant::now();
            } else if progress_at.elapsed() >= STALL_LIMIT {
                return Err(EngineError::Config(format!(
                    "a write to the origin waited for older flush groups to reach it, and \
                     group {g} made no progress for {} s",
                    STALL_LIMIT.as_secs()
                )));
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
            pending = now;
        }
        Ok(())
    }
}
