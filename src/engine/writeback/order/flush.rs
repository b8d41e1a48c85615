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
//! closed group is on the origin (`before_foreground_write`).

use std::time::{Duration, Instant};

use super::super::pace::{wait_if_stalled, Pace};
use super::{Order, RunLock};
use crate::engine::cache::Cache;
use crate::engine::format::Record;
use crate::engine::origin::locks::BlockLocks;
use crate::engine::sectors::SECTOR_BYTES;
use crate::engine::stats::bump;
use crate::engine::{EngineError, EngineResult, WritebackOrder};

/// Shadows or blocks one step writes back at most.
const STEP_ITEMS: usize = 1024;
/// Longest a foreground origin write waits for the closed groups while
/// none of them makes progress (a slow origin that keeps taking writes
/// only slows it down: a full writeback cache stalls writes, it does not
/// fail them).
const STALL_LIMIT: Duration = Duration::from_secs(60);

pub(crate) struct Flush;

impl Order for Flush {
    fn setting(&self) -> WritebackOrder {
        WritebackOrder::Flush
    }

    /// Part of the oldest group not done: at once while a checkpoint waits
    /// for the closed groups, else when writeback is due.
    fn background_step(&self, e: &Cache) -> EngineResult<usize> {
        if e.journal.checkpoint_waits() && self.older_groups_pending(e) {
            // A checkpoint waits for the closed groups.
            return step(e, Pace::Full);
        }
        let (cands, pace) = e.writeback_candidates();
        if cands.is_empty() {
            return Ok(0);
        }
        // Writeback is due; what goes is the oldest group's.
        step(e, pace)
    }

    /// The groups hold every volume's writes and go to the origins whole,
    /// in order: every volume is written back, whatever `wanted` accepts.
    fn write_back(
        &self,
        e: &Cache,
        _wanted: &dyn Fn(u64) -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        for _pass in 0..16 {
            write_back_groups(e, progress)?;
            if e.settled(&|_| true) {
                break;
            }
        }
        Ok(())
    }

    /// One thread writes the groups back in turn, and a foreground write
    /// waiting for them holds block locks on its own thread
    /// (`before_foreground_write`).
    fn side_by_side(&self) -> bool {
        false
    }

    /// A block whose lock this thread holds (a foreground write waiting
    /// for older groups) is written with them.
    fn lock_for_run(&self, locks: &BlockLocks, b: u64) -> Option<RunLock> {
        if locks.try_lock(b) {
            Some(RunLock::Taken)
        } else if locks.held_here(b) {
            Some(RunLock::HeldHere)
        } else {
            None
        }
    }

    /// The records that put these blocks' data in their slots are made
    /// durable before the data reaches the origin. Otherwise a crash could
    /// drop a write whose data the origin has, the recovered cache show an
    /// older version of the block, and the origin, once the cache is lost,
    /// the write that the volume had lost (a no-op when nothing was
    /// appended since the last commit; the blocks are locked, so no write
    /// to them is half done).
    fn before_run_sent(&self, e: &Cache) -> EngineResult<()> {
        e.commit()
    }

    /// The order turn is held: no waiting for block locks under it (a
    /// write holding one may wait for the turn). A block whose lock is
    /// taken stays dirty and goes again.
    fn finish_run(
        &self,
        e: &Cache,
        run: &[(u64, u32)],
        mine: &dyn Fn(u64) -> bool,
        clean: bool,
    ) -> usize {
        let blocks = || run.iter().map(|&(b, _)| b);
        let origin = e.origins.of_key(run[0].0);
        let locked: Vec<bool> = blocks()
            .map(|b| mine(b) || origin.locks().try_lock(b))
            .collect();
        let mut skip = origin.flights().finish(blocks());
        for (s, &l) in skip.iter_mut().zip(&locked) {
            *s |= !l;
        }
        let n = if clean { e.mark_clean(run, &skip) } else { 0 };
        for (b, l) in blocks().zip(locked) {
            if l && !mine(b) {
                origin.locks().unlock(b);
            }
        }
        n
    }

    fn older_groups_pending(&self, e: &Cache) -> bool {
        e.meta.closed_pending().is_some()
    }

    /// The writes acknowledged so far form a group of their own.
    fn client_flush(&self, e: &Cache) {
        close_group(e);
    }

