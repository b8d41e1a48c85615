//! The mapping table: which origin block each cache slot holds, which of
//! its sectors hold data and which of those are dirty. Recovery and the
//! running engine change it through the same `apply`, so what the journal
//! replays is exactly what the engine did.

use std::collections::BinaryHeap;

use super::entries::Entries;
use super::index::BlockIndex;
use super::sectors::{PartialMaps, SectorRun, SectorSet};
use crate::engine::format::{
    entry_decode, entry_encode, whole_sets, CheckpointData, PartialEntry, Record, ENTRY_DIRTY,
    ENTRY_FREE,
};
use crate::engine::observe::heat::RegionCounts;
use crate::engine::origin::address::KeySpace;

/// In memory a cached block costs its entry (4 bytes, or 8 for volumes of
/// 2^31 blocks or more in all: entries.rs), an index bucket (4 bytes at most 4/5 full) and one
/// bit saying whether it is whole; dirty blocks are found by scanning
/// entries, so being dirty costs nothing extra. Only slots that are not
/// whole (some sectors without data, or some but not all dirty) keep sector
/// maps (sectors.rs).
pub struct Table {
    /// Per slot: `format::entry_encode` or ENTRY_FREE. The dirty bit means
    /// "some sector is dirty".
    pub entries: Entries,
    /// Origin block -> slot.
    index: BlockIndex,
    /// Bit per slot: the slot has sector maps in `partial`.
    partial_bits: Vec<u64>,
    partial: PartialMaps,
    dirty_count: u64,
    /// The blocks a key may name: (volume, block) pairs of the cache's
    /// volumes (origin/address.rs).
    keys: KeySpace,
    sectors: usize,
    /// Cached and dirty blocks per region of the volume (the heat map).
    pub regions: RegionCounts,
    /// See `set_dirty_slots`.
    dirty_slots: u32,
}

/// What `apply` did to slots other than the record's own.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// A slot that held the same block before a Map and is now free.
    pub released: Option<u32>,
}

/// A cached block as one request sees it (`Table::cached`): its slot, and
/// what the slot holds of the request's sectors in that block. The one
/// name for "what the cache has of this block" from the table up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cached {
    pub slot: u32,
    /// Some sector of the block is dirty.
    pub dirty: bool,
    /// The slot holds the whole block, all clean or all dirty (no sector
    /// maps).
    pub whole: bool,
    /// Every requested sector holds data: a read of them is a hit.
    pub valid: bool,
    /// No requested sector holds clean data: a write may go in place.
    pub writable: bool,
}

impl Cached {
    /// A slot with sector maps `valid` and `dirty`, seen by a request for
    /// `run`.
    pub fn of(slot: u32, run: SectorRun, valid: &SectorSet, dirty: &SectorSet) -> Cached {
        let whole = valid.is_full() && (dirty.is_empty() || dirty.is_full());
        let clean = valid.minus(dirty);
        Cached {
            slot,
            dirty: !dirty.is_empty(),
            whole,
            valid: valid.covers(run),
            writable: !clean.meets(run),
        }
    }
}

impl Table {
    pub fn new(slot_count: u64, keys: KeySpace, sectors: usize) -> Table {
        Table {
            entries: Entries::for_keys(slot_count, &keys),
            index: BlockIndex::new(slot_count),
            partial_bits: vec![0; (slot_count as usize).div_ceil(64)],
            partial: PartialMaps::new(sectors),
            dirty_count: 0,
            regions: RegionCounts::new(&keys),
            keys,
            sectors,
            dirty_slots: slot_count as u32,
        }
    }

    /// The keys it may hold (shared with every clone: the origins' too).
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// An empty table of the same shape.
    pub fn emptied(&self) -> Table {
        let mut t = Table::new(self.slot_count(), self.keys.clone(), self.sectors);
        t.dirty_slots = self.dirty_slots;
        t
    }

