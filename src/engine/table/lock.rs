//! The table and its lock as one part: `MetaLock` holds `Meta` under the
//! metadata lock (rank `Meta`). A step that reads or changes the table in
//! one short critical section is a method here, so the lock is taken
//! where the data lives. Steps that interleave table work with other parts
//! under one critical section still take `lock()`; tests/tidy.rs counts
//! those sites outside `table/`, and the count only falls.

use std::ops::{Range, RangeInclusive};

use super::groups::Shadow;
use super::sectors::SectorSet;
use super::Meta;
use crate::engine::format::CheckpointData;
use crate::engine::journal::crash_log::{CrashLog, Trim};
use crate::engine::policy::PolicyKind;
use crate::sync::{Mutex, MutexGuard, Rank};

pub(crate) struct MetaLock(Mutex<Meta>);

impl MetaLock {
    pub(crate) fn new(meta: Meta) -> MetaLock {
        MetaLock(Mutex::new(Rank::Meta, meta))
    }

    /// The metadata lock, for a critical section that spans several steps.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Meta> {
        self.0.lock()
    }

    /// The slot holding `block`, and whether it is dirty.
    pub(crate) fn lookup(&self, block: u64) -> Option<(u32, bool)> {
        self.0.lock().table().lookup(block)
    }

    /// The valid and dirty sectors of `slot`.
    pub(crate) fn sector_sets(&self, slot: u32) -> (SectorSet, SectorSet) {
        self.0.lock().table().sector_sets(slot)
    }

    pub(crate) fn dirty_count(&self) -> u64 {
        self.0.lock().table().dirty_count()
    }

    /// Every dirty block, sorted.
    pub(crate) fn all_dirty(&self) -> Vec<u64> {
        self.0.lock().table().all_dirty()
    }

    /// Free slots that may take dirty data.
    pub(crate) fn free_slots(&self) -> usize {
        self.0.lock().free_slots()
    }

    /// See `Meta::releases_pending`.
    pub(crate) fn releases_pending(&self, blocks: RangeInclusive<u64>, durable: u64) -> bool {
        self.0.lock().releases_pending(blocks, durable)
    }

    /// The table as a checkpoint writes it.
    pub(crate) fn snapshot(&self) -> CheckpointData {
        self.0.lock().snapshot()
    }

    pub(crate) fn set_policy(&self, kind: PolicyKind) {
        self.0.lock().set_policy(kind)
    }

    /// Drops every mapping (the cache was given up).
    pub(crate) fn forget_all(&self) {
        self.0.lock().forget_all()
    }

    pub(crate) fn set_crash_log(&self, log: CrashLog) {
        self.0.lock().set_crash_log(log)
    }

    pub(crate) fn take_crash_log(&self) -> Option<CrashLog> {
        self.0.lock().take_crash_log()
    }

    /// The crash log's pages of durable records to clear, if any.
    pub(crate) fn plan_crash_log_trim(&self) -> Option<Trim> {
        self.0.lock().crash_log().and_then(|l| l.plan_trim())
    }

    /// Writeback in flush order: the open group (0 without groups).
    pub(crate) fn open_group(&self) -> u64 {
        self.0.lock().groups().map_or(0, |g| g.open())
    }

    /// Writeback in flush order: the oldest closed group not yet on the
    /// origin.
    pub(crate) fn closed_pending(&self) -> Option<u64> {
        self.0.lock().groups().and_then(|g| g.closed_pending())
    }

    /// Up to `max` of group `g`'s older versions not yet written back
    /// (`None` without groups).
    pub(crate) fn shadows_of(&self, g: u64, max: usize) -> Option<Vec<(u64, Shadow)>> {
        self.0.lock().groups().map(|gr| gr.shadows_of(g, max))
    }

    /// The log placement's cleaner: see `Meta::end_cleaning`.
    pub(crate) fn end_cleaning(&self, dirty: bool) {
        self.0.lock().end_cleaning(dirty)
    }

    /// The log placement: freed segments to discard.
    pub(crate) fn take_trims(&self) -> Vec<Range<u32>> {
        self.0.lock().take_trims()
    }

    pub(crate) fn trim_done(&self, segment: Range<u32>) {
        self.0.lock().trim_done(segment)
    }

    /// How many of `blocks` are cached.
    pub(crate) fn count_cached(&self, blocks: impl Iterator<Item = u64>) -> u64 {
        let m = self.0.lock();
        blocks.filter(|&b| m.table().lookup(b).is_some()).count() as u64
    }

    /// The valid sectors of `block` and whether it is dirty, if `slot`
    /// still holds it (`None`: superseded or dropped).
    pub(crate) fn held_at(&self, block: u64, slot: u32) -> Option<(SectorSet, bool)> {
        let m = self.0.lock();
        match m.table().lookup(block) {
            Some((s, dirty)) if s == slot => Some((m.table().sector_sets(slot).0, dirty)),
            _ => None,
        }
    }

    /// Volume `v` grew to `blocks` blocks online (`Table::grow_volume`).
    pub(crate) fn grow_volume(&self, v: usize, blocks: u64) {
        self.0.lock().grow_volume(v, blocks)
    }

    /// Volume `v`'s removal was given up: `Meta::unseal_volume`.
    pub(crate) fn unseal_volume(&self, v: usize) {
        self.0.lock().unseal_volume(v)
    }

    /// The cache device grew: `Meta::grow_slots`.
    pub(crate) fn grow_slots(&self, slot_count: u64) {
        self.0.lock().grow_slots(slot_count)
    }

    /// A volume of `blocks` blocks was added online (`Table::add_volume`).
    pub(crate) fn add_volume(&self, blocks: u64) -> usize {
        self.0.lock().add_volume(blocks)
    }

    /// Volume `v`'s heat map counts: cached and dirty blocks per region.
    pub(crate) fn regions(&self, v: usize) -> (Vec<u32>, Vec<u32>) {
        let m = self.0.lock();
        match m.table().regions.volume(v) {
            Some(map) => (map.cached.clone(), map.dirty.clone()),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// Records wait for a commit; the crash log is half full.
    pub(crate) fn commit_pressure(&self) -> (bool, bool) {
        let m = self.0.lock();
        let log_half_full = m
            .crash_log_ref()
            .is_some_and(|l| l.len() >= l.capacity() / 2);
        (m.commit_waiting(), log_half_full)
    }

    /// The crash log's bytes as they stand (no record half appended), for
    /// crash tests (`Engine::crash_log_image`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn crash_log_image(&self) -> Option<Vec<u8>> {
        self.0.lock().crash_log_ref().map(|l| l.image_bytes())
    }

    /// Writeback in flush order: the group to write back next (the oldest
    /// closed one not on the origin, else the oldest pending), and the
    /// open group.
    pub(crate) fn next_group(&self) -> (Option<u64>, u64) {
        let m = self.0.lock();
        let groups = m.groups().expect("flush order keeps groups");
        (
            groups.closed_pending().or(groups.oldest_pending()),
            groups.open(),
        )
    }

    /// Writeback in flush order: group `g` has no block nor older version
    /// left to write back.
    pub(crate) fn group_written(&self, g: u64) -> bool {
        let m = self.0.lock();
        let gr = m.groups().expect("flush order keeps groups");
        gr.blocks_of(g, 0, 1).is_empty() && gr.shadows_of(g, 1).is_empty()
    }

    /// Dirty blocks and older versions (flush order) left to write back.
    pub(crate) fn writeback_left(&self) -> u64 {
        let m = self.0.lock();
        let counts = m.groups().map(|g| g.counts()).unwrap_or_default();
        m.table().dirty_count() + counts.shadows
    }
}
