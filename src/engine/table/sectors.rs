//! Which 512-byte sectors of a cache block hold data (valid) and which hold
//! data the origin does not have yet (dirty), for blocks that are not
//! simply whole.
//!
//! Most slots hold a whole block, all clean or all dirty: the slot entry says
//! so and nothing else is stored. A slot written or read in part keeps two
//! bitmaps here, valid and dirty (dirty is a subset of valid), until it
//! becomes whole again. Invariants a [`PartialMaps`] entry keeps:
//! - valid is not empty, dirty is a subset of valid;
//! - the slot is not whole (valid is not every sector, or dirty is neither
//!   empty nor every sector): a whole slot has no entry.

use std::collections::HashMap;

/// Bytes per sector: the unit of validity and dirtiness.
pub const SECTOR_BYTES: u64 = 512;
/// Most sectors in a block (the largest block size, 1 MiB).
pub const MAX_SECTORS: usize = 2048;
const MAX_WORDS: usize = MAX_SECTORS / 64;

/// Sectors `first..first + count` of one block (`count >= 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SectorRun {
    pub first: u16,
    pub count: u16,
}

impl SectorRun {
    pub fn new(first: usize, count: usize) -> SectorRun {
        debug_assert!(count >= 1 && first + count <= MAX_SECTORS);
        SectorRun {
            first: first as u16,
            count: count as u16,
        }
    }

    /// The sectors of bytes `in_block..in_block + len` (both multiples of
    /// 512, `len > 0`).
    pub fn of_bytes(in_block: u64, len: u64) -> SectorRun {
        SectorRun::new(
            (in_block / SECTOR_BYTES) as usize,
            (len / SECTOR_BYTES) as usize,
        )
    }

    pub fn end(self) -> usize {
        self.first as usize + self.count as usize
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.first as usize..self.end()
    }
}

/// A set of sectors of one block.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SectorSet {
    words: [u64; MAX_WORDS],
    /// Sectors per block.
    n: u16,
}

impl std::fmt::Debug for SectorSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runs: Vec<_> = self.runs().map(|r| r.range()).collect();
        write!(f, "SectorSet({} of {}: {runs:?})", self.count(), self.n)
    }
}

impl SectorSet {
    pub fn empty(sectors: usize) -> SectorSet {
        assert!((1..=MAX_SECTORS).contains(&sectors));
        SectorSet {
            words: [0; MAX_WORDS],
            n: sectors as u16,
        }
    }

    pub fn full(sectors: usize) -> SectorSet {
        let mut s = SectorSet::empty(sectors);
        s.insert_run(SectorRun::new(0, sectors));
        s
    }

    pub fn of_run(sectors: usize, run: SectorRun) -> SectorSet {
        let mut s = SectorSet::empty(sectors);
        s.insert_run(run);
        s
    }

    /// Sectors per block.
    pub fn sectors(&self) -> usize {
        self.n as usize
    }

    fn nwords(&self) -> usize {
        (self.n as usize).div_ceil(64)
    }

    pub fn contains(&self, sector: usize) -> bool {
        self.words[sector / 64] & (1 << (sector % 64)) != 0
    }

    pub fn insert_run(&mut self, run: SectorRun) {
        assert!(
            run.end() <= self.n as usize,
            "{run:?} beyond {} sectors",
            self.n
        );
        for s in run.range() {
            self.words[s / 64] |= 1 << (s % 64);
        }
    }

    pub fn remove_run(&mut self, run: SectorRun) {
        for s in run.range() {
            self.words[s / 64] &= !(1 << (s % 64));
        }
    }

    pub fn count(&self) -> usize {
        self.words[..self.nwords()]
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words[..self.nwords()].iter().all(|&w| w == 0)
    }

    pub fn is_full(&self) -> bool {
        self.count() == self.n as usize
    }

    /// True if every sector of `run` is in the set.
    pub fn covers(&self, run: SectorRun) -> bool {
        run.range().all(|s| self.contains(s))
    }

    /// True if some sector of `run` is in the set.
    pub fn meets(&self, run: SectorRun) -> bool {
        run.range().any(|s| self.contains(s))
    }