    /// The cache device grew to `slot_count` slots (`Engine::grow_cache`):
    /// the new ones are free. On one cache device every slot may hold
    /// dirty data, the new ones too.
    pub fn grow_slots(&mut self, slot_count: u64) {
        let was = self.slot_count();
        self.entries.grow(slot_count);
        self.partial_bits
            .resize((slot_count as usize).div_ceil(64), 0);
        self.index.grow(slot_count, &self.entries);
        if self.dirty_slots as u64 == was {
            self.dirty_slots = slot_count as u32;
        }
    }

    /// Slots below `n` may hold dirty data (on a cache set, the mirrored
    /// ones); a dirty record for any other slot is invalid.
    pub fn set_dirty_slots(&mut self, n: u32) {
        self.dirty_slots = n.min(self.slot_count() as u32);
    }

    pub fn dirty_slots(&self) -> u32 {
        self.dirty_slots
    }

    /// Sectors per block.
    pub fn sectors(&self) -> usize {
        self.sectors
    }

    /// Heap bytes of the entries, the block index and the sector maps.
    pub fn heap_bytes(&self) -> u64 {
        self.entries.heap_bytes()
            + self.index.heap_bytes()
            + self.regions.heap_bytes()
            + (self.partial_bits.capacity() * 8) as u64
            + self.partial.heap_bytes()
    }

    /// Volume `v` grew to `blocks` blocks (online, under the metadata
    /// lock): its keys reach further for every holder of the key space,
    /// the entries widen if they must, and the volumes' heat-map regions
    /// are cut again and recounted from the entries.
    pub fn grow_volume(&mut self, v: usize, blocks: u64) {
        self.keys.grow(v, blocks);
        self.keys_changed();
    }

    /// One more volume, of `blocks` blocks, in the key space (online,
    /// under the metadata lock: `Engine::add_volume`); returns its index.
    /// Narrow entries are placed anew (entries.rs: their dense indexes)
    /// or widen if the volumes pass 2^31 blocks, and the heat-map regions
    /// are recounted.
    pub fn add_volume(&mut self, blocks: u64) -> usize {
        let v = self.keys.add(blocks);
        self.keys_changed();
        v
    }

    /// The key space grew: entries and regions follow.
    fn keys_changed(&mut self) {
        self.entries.fit_keys(&self.keys);
        let mut regions = RegionCounts::new(&self.keys);
        for e in self.entries.iter() {
            if let Some((block, dirty)) = entry_decode(e) {
                regions.cached(block, true);
                if dirty {
                    regions.dirty(block, true);
                }
            }
        }
        self.regions = regions;
    }

    /// Builds a table from a checkpoint, checking its invariants.
    pub fn from_checkpoint(
        data: CheckpointData,
        keys: KeySpace,
        sectors: usize,
    ) -> Result<Table, String> {
        let mut t = Table::new(data.entries.len() as u64, keys, sectors);
        for (slot, &e) in data.entries.iter().enumerate() {
            if e == ENTRY_FREE {
                continue;
            }
            let (block, dirty) =
                entry_decode(e).ok_or_else(|| format!("slot {slot}: invalid entry {e:#x}"))?;
            if !t.keys.contains(block) {
                return Err(format!("slot {slot}: {}", t.keys.describe_outside(block)));
            }
            if let Some(other) = t.index.get(&t.entries, block) {
                return Err(format!(
                    "slots {other} and {slot} both hold origin block {block}"
                ));
            }
            t.entries.set(slot, e);
            t.index.insert(&t.entries, block, slot as u32);
            t.regions.cached(block, true);
            if dirty {
                t.dirty_count += 1;
                t.regions.dirty(block, true);
            }
        }
        for &(slot, valid, dirty) in &data.partial {
            let e = data
                .entries
                .get(slot as usize)
                .copied()
                .unwrap_or(ENTRY_FREE);
            let Some((_, entry_dirty)) = entry_decode(e) else {
                return Err(format!("slot {slot}: sector maps for a free slot"));
            };
            if valid.sectors() != sectors || dirty.sectors() != sectors {
                return Err(format!("slot {slot}: sector maps of the wrong size"));
            }
            if valid.is_empty() || !dirty.is_subset(&valid) {
                return Err(format!(
                    "slot {slot}: sector maps with no valid sector or a dirty sector that is not valid"
                ));
            }
            if dirty.is_empty() == entry_dirty {
                return Err(format!(
                    "slot {slot}: the entry's dirty flag disagrees with its sector maps"
                ));
            }
            t.set_sets(slot, &valid, &dirty);
        }
        Ok(t)
    }

