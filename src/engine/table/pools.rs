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
use super::segments::{Geometry, Segments};

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

    /// One cache device grew to `slot_count` slots: every one may hold
    /// dirty data, the new ones free. (A cache set does not grow: its
    /// members are replaced, `replace-cache`.)
    pub fn grow(&mut self, slot_count: u32, log: Option<Geometry>) {
        assert_eq!(self.own.slot_count(), 0, "a cache set does not grow");
        self.mirror.grow(slot_count);
        self.dirty_slots = slot_count;
        self.own = FreeSlots::covering(slot_count..slot_count);
        if let Some(g) = log {
            self.own.enable_log(g);
        }
    }

    /// Turns the log placement on in both pools (after the free slots
    /// are in).
    pub fn enable_log(&mut self, g: Geometry) {
        self.mirror.enable_log(g);
        self.own.enable_log(g);
    }

    /// The segments of the pool for data this dirty (the mirrored pool for
    /// dirty data; the own pool for clean data, unless it has no slot),
    /// with the log placement.
    pub fn segments(&self, dirty: bool) -> Option<&Segments> {
        self.pool_for(dirty).log()
    }

    /// Both pools' segments, mirrored first (with the log placement).
    pub fn all_segments(&self) -> impl Iterator<Item = &Segments> {
        [self.mirror.log(), self.own.log()].into_iter().flatten()
    }

    /// Data this dirty goes to the mirrored pool (all of it on one cache
    /// device, which has no own slots).
    fn mirror_takes(&self, dirty: bool) -> bool {
        dirty || self.own.slot_count() == 0
    }

    fn pool_for(&self, dirty: bool) -> &FreeSlots {
        if self.mirror_takes(dirty) {
            &self.mirror
        } else {
            &self.own
        }
    }

    /// Starts emptying `segment` of the pool for data this dirty: its free
    /// slots are held out of the pool until all of it is free.
    pub fn begin_cleaning(&mut self, dirty: bool, segment: Range<u32>) {
        self.pool_for_mut(dirty).begin_cleaning(segment)
    }

    /// Gives up emptying the pool's segment being emptied: its free slots
    /// return to the pool.
    pub fn end_cleaning(&mut self, dirty: bool) {
        let held = self.pool_for_mut(dirty).end_cleaning();
        self.extend(held);
    }

    fn pool_for_mut(&mut self, dirty: bool) -> &mut FreeSlots {
        if self.mirror_takes(dirty) {
            &mut self.mirror
        } else {
            &mut self.own
        }
    }

    /// Segments waiting for their discard, from both pools: their slots
    /// are out of the pools until `trim_done`.
    pub fn take_trims(&mut self) -> Vec<Range<u32>> {
        let mut v = self.mirror.take_trims();
        v.extend(self.own.take_trims());
        v
    }

    /// The discard of a segment from `take_trims` is done: its slots are
    /// free again.
    pub fn trim_done(&mut self, segment: Range<u32>) {
        let slots = self.pool(segment.start).trim_done(segment.start);
        debug_assert_eq!(slots, segment);
        self.extend(slots);
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

    /// Takes `slot` out of the free slots (a slot in use that the table
    /// shows free: a flush group's shadow, table/groups.rs).
    pub fn remove(&mut self, slot: u32) {
        self.pool(slot).remove(slot);
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
        let pool = if range.start < self.dirty_slots {
            &self.mirror
        } else {
            &self.own
        };
        let free = pool.count_in(range.clone()) + pool.trimming_in(range.clone());
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