    pub fn union(&self, other: &SectorSet) -> SectorSet {
        let mut out = *self;
        for (a, b) in out.words.iter_mut().zip(other.words.iter()) {
            *a |= b;
        }
        out
    }

    pub fn minus(&self, other: &SectorSet) -> SectorSet {
        let mut out = *self;
        for (a, b) in out.words.iter_mut().zip(other.words.iter()) {
            *a &= !b;
        }
        out
    }

    pub fn intersect(&self, other: &SectorSet) -> SectorSet {
        let mut out = *self;
        for (a, b) in out.words.iter_mut().zip(other.words.iter()) {
            *a &= b;
        }
        out
    }

    pub fn is_subset(&self, other: &SectorSet) -> bool {
        self.minus(other).is_empty()
    }

    /// The sectors not in the set.
    pub fn complement(&self) -> SectorSet {
        SectorSet::full(self.n as usize).minus(self)
    }

    /// The maximal runs of the set, ascending.
    pub fn runs(&self) -> impl Iterator<Item = SectorRun> + '_ {
        let n = self.n as usize;
        let mut s = 0usize;
        std::iter::from_fn(move || {
            while s < n && !self.contains(s) {
                s += 1;
            }
            if s >= n {
                return None;
            }
            let first = s;
            while s < n && self.contains(s) {
                s += 1;
            }
            Some(SectorRun::new(first, s - first))
        })
    }

    /// The smallest run holding every sector of the set (None if empty).
    pub fn hull(&self) -> Option<SectorRun> {
        let mut runs = self.runs();
        let first = runs.next()?;
        let last = runs.last().unwrap_or(first);
        Some(SectorRun::new(
            first.first as usize,
            last.end() - first.first as usize,
        ))
    }

    /// The bitmap as bytes, sector 0 in bit 0 of byte 0 (`sectors / 8`
    /// bytes; the on-disk form of docs/format.md).
    pub fn to_bytes(&self, out: &mut [u8]) {
        let nbytes = (self.n as usize).div_ceil(8);
        for (i, b) in out[..nbytes].iter_mut().enumerate() {
            *b = (self.words[i / 8] >> ((i % 8) * 8)) as u8;
        }
    }

    /// The set of `sectors` sectors the bytes describe; `None` if a bit past
    /// the last sector is set.
    pub fn from_bytes(sectors: usize, bytes: &[u8]) -> Option<SectorSet> {
        let mut s = SectorSet::empty(sectors);
        let nbytes = sectors.div_ceil(8);
        for (i, &b) in bytes[..nbytes].iter().enumerate() {
            s.words[i / 8] |= (b as u64) << ((i % 8) * 8);
        }
        let tail = sectors % 64;
        if tail != 0 && s.words[sectors / 64] >> tail != 0 {
            return None;
        }
        Some(s)
    }
}

/// The valid and dirty sectors of every slot that is not whole, in a pool of
/// words (no allocation per slot): `2 * words_per_set` words per entry.
pub struct PartialMaps {
    sectors: usize,
    words_per_set: usize,
    /// Slot -> index of its entry in the pool.
    index: HashMap<u32, u32>,
    pool: Vec<u64>,
    free_entries: Vec<u32>,
}