    /// The checkpoint of the table as it is now.
    /// The table once volumes `gone` (ascending) are taken out (recovery.rs
    /// `finish_removals`), over `keys`, the key space without them: their
    /// clean blocks are dropped, a dirty one is refused, and the keys of
    /// the volumes after each move down one place (`KeySpace::key_without`).
    pub fn without_volumes(&self, gone: &[usize], keys: KeySpace) -> Result<Table, String> {
        let mut data = self.snapshot();
        for (slot, e) in data.entries.iter_mut().enumerate() {
            let Some((mut key, dirty)) = entry_decode(*e) else {
                continue;
            };
            for &v in gone.iter().rev() {
                match self.keys.key_without(v, key) {
                    Some(k) => key = k,
                    None if dirty => {
                        return Err(format!(
                            "slot {slot} holds a dirty block of volume {v}, which was removed"
                        ))
                    }
                    None => {
                        *e = ENTRY_FREE;
                        break;
                    }
                }
            }
            if *e != ENTRY_FREE {
                *e = entry_encode(key, dirty);
            }
        }
        let entries = &data.entries;
        data.partial.retain(|p| entries[p.0 as usize] != ENTRY_FREE);
        let mut t = Table::from_checkpoint(data, keys, self.sectors)?;
        t.dirty_slots = self.dirty_slots;
        Ok(t)
    }

    pub fn snapshot(&self) -> CheckpointData {
        let mut partial: Vec<PartialEntry> = self.partial.iter().collect();
        partial.sort_unstable_by_key(|p| p.0);
        CheckpointData {
            entries: self.entries.to_vec(),
            partial,
            open_group: 0,
        }
    }

