//! Slots: records applied in memory, allocation of slots free on disk,
//! eviction of clean blocks, and storing data in new slots.

use super::sectors::{SectorSet, SECTOR_BYTES};
use crate::engine::cache::Cache;
use crate::engine::format::Record;
use crate::engine::origin::Origin;
use crate::engine::policy::Verdict;
use crate::engine::request::Segment;

use super::{share, Meta};
use crate::device::DeviceError;
use crate::engine::stats::bump;
use crate::engine::{EngineError, EngineResult};

/// Clean blocks evicted at once when no slot is free.
const EVICT_BATCH: usize = 64;
/// Candidates examined per eviction.
const EVICT_SCAN: usize = 4096;

/// Why a store stopped (`Yes`: it stored every block).
pub(crate) enum Stored {
    Yes,
    /// Every cache block is dirty or busy.
    NoSlot,
    /// The cache device failed the write (counted); the slot stays free.
    CacheError(DeviceError),
}

/// When the block a record makes dirty became dirty: now, or, if it was
/// already dirty (in this slot or the one a map supersedes), when it was,
/// so that rewrites never postpone the max-age writeback; `None` for a
/// record that makes nothing dirty.
fn dirty_since(m: &Meta, r: &Record, now_s: u16) -> Option<u16> {
    match *r {
        Record::Map {
            block, dirty: true, ..
        }
        | Record::MapRun {
            block, dirty: true, ..
        }
        | Record::AddRun {
            block, dirty: true, ..
        } => Some(match m.table.lookup(block) {
            Some((old, true)) => m.dirty_since_s[old as usize],
            _ => now_s,
        }),
        _ => None,
    }
}

/// The slots that hold a block of `origin`'s volume: (slot, block, dirty).
fn volume_slots(m: &Meta, origin: &Origin) -> Vec<(u32, u64, bool)> {
    (0..m.table.slot_count() as u32)
        .filter_map(|slot| {
            let (block, dirty) = m.table.slot_block(slot)?;
            origin.cacheable(block).then_some((slot, block, dirty))
        })
        .collect()
}

impl Cache {
    /// Applies a record to the in-memory state and queues it for the journal.
    pub(crate) fn append(&self, m: &mut Meta, r: Record) {
        if self.given_up() {
            // The cache was given up (io/failure.rs): its table is empty
            // and nothing is journalled again.
            return;
        }
        // Kept in release builds (a few comparisons): a record the table
        // would reject is an engine bug, stopped before it reaches the
        // journal, where replay would refuse the cache.
        if let Err(e) = m.table.validate(&r) {
            panic!("engine bug: appending an invalid record: {e}");
        }
        let now_s = (self.now_ms() / 1000) as u16;
        let dirty_since = dirty_since(m, &r, now_s);
        let unmapped_block = match r {
            Record::Unmap { slot } => m.table.slot_block(slot).map(|(b, _)| b),
            _ => None,
        };
        // Writeback in flush order keeps a slot a record frees as a shadow
        // while its group is not on the origin (groups.rs); a group's
        // `Done` frees its shadows.
        let (shadow, done) = match m.groups.as_mut() {
            Some(g) => g.note(&m.table, &r),
            None => (None, Vec::new()),
        };
        for slot in done {
            m.releases.free_slot(slot);
        }
        let released = m.table.apply(&r).released;
        match r {
            Record::Map { slot, block, .. } | Record::MapRun { slot, block, .. } => {
                m.set_touched(slot, false);
                match released {
                    Some(old) => m.policy.moved(old, slot, block),
                    None => m.policy.inserted(slot, block),
                }
            }
            Record::Unmap { slot } => {
                m.policy.removed(slot);
                if shadow != Some(slot) {
                    m.releases.free_slot(slot);
                }
            }
            Record::AddRun { .. }
            | Record::Clean { .. }
            | Record::Close { .. }
            | Record::Done { .. } => {}
        }
        if let Some(t) = dirty_since {
            m.dirty_since_s[r.slot() as usize] = t;
        }
        if let Some(old) = released.filter(|&old| shadow != Some(old)) {
            m.releases.free_slot(old);
        }
        let released_block = match r {
            Record::Map { block, .. } | Record::MapRun { block, .. } if released.is_some() => {
                Some(block)
            }
            _ => unmapped_block,
        };
        if let Some(b) = released_block {
            m.releases.release_block(b);
        }
        m.records.push(r);
        self.mirror_in_crash_log(m, &r);
        self.journal.note_completed();
    }

