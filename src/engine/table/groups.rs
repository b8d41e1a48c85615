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
//! Kept in memory under the metadata lock, changed with the records that
//! change the table (`Engine::append`). Not persisted yet: a restart puts
//! every dirty block in one group and frees the shadows (their slots are
//! already free in the journalled table).

use std::collections::{BTreeMap, BTreeSet};

use super::sectors::SectorSet;

/// An older version of a block, kept for its group's writeback.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shadow {
    pub slot: u32,
    /// The sectors that are dirty in it (written back; the others are not).
    pub dirty: SectorSet,
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
    /// Dirty slots found at open all join group 0 (`dirty`: their slots
    /// and blocks).
    pub fn new(slot_count: u64, dirty: impl Iterator<Item = (u32, u64)>) -> Groups {
        let mut g = Groups {
            open: 0,
            open_used: false,
            done: 0,
            slot_group: vec![0; slot_count as usize],
            blocks: BTreeMap::new(),
            shadows: BTreeMap::new(),
            shadow_peak: 0,
        };
        for (_, block) in dirty {
            g.blocks.entry(0).or_default().insert(block);
            g.open_used = true;
        }
        g
    }

    pub fn open(&self) -> u64 {
        self.open
    }

    /// The group of a dirty slot's data.
    pub fn group_of(&self, slot: u32) -> u64 {
        self.slot_group[slot as usize]
    }

    /// A client flush: the open group closes (if it took any write).
    pub fn close(&mut self) {
        if self.open_used {
            self.open += 1;
            self.open_used = false;
        }
    }

    /// `slot` (holding `block`) gets dirty data: it joins the open group.
    /// A slot already dirty stays in its group: the engine writes a slot
    /// of a closed group in place only when the write looked it up before
    /// a flush closed the group (`Meta::may_overwrite`), and a write
    /// concurrent with a flush may be in the group before it.
    pub fn dirtied(&mut self, slot: u32, block: u64, was_dirty: bool) {
        if was_dirty {
            return;
        }
        self.open_used = true;
        self.slot_group[slot as usize] = self.open;
        self.blocks.entry(self.open).or_default().insert(block);
    }

    /// Dirty `slot` (holding `block`) was written back.
    pub fn cleaned(&mut self, slot: u32, block: u64) {
        self.forget(self.slot_group[slot as usize], block);
    }

    /// Dirty `slot` (holding `block`, dirty sectors `dirty`) leaves the
    /// mapping (superseded or unmapped). Returns true if it stays as a
    /// shadow: its group is closed and not yet on the origin.
    pub fn removed(&mut self, slot: u32, block: u64, dirty: SectorSet) -> bool {
        let g = self.slot_group[slot as usize];
        self.forget(g, block);
        if g >= self.open {
            return false;
        }
        let old = self.shadows.insert((g, block), Shadow { slot, dirty });
        assert!(old.is_none(), "two shadows of block {block} in group {g}");
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

    /// The oldest group with data not yet on the origin.
    pub fn oldest_pending(&self) -> Option<u64> {
        let b = self.blocks.keys().next().copied();
        let s = self.shadows.keys().next().map(|&(g, _)| g);
        match (b, s) {
            (Some(b), Some(s)) => Some(b.min(s)),
            (b, s) => b.or(s),
        }
    }

    /// The oldest closed group with data not yet on the origin.
    pub fn closed_pending(&self) -> Option<u64> {
        self.oldest_pending().filter(|&g| g < self.open)
    }

    /// Up to `max` mapped blocks of group `g`, ascending.
    pub fn blocks_of(&self, g: u64, max: usize) -> Vec<u64> {
        self.blocks
            .get(&g)
            .map(|s| s.iter().take(max).copied().collect())
            .unwrap_or_default()
    }

    /// Up to `max` shadows of group `g`, by block.
    pub fn shadows_of(&self, g: u64, max: usize) -> Vec<(u64, Shadow)> {
        self.shadows
            .range((g, 0)..=(g, u64::MAX))
            .take(max)
            .map(|(&(_, b), &s)| (b, s))
            .collect()
    }

    /// The shadow of `block` in group `g` is on the origin: it goes (the
    /// caller frees its slot).
    pub fn drop_shadow(&mut self, g: u64, block: u64) -> Option<Shadow> {
        self.shadows.remove(&(g, block))
    }

    /// The origin was flushed after every group below `g` was written:
    /// they are done.
    pub fn done_below(&mut self, g: u64) {
        self.done = self.done.max(g);
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> SectorSet {
        SectorSet::full(8)
    }

    #[test]
    fn an_overwrite_after_a_flush_keeps_the_older_version() {
        let mut g = Groups::new(8, std::iter::empty());
        g.dirtied(0, 10, false);
        g.close();
        assert_eq!(g.closed_pending(), Some(0));
        // Block 10 moves to slot 1 in group 1: slot 0 stays as group 0's.
        assert!(g.removed(0, 10, full()));
        g.dirtied(1, 10, false);
        assert_eq!(g.shadows_of(0, 8).len(), 1);
        assert_eq!(g.blocks_of(0, 8), Vec::<u64>::new());
        assert_eq!(g.blocks_of(1, 8), vec![10]);
        assert_eq!(g.drop_shadow(0, 10).map(|s| s.slot), Some(0));
        assert_eq!(g.closed_pending(), None);
        assert_eq!(g.oldest_pending(), Some(1));
    }

    #[test]
    fn within_the_open_group_nothing_is_kept() {
        let mut g = Groups::new(8, std::iter::empty());
        g.dirtied(0, 10, false);
        assert!(!g.removed(0, 10, full()));
        g.dirtied(1, 10, false);
        g.dirtied(1, 10, true);
        assert_eq!(g.counts().shadows, 0);
        g.cleaned(1, 10);
        assert_eq!(g.oldest_pending(), None);
    }

    #[test]
    fn an_empty_group_is_not_closed() {
        let mut g = Groups::new(8, std::iter::empty());
        g.close();
        assert_eq!(g.open(), 0);
        g.dirtied(2, 5, false);
        g.close();
        g.close();
        assert_eq!(g.open(), 1);
        assert_eq!(g.counts().closed_pending, 1);
    }
}
