//! Writeback in address order (`WritebackOrder::Address`, the default):
//! blocks go by watermark, age and address, whatever order is cheapest,
//! each volume's batch to its own origin at once. A cache device lost in
//! the middle leaves the origin with blocks from different moments.

use super::super::pace::wait_if_stalled;
use super::{Order, RunLock};
use crate::engine::cache::Cache;
use crate::engine::origin::locks::BlockLocks;
use crate::engine::{EngineResult, WritebackOrder};

pub(crate) struct Address;

impl Order for Address {
    fn setting(&self) -> WritebackOrder {
        WritebackOrder::Address
    }

    /// The batch the watermarks, ages and idle time call for, to the
    /// origins' lanes when they run (several volumes), else here.
    fn background_step(&self, e: &Cache) -> EngineResult<usize> {
        let (cands, pace) = e.writeback_candidates();
        if cands.is_empty() {
            return Ok(0);
        }
        if e.lanes_on() {
            return Ok(e.hand_to_lanes(&cands, pace));
        }
        e.writeback_blocks(&cands, pace)
    }

    /// Passes over a snapshot of the wanted dirty blocks, at most 16 (a
    /// mode switch under way may leave blocks dirty in a volume whose mode
    /// keeps none: `settled`).
    fn write_back(
        &self,
        e: &Cache,
        wanted: &dyn Fn(u64) -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        for _pass in 0..16 {
            let mut snapshot: Vec<u64> = e.meta.all_dirty();
            snapshot.retain(|&k| wanted(k));
            let total = snapshot.len() as u64;
            progress(0, total);
            let mut stalled = 0;
            let mut remaining = snapshot;
            while !remaining.is_empty() {
                let next = e.write_back_pass(&remaining, total, progress)?;
                wait_if_stalled(&mut stalled, next.len() < remaining.len())?;
                remaining = next;
            }
            if e.settled(wanted) {
                break;
            }
        }
        Ok(())
    }

    fn side_by_side(&self) -> bool {
        true
    }

    fn lock_for_run(&self, locks: &BlockLocks, b: u64) -> Option<RunLock> {
        locks.try_lock(b).then_some(RunLock::Taken)
    }

    fn before_run_sent(&self, _: &Cache) -> EngineResult<()> {
        Ok(())
    }

    /// Waits for the run's block locks (a write holding one finishes
    /// first).
    fn finish_run(
        &self,
        e: &Cache,
        run: &[(u64, u32)],
        _mine: &dyn Fn(u64) -> bool,
        clean: bool,
    ) -> usize {
        let origin = e.origins.of_key(run[0].0);
        let _guard = origin.locks().lock_range(run[0].0, run[run.len() - 1].0);
        let touched = origin.flights().finish(run.iter().map(|&(b, _)| b));
        if clean {
            e.mark_clean(run, &touched)
        } else {
            0
        }
    }

    fn older_groups_pending(&self, _: &Cache) -> bool {
        false
    }

    fn client_flush(&self, _: &Cache) {}

    fn before_foreground_write(&self, _: &Cache) -> EngineResult<()> {
        Ok(())
    }

    fn write_back_closed(&self, _: &Cache) -> EngineResult<()> {
        Ok(())
    }

    /// A volume's blocks are written back on their own; dropping them
    /// checks that none is still dirty (`drop_volume_blocks`).
    fn removes_served(&self) -> EngineResult<()> {
        Ok(())
    }

    fn check_written_back(&self, _: &Cache) -> EngineResult<()> {
        Ok(())
    }
}
