//! Origin block -> cache slot, in 4 bytes per bucket.
//!
//! An open-addressing hash table that stores only slot numbers: the key of a
//! bucket is read from the slot's table entry, so a cached block costs one
//! `u32` here (at most `LOAD` full) instead of a `HashMap<u64, u32>` entry.
//! Linear probing with backward-shift deletion keeps it tombstone-free; the
//! table grows only with the cache device (`grow`), all at once.

use super::entries::Entries;
use crate::engine::format::entry_decode;

const EMPTY: u32 = u32::MAX;
/// Maximum fill: 5 buckets per 4 slots.
const LOAD_NUM: u64 = 4;
const LOAD_DEN: u64 = 5;

pub struct BlockIndex {
    buckets: Vec<u32>,
    len: u64,
}

fn hash(block: u64) -> u64 {
    // Fibonacci hashing, then a multiply-shift range reduction in `home`.
    block.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
}

impl BlockIndex {
    /// An index able to hold `slot_count` blocks.
    pub fn new(slot_count: u64) -> BlockIndex {
        let buckets = (slot_count * LOAD_DEN).div_ceil(LOAD_NUM).max(8);
        BlockIndex {
            buckets: vec![EMPTY; buckets as usize],
            len: 0,
        }
    }

    pub fn heap_bytes(&self) -> u64 {
        (self.buckets.capacity() * 4) as u64
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn home(&self, block: u64) -> usize {
        ((hash(block) as u128 * self.buckets.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    fn block_of(entries: &Entries, slot: u32) -> u64 {
        entry_decode(entries.get(slot as usize))
            .expect("an indexed slot holds a block")
            .0
    }

    /// Bucket holding `block`, if any.
    fn find(&self, entries: &Entries, block: u64) -> Option<usize> {
        let mut i = self.home(block);
        loop {
            let s = self.buckets[i];
            if s == EMPTY {
                return None;
            }
            if Self::block_of(entries, s) == block {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    /// Room for `slot_count` blocks (the cache device grew): every slot
    /// it holds is placed again in the larger table.
    pub fn grow(&mut self, slot_count: u64, entries: &Entries) {
        let mut larger = BlockIndex::new(slot_count);
        if larger.buckets.len() <= self.buckets.len() {
            return;
        }
        for &s in self.buckets.iter().filter(|&&s| s != EMPTY) {
            larger.insert(entries, Self::block_of(entries, s), s);
        }
        *self = larger;
    }

    pub fn get(&self, entries: &Entries, block: u64) -> Option<u32> {
        self.find(entries, block).map(|i| self.buckets[i])
    }

    /// Points `block` at `slot`; `entries[slot]` must already name `block`.
    /// Returns the slot it replaced.
    pub fn insert(&mut self, entries: &Entries, block: u64, slot: u32) -> Option<u32> {
        let mut i = self.home(block);
        loop {
            let s = self.buckets[i];
            if s == EMPTY {
                // An empty bucket must remain so that every probe ends.
                assert!(
                    self.len + 1 < self.buckets.len() as u64,
                    "block index over capacity"
                );
                self.buckets[i] = slot;
                self.len += 1;
                return None;
            }
            if s == slot || Self::block_of(entries, s) == block {
                self.buckets[i] = slot;
                return (s != slot).then_some(s);
            }
            i = self.next(i);
        }
    }

    /// Removes `block`; `entries` must still name it for its slot.
    pub fn remove(&mut self, entries: &Entries, block: u64) -> Option<u32> {
        let mut hole = self.find(entries, block)?;
        let removed = self.buckets[hole];
        self.len -= 1;
        // Backward-shift: move later members of the probe run into the hole
        // when the hole lies on their way from their home bucket.
        let mut j = self.next(hole);
        loop {
            let s = self.buckets[j];
            if s == EMPTY {
                break;
            }
            let home = self.home(Self::block_of(entries, s));
            let between = if hole <= j {
                home <= hole || home > j
            } else {
                home <= hole && home > j
            };
            if between {
                self.buckets[hole] = s;
                hole = j;
            }
            j = self.next(j);
        }
        self.buckets[hole] = EMPTY;
        Some(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::format::{entry_encode, ENTRY_FREE};
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    #[test]
    fn matches_a_hashmap() {
        for seed in 0..8u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let slots = [16u64, 100, 1000][seed as usize % 3];
            let span = slots * 3;
            // Narrow entries (a small origin).
            let mut entries = Entries::new(slots, span);
            let mut idx = BlockIndex::new(slots);
            let mut model: HashMap<u64, u32> = HashMap::new();
            // Few distinct blocks so that probe runs collide and wrap.
            for _ in 0..20_000 {
                let slot = rng.gen_range(0..slots) as u32;
                if let Some((b, _)) = entry_decode(entries.get(slot as usize)) {
                    assert_eq!(idx.remove(&entries, b), Some(slot), "seed {seed}");
                    model.remove(&b);
                    entries.set(slot as usize, ENTRY_FREE);
                }
                if rng.gen_bool(0.7) {
                    let block = rng.gen_range(0..span);
                    if let Some(old) = model.get(&block).copied() {
                        assert_eq!(idx.remove(&entries, block), Some(old));
                        entries.set(old as usize, ENTRY_FREE);
                    }
                    entries.set(slot as usize, entry_encode(block, false));
                    assert_eq!(idx.insert(&entries, block, slot), None);
                    model.insert(block, slot);
                }
                assert_eq!(idx.len(), model.len() as u64);
            }
            for b in 0..span {
                assert_eq!(idx.get(&entries, b), model.get(&b).copied(), "seed {seed}");
            }
        }
    }

    #[test]
    fn full_cache_fits() {
        let slots = 1000u64;
        // Wide entries (blocks past 2^31).
        let mut entries = Entries::new(slots, 1 << 41);
        let mut idx = BlockIndex::new(slots);
        for s in 0..slots {
            let block = s * 7919 + (1 << 40);
            entries.set(s as usize, entry_encode(block, true));
            idx.insert(&entries, block, s as u32);
        }
        assert_eq!(idx.len(), slots);
        assert_eq!(idx.get(&entries, 5 * 7919 + (1 << 40)), Some(5));
        assert_eq!(idx.get(&entries, 1), None);
    }
}
