//! The mapping table: which origin block each cache slot holds and whether
//! it is dirty. Recovery and the running engine change it through the same
//! `apply`, so what the journal replays is exactly what the engine did.

use std::collections::BinaryHeap;

use super::entries::Entries;
use super::format::{entry_decode, entry_encode, Record, ENTRY_DIRTY, ENTRY_FREE};
use super::index::BlockIndex;

/// In memory a cached block costs its entry (4 bytes, or 8 for origins of
/// 2^31 blocks or more) and an index bucket (4 bytes at most 4/5 full);
/// dirty blocks are found by scanning entries, so being dirty costs nothing
/// extra.
pub struct Table {
    /// Per slot: `format::entry_encode` or ENTRY_FREE.
    pub entries: Entries,
    /// Origin block -> slot.
    index: BlockIndex,
    dirty_count: u64,
    pub origin_blocks: u64,
}

/// What `apply` did to slots other than the record's own.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// A slot that held the same block before a Map and is now free.
    pub released: Option<u32>,
}

impl Table {
    pub fn new(slot_count: u64, origin_blocks: u64) -> Table {
        Table {
            entries: Entries::new(slot_count, origin_blocks),
            index: BlockIndex::new(slot_count),
            dirty_count: 0,
            origin_blocks,
        }
    }

    /// Heap bytes of the entries and the block index.
    pub fn heap_bytes(&self) -> u64 {
        self.entries.heap_bytes() + self.index.heap_bytes()
    }

    /// Builds a table from checkpoint entries, checking its invariants.
    pub fn from_entries(entries: Vec<u64>, origin_blocks: u64) -> Result<Table, String> {
        let mut t = Table::new(entries.len() as u64, origin_blocks);
        for (slot, &e) in entries.iter().enumerate() {
            if e == ENTRY_FREE {
                continue;
            }
            let (block, dirty) =
                entry_decode(e).ok_or_else(|| format!("slot {slot}: invalid entry {e:#x}"))?;
            if block >= origin_blocks {
                return Err(format!(
                    "slot {slot}: origin block {block} beyond the origin ({origin_blocks} blocks)"
                ));
            }
            if let Some(other) = t.index.get(&t.entries, block) {
                return Err(format!(
                    "slots {other} and {slot} both hold origin block {block}"
                ));
            }
            t.entries.set(slot, e);
            t.index.insert(&t.entries, block, slot as u32);
            if dirty {
                t.dirty_count += 1;
            }
        }
        Ok(t)
    }