    /// Copies an appended record to the crash log; a log half full wakes
    /// the background to commit, one three quarters full makes writers
    /// commit before they return.
    fn mirror_in_crash_log(&self, m: &mut Meta, r: &Record) {
        let Some(log) = m.crash_log.as_mut() else {
            return;
        };
        if !log.append(r) {
            bump(&self.stats.crash_log_overflows, 1);
        }
        if log.len() == log.capacity() / 2 {
            // The background commits a log this full (writeback.rs).
            self.bell.wake();
        }
        if log.len() >= log.capacity() / 4 * 3 {
            self.journal.press();
        }
    }

    /// Up to `n` slots free on disk for data this `dirty`, to hold blocks
    /// from `key` on (adjacent where the free slots allow; dirty data only
    /// in slots that may hold it: `pools.rs`), evicting clean blocks (and
    /// committing their release) if none is free. A volume at its maximum
    /// share evicts its own first (`share.rs`). Empty if every such block
    /// is dirty or busy.
    pub(crate) fn alloc_slots(&self, n: usize, dirty: bool, key: u64) -> EngineResult<Vec<u32>> {
        for _ in 0..3 {
            {
                let mut m = self.meta.lock();
                if m.sealed(key) {
                    return Ok(Vec::new()); // its volume is being removed
                }
                let own = self.evict_own_if_full(&mut m, n, key);
                if own == Some(0) {
                    return Ok(Vec::new());
                }
                if m.free.has_free(dirty) {
                    let before = m.free_slots();
                    let slots = m.free.take(n, dirty);
                    // Running low: the background evicts and commits ahead.
                    let low = self.low_free_slots(&m);
                    if before > low && m.free_slots() <= low
                        || self.placement.needs_cleaning(self, &m)
                    {
                        self.bell.wake();
                    }
                    return Ok(slots);
                }
                let within = dirty.then(|| m.table.dirty_slots());
                if m.releases.waiting_slots() == 0
                    && own.is_none()
                    && self.evict_below(&mut m, EVICT_BATCH, within) == 0
                {
                    return Ok(Vec::new());
                }
            }
            self.commit()?;
        }
        Ok(self.meta.lock().free.take(n, dirty))
    }

    /// If `n` new blocks would take `key`'s volume past its maximum share,
    /// evicts up to `n` of its own clean blocks and says how many; `None`
    /// if it has room.
    fn evict_own_if_full(&self, m: &mut Meta, n: usize, key: u64) -> Option<usize> {
        let v = self.origins.key_space().split(key).0;
        let share = self.origins.get(v)?.share();
        if !share::over_max(&m.table, self.origins.len(), v, share, n as u64) {
            return None;
        }
        let keys = self.origins.key_space();
        let Meta { table, policy, .. } = &mut *m;
        let victims = policy.select(n, EVICT_SCAN, &mut |slot| match table.slot_block(slot) {
            Some((block, false)) if keys.split(block).0 == v => {
                if self.origins.of_key(block).locks().try_lock(block) {
                    Verdict::Take
                } else {
                    Verdict::Skip
                }
            }
            Some((block, true)) if keys.split(block).0 == v => Verdict::Rotate,
            _ => Verdict::Skip,
        });
        Some(self.unmap_victims(m, victims))
    }

    /// Evicts up to `want` clean, unlocked blocks from slots that may take
    /// dirty data (the background's reserve: `Meta::free_slots`); returns
    /// how many. Their slots become reusable after the next commit.
    pub(crate) fn evict(&self, m: &mut Meta, want: usize) -> usize {
        let dirty_capable = m.table.dirty_slots();
        self.evict_below(m, want, Some(dirty_capable))
    }

    /// `evict`, of blocks in slots below `limit` only (if given); a
    /// volume at or below its share's floor keeps its blocks (`share.rs`).
    fn evict_below(&self, m: &mut Meta, want: usize, limit: Option<u32>) -> usize {
        // A cache of one volume shares with nobody: nothing to gather.
        let several = self.origins.len() > 1;
        let mut floors = several
            .then(|| share::Floors::of(&m.table, self.origins.iter().map(|o| o.share())))
            .flatten();
        let keys = self.origins.key_space();
        let Meta { table, policy, .. } = &mut *m;
        let limit = limit.unwrap_or(u32::MAX);
        let victims = policy.select(want, EVICT_SCAN, &mut |slot| {
            if slot >= limit {
                return Verdict::Skip;
            }
            match table.slot_block(slot) {
                None => Verdict::Take,
                Some((_, true)) => Verdict::Rotate,
                Some((block, false)) => {
                    let v = keys.split(block).0;
                    if floors.as_ref().is_some_and(|f| f.keeps(v)) {
                        return Verdict::Rotate;
                    }
                    if !self.origins.of_key(block).locks().try_lock(block) {
                        return Verdict::Skip;
                    }
                    if let Some(f) = floors.as_mut() {
                        f.took(v);
                    }
                    Verdict::Take
                }
            }
        });
        self.unmap_victims(m, victims)
    }

