//! The per-slot mapping entries in memory, 4 bytes per slot when every
//! cacheable block of every volume fits in 31 bits (2^31 blocks in all: 8
//! TiB at 4 KiB blocks), 8 bytes otherwise. Callers see the on-disk
//! encoding of `format::entry_encode` (key + 1, bit 63 dirty, 0 free)
//! either way.
//!
//! A key is (volume, block), volume `v`'s keys starting at `v << 40` (4
//! KiB blocks: origin/address.rs), so a second volume's keys never fit in
//! 31 bits. A 4-byte entry holds a *dense* index instead: the volumes'
//! blocks one after the other (`Dense`), so a cache of several volumes
//! keeps 4 bytes a slot while their blocks add up to less than 2^31. For
//! one volume the dense index is the key.

use crate::engine::format::ENTRY_DIRTY;
use crate::engine::origin::address::KeySpace;

const NARROW_DIRTY: u32 = 1 << 31;

pub enum Entries {
    /// Dense index + 1 in bits 0..31, bit 31 dirty, 0 free.
    Narrow(Vec<u32>, Dense),
    Wide(Vec<u64>),
}

/// Where each volume's keys sit among the dense indexes of narrow entries:
/// volume `v`'s block `b` is `starts[v] + b`. Fixed between two changes of
/// the key space (`Entries::fit`), which re-encode the entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dense {
    /// log2 of the keys in one volume's space (0: one volume, identity).
    shift: u32,
    starts: Vec<u64>,
    /// One past the last dense index.
    end: u64,
}

impl Dense {
    /// Keys are dense indexes: one volume of `blocks`.
    fn identity(blocks: u64) -> Dense {
        Dense {
            shift: 0,
            starts: vec![0],
            end: blocks,
        }
    }

    /// The volumes of `keys`, one after the other.
    fn of(keys: &KeySpace) -> Dense {
        let n = keys.volumes();
        if n <= 1 {
            return Dense::identity(keys.blocks(0));
        }
        let mut starts = Vec::with_capacity(n);
        let mut at = 0;
        for v in 0..n {
            starts.push(at);
            at += keys.blocks(v);
        }
        Dense {
            shift: keys.base_key(1).trailing_zeros(),
            end: starts[n - 1] + keys.blocks(n - 1),
            starts,
        }
    }

    #[inline]
    fn to_dense(&self, key: u64) -> u64 {
        if self.shift == 0 {
            return key;
        }
        let v = (key >> self.shift) as usize;
        self.starts[v] + (key & ((1 << self.shift) - 1))
    }

    #[inline]
    fn to_key(&self, dense: u64) -> u64 {
        if self.shift == 0 {
            return dense;
        }
        let v = self.starts.partition_point(|&s| s <= dense) - 1;
        ((v as u64) << self.shift) | (dense - self.starts[v])
    }

    /// A narrow entry (dense) in the on-disk encoding (key).
    #[inline]
    fn widen(&self, e: u32) -> u64 {
        let w = widen(e);
        match w & !ENTRY_DIRTY {
            0 => w,
            d => (self.to_key(d - 1) + 1) | (w & ENTRY_DIRTY),
        }
    }
}

impl Entries {
    /// `slot_count` free entries for one origin of `origin_blocks` blocks.
    pub fn new(slot_count: u64, origin_blocks: u64) -> Entries {
        Entries::with(slot_count, Dense::identity(origin_blocks))
    }

    /// `slot_count` free entries for the volumes of `keys`.
    pub fn for_keys(slot_count: u64, keys: &KeySpace) -> Entries {
        Entries::with(slot_count, Dense::of(keys))
    }

    fn with(slot_count: u64, dense: Dense) -> Entries {
        if dense.end < NARROW_DIRTY as u64 {
            Entries::Narrow(vec![0; slot_count as usize], dense)
        } else {
            Entries::Wide(vec![0; slot_count as usize])
        }
    }

