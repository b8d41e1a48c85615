//! Flush groups, for writeback in flush order (`--writeback-order flush`,
//! docs/engine.md, "Ordered writeback").
//!
//! The writes between two client flushes form one group; group k+1
//! reaches the origin only after group k is written and the origin
//! flushed. So each dirty slot carries the group its data belongs to, and
//! a block dirty in a closed group that a later group overwrites keeps its
//! older contents, in the slot that held them, as a *shadow*: a slot
//! outside the mapping (reads never see it) that writeback copies to the
//! origin with the rest of its group and frees after. The write itself
//! goes to a new slot (the engine never overwrites such a slot in place:
//! `Meta::may_overwrite`).
//!
//! Kept under the metadata lock and changed only by records (`note`),
//! the same at run time (`Cache::append`) and in recovery's replay: the
//! table's records say which slot holds what, two more say when a group
//! closes (`Close`, at a client flush) and when one is on the origin
//! (`Done`, after the origin flush that ends its writeback, which frees its
//! shadows). A checkpoint holds no groups: it is taken while no closed group
//! is pending (journal/commit.rs), so every dirty slot in it is in the open
//! group, whose number the superblock keeps.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::map::Table;
use super::sectors::SectorSet;
use crate::engine::format::Record;

/// An older version of a block, kept for its group's writeback.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shadow {
    pub slot: u32,
    /// The sectors that are dirty in it (written back; the others are not).
    pub dirty: SectorSet,
    /// On the origin (not yet flushed there): it stays until its group's
    /// `Done` frees it.
    pub written: bool,
}

/// The groups of the dirty data.
pub(crate) struct Groups {
    /// The group taking writes now.
    open: u64,
    /// A block became dirty in the open group (an empty group is not
    /// closed).
    open_used: bool,
    /// Every group below this one is on the origin and flushed.
    done: u64,
    /// Per slot, the group of its dirty data (valid while it is dirty).
    slot_group: Vec<u64>,
    /// Per group, the mapped blocks whose dirty data belongs to it.
    blocks: BTreeMap<u64, BTreeSet<u64>>,
    /// Per (group, block), the older version kept for that group.
    shadows: BTreeMap<(u64, u64), Shadow>,
    /// The slots of `shadows`, to answer `is_shadow` at once.
    shadow_at: HashSet<u32>,
    /// Most shadows held at once since open.
    shadow_peak: u64,
}

/// What `Groups` counts, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupCounts {
    /// The group taking writes (groups are numbered from 0 at open).
    pub open: u64,
    /// Every group below this one is on the origin and flushed.
    pub done: u64,
    /// Groups closed by a flush whose data is not all on the origin yet.
    pub closed_pending: u64,
    /// Older versions of blocks kept for their groups: cache blocks they
    /// take (the cost of the order in cache space).
    pub shadows: u64,
    /// Most older versions kept at once since open.
    pub shadow_peak: u64,
}

impl Groups {
    /// The groups of a table loaded from a checkpoint: every dirty slot
    /// is in the open group `open`, and every group below it is done.
    /// The cache device grew to `slot_count` slots (none of the new ones
    /// dirty).
    pub fn grow_slots(&mut self, slot_count: u64) {
        self.slot_group.resize(slot_count as usize, self.open);
    }

    pub fn new(open: u64, table: &Table) -> Groups {
        let slots = table.slot_count();
        let mut g = Groups {
            open,
            open_used: false,
            done: open,
            slot_group: vec![open; slots as usize],
            blocks: BTreeMap::new(),
            shadows: BTreeMap::new(),
            shadow_at: HashSet::new(),
            shadow_peak: 0,
        };
        for slot in 0..slots as u32 {
            if let Some((block, true)) = table.slot_block(slot) {
                g.blocks.entry(open).or_default().insert(block);
                g.open_used = true;
            }
        }
        g
    }

    /// What `r` (valid, about to be applied to `table`) changes in the
    /// groups. Returns the slot it frees that stays as a shadow instead, if
    /// any, and the slots a `Done` frees.
    pub fn note(&mut self, table: &Table, r: &Record) -> (Option<u32>, Vec<u32>) {
        let dirty_block = |slot: u32| match table.slot_block(slot) {
            Some((b, true)) => Some(b),
            _ => None,
        };
        let kept = match *r {
            Record::Map { slot, block, dirty }
            | Record::MapRun {
                slot, block, dirty, ..
            } => {
                let mut kept = None;
                if let Some((old, true)) = table.lookup(block).filter(|&(old, _)| old != slot) {
                    let (_, d) = table.sector_sets(old);
                    if self.removed(old, block, d) {
                        kept = Some(old);
                    }
                }
                let was_dirty = dirty_block(slot) == Some(block);
                if dirty {
                    self.dirtied(slot, block, was_dirty);
                } else if was_dirty {
                    self.cleaned(slot, block);
                }
                kept
            }
            Record::AddRun {
                slot,
                block,
                dirty: true,
                ..
            } => {
                self.dirtied(slot, block, dirty_block(slot).is_some());
                None
            }
            Record::AddRun { .. } => None,
            Record::Clean { slot } => {
                if let Some(b) = dirty_block(slot) {
                    self.cleaned(slot, b);
                }
                None
            }
            Record::Unmap { slot } => dirty_block(slot).and_then(|b| {
                let (_, d) = table.sector_sets(slot);
                self.removed(slot, b, d).then_some(slot)
            }),
            Record::Close { group } => {
                self.open = self.open.max(group);
                self.open_used = false;
                None
            }
            Record::Done { group } => return (None, self.finish(group)),
        };
        (kept, Vec::new())
    }