    /// Unmaps the blocks of `victims` (each locked by the selection, and
    /// unlocked here); returns how many.
    fn unmap_victims(&self, m: &mut Meta, victims: Vec<u32>) -> usize {
        let mut n = 0;
        for slot in victims {
            if let Some((block, _)) = m.table.slot_block(slot) {
                m.policy.evicted(slot, block);
                self.append(m, Record::Unmap { slot });
                self.origins.of_key(block).locks().unlock(block);
                bump(&self.stats.demotions, 1);
                n += 1;
            }
        }
        n
    }

    /// Drops every block of volume `v` (`Engine::remove_volume`, after
    /// its write back): each must be clean. Fails, dropping none, naming
    /// how many are still dirty.
    pub(crate) fn drop_volume_blocks(&self, v: usize) -> EngineResult<()> {
        let origin = self.volume(v)?;
        let mut m = self.meta.lock();
        let held = volume_slots(&m, origin);
        let dirty = held.iter().filter(|&&(_, _, d)| d).count();
        if dirty > 0 {
            return Err(EngineError::Config(format!(
                "volume {} still holds {dirty} dirty blocks after its write back (blocks busy?): \
                 nothing was removed; try again",
                origin.name()
            )));
        }
        for (slot, _, _) in held {
            self.append(&mut m, Record::Unmap { slot });
        }
        Ok(())
    }

    /// Drops volume `v`'s blocks while requests run (`Engine::
    /// remove_volume_served`): the volume is sealed first (no slot is
    /// handed out for its blocks again), then each of its clean blocks
    /// whose lock is free is unmapped, under the table's lock. A write that
    /// holds a block's lock finishes first; one that needs a slot from now
    /// on goes around the cache. Returns how many of its blocks are left:
    /// dirty ones (write them back, then call again) and busy ones.
    pub(crate) fn drop_volume_blocks_served(&self, v: usize) -> EngineResult<usize> {
        let origin = self.volume(v)?;
        let mut m = self.meta.lock();
        m.seal_volume(v);
        let held = volume_slots(&m, origin);
        let mut left = 0;
        for (slot, block, dirty) in held {
            if dirty || !origin.locks().try_lock(block) {
                left += 1;
                continue;
            }
            self.append(&mut m, Record::Unmap { slot });
            origin.locks().unlock(block);
        }
        Ok(left)
    }

    /// Makes the slots of `ranges` (a cache set's members that are not
    /// healthy) unusable, and every other slot usable: the clean blocks
    /// they held are unmapped (the origin has them; a member's own slots
    /// never hold dirty data). Returns false if a block was busy and kept
    /// its mapping for now (call again).
    pub(crate) fn retire_slots(&self, ranges: Vec<std::ops::Range<u32>>) -> bool {
        let mut m = self.meta.lock();
        m.free.set_unusable(ranges.clone());
        let mut complete = true;
        for slot in ranges.into_iter().flatten() {
            let Some((block, dirty)) = m.table.slot_block(slot) else {
                continue;
            };
            assert!(!dirty, "dirty data in slot {slot}, which has one copy");
            if !self.origins.of_key(block).locks().try_lock(block) {
                complete = false;
                continue;
            }
            // (The unmap tells the policy.)
            self.append(&mut m, Record::Unmap { slot });
            self.origins.of_key(block).locks().unlock(block);
            bump(&self.stats.demotions, 1);
        }
        complete
    }

    /// `n` free slots for new dirty blocks of `key`'s volume, if free
    /// slots are plentiful (above the background's reserve) and the volume
    /// is within its share: for a caller that must not wait, so nothing is
    /// evicted, waited for or committed (`None` instead).
    pub(crate) fn take_free_slots(&self, n: usize, key: u64) -> Option<Vec<u32>> {
        let mut m = self.meta.lock();
        if m.sealed(key) || !m.free.has_free(true) {
            return None;
        }
        let v = self.origins.key_space().split(key).0;
        let share = self.origins.get(v)?.share();
        if share::over_max(&m.table, self.origins.len(), v, share, n as u64) {
            return None;
        }
        let low = self.low_free_slots(&m);
        if m.free_slots() < n + low {
            return None;
        }
        let slots = m.free.take(n, true);
        if slots.len() < n {
            m.free.extend(slots);
            return None;
        }
        if m.free_slots() <= low || self.placement.needs_cleaning(self, &m) {
            self.bell.wake();
        }
        Some(slots)
    }