    pub fn slot_count(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn lookup(&self, block: u64) -> Option<(u32, bool)> {
        self.index
            .get(&self.entries, block)
            .map(|s| (s, self.entries.get(s as usize) & ENTRY_DIRTY != 0))
    }

    /// What the cache has of `block`'s sectors `run`, if it is cached.
    pub fn cached(&self, block: u64, run: SectorRun) -> Option<Cached> {
        let (slot, dirty) = self.lookup(block)?;
        if !self.is_partial(slot) {
            return Some(Cached {
                slot,
                dirty,
                whole: true,
                valid: true,
                writable: dirty,
            });
        }
        let (valid, dirty) = self.sector_sets(slot);
        let mut c = Cached::of(slot, run, &valid, &dirty);
        // Empty sectors of a slot that may not hold dirty data are not
        // written in place.
        c.writable &= slot < self.dirty_slots;
        Some(c)
    }

    pub fn is_dirty(&self, block: u64) -> bool {
        matches!(self.lookup(block), Some((_, true)))
    }

    pub fn slot_block(&self, slot: u32) -> Option<(u64, bool)> {
        entry_decode(self.entries.get(slot as usize))
    }

    fn is_partial(&self, slot: u32) -> bool {
        self.partial_bits[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    /// The (valid, dirty) sectors of a slot (both empty for a free slot).
    pub fn sector_sets(&self, slot: u32) -> (SectorSet, SectorSet) {
        if self.is_partial(slot) {
            return self.partial.get(slot).expect("partial bit without maps");
        }
        whole_sets(self.entries.get(slot as usize), self.sectors)
    }

    /// Slots with sector maps (not whole).
    pub fn partial_count(&self) -> usize {
        self.partial.len()
    }

    /// Stores the sector state of a mapped slot: as sector maps unless it is
    /// whole; keeps the entry's dirty flag and the dirty count in step.
    fn set_sets(&mut self, slot: u32, valid: &SectorSet, dirty: &SectorSet) {
        let e = self.entries.get(slot as usize);
        // Kept in release builds: records are validated before they are
        // applied, so this only fails on an engine bug.
        assert!(e != ENTRY_FREE && !valid.is_empty() && dirty.is_subset(valid));
        let whole = valid.is_full() && (dirty.is_empty() || dirty.is_full());
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        if whole {
            self.partial_bits[word] &= !bit;
            self.partial.remove(slot);
        } else {
            self.partial_bits[word] |= bit;
            self.partial.set(slot, valid, dirty);
        }
        let was_dirty = e & ENTRY_DIRTY != 0;
        let now_dirty = !dirty.is_empty();
        if was_dirty != now_dirty {
            self.entries.set(
                slot as usize,
                if now_dirty {
                    e | ENTRY_DIRTY
                } else {
                    e & !ENTRY_DIRTY
                },
            );
            if now_dirty {
                self.dirty_count += 1;
            } else {
                self.dirty_count -= 1;
            }
            let block = entry_decode(e).expect("a mapped slot").0;
            self.regions.dirty(block, now_dirty);
        }
    }

    pub fn used(&self) -> u64 {
        self.index.len()
    }

    pub fn dirty_count(&self) -> u64 {
        self.dirty_count
    }

    /// Up to `want[v]` dirty blocks of each volume `v`, the ones from
    /// `cursors[v]` on first and then, wrapping around, the volume's lowest
    /// ones; all of them ascending. One pass over the entries: a batch of
    /// background writeback takes its share of every volume's dirty blocks
    /// at once, so the volumes drain side by side.
    pub fn dirty_from_each(&self, cursors: &[u64], want: &[usize]) -> Vec<u64> {
        if self.dirty_count == 0 {
            return Vec::new();
        }
        // Each volume's `want` smallest keys, where its blocks below its
        // cursor sort after every block at or above it.
        let mut heaps: Vec<BinaryHeap<(bool, u64)>> = want
            .iter()
            .map(|&w| BinaryHeap::with_capacity(w + 1))
            .collect();
        for e in self.entries.iter() {
            if e & ENTRY_DIRTY == 0 {
                continue;
            }
            let Some((b, _)) = entry_decode(e) else {
                continue;
            };
            let v = self.keys.split(b).0;
            let (Some(heap), Some(&w), Some(&c)) = (heaps.get_mut(v), want.get(v), cursors.get(v))
            else {
                continue;
            };
            let key = (b < c, b);
            if heap.len() < w {
                heap.push(key);
            } else if heap.peek().is_some_and(|&top| key < top) {
                heap.pop();
                heap.push(key);
            }
        }
        let mut v: Vec<u64> = heaps
            .into_iter()
            .flat_map(|h| h.into_vec().into_iter().map(|(_, b)| b))
            .collect();
        v.sort_unstable();
        v
    }

    /// Every dirty block, ascending.
    pub fn all_dirty(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .entries
            .iter()
            .filter(|&e| e & ENTRY_DIRTY != 0)
            .filter_map(|e| entry_decode(e).map(|(b, _)| b))
            .collect();
        v.sort_unstable();
        v
    }

    /// Checks that `r` is valid in the current state (recovery rejects a
    /// journal whose records do not fit the table they follow).
    pub fn validate(&self, r: &Record) -> Result<(), String> {
        if r.is_group() {
            // Flush groups are checked by table/groups.rs.
            return Ok(());
        }
        let slot = r.slot();
        if slot as u64 >= self.slot_count() {
            return Err(format!("record names slot {slot} of {}", self.slot_count()));
        }
        let run_fits = |run: SectorRun| {
            if run.count == 0 || run.end() > self.sectors {
                Err(format!(
                    "record {r:?} names sectors beyond the block's {}",
                    self.sectors
                ))
            } else {
                Ok(())
            }
        };
        let makes_dirty = matches!(
            *r,
            Record::Map { dirty: true, .. }
                | Record::MapRun { dirty: true, .. }
                | Record::AddRun { dirty: true, .. }
        );
        if makes_dirty && slot >= self.dirty_slots {
            return Err(format!(
                "record {r:?} puts dirty data in slot {slot}, which has one copy (dirty data \
                 goes to slots below {})",
                self.dirty_slots
            ));
        }
        match *r {
            Record::Map { block, .. } | Record::MapRun { block, .. }
                if !self.keys.contains(block) =>
            {
                Err(format!("record maps {}", self.keys.describe_outside(block)))
            }
            Record::Map { .. } => Ok(()),
            Record::MapRun { run, .. } => run_fits(run),
            Record::AddRun { block, run, .. } => {
                run_fits(run)?;
                match self.slot_block(slot) {
                    Some((b, _)) if b == block => Ok(()),
                    _ => Err(format!(
                        "record {r:?} names a slot that does not hold its block"
                    )),
                }
            }
            Record::Close { .. } | Record::Done { .. } => Ok(()),
            Record::Clean { .. } | Record::Unmap { .. } => {
                if self.entries.get(slot as usize) == ENTRY_FREE {
                    Err(format!("record {r:?} names a free slot"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Applies a record. The record must be valid (see `validate`).
    pub fn apply(&mut self, r: &Record) -> Applied {
        let mut applied = Applied::default();
        match *r {
            Record::Map { slot, block, dirty } => {
                applied.released = self.map(slot, block, dirty);
            }
            Record::MapRun {
                slot,
                block,
                run,
                dirty,
            } => {
                applied.released = self.map(slot, block, false);
                let valid = SectorSet::of_run(self.sectors, run);
                let d = if dirty {
                    valid
                } else {
                    SectorSet::empty(self.sectors)
                };
                self.set_sets(slot, &valid, &d);
            }
            Record::AddRun {
                slot, run, dirty, ..
            } => {
                let (mut valid, mut d) = self.sector_sets(slot);
                valid.insert_run(run);
                if dirty {
                    d.insert_run(run);
                }
                self.set_sets(slot, &valid, &d);
            }
            Record::Clean { slot } => {
                if self.entries.get(slot as usize) != ENTRY_FREE {
                    let (valid, _) = self.sector_sets(slot);
                    self.set_sets(slot, &valid, &SectorSet::empty(self.sectors));
                }
            }
            Record::Unmap { slot } => self.clear_slot(slot),
            Record::Close { .. } | Record::Done { .. } => {}
        }
        applied
    }

    /// Puts `block` in `slot` whole (clean or dirty), freeing any other slot
    /// that held it; returns that slot.
    fn map(&mut self, slot: u32, block: u64, dirty: bool) -> Option<u32> {
        self.clear_slot(slot);
        let released = self.index.get(&self.entries, block);
        if let Some(old) = released {
            self.clear_slot(old);
        }
        self.entries.set(slot as usize, entry_encode(block, dirty));
        self.index.insert(&self.entries, block, slot);
        self.regions.cached(block, true);
        if dirty {
            self.dirty_count += 1;
            self.regions.dirty(block, true);
        }
        released
    }

    fn clear_slot(&mut self, slot: u32) {
        if let Some((block, dirty)) = self.slot_block(slot) {
            if dirty {
                self.dirty_count -= 1;
                self.regions.dirty(block, false);
            }
            if self.index.get(&self.entries, block) == Some(slot) {
                self.index.remove(&self.entries, block);
            }
            self.regions.cached(block, false);
        }
        self.entries.set(slot as usize, ENTRY_FREE);
        if self.is_partial(slot) {
            self.partial_bits[slot as usize / 64] &= !(1 << (slot % 64));
            self.partial.remove(slot);
        }
    }

    /// Drops every clean sector: frees the slots holding no dirty sector
    /// (returns how many) and keeps only the dirty sectors of the others.
    pub fn drop_clean(&mut self) -> u64 {
        let mut n = 0;
        for slot in 0..self.entries.len() as u32 {
            match self.slot_block(slot) {
                Some((_, false)) => {
                    self.clear_slot(slot);
                    n += 1;
                }
                Some((_, true)) => {
                    let (_, dirty) = self.sector_sets(slot);
                    self.set_sets(slot, &dirty, &dirty);
                }
                None => {}
            }
        }
        n
    }

    /// The free slots, ascending.
    pub fn free_slots(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.entries.len() as u32).filter(|&s| self.entries.get(s as usize) == ENTRY_FREE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_supersedes() {
        let mut t = Table::new(4, KeySpace::one(100), 8);
        t.apply(&Record::Map {
            slot: 0,
            block: 7,
            dirty: false,
        });
        let a = t.apply(&Record::Map {
            slot: 1,
            block: 7,
            dirty: true,
        });
        assert_eq!(a.released, Some(0));
        assert_eq!(t.lookup(7), Some((1, true)));
        assert_eq!(t.slot_block(0), None);
        t.apply(&Record::Clean { slot: 1 });
        assert_eq!(t.lookup(7), Some((1, false)));
        assert_eq!(t.dirty_count(), 0);
        t.apply(&Record::Unmap { slot: 1 });
        assert_eq!(t.lookup(7), None);
        assert!(t.validate(&Record::Unmap { slot: 1 }).is_err());
        assert!(t
            .validate(&Record::Map {
                slot: 9,
                block: 1,
                dirty: false
            })
            .is_err());
        assert!(t
            .validate(&Record::Map {
                slot: 1,
                block: 100,
                dirty: false
            })
            .is_err());
    }

    #[test]
    fn entries_checked() {
        let e = vec![entry_encode(3, true), entry_encode(3, false)];
        let cp = |entries: Vec<u64>| CheckpointData {
            entries,
            partial: Vec::new(),
            open_group: 0,
        };
        assert!(Table::from_checkpoint(cp(e), KeySpace::one(10), 8)
            .err()
            .unwrap()
            .contains("both hold"));
        assert!(
            Table::from_checkpoint(cp(vec![entry_encode(10, false)]), KeySpace::one(10), 8)
                .is_err()
        );
        let t = Table::from_checkpoint(cp(vec![entry_encode(3, true), 0]), KeySpace::one(10), 8)
            .unwrap();
        assert_eq!(t.dirty_count(), 1);
        assert_eq!(t.free_slots().collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn dirty_from_wraps_at_the_cursor() {
        let mut t = Table::new(8, KeySpace::one(100), 8);
        for (slot, block) in [(0u32, 50u64), (1, 10), (2, 70), (3, 30), (4, 90)] {
            t.apply(&Record::Map {
                slot,
                block,
                dirty: block != 70,
            });
        }
        assert_eq!(t.dirty_count(), 4);
        let from = |c: u64, w: usize| t.dirty_from_each(&[c], &[w]);
        assert_eq!(from(0, 10), vec![10, 30, 50, 90]);
        assert_eq!(from(40, 2), vec![50, 90]);
        assert_eq!(from(40, 3), vec![10, 50, 90]);
        assert_eq!(from(95, 10), vec![10, 30, 50, 90]);
        assert_eq!(from(40, 0), Vec::<u64>::new());
        assert_eq!(t.all_dirty(), vec![10, 30, 50, 90]);
        assert!(t.is_dirty(30) && !t.is_dirty(70) && !t.is_dirty(71));
    }

    #[test]
    fn dirty_from_each_takes_a_share_of_every_volume() {
        let keys = KeySpace::new(4096, vec![100, 100]);
        let v1 = keys.base_key(1);
        let mut t = Table::new(8, keys, 8);
        for (slot, block) in [(0u32, 10u64), (1, 20), (2, 30), (3, v1 + 5), (4, v1 + 6)] {
            t.apply(&Record::Map {
                slot,
                block,
                dirty: true,
            });
        }
        // Each volume from its own cursor, wrapping inside itself.
        assert_eq!(t.dirty_from_each(&[15, v1], &[2, 1]), vec![20, 30, v1 + 5]);
        assert_eq!(
            t.dirty_from_each(&[25, v1 + 6], &[2, 2]),
            vec![10, 30, v1 + 5, v1 + 6]
        );
        // A volume that wants none gives none; a missing one is skipped.
        assert_eq!(t.dirty_from_each(&[0, 0], &[0, 8]), vec![v1 + 5, v1 + 6]);
        assert_eq!(t.dirty_from_each(&[0], &[1]), vec![10]);
    }

    fn run(first: usize, count: usize) -> SectorRun {
        SectorRun::new(first, count)
    }

    #[test]
    fn what_a_request_sees_of_a_partial_slot() {
        let valid = SectorSet::of_run(8, SectorRun::new(0, 4));
        let dirty = SectorSet::of_run(8, SectorRun::new(2, 2));
        let h = Cached::of(1, SectorRun::new(2, 2), &valid, &dirty);
        assert!(h.valid && h.writable && h.dirty && !h.whole);
        // Sectors 4.. hold nothing: writable, not valid.
        let h = Cached::of(1, SectorRun::new(3, 3), &valid, &dirty);
        assert!(!h.valid && h.writable);
        // Sector 1 is clean.
        let h = Cached::of(1, SectorRun::new(1, 2), &valid, &dirty);
        assert!(h.valid && !h.writable);
    }

    #[test]
    fn runs_build_up_and_collapse_to_whole() {
        let mut t = Table::new(4, KeySpace::one(100), 8);
        t.apply(&Record::MapRun {
            slot: 2,
            block: 9,
            run: run(3, 1),
            dirty: true,
        });
        assert_eq!(
            t.cached(9, run(3, 1)),
            Some(Cached {
                slot: 2,
                dirty: true,
                whole: false,
                valid: true,
                writable: true,
            })
        );
        assert_eq!(t.dirty_count(), 1);
        // Clean fill of the rest: sector 3 stays dirty.
        let add = Record::AddRun {
            slot: 2,
            block: 9,
            run: run(0, 8),
            dirty: false,
        };
        assert!(t.validate(&add).is_ok());
        t.apply(&add);
        let (v, d) = t.sector_sets(2);
        assert!(v.is_full());
        assert_eq!(d, SectorSet::of_run(8, run(3, 1)));
        assert_eq!(t.partial_count(), 1);
        // Writeback: whole and clean, the maps are gone.
        t.apply(&Record::Clean { slot: 2 });
        assert_eq!(t.partial_count(), 0);
        assert_eq!(
            t.cached(9, run(0, 8)).map(|l| (l.dirty, l.whole)),
            Some((false, true))
        );
        assert_eq!(t.dirty_count(), 0);
        // A dirty write of everything: whole and dirty.
        t.apply(&Record::AddRun {
            slot: 2,
            block: 9,
            run: run(0, 8),
            dirty: true,
        });
        assert_eq!(
            t.cached(9, run(0, 8)).map(|l| (l.dirty, l.whole)),
            Some((true, true))
        );
        assert_eq!(t.partial_count(), 0);
        // A run map supersedes the whole slot.
        let a = t.apply(&Record::MapRun {
            slot: 0,
            block: 9,
            run: run(0, 2),
            dirty: false,
        });
        assert_eq!(a.released, Some(2));
        assert_eq!(t.dirty_count(), 0);
        assert_eq!(t.sector_sets(2), (SectorSet::empty(8), SectorSet::empty(8)));
        let snap = t.snapshot();
        assert_eq!(snap.partial.len(), 1);
        let back = Table::from_checkpoint(snap.clone(), KeySpace::one(100), 8).unwrap();
        assert_eq!(back.snapshot(), snap);
        t.apply(&Record::Unmap { slot: 0 });
        assert_eq!(t.partial_count(), 0);
    }

    /// The heat map's counts agree with the table.
    fn assert_regions(t: &Table) {
        let map = t.regions.volume(0).unwrap();
        let cached: u64 = map.cached.iter().map(|&c| c as u64).sum();
        let dirty: u64 = map.dirty.iter().map(|&c| c as u64).sum();
        assert_eq!((cached, dirty), (t.used(), t.dirty_count()));
        assert_eq!(t.regions.totals(), vec![(cached, dirty)]);
        assert_eq!(t.regions.held(0), cached);
    }

    #[test]
    fn region_counts_follow_random_records() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut t = Table::new(64, KeySpace::one(5000), 8);
        for _ in 0..20_000 {
            let slot = rng.gen_range(0..64u32);
            let block = rng.gen_range(0..5000u64);
            let first = rng.gen_range(0..8usize);
            let run = SectorRun::new(first, rng.gen_range(1..=8 - first));
            let dirty = rng.gen_bool(0.5);
            let r = match rng.gen_range(0..5) {
                0 => Record::Map { slot, block, dirty },
                1 => Record::MapRun {
                    slot,
                    block,
                    run,
                    dirty,
                },
                2 => match t.slot_block(slot) {
                    Some((block, _)) => Record::AddRun {
                        slot,
                        block,
                        run,
                        dirty,
                    },
                    None => continue,
                },
                3 => Record::Clean { slot },
                _ => Record::Unmap { slot },
            };
            if t.validate(&r).is_ok() {
                t.apply(&r);
            }
        }
        assert_regions(&t);
        let back = Table::from_checkpoint(t.snapshot(), KeySpace::one(5000), 8).unwrap();
        assert_regions(&back);
        assert_eq!(back.regions.volume(0), t.regions.volume(0));
    }

    #[test]
    fn run_records_are_validated() {
        let mut t = Table::new(4, KeySpace::one(100), 8);
        t.apply(&Record::Map {
            slot: 1,
            block: 5,
            dirty: false,
        });
        let add = |slot, block, first, count| Record::AddRun {
            slot,
            block,
            run: run(first, count),
            dirty: true,
        };
        assert!(t.validate(&add(1, 5, 7, 1)).is_ok());
        assert!(t.validate(&add(1, 5, 7, 2)).is_err(), "past the block");
        assert!(t.validate(&add(1, 6, 0, 1)).is_err(), "another block");
        assert!(t.validate(&add(0, 5, 0, 1)).is_err(), "a free slot");
        assert!(t
            .validate(&Record::MapRun {
                slot: 0,
                block: 100,
                run: run(0, 1),
                dirty: false
            })
            .is_err());
    }

    #[test]
    fn checkpoint_maps_are_checked() {
        let e = vec![entry_encode(3, true), entry_encode(4, false), 0];
        let v = SectorSet::of_run(8, run(0, 4));
        let d = SectorSet::of_run(8, run(1, 1));
        let ok = CheckpointData {
            entries: e.clone(),
            partial: vec![(0, v, d), (1, v, SectorSet::empty(8))],
            open_group: 0,
        };
        assert!(Table::from_checkpoint(ok, KeySpace::one(10), 8).is_ok());
        for (bad, why) in [
            (vec![(2, v, d)], "free slot"),
            (vec![(1, v, d)], "dirty flag"),
            (vec![(0, d, v)], "not valid"),
            (
                vec![(0, SectorSet::empty(8), SectorSet::empty(8))],
                "no valid",
            ),
        ] {
            let cp = CheckpointData {
                entries: e.clone(),
                partial: bad,
                open_group: 0,
            };
            let err = Table::from_checkpoint(cp, KeySpace::one(10), 8)
                .err()
                .unwrap();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn drop_clean_keeps_only_dirty_sectors() {
        let mut t = Table::new(4, KeySpace::one(100), 8);
        t.apply(&Record::Map {
            slot: 0,
            block: 1,
            dirty: false,
        });
        t.apply(&Record::Map {
            slot: 1,
            block: 2,
            dirty: false,
        });
        t.apply(&Record::AddRun {
            slot: 1,
            block: 2,
            run: run(4, 2),
            dirty: true,
        });
        assert_eq!(t.drop_clean(), 1);
        assert_eq!(t.lookup(1), None);
        assert_eq!(
            t.sector_sets(1),
            (
                SectorSet::of_run(8, run(4, 2)),
                SectorSet::of_run(8, run(4, 2))
            )
        );
    }
}