    /// The group a client flush would open now, if the open one took a
    /// write (an empty group is not closed).
    pub fn next_close(&self) -> Option<u64> {
        self.open_used.then_some(self.open + 1)
    }

    pub fn open(&self) -> u64 {
        self.open
    }

    /// The group of a dirty slot's data.
    pub fn group_of(&self, slot: u32) -> u64 {
        self.slot_group[slot as usize]
    }

    /// `slot` (holding `block`) gets dirty data: it joins the open group.
    /// A slot already dirty stays in its group: the engine writes a slot
    /// of a closed group in place only when the write looked it up before
    /// a flush closed the group (`Meta::may_overwrite`), and a write
    /// concurrent with a flush may be in the group before it.
    fn dirtied(&mut self, slot: u32, block: u64, was_dirty: bool) {
        if was_dirty {
            return;
        }
        self.open_used = true;
        self.slot_group[slot as usize] = self.open;
        self.blocks.entry(self.open).or_default().insert(block);
    }

    /// Dirty `slot` (holding `block`) was written back.
    fn cleaned(&mut self, slot: u32, block: u64) {
        self.forget(self.slot_group[slot as usize], block);
    }

    /// Dirty `slot` (holding `block`, dirty sectors `dirty`) leaves the
    /// mapping (superseded or unmapped). Returns true if it stays as a
    /// shadow: its group is closed and not yet on the origin.
    fn removed(&mut self, slot: u32, block: u64, dirty: SectorSet) -> bool {
        let g = self.slot_group[slot as usize];
        self.forget(g, block);
        if g >= self.open {
            return false;
        }
        if self.shadows.contains_key(&(g, block)) {
            // Not made by the engine (a group's one version of a block);
            // a damaged journal could say so: the first stays.
            debug_assert!(false, "two shadows of block {block} in group {g}");
            return false;
        }
        self.shadows.insert(
            (g, block),
            Shadow {
                slot,
                dirty,
                written: false,
            },
        );
        self.shadow_at.insert(slot);
        self.shadow_peak = self.shadow_peak.max(self.shadows.len() as u64);
        true
    }

    fn forget(&mut self, g: u64, block: u64) {
        if let Some(set) = self.blocks.get_mut(&g) {
            set.remove(&block);
            if set.is_empty() {
                self.blocks.remove(&g);
            }
        }
    }

    /// The oldest group with data not yet on the origin (shadows written
    /// but not yet `Done` are on it).
    pub fn oldest_pending(&self) -> Option<u64> {
        self.oldest(false)
    }

    /// The oldest closed group not yet done (written back and flushed).
    pub fn closed_pending(&self) -> Option<u64> {
        self.oldest(true).filter(|&g| g < self.open)
    }

    /// The oldest group of a mapped dirty block or of a shadow (of one not
    /// yet written, unless `written_too`).
    fn oldest(&self, written_too: bool) -> Option<u64> {
        let block = self.blocks.keys().next().copied();
        let shadow = self
            .shadows
            .iter()
            .find(|(_, s)| written_too || !s.written)
            .map(|(&(g, _), _)| g);
        block.into_iter().chain(shadow).min()
    }

    /// Up to `max` mapped blocks of group `g`, ascending from `from`, then
    /// from the start (a sweep: a region written back after its writes
    /// gathered goes in long runs).
    pub fn blocks_of(&self, g: u64, from: u64, max: usize) -> Vec<u64> {
        let Some(set) = self.blocks.get(&g) else {
            return Vec::new();
        };
        let mut v: Vec<u64> = set.range(from..).take(max).copied().collect();
        if v.len() < max {
            v.extend(set.range(..from).take(max - v.len()));
        }
        v
    }

    /// Up to `max` shadows of group `g` not yet written, by block.
    pub fn shadows_of(&self, g: u64, max: usize) -> Vec<(u64, Shadow)> {
        self.shadows
            .range((g, 0)..=(g, u64::MAX))
            .filter(|(_, s)| !s.written)
            .take(max)
            .map(|(&(_, b), &s)| (b, s))
            .collect()
    }

    /// The shadow of `block` in group `g` was written to the origin.
    pub fn shadow_written(&mut self, g: u64, block: u64) {
        if let Some(s) = self.shadows.get_mut(&(g, block)) {
            s.written = true;
        }
    }

