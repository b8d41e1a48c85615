//! The free slots, in two pools: slots that may hold dirty data (on a cache
//! set, the mirrored slots: two copies) and slots for clean data only (a
//! set member's own slots: one copy). A single cache device has one pool:
//! every slot may hold dirty data.
//!
//! Dirty data takes mirrored slots only (the table refuses a dirty record
//! anywhere else); clean data takes a member's own slots first, so the
//! mirrored ones stay for writes. Slots of a member that is not healthy are
//! *unusable*: free ones are parked, not handed out, until the member is
//! healthy again. Every slot free on disk is in a pool or parked.

use std::ops::Range;

use super::free::FreeSlots;

pub struct Pools {
    /// Slots `0..dirty_slots`.
    mirror: FreeSlots,
    /// Slots `dirty_slots..slot_count`.
    own: FreeSlots,
    dirty_slots: u32,
    unusable: Vec<Range<u32>>,
    /// Free slots in unusable ranges.
    parked: Vec<u32>,
}

impl Pools {
    /// No slot free; slots below `dirty_slots` may hold dirty data.
    pub fn new(slot_count: u64, dirty_slots: u32) -> Pools {
        Pools {
            mirror: FreeSlots::covering(0..dirty_slots),
            own: FreeSlots::covering(dirty_slots..slot_count as u32),
            dirty_slots,
            unusable: Vec::new(),
            parked: Vec::new(),
        }
    }

    /// Free slots that may take dirty data (on one cache device, all).
    pub fn dirty_capable(&self) -> usize {
        self.mirror.len()
    }

    /// A slot for data this dirty is free.
    pub fn has_free(&self, dirty: bool) -> bool {
        !self.mirror.is_empty() || (!dirty && !self.own.is_empty())
    }

    pub fn heap_bytes(&self) -> u64 {
        self.mirror.heap_bytes() + self.own.heap_bytes() + (self.parked.capacity() * 4) as u64
    }

    fn pool(&mut self, slot: u32) -> &mut FreeSlots {
        if slot < self.dirty_slots {
            &mut self.mirror
        } else {
            &mut self.own
        }
    }

    fn is_unusable(&self, slot: u32) -> bool {
        self.unusable.iter().any(|r| r.contains(&slot))
    }

    /// Marks `slot` free (parked if it is unusable). Freeing a free slot
    /// is a bug.
    pub fn insert(&mut self, slot: u32) {
        if !self.unusable.is_empty() && self.is_unusable(slot) {
            self.parked.push(slot);
            return;
        }
        self.pool(slot).insert(slot)
    }

    pub fn extend(&mut self, slots: impl IntoIterator<Item = u32>) {
        for s in slots {
            self.insert(s);
        }
    }

    /// Up to `n` free slots for data this dirty (see `FreeSlots::take`):
    /// dirty data from the mirrored pool; clean data from the own pool
    /// first.
    pub fn take(&mut self, n: usize, dirty: bool) -> Vec<u32> {
        if dirty || self.own.is_empty() {
            return self.mirror.take(n);
        }
        let mut slots = self.own.take(n);
        if slots.len() < n {
            slots.extend(self.mirror.take(n - slots.len()));
        }
        slots
    }

    /// The slots that are unusable now (replacing the earlier list): free
    /// slots in them are parked; parked slots outside them are free again.
    pub fn set_unusable(&mut self, ranges: Vec<Range<u32>>) {
        for r in &ranges {
            if !self.unusable.contains(r) {
                for s in r.clone() {
                    if self.pool(s).remove(s) {
                        self.parked.push(s);
                    }
                }
            }
        }
        self.unusable = ranges;
        let parked = std::mem::take(&mut self.parked);
        self.extend(parked);
    }

    /// Slots of `range` not free on disk (holding data, or waiting for a
    /// release): `range` lies within one pool.
    pub fn used_in(&self, range: Range<u32>) -> u64 {
        let free = if range.start < self.dirty_slots {
            self.mirror.count_in(range.clone())
        } else {
            self.own.count_in(range.clone())
        };
        let parked = self.parked.iter().filter(|s| range.contains(s)).count() as u64;
        range.len() as u64 - free - parked
    }

    pub fn unusable(&self) -> &[Range<u32>] {
        &self.unusable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_data_takes_mirrored_slots_and_clean_prefers_own() {
        let mut p = Pools::new(100, 40);
        p.extend([5, 6, 50, 51, 90]);
        assert_eq!(p.take(2, false), vec![50, 51]);
        assert_eq!(p.take(1, true), vec![5]);
        assert_eq!(p.take(1, false), vec![90]);
        // Own slots gone: clean data falls back to mirrored ones.
        assert_eq!(p.take(1, false), vec![6]);
        assert!(!p.has_free(true) && !p.has_free(false));
    }

    #[test]
    fn unusable_slots_are_dropped_until_usable_again() {
        let mut p = Pools::new(100, 40);
        p.extend([1, 60, 61, 80]);
        p.set_unusable(vec![50..70, 95..97]);
        assert_eq!(p.dirty_capable() + p.own.len(), 2);
        p.insert(65);
        assert_eq!(p.dirty_capable() + p.own.len(), 2);
        assert_eq!(p.take(5, false), vec![80, 1]);
        assert_eq!(p.used_in(50..70), 20 - 3);
        p.set_unusable(vec![]);
        assert_eq!(p.used_in(50..70), 20 - 3);
        assert_eq!(p.used_in(0..40), 40, "no mirrored slot is free");
        assert_eq!(p.take(5, false), vec![60, 61, 65]);
    }
}