    /// Every closed group must be on the origin first. This thread writes
    /// groups back itself meanwhile (step by step, so that two such
    /// writers each write the blocks they hold), the blocks it holds with
    /// them (`lock_for_run`). Fails once the groups made no progress for
    /// `STALL_LIMIT` (the origin is gone); the write is then not made.
    fn before_foreground_write(&self, e: &Cache) -> EngineResult<()> {
        let closed = || e.meta.closed_pending();
        let mut pending = closed();
        let mut progress_at = Instant::now();
        while let Some(g) = pending {
            let written = step(e, Pace::Full)?;
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

    /// Every closed group, leaving the open one: a checkpoint keeps no
    /// closed group (journal/commit.rs).
    fn write_back_closed(&self, e: &Cache) -> EngineResult<()> {
        let open = e.meta.open_group();
        write_back_groups_below(e, open, &mut |_, _| {})
    }

    /// Writes that arrived meanwhile, of any volume, may share a group
    /// with the volume's.
    /// Its groups span every volume, and the next open, which takes a
    /// removed volume's record out, would have to move their keys too.
    fn removes_served(&self) -> EngineResult<()> {
        Err(EngineError::Config(
            "writeback in flush order keeps every volume's writes in one order: remove the \
             origin with the daemon stopped"
                .into(),
        ))
    }

    fn check_written_back(&self, e: &Cache) -> EngineResult<()> {
        if e.meta.dirty_count() > 0 {
            return Err(EngineError::Config(
                "flush order: dirty blocks are left after the write back; nothing was removed"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A client flush (or `write_back_all`) closes the open group, if it took
/// a write: a `Close` record, journalled with the flush's commit.
fn close_group(e: &Cache) {
    let mut m = e.meta.lock();
    if let Some(group) = m.groups().and_then(|g| g.next_close()) {
        e.append(&mut m, Record::Close { group });
    }
}

/// One step of writeback in flush order: part of the oldest group not
/// done (its older versions first, then its mapped blocks), and, once a
/// closed group is all written, an origin flush and its `Done` record,
/// after which the next group may start. Returns the blocks written back.
fn step(e: &Cache, pace: Pace) -> EngineResult<usize> {
    let mut cursor = e.writeback.order_turn.lock();
    let (g, open) = e.meta.next_group();
    let Some(g) = g else {
        return Ok(0);
    };
    let mut written = write_back_shadows(e, g)?;
    let mut blocks = e
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
        written += e.writeback_blocks_in(&blocks, pace, Some(g))?;
    }
    if g < open && e.meta.group_written(g) {
        // Flushed, group g is done, and the next group may start.
        e.origins.flush(&e.stats)?;
        let mut m = e.meta.lock();
        e.append(&mut m, Record::Done { group: g });
        bump(&e.stats.groups_written_back, 1);
    }
    Ok(written)
}

/// Writes group `g`'s older versions back (up to a step's worth). They
/// stay, written, until the group's `Done`. Nothing locks them: nothing
/// else uses them.
fn write_back_shadows(e: &Cache, g: u64) -> EngineResult<usize> {
    let Some(shadows) = e.meta.shadows_of(g, STEP_ITEMS) else {
        return Ok(0);
    };
    let sb = SECTOR_BYTES as usize;
    let epochs = e.origins.loss_epochs();
    for &(block, shadow) in &shadows {
        for run in shadow.dirty.runs() {
            let mut buf = crate::device::AlignedBuf::zeroed(run.count as usize * sb);
            let at = run.first as u64 * SECTOR_BYTES;
            e.cache_read(shadow.slot, at, &mut buf)?;
            e.origin_write_now(&buf, block * e.block_bytes + at)?;
        }
    }
    if shadows.is_empty() {
        return Ok(0);
    }
    // Written only once the origin has them for good, as blocks are
    // marked clean (run.rs): the group's `Done` drops them.
    e.origins.flush_since(&e.stats, &epochs)?;
    let mut m = e.meta.lock();
    for &(block, _) in &shadows {
        m.shadow_written(g, block);
    }
    drop(m);
    bump(&e.stats.shadows_written_back, shadows.len() as u64);
    Ok(shadows.len())
}

/// `write_back_all` in flush order: closes the open group (a group may
/// always be split in two), then writes back group after group until every
/// group up to it is on the origin. Writes that arrive meanwhile join later
/// groups and are left for later, so it ends.
fn write_back_groups(e: &Cache, progress: &mut dyn FnMut(u64, u64)) -> EngineResult<()> {
    close_group(e);
    let target = e.meta.open_group();
    write_back_groups_below(e, target, progress)
}

fn write_back_groups_below(
    e: &Cache,
    target: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> EngineResult<()> {
    let left = || e.meta.writeback_left();
    let total = left();
    progress(0, total);
    let mut stalled = 0;
    loop {
        let pending = e.meta.closed_pending();
        match pending {
            Some(g) if g < target => {}
            _ => break,
        }
        let written = step(e, Pace::Full)?;
        wait_if_stalled(&mut stalled, written > 0)?;
        progress(total.saturating_sub(left()), total);
    }
    Ok(())
}