    pub fn slot_count(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn lookup(&self, block: u64) -> Option<(u32, bool)> {
        self.index
            .get(&self.entries, block)
            .map(|s| (s, self.entries.get(s as usize) & ENTRY_DIRTY != 0))
    }

    pub fn is_dirty(&self, block: u64) -> bool {
        matches!(self.lookup(block), Some((_, true)))
    }

    pub fn slot_block(&self, slot: u32) -> Option<(u64, bool)> {
        entry_decode(self.entries.get(slot as usize))
    }

    pub fn used(&self) -> u64 {
        self.index.len()
    }

    pub fn dirty_count(&self) -> u64 {
        self.dirty_count
    }

    /// Up to `want` dirty blocks, ascending from `cursor` and wrapping
    /// around to the lowest ones. One pass over the entries.
    pub fn dirty_from(&self, cursor: u64, want: usize) -> Vec<u64> {
        if want == 0 || self.dirty_count == 0 {
            return Vec::new();
        }
        // The `want` smallest keys, where blocks below the cursor sort after
        // every block at or above it.
        let key = |b: u64| (b < cursor, b);
        let mut heap: BinaryHeap<(bool, u64)> = BinaryHeap::with_capacity(want + 1);
        for e in self.entries.iter() {
            if e & ENTRY_DIRTY == 0 {
                continue;
            }
            let Some((b, _)) = entry_decode(e) else {
                continue;
            };
            if heap.len() < want {
                heap.push(key(b));
            } else if key(b) < *heap.peek().expect("heap is full") {
                heap.pop();
                heap.push(key(b));
            }
        }
        let mut v: Vec<(bool, u64)> = heap.into_vec();
        v.sort_unstable();
        v.into_iter().map(|(_, b)| b).collect()
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
        let slot = match *r {
            Record::Map { slot, block, .. } => {
                if block >= self.origin_blocks {
                    return Err(format!(
                        "record maps origin block {block} beyond the origin"
                    ));
                }
                slot
            }
            Record::Clean { slot } | Record::Unmap { slot } => slot,
        };
        if slot as u64 >= self.slot_count() {
            return Err(format!("record names slot {slot} of {}", self.slot_count()));
        }
        if !matches!(r, Record::Map { .. }) && self.entries.get(slot as usize) == ENTRY_FREE {
            return Err(format!("record {r:?} names a free slot"));
        }
        Ok(())
    }

    /// Applies a record. The record must be valid (see `validate`).
    pub fn apply(&mut self, r: &Record) -> Applied {
        let mut applied = Applied::default();
        match *r {
            Record::Map { slot, block, dirty } => {
                self.clear_slot(slot);
                if let Some(old) = self.index.get(&self.entries, block) {
                    self.clear_slot(old);
                    applied.released = Some(old);
                }
                self.entries.set(slot as usize, entry_encode(block, dirty));
                self.index.insert(&self.entries, block, slot);
                if dirty {
                    self.dirty_count += 1;
                }
            }
            Record::Clean { slot } => {
                let e = self.entries.get(slot as usize);
                if e != ENTRY_FREE && e & ENTRY_DIRTY != 0 {
                    self.entries.set(slot as usize, e & !ENTRY_DIRTY);
                    self.dirty_count -= 1;
                }
            }
            Record::Unmap { slot } => self.clear_slot(slot),
        }
        applied
    }

    fn clear_slot(&mut self, slot: u32) {
        if let Some((block, dirty)) = self.slot_block(slot) {
            if dirty {
                self.dirty_count -= 1;
            }
            if self.index.get(&self.entries, block) == Some(slot) {
                self.index.remove(&self.entries, block);
            }
        }
        self.entries.set(slot as usize, ENTRY_FREE);
    }

    /// Frees every slot holding a clean block; returns how many.
    pub fn drop_clean(&mut self) -> u64 {
        let mut n = 0;
        for slot in 0..self.entries.len() as u32 {
            if matches!(self.slot_block(slot), Some((_, false))) {
                self.clear_slot(slot);
                n += 1;
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
        let mut t = Table::new(4, 100);
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
        assert!(Table::from_entries(e, 10)
            .err()
            .unwrap()
            .contains("both hold"));
        assert!(Table::from_entries(vec![entry_encode(10, false)], 10).is_err());
        let t = Table::from_entries(vec![entry_encode(3, true), 0], 10).unwrap();
        assert_eq!(t.dirty_count(), 1);
        assert_eq!(t.free_slots().collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn dirty_from_wraps_at_the_cursor() {
        let mut t = Table::new(8, 100);
        for (slot, block) in [(0u32, 50u64), (1, 10), (2, 70), (3, 30), (4, 90)] {
            t.apply(&Record::Map {
                slot,
                block,
                dirty: block != 70,
            });
        }
        assert_eq!(t.dirty_count(), 4);
        assert_eq!(t.dirty_from(0, 10), vec![10, 30, 50, 90]);
        assert_eq!(t.dirty_from(40, 2), vec![50, 90]);
        assert_eq!(t.dirty_from(40, 3), vec![50, 90, 10]);
        assert_eq!(t.dirty_from(95, 10), vec![10, 30, 50, 90]);
        assert_eq!(t.all_dirty(), vec![10, 30, 50, 90]);
        assert!(t.is_dirty(30) && !t.is_dirty(70) && !t.is_dirty(71));
    }
}
