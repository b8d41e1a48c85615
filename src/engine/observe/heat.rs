//! The LBA heat map: each volume in `REGIONS` equal regions, and per
//! region how many blocks are cached, how many dirty, and how many accesses
//! it has seen (a volume's totals are their sums). Cached and dirty counts
//! live in the table and change with
//! every record under the metadata lock (O(1) each); accesses are relaxed
//! atomics bumped by requests. A snapshot copies 2 x 1024 counters under
//! the metadata lock (about a microsecond) and the accesses without it.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use std::sync::OnceLock;

use crate::engine::origin::address::{KeySpace, MAX_VOLUMES};

/// Regions of the heat map.
pub const REGIONS: usize = 1024;

fn region_blocks(origin_blocks: u64) -> u64 {
    origin_blocks.max(1).div_ceil(REGIONS as u64)
}

/// The region of a volume's `block` in a map of `region_blocks` per region.
fn region_of(block: u64, region_blocks: u64) -> usize {
    ((block / region_blocks) as usize).min(REGIONS - 1)
}

/// Cached and dirty blocks per region of each volume (kept by `Table`).
pub struct RegionCounts {
    keys: KeySpace,
    volumes: Vec<VolumeRegions>,
}

/// One volume's map.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeRegions {
    region_blocks: u64,
    pub cached: Vec<u32>,
    pub dirty: Vec<u32>,
    /// Cached blocks in all its regions (what its share is measured by).
    held: u64,
}

fn step(n: &mut u32, up: bool) {
    *n = if up { *n + 1 } else { *n - 1 };
}

impl RegionCounts {
    /// The maps of the volumes of `keys`.
    pub fn new(keys: &KeySpace) -> RegionCounts {
        let volumes = (0..keys.volumes())
            .map(|v| VolumeRegions {
                region_blocks: region_blocks(keys.blocks(v)),
                cached: vec![0; REGIONS],
                dirty: vec![0; REGIONS],
                held: 0,
            })
            .collect();
        RegionCounts {
            keys: keys.clone(),
            volumes,
        }
    }

    /// The map of `key`'s volume and its region in it.
    fn region(&mut self, key: u64) -> Option<(&mut VolumeRegions, usize)> {
        let (v, b) = self.keys.split(key);
        let map = self.volumes.get_mut(v)?;
        let r = region_of(b, map.region_blocks);
        Some((map, r))
    }

    /// A block became cached (`up`) or stopped being cached.
    pub fn cached(&mut self, key: u64, up: bool) {
        let Some((map, r)) = self.region(key) else {
            return;
        };
        step(&mut map.cached[r], up);
        map.held = if up { map.held + 1 } else { map.held - 1 };
    }

    /// Volume `v`'s cached blocks (0 for no such volume), in O(1).
    pub fn held(&self, v: usize) -> u64 {
        self.volumes.get(v).map_or(0, |m| m.held)
    }

    /// A cached block became dirty (`up`) or clean.
    pub fn dirty(&mut self, key: u64, up: bool) {
        let Some((map, r)) = self.region(key) else {
            return;
        };
        step(&mut map.dirty[r], up);
    }

    /// Volume `v`'s map.
    pub fn volume(&self, v: usize) -> Option<&VolumeRegions> {
        self.volumes.get(v)
    }

    /// (cached, dirty) blocks of each volume: its regions' sums (2 x
    /// 1024 adds a volume, under the metadata lock).
    pub fn totals(&self) -> Vec<(u64, u64)> {
        let sum = |counts: &[u32]| counts.iter().map(|&c| u64::from(c)).sum::<u64>();
        (self.volumes.iter())
            .map(|m| (sum(&m.cached), sum(&m.dirty)))
            .collect()
    }

    /// Which regions of each volume hold dirty blocks (the stale map's
    /// unit, journal/stale_map.rs): 16 words a volume, under the metadata
    /// lock.
    pub fn dirty_regions(&self) -> Vec<DirtyRegions> {
        (self.volumes.iter().enumerate())
            .map(|(v, m)| {
                let mut bits = [0u64; REGIONS / 64];
                for (r, _) in m.dirty.iter().enumerate().filter(|(_, &n)| n > 0) {
                    bits[r / 64] |= 1 << (r % 64);
                }
                DirtyRegions {
                    region_blocks: m.region_blocks,
                    volume_blocks: self.keys.blocks(v),
                    bits,
                }
            })
            .collect()
    }

