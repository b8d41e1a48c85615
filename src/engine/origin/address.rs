//! Where each volume's blocks sit in the engine's one address space.
//!
//! A cache holds several origins (volumes). The engine addresses them all
//! in one space of bytes: volume `v`'s byte `o` is at `v << VOLUME_SHIFT |
//! o`, and a block's key in the table is its address over the block size.
//! So the table's key is (volume, block) in one `u64`, and volume 0's keys
//! are its block numbers: a cache of one origin keeps the format, the
//! 4-byte entries and the speed it had before volumes.
//!
//! A request never crosses a volume's end (`Cache::check_span`), so the
//! blocks of one request are consecutive keys of one volume.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Bits of a volume's byte offset: each volume has 4 PiB of address space.
pub const VOLUME_SHIFT: u32 = 52;
/// Volumes one cache can hold (as many as the superblock's volume table
/// has records: format/volumes.rs).
pub const MAX_VOLUMES: usize = 59;
/// The largest origin a volume can have.
pub const MAX_VOLUME_BYTES: u64 = 1 << VOLUME_SHIFT;
const OFFSET_MASK: u64 = MAX_VOLUME_BYTES - 1;

/// The volume an address belongs to.
pub fn volume_of(addr: u64) -> usize {
    (addr >> VOLUME_SHIFT) as usize
}

/// The byte offset of an address inside its volume.
pub fn offset_in_volume(addr: u64) -> u64 {
    addr & OFFSET_MASK
}

/// The address of byte `offset` of the volume at `base`. An offset past
/// the volume's 4 PiB stays in the volume's space, at its last byte, so
/// that the door refuses it as past the volume's end: a client's offset
/// never reaches another volume's blocks.
pub fn in_volume(base: u64, offset: u64) -> u64 {
    base + offset.min(OFFSET_MASK)
}

/// The address of volume `v`'s byte 0.
pub fn base(v: usize) -> u64 {
    (v as u64) << VOLUME_SHIFT
}

/// The blocks that can be cached in each volume, and how keys map to
/// them: what the table checks a key against.
///
/// Clones share the volumes' sizes and count: a volume that grows online
/// (`Engine::grow_volume`) or is added (`Engine::add_volume`) does so for
/// every holder of a clone at once.
#[derive(Clone, Debug)]
pub struct KeySpace {
    /// log2 of the keys in one volume's space.
    shift: u32,
    /// Every volume's blocks, `MAX_VOLUMES` of them: 0 past the count, so
    /// a key of a volume not (yet) there is outside without a look at it.
    blocks: Arc<[AtomicU64]>,
    count: Arc<AtomicUsize>,
}

impl PartialEq for KeySpace {
    fn eq(&self, other: &KeySpace) -> bool {
        self.shift == other.shift && self.sizes() == other.sizes()
    }
}

impl Eq for KeySpace {}

impl KeySpace {
    /// Volumes of `blocks[v]` whole blocks of `block_bytes` (a power of two).
    pub fn new(block_bytes: u64, blocks: Vec<u64>) -> KeySpace {
        assert!(blocks.len() <= MAX_VOLUMES, "at most {MAX_VOLUMES} volumes");
        let count = Arc::new(AtomicUsize::new(blocks.len()));
        let sizes = blocks.into_iter().chain(std::iter::repeat(0));
        KeySpace {
            shift: VOLUME_SHIFT - block_bytes.trailing_zeros(),
            blocks: sizes.take(MAX_VOLUMES).map(AtomicU64::new).collect(),
            count,
        }
    }

    /// One more volume of `blocks` blocks, for every clone: returns its
    /// index. Its size is stored before the count that makes it a volume.
    pub fn add(&self, blocks: u64) -> usize {
        let v = self.count.load(Ordering::Acquire);
        assert!(v < MAX_VOLUMES, "at most {MAX_VOLUMES} volumes");
        self.blocks[v].store(blocks, Ordering::Release);
        self.count.store(v + 1, Ordering::Release);
        v
    }

    /// Every volume's blocks.
    fn sizes(&self) -> Vec<u64> {
        (0..self.volumes()).map(|v| self.blocks(v)).collect()
    }

    /// `key`'s key once volume `v` is taken out (`Engine::remove_volume`):
    /// the volumes after `v` move down one place; `None` for one of `v`'s.
    pub fn key_without(&self, v: usize, key: u64) -> Option<u64> {
        let (kv, b) = self.split(key);
        match kv.cmp(&v) {
            std::cmp::Ordering::Less => Some(key),
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => Some(self.base_key(kv - 1) + b),
        }
    }

