//! The per-slot mapping entries in memory, 4 bytes per slot when every
//! origin block number fits in 31 bits (origins below 2^31 blocks: 8 TiB at
//! 4 KiB blocks), 8 bytes otherwise. Callers see the on-disk encoding of
//! `format::entry_encode` (block + 1, bit 63 dirty, 0 free) either way.

use crate::engine::format::ENTRY_DIRTY;

const NARROW_DIRTY: u32 = 1 << 31;

pub enum Entries {
    /// `block + 1` in bits 0..31, bit 31 dirty, 0 free.
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Entries {
    /// `slot_count` free entries for an origin of `origin_blocks` blocks.
    pub fn new(slot_count: u64, origin_blocks: u64) -> Entries {
        if origin_blocks < NARROW_DIRTY as u64 {
            Entries::Narrow(vec![0; slot_count as usize])
        } else {
            Entries::Wide(vec![0; slot_count as usize])
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Entries::Narrow(v) => v.len(),
            Entries::Wide(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn heap_bytes(&self) -> u64 {
        match self {
            Entries::Narrow(v) => (v.capacity() * 4) as u64,
            Entries::Wide(v) => (v.capacity() * 8) as u64,
        }
    }

    /// The entry of `slot`, in the on-disk encoding.
    #[inline]
    pub fn get(&self, slot: usize) -> u64 {
        match self {
            Entries::Narrow(v) => widen(v[slot]),
            Entries::Wide(v) => v[slot],
        }
    }

    /// Sets the entry of `slot`. A narrow table takes only entries of
    /// blocks below the origin size it was made for (the table checks
    /// blocks against the origin before they get here).
    #[inline]
    pub fn set(&mut self, slot: usize, entry: u64) {
        match self {
            Entries::Narrow(v) => {
                let value = entry & !ENTRY_DIRTY;
                assert!(
                    value < NARROW_DIRTY as u64,
                    "entry {entry:#x} in a narrow table"
                );
                let dirty = if entry & ENTRY_DIRTY != 0 {
                    NARROW_DIRTY
                } else {
                    0
                };
                v[slot] = value as u32 | dirty;
            }
            Entries::Wide(v) => v[slot] = entry,
        }
    }

    /// Makes room for blocks below `origin_blocks` (an origin grown
    /// online): a narrow table whose blocks no longer fit in 31 bits
    /// becomes wide, its entries the same.
    pub fn fit(&mut self, origin_blocks: u64) {
        if let Entries::Narrow(v) = self {
            if origin_blocks >= NARROW_DIRTY as u64 {
                *self = Entries::Wide(v.iter().map(|&e| widen(e)).collect());
            }
        }
    }

    /// Every entry in slot order, in the on-disk encoding.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (narrow, wide): (&[u32], &[u64]) = match self {
            Entries::Narrow(v) => (v, &[]),
            Entries::Wide(v) => (&[], v),
        };
        narrow.iter().map(|&e| widen(e)).chain(wide.iter().copied())
    }

    /// A copy in the on-disk encoding (for a checkpoint).
    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

#[inline]
fn widen(e: u32) -> u64 {
    (e & !NARROW_DIRTY) as u64
        | if e & NARROW_DIRTY != 0 {
            ENTRY_DIRTY
        } else {
            0
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::format::{entry_decode, entry_encode, ENTRY_FREE};

    #[test]
    fn both_widths_keep_the_encoding() {
        for origin_blocks in [1000u64, (1 << 31) - 1, 1 << 31, 1 << 40] {
            let mut t = Entries::new(4, origin_blocks);
            assert_eq!(matches!(t, Entries::Narrow(_)), origin_blocks < 1 << 31);
            let last = origin_blocks - 1;
            t.set(0, entry_encode(last, true));
            t.set(1, entry_encode(0, false));
            t.set(3, entry_encode(7, true));
            t.set(3, entry_encode(7, false));
            assert_eq!(entry_decode(t.get(0)), Some((last, true)));
            assert_eq!(entry_decode(t.get(1)), Some((0, false)));
            assert_eq!(t.get(2), ENTRY_FREE);
            assert_eq!(entry_decode(t.get(3)), Some((7, false)));
            assert_eq!(t.to_vec(), (0..4).map(|s| t.get(s)).collect::<Vec<_>>());
            assert_eq!(
                t.heap_bytes(),
                if origin_blocks < 1 << 31 { 16 } else { 32 }
            );
        }
    }

    #[test]
    #[should_panic(expected = "narrow table")]
    fn a_narrow_table_refuses_a_block_beyond_31_bits() {
        Entries::new(1, 100).set(0, entry_encode(1 << 31, false));
    }
}