    pub fn heap_bytes(&self) -> u64 {
        let per = |m: &VolumeRegions| (m.cached.capacity() * 4 + m.dirty.capacity() * 4) as u64;
        self.volumes.iter().map(per).sum::<u64>() + (self.volumes.capacity() * 64) as u64
    }
}

/// The regions of one volume that hold at least one dirty block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyRegions {
    pub region_blocks: u64,
    pub volume_blocks: u64,
    pub bits: [u64; REGIONS / 64],
}

impl DirtyRegions {
    /// True if every region dirty in `other` is dirty here too, in the
    /// same cut of the volume.
    pub fn covers(&self, other: &DirtyRegions) -> bool {
        self.region_blocks == other.region_blocks
            && self.volume_blocks == other.volume_blocks
            && (self.bits.iter().zip(&other.bits)).all(|(&a, &b)| b & !a == 0)
    }

    /// The dirty regions as runs of blocks `(first, count)`, adjacent
    /// regions merged, the last cut at the volume's end.
    pub fn block_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for r in (0..REGIONS).filter(|&r| self.bits[r / 64] & (1 << (r % 64)) != 0) {
            let first = r as u64 * self.region_blocks;
            let end = (first + self.region_blocks).min(self.volume_blocks);
            if first >= end {
                continue;
            }
            match runs.last_mut() {
                Some((f, n)) if *f + *n == first => *n = end - *f,
                _ => runs.push((first, end - first)),
            }
        }
        runs
    }
}

/// One volume's blocks a region, and its counts.
type VolumeAccesses = (AtomicU64, Vec<AtomicU64>);

/// Accesses per region of each volume.
pub struct Accesses {
    keys: KeySpace,
    /// A slot per volume the cache can hold, set when it is added (read
    /// without a lock by every request).
    volumes: Box<[OnceLock<Box<VolumeAccesses>>]>,
}

impl Accesses {
    /// As `RegionCounts::new`.
    pub fn new(keys: &KeySpace) -> Accesses {
        let a = Accesses {
            keys: keys.clone(),
            volumes: (0..MAX_VOLUMES).map(|_| OnceLock::new()).collect(),
        };
        (0..keys.volumes()).for_each(|v| a.volume_added(v));
        a
    }

    /// Volume `v` is in the key space now: its counts start.
    pub fn volume_added(&self, v: usize) {
        let counts = (0..REGIONS).map(|_| AtomicU64::new(0)).collect();
        let region = AtomicU64::new(region_blocks(self.keys.blocks(v)));
        let _ = self.volumes[v].set(Box::new((region, counts)));
    }

    fn volume(&self, v: usize) -> Option<&VolumeAccesses> {
        self.volumes.get(v)?.get().map(|a| &**a)
    }

    /// The volume of `key`.
    pub fn volume_of(&self, key: u64) -> usize {
        self.keys.split(key).0
    }

    pub fn accessed(&self, key: u64) {
        let (v, b) = self.keys.split(key);
        let Some((region_blocks, counts)) = self.volume(v) else {
            return;
        };
        let r = region_of(b, region_blocks.load(Ordering::Relaxed));
        counts[r].fetch_add(1, Ordering::Relaxed);
    }

    /// Volume `v` grew (the key space has its new size): its regions are
    /// cut again and their counts start over.
    pub fn volume_grew(&self, v: usize) {
        if let Some((region, counts)) = self.volume(v) {
            region.store(region_blocks(self.keys.blocks(v)), Ordering::Relaxed);
            counts.iter().for_each(|c| c.store(0, Ordering::Relaxed));
        }
    }

    /// Volume `v`'s accesses per region (empty for no such volume).
    pub fn snapshot(&self, v: usize) -> Vec<u64> {
        let Some((_, counts)) = self.volume(v) else {
            return Vec::new();
        };
        counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    pub fn heap_bytes(&self) -> u64 {
        let set = self.volumes.iter().filter(|v| v.get().is_some()).count();
        (set * REGIONS * 8 + self.volumes.len() * 16) as u64
    }
}

/// A copy of the heat map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeatMap {
    /// Origin blocks per region (the last region may hold fewer).
    pub region_blocks: u64,
    pub block_bytes: u32,
    pub cached: Vec<u32>,
    pub dirty: Vec<u32>,
    /// Accesses since the engine opened (rates come from two copies).
    pub accesses: Vec<u64>,
}