    /// Volume `v` has `blocks` blocks from now on, for every clone (it
    /// only grows: a smaller count is ignored).
    pub fn grow(&self, v: usize, blocks: u64) {
        if v < self.volumes() {
            self.blocks[v].fetch_max(blocks, Ordering::AcqRel);
        }
    }

    /// One volume of `blocks` blocks (its keys are its block numbers), for
    /// tests of the table alone.
    #[cfg(any(test, feature = "testing"))]
    pub fn one(blocks: u64) -> KeySpace {
        KeySpace::new(4096, vec![blocks])
    }

    /// The volume of `key` and its block in it.
    pub fn split(&self, key: u64) -> (usize, u64) {
        ((key >> self.shift) as usize, key & ((1 << self.shift) - 1))
    }

    /// The key of volume `v`'s first block.
    pub fn base_key(&self, v: usize) -> u64 {
        (v as u64) << self.shift
    }

    /// True if `key` is a cacheable block of some volume.
    pub fn contains(&self, key: u64) -> bool {
        let (v, b) = self.split(key);
        b < self.blocks(v)
    }

    /// One past the highest key any volume has.
    pub fn end(&self) -> u64 {
        match self.volumes() {
            0 => 0,
            n => self.base_key(n - 1) + self.blocks(n - 1),
        }
    }

    pub fn volumes(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Volume `v`'s blocks (0 for no such volume).
    pub fn blocks(&self, v: usize) -> u64 {
        self.blocks.get(v).map_or(0, |n| n.load(Ordering::Acquire))
    }

    /// Why `key` is not a block of any volume, for a damage report.
    pub fn describe_outside(&self, key: u64) -> String {
        let (v, b) = self.split(key);
        let n = self.volumes();
        match (v < n).then(|| self.blocks(v)) {
            None if n == 1 => format!(
                "origin block {key} beyond the origin ({} blocks)",
                self.blocks(0)
            ),
            None => format!("block {b} of volume {v}, which the cache does not have"),
            Some(n) if self.volumes() == 1 => {
                format!("origin block {b} beyond the origin ({n} blocks)")
            }
            Some(n) => format!("block {b} beyond volume {v}'s end ({n} blocks)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_volume_and_block() {
        for bs in [4096u64, 65536, 1 << 20] {
            let k = KeySpace::new(bs, vec![10, 20, 5]);
            assert_eq!(k.split(7), (0, 7));
            let key = (base(2) + 4 * bs) / bs;
            assert_eq!(k.split(key), (2, 4));
            assert_eq!(k.base_key(2), base(2) / bs);
            assert!(k.contains(key) && !k.contains(key + 1) && k.contains(9) && !k.contains(10));
            assert!(!k.contains(k.base_key(3)));
            assert_eq!(k.end(), k.base_key(2) + 5);
            assert!(k.describe_outside(k.base_key(3)).contains("volume 3"));
        }
        assert_eq!(volume_of(base(7) + 5), 7);
        assert_eq!(in_volume(base(1), 5), base(1) + 5);
        assert_eq!(volume_of(in_volume(base(1), u64::MAX)), 1);
        assert_eq!(volume_of(in_volume(base(1), MAX_VOLUME_BYTES)), 1);
        assert_eq!(offset_in_volume(base(7) + 5), 5);
        // A lone volume's keys are its block numbers; volume 1's begin
        // past any narrow (31-bit) entry.
        assert_eq!(KeySpace::one(9).end(), 9);
        assert!(KeySpace::new(1 << 20, vec![1, 1]).base_key(1) >= 1 << 31);
        assert!(KeySpace::one(9)
            .describe_outside(12)
            .contains("beyond the origin"));
    }

    #[test]
    fn a_volume_grows_for_every_clone_and_never_shrinks() {
        let k = KeySpace::new(4096, vec![10, 20]);
        let held = k.clone();
        let key = k.base_key(1) + 25;
        assert!(!held.contains(key));
        k.grow(1, 30);
        assert!(held.contains(key) && held.blocks(1) == 30 && held.blocks(0) == 10);
        k.grow(1, 5);
        k.grow(9, 5);
        assert_eq!(held, KeySpace::new(4096, vec![10, 30]));
        // A volume added is there for every clone.
        assert_eq!(k.add(7), 2);
        assert!(held.contains(held.base_key(2) + 6) && !held.contains(held.base_key(2) + 7));
        assert_eq!(held, KeySpace::new(4096, vec![10, 30, 7]));
        assert_eq!(held.end(), held.base_key(2) + 7);
    }
}