    /// Slots from `take_free_slots` that now hold `segs` (one each, in
    /// order: whole blocks, or parts of blocks not cached), dirty: mapped.
    /// Or given back, not written.
    pub(crate) fn settle_new_slots(&self, slots: &[u32], segs: &[Segment], written: bool) {
        let mut m = self.meta.lock();
        if !written {
            m.free.extend(slots.iter().copied());
            return;
        }
        for (seg, &slot) in segs.iter().zip(slots) {
            let (block, dirty) = (seg.block, true);
            let record = match self.full_block(seg) {
                true => Record::Map { slot, block, dirty },
                false => Record::MapRun {
                    slot,
                    block,
                    run: seg.run(),
                    dirty,
                },
            };
            self.append(&mut m, record);
        }
    }

    /// Stores consecutive whole blocks starting at `first_block` (`data` is
    /// a multiple of the block size) in slots free on disk, writing runs of
    /// adjacent slots with one device write, then maps them (the records
    /// become durable only after the data: see commit.rs). Returns how many
    /// leading blocks were stored and, if not all, why it stopped.
    pub(crate) fn store_in_new_slots(
        &self,
        first_block: u64,
        data: &[u8],
        dirty: bool,
    ) -> EngineResult<(usize, Stored)> {
        let bs = self.block_bytes as usize;
        let n = data.len() / bs;
        if n == 0 {
            return Ok((0, Stored::Yes));
        }
        if !self.admitting() {
            // The cache device failed too often: callers treat this like a
            // full cache (write around it, skip the promotion).
            return Ok((0, Stored::NoSlot));
        }
        let slots = self.alloc_slots(n, dirty, first_block)?;
        if slots.is_empty() {
            return Ok((0, Stored::NoSlot));
        }
        let mut written = 0;
        let mut failure = None;
        while written < slots.len() {
            let mut run = 1;
            while written + run < slots.len() && slots[written + run] == slots[written] + run as u32
            {
                run += 1;
            }
            let bytes = &data[written * bs..(written + run) * bs];
            if let Err(e) = self.cache_write(slots[written], 0, bytes) {
                failure = Some(e);
                break;
            }
            written += run;
        }
        let mut m = self.meta.lock();
        m.free.extend(slots[written..].iter().copied());
        for (k, &slot) in slots[..written].iter().enumerate() {
            let block = first_block + k as u64;
            self.append(&mut m, Record::Map { slot, block, dirty });
        }
        drop(m);
        let why = match failure {
            Some(e) => Stored::CacheError(e),
            None if written < n => Stored::NoSlot,
            None => Stored::Yes,
        };
        Ok((written, why))
    }

    /// Stores some sectors of `block` in a new slot: `valid` (non-empty)
    /// says which, `bytes` holds the sectors of `valid`'s hull (from its
    /// first to its last sector). All of them are mapped `dirty` or clean,
    /// superseding any slot that held the block (its release is made
    /// durable before any origin write, as for every map).
    pub(crate) fn store_sectors(
        &self,
        block: u64,
        valid: &SectorSet,
        bytes: &[u8],
        dirty: bool,
    ) -> EngineResult<Stored> {
        let hull = valid.hull().expect("storing no sector");
        assert_eq!(bytes.len() as u64, hull.count as u64 * SECTOR_BYTES);
        if valid.is_full() {
            let (_, why) = self.store_in_new_slots(block, bytes, dirty)?;
            return Ok(why);
        }
        if !self.admitting() {
            return Ok(Stored::NoSlot);
        }
        let Some(&slot) = self.alloc_slots(1, dirty, block)?.first() else {
            return Ok(Stored::NoSlot);
        };
        if let Err(e) = self.cache_write(slot, hull.first as u64 * SECTOR_BYTES, bytes) {
            self.meta.lock().free.insert(slot);
            return Ok(Stored::CacheError(e));
        }
        let mut m = self.meta.lock();
        let mut runs = valid.runs();
        let first = runs.next().expect("non-empty");
        self.append(
            &mut m,
            Record::MapRun {
                slot,
                block,
                run: first,
                dirty,
            },
        );
        for run in runs {
            self.append(
                &mut m,
                Record::AddRun {
                    slot,
                    block,
                    run,
                    dirty,
                },
            );
        }
        Ok(Stored::Yes)
    }
}