impl PartialMaps {
    pub fn new(sectors: usize) -> PartialMaps {
        PartialMaps {
            sectors,
            words_per_set: sectors.div_ceil(64),
            index: HashMap::new(),
            pool: Vec::new(),
            free_entries: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn heap_bytes(&self) -> u64 {
        // hashbrown: a (key, value) pair and a control byte per bucket.
        (self.index.capacity() * 9 + self.pool.capacity() * 8 + self.free_entries.capacity() * 4)
            as u64
    }

    /// (valid, dirty) of a slot that has an entry.
    pub fn get(&self, slot: u32) -> Option<(SectorSet, SectorSet)> {
        let &e = self.index.get(&slot)?;
        let w = self.words_per_set;
        let at = e as usize * 2 * w;
        let mut valid = SectorSet::empty(self.sectors);
        let mut dirty = SectorSet::empty(self.sectors);
        valid.words[..w].copy_from_slice(&self.pool[at..at + w]);
        dirty.words[..w].copy_from_slice(&self.pool[at + w..at + 2 * w]);
        Some((valid, dirty))
    }

    pub fn set(&mut self, slot: u32, valid: &SectorSet, dirty: &SectorSet) {
        assert!(!valid.is_empty() && dirty.is_subset(valid));
        let w = self.words_per_set;
        let e = match self.index.get(&slot) {
            Some(&e) => e,
            None => {
                let e = self.free_entries.pop().unwrap_or_else(|| {
                    let e = (self.pool.len() / (2 * w)) as u32;
                    self.pool.resize(self.pool.len() + 2 * w, 0);
                    e
                });
                self.index.insert(slot, e);
                e
            }
        };
        let at = e as usize * 2 * w;
        self.pool[at..at + w].copy_from_slice(&valid.words[..w]);
        self.pool[at + w..at + 2 * w].copy_from_slice(&dirty.words[..w]);
    }

    pub fn remove(&mut self, slot: u32) {
        if let Some(e) = self.index.remove(&slot) {
            self.free_entries.push(e);
            if self.index.is_empty() {
                // Give the memory of a burst of partial writes back.
                self.pool = Vec::new();
                self.free_entries = Vec::new();
                self.index.shrink_to_fit();
            }
        }
    }

    /// Every (slot, valid, dirty), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, SectorSet, SectorSet)> + '_ {
        self.index.keys().map(|&slot| {
            let (v, d) = self.get(slot).expect("indexed");
            (slot, v, d)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_hull_and_bytes() {
        let mut s = SectorSet::empty(8);
        s.insert_run(SectorRun::new(1, 2));
        s.insert_run(SectorRun::new(5, 3));
        assert_eq!(
            s.runs().map(|r| r.range()).collect::<Vec<_>>(),
            vec![1..3, 5..8]
        );
        assert_eq!(s.hull(), Some(SectorRun::new(1, 7)));
        assert_eq!(s.count(), 5);
        assert!(s.covers(SectorRun::new(5, 3)) && !s.covers(SectorRun::new(2, 2)));
        assert!(s.meets(SectorRun::new(3, 3)) && !s.meets(SectorRun::new(3, 2)));
        let mut b = [0u8; 1];
        s.to_bytes(&mut b);
        assert_eq!(b[0], 0b1110_0110);
        assert_eq!(SectorSet::from_bytes(8, &b), Some(s));
        assert_eq!(s.complement().runs().count(), 2);
        assert!(SectorSet::empty(8).hull().is_none());
    }

    #[test]
    fn big_blocks_and_stray_bits() {
        let n = MAX_SECTORS;
        let mut s = SectorSet::empty(n);
        s.insert_run(SectorRun::new(60, 10));
        s.insert_run(SectorRun::new(n - 1, 1));
        let mut bytes = vec![0u8; n / 8];
        s.to_bytes(&mut bytes);
        assert_eq!(SectorSet::from_bytes(n, &bytes), Some(s));
        assert!(SectorSet::full(n).is_full());
        // 12 sectors in two bytes: bits 12..16 must be zero.
        assert!(SectorSet::from_bytes(12, &[0xff, 0x1f]).is_none());
        assert!(SectorSet::from_bytes(12, &[0xff, 0x0f]).is_some());
    }

    #[test]
    fn maps_reuse_their_pool() {
        let mut m = PartialMaps::new(8);
        let v = SectorSet::of_run(8, SectorRun::new(0, 4));
        let d = SectorSet::of_run(8, SectorRun::new(1, 1));
        m.set(3, &v, &d);
        m.set(9, &v, &SectorSet::empty(8));
        assert_eq!(m.get(3), Some((v, d)));
        m.remove(3);
        assert_eq!(m.get(3), None);
        m.set(4, &v, &d);
        assert_eq!(m.pool.len(), 4, "the freed entry is reused");
        assert_eq!(m.iter().count(), 2);
    }
}
