//! The mapping table: which origin block each cache slot holds and whether
//! it is dirty. Recovery and the running engine change it through the same
//! `apply`, so what the journal replays is exactly what the engine did.

use std::collections::{BTreeSet, HashMap};

use super::format::{entry_decode, entry_encode, Record, ENTRY_DIRTY, ENTRY_FREE};

pub struct Table {
    /// Per slot: `format::entry_encode` or ENTRY_FREE.
    pub entries: Vec<u64>,
    /// Origin block -> slot.
    pub map: HashMap<u64, u32>,
    /// Dirty origin blocks, ascending (writeback order).
    pub dirty: BTreeSet<u64>,
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
            entries: vec![ENTRY_FREE; slot_count as usize],
            map: HashMap::new(),
            dirty: BTreeSet::new(),
            origin_blocks,
        }
    }

    /// Builds a table from checkpoint entries, checking its invariants.
    pub fn from_entries(entries: Vec<u64>, origin_blocks: u64) -> Result<Table, String> {
        let mut t = Table {
            entries,
            map: HashMap::new(),
            dirty: BTreeSet::new(),
            origin_blocks,
        };
        for (slot, &e) in t.entries.iter().enumerate() {
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
            if let Some(other) = t.map.insert(block, slot as u32) {
                return Err(format!(
                    "slots {other} and {slot} both hold origin block {block}"
                ));
            }
            if dirty {
                t.dirty.insert(block);
            }
        }
        Ok(t)
    }

    pub fn slot_count(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn lookup(&self, block: u64) -> Option<(u32, bool)> {
        self.map
            .get(&block)
            .map(|&s| (s, self.entries[s as usize] & ENTRY_DIRTY != 0))
    }

    pub fn slot_block(&self, slot: u32) -> Option<(u64, bool)> {
        entry_decode(self.entries[slot as usize])
    }

    pub fn used(&self) -> u64 {
        self.map.len() as u64
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
        if !matches!(r, Record::Map { .. }) && self.entries[slot as usize] == ENTRY_FREE {
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
                if let Some(&old) = self.map.get(&block) {
                    self.clear_slot(old);
                    applied.released = Some(old);
                }
                self.entries[slot as usize] = entry_encode(block, dirty);
                self.map.insert(block, slot);
                if dirty {
                    self.dirty.insert(block);
                }
            }
            Record::Clean { slot } => {
                if let Some((block, _)) = self.slot_block(slot) {
                    self.entries[slot as usize] &= !ENTRY_DIRTY;
                    self.dirty.remove(&block);
                }
            }
            Record::Unmap { slot } => self.clear_slot(slot),
        }
        applied
    }

    fn clear_slot(&mut self, slot: u32) {
        if let Some((block, _)) = self.slot_block(slot) {
            self.dirty.remove(&block);
            if self.map.get(&block) == Some(&slot) {
                self.map.remove(&block);
            }
        }
        self.entries[slot as usize] = ENTRY_FREE;
    }

    pub fn free_slots(&self) -> Vec<u32> {
        // Descending, so that pop() hands out low slots first.
        (0..self.entries.len() as u32)
            .rev()
            .filter(|&s| self.entries[s as usize] == ENTRY_FREE)
            .collect()
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
        assert!(t.dirty.is_empty());
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
        assert_eq!(t.dirty.len(), 1);
        assert_eq!(t.free_slots(), vec![1]);
    }
}