    /// Group `g` (and every group below it) is on the origin, flushed:
    /// returns the slots of its shadows, free now.
    fn finish(&mut self, g: u64) -> Vec<u32> {
        self.done = self.done.max(g + 1);
        let keep = self.shadows.split_off(&(g + 1, 0));
        let gone = std::mem::replace(&mut self.shadows, keep);
        let slots: Vec<u32> = gone.values().map(|s| s.slot).collect();
        for s in &slots {
            self.shadow_at.remove(s);
        }
        slots
    }

    /// `slot` holds an older version kept for its group.
    pub fn is_shadow(&self, slot: u32) -> bool {
        self.shadow_at.contains(&slot)
    }

    /// Every group below this one is done.
    #[cfg(test)]
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The slots shadows hold (not free, whatever the table says).
    pub fn shadow_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.shadows.values().map(|s| s.slot)
    }

    pub fn counts(&self) -> GroupCounts {
        let pending: BTreeSet<u64> = self
            .blocks
            .keys()
            .copied()
            .chain(self.shadows.keys().map(|&(g, _)| g))
            .filter(|&g| g < self.open)
            .collect();
        GroupCounts {
            open: self.open,
            done: self.done,
            closed_pending: pending.len() as u64,
            shadows: self.shadows.len() as u64,
            shadow_peak: self.shadow_peak,
        }
    }

    pub fn heap_bytes(&self) -> u64 {
        let per_block = 3 * std::mem::size_of::<u64>() as u64;
        let per_shadow = std::mem::size_of::<(u64, u64, Shadow)>() as u64;
        (self.slot_group.capacity() * 8) as u64
            + self.blocks.values().map(|s| s.len() as u64).sum::<u64>() * per_block
            + self.shadows.len() as u64 * per_shadow
            + self.shadow_at.capacity() as u64 * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Table::new(8, crate::engine::origin::address::KeySpace::one(64), 8)
    }

    /// Applies `r` to the table and the groups, as `Cache::append` does.
    fn apply(t: &mut Table, g: &mut Groups, r: Record) -> (Option<u32>, Vec<u32>) {
        let out = g.note(t, &r);
        t.apply(&r);
        out
    }

    fn map(slot: u32, block: u64) -> Record {
        Record::Map {
            slot,
            block,
            dirty: true,
        }
    }

    #[test]
    fn an_overwrite_after_a_flush_keeps_the_older_version() {
        let (mut t, mut g) = (table(), Groups::new(0, &table()));
        apply(&mut t, &mut g, map(0, 10));
        let n = g.next_close().unwrap();
        apply(&mut t, &mut g, Record::Close { group: n });
        assert_eq!(g.closed_pending(), Some(0));
        // Block 10 moves to slot 1 in group 1: slot 0 stays as group 0's.
        assert_eq!(apply(&mut t, &mut g, map(1, 10)).0, Some(0));
        assert_eq!(g.shadows_of(0, 8).len(), 1);
        assert_eq!(g.blocks_of(0, 0, 8), Vec::<u64>::new());
        assert_eq!(g.blocks_of(1, 0, 8), vec![10]);
        g.shadow_written(0, 10);
        assert_eq!(g.oldest_pending(), Some(1));
        // Written is not done: the group is pending until its Done.
        assert_eq!(g.closed_pending(), Some(0));
        assert_eq!(apply(&mut t, &mut g, Record::Done { group: 0 }).1, vec![0]);
        assert_eq!(g.closed_pending(), None);
        assert_eq!(g.done(), 1);
    }

    #[test]
    fn within_the_open_group_nothing_is_kept() {
        let (mut t, mut g) = (table(), Groups::new(0, &table()));
        apply(&mut t, &mut g, map(0, 10));
        assert_eq!(apply(&mut t, &mut g, map(1, 10)).0, None);
        assert_eq!(g.counts().shadows, 0);
        apply(&mut t, &mut g, Record::Clean { slot: 1 });
        assert_eq!(g.oldest_pending(), None);
    }

    #[test]
    fn an_empty_group_is_not_closed() {
        let (mut t, mut g) = (table(), Groups::new(0, &table()));
        assert_eq!(g.next_close(), None);
        apply(&mut t, &mut g, map(2, 5));
        assert_eq!(g.next_close(), Some(1));
        apply(&mut t, &mut g, Record::Close { group: 1 });
        assert_eq!(g.next_close(), None);
        assert_eq!(g.counts().closed_pending, 1);
    }

    #[test]
    fn a_loaded_table_is_one_open_group() {
        let mut t = table();
        t.apply(&map(3, 7));
        let g = Groups::new(5, &t);
        assert_eq!((g.open(), g.done(), g.blocks_of(5, 0, 8)), (5, 5, vec![7]));
        assert_eq!(g.closed_pending(), None);
    }
}