    /// `slot_count` entries, the new ones free (the cache device grew).
    pub fn grow(&mut self, slot_count: u64) {
        match self {
            Entries::Narrow(v, _) => v.resize(slot_count as usize, 0),
            Entries::Wide(v) => v.resize(slot_count as usize, 0),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Entries::Narrow(v, _) => v.len(),
            Entries::Wide(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn heap_bytes(&self) -> u64 {
        match self {
            Entries::Narrow(v, d) => (v.capacity() * 4 + d.starts.capacity() * 8) as u64,
            Entries::Wide(v) => (v.capacity() * 8) as u64,
        }
    }

    /// The entry of `slot`, in the on-disk encoding.
    #[inline]
    pub fn get(&self, slot: usize) -> u64 {
        match self {
            Entries::Narrow(v, d) => d.widen(v[slot]),
            Entries::Wide(v) => v[slot],
        }
    }

    /// Sets the entry of `slot`. A narrow table takes only entries of
    /// blocks of the volumes it was made for (the table checks blocks
    /// against them before they get here).
    #[inline]
    pub fn set(&mut self, slot: usize, entry: u64) {
        match self {
            Entries::Narrow(v, d) => v[slot] = narrow(d, entry),
            Entries::Wide(v) => v[slot] = entry,
        }
    }

    /// Makes room for the volumes of `keys` now (one grew or was added
    /// online): narrow entries are placed anew (a volume before another
    /// that grew moves the other's dense indexes), or all become wide if
    /// the volumes no longer fit in 31 bits.
    pub fn fit_keys(&mut self, keys: &KeySpace) {
        self.refit(Dense::of(keys));
    }

    fn refit(&mut self, next: Dense) {
        let Entries::Narrow(v, was) = self else {
            return;
        };
        if next == *was {
            return;
        }
        if next.end >= NARROW_DIRTY as u64 {
            *self = Entries::Wide(v.iter().map(|&e| was.widen(e)).collect());
            return;
        }
        for e in v.iter_mut() {
            *e = narrow(&next, was.widen(*e));
        }
        *was = next;
    }

    /// Every entry in slot order, in the on-disk encoding.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (narrow, wide, dense): (&[u32], &[u64], Option<&Dense>) = match self {
            Entries::Narrow(v, d) => (v, &[], Some(d)),
            Entries::Wide(v) => (&[], v, None),
        };
        (narrow.iter())
            .map(move |&e| dense.expect("narrow").widen(e))
            .chain(wide.iter().copied())
    }

    /// A copy in the on-disk encoding (for a checkpoint).
    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

/// An entry in the on-disk encoding as a narrow one of `d`.
#[inline]
fn narrow(d: &Dense, entry: u64) -> u32 {
    let value = entry & !ENTRY_DIRTY;
    let value = match value {
        0 => 0,
        k => d.to_dense(k - 1) + 1,
    };
    assert!(
        value < NARROW_DIRTY as u64,
        "entry {entry:#x} in a narrow table"
    );
    let dirty = if entry & ENTRY_DIRTY != 0 {
        NARROW_DIRTY
    } else {
        0
    };
    value as u32 | dirty
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
            assert_eq!(matches!(t, Entries::Narrow(..)), origin_blocks < 1 << 31);
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
            // A narrow table also keeps where its one volume starts.
            assert_eq!(
                t.heap_bytes(),
                if origin_blocks < 1 << 31 { 16 + 8 } else { 32 }
            );
        }
    }

    #[test]
    fn several_volumes_keep_4_bytes_a_slot_and_move_when_one_grows() {
        let keys = KeySpace::new(4096, vec![100, 50]);
        let mut t = Entries::for_keys(4, &keys);
        assert!(matches!(t, Entries::Narrow(..)));
        let (a, b) = (keys.base_key(0) + 99, keys.base_key(1) + 49);
        t.set(0, entry_encode(a, true));
        t.set(1, entry_encode(b, false));
        t.set(2, entry_encode(keys.base_key(1), true));
        let want = |t: &Entries| {
            assert_eq!(entry_decode(t.get(0)), Some((a, true)));
            assert_eq!(entry_decode(t.get(1)), Some((b, false)));
            assert_eq!(entry_decode(t.get(2)), Some((keys.base_key(1), true)));
            assert_eq!(t.get(3), ENTRY_FREE);
            assert_eq!(t.to_vec(), (0..4).map(|s| t.get(s)).collect::<Vec<_>>());
        };
        want(&t);
        assert_eq!(t.heap_bytes(), 16 + 16);
        // Volume 0 grows: volume 1's dense indexes move; the keys stay.
        keys.grow(0, 1000);
        t.fit_keys(&keys);
        want(&t);
        t.set(3, entry_encode(keys.base_key(0) + 999, false));
        assert_eq!(
            entry_decode(t.get(3)),
            Some((keys.base_key(0) + 999, false))
        );
        t.set(3, ENTRY_FREE);
        // A third volume, then more than 2^31 blocks in all: wide.
        keys.add(7);
        t.fit_keys(&keys);
        want(&t);
        assert!(matches!(t, Entries::Narrow(..)));
        keys.grow(2, 1 << 31);
        t.fit_keys(&keys);
        assert!(matches!(t, Entries::Wide(_)));
        want(&t);
    }

    #[test]
    #[should_panic(expected = "narrow table")]
    fn a_narrow_table_refuses_a_block_beyond_31_bits() {
        Entries::new(1, 100).set(0, entry_encode(1 << 31, false));
    }
}
