//! The LBA heat map: the volume in `REGIONS` equal regions, and per region
//! how many blocks are cached, how many dirty, and how many accesses it
//! has seen. Cached and dirty counts live in the table and change with
//! every record under the metadata lock (O(1) each); accesses are relaxed
//! atomics bumped by requests. A snapshot copies 2 x 1024 counters under
//! the metadata lock (about a microsecond) and the accesses without it.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Regions of the heat map.
pub const REGIONS: usize = 1024;

fn region_blocks(origin_blocks: u64) -> u64 {
    origin_blocks.max(1).div_ceil(REGIONS as u64)
}

/// The region of `block` in a map of `region_blocks` per region, or `None`
/// for a key from `limit` on (another volume's).
fn region_of(block: u64, region_blocks: u64, limit: u64) -> Option<usize> {
    (block < limit).then(|| ((block / region_blocks) as usize).min(REGIONS - 1))
}

/// Cached and dirty blocks per region (kept by `Table`). The map covers
/// the first volume; keys from `limit` on (other volumes') are not counted.
pub struct RegionCounts {
    region_blocks: u64,
    limit: u64,
    pub cached: Vec<u32>,
    pub dirty: Vec<u32>,
}

impl RegionCounts {
    /// The map of a volume of `origin_blocks` whose keys end before `limit`.
    pub fn new(origin_blocks: u64, limit: u64) -> RegionCounts {
        RegionCounts {
            region_blocks: region_blocks(origin_blocks),
            limit,
            cached: vec![0; REGIONS],
            dirty: vec![0; REGIONS],
        }
    }

    fn region(&self, block: u64) -> Option<usize> {
        region_of(block, self.region_blocks, self.limit)
    }

    /// A block became cached (`up`) or stopped being cached.
    pub fn cached(&mut self, block: u64, up: bool) {
        let Some(r) = self.region(block) else { return };
        self.cached[r] = if up {
            self.cached[r] + 1
        } else {
            self.cached[r] - 1
        };
    }

    /// A cached block became dirty (`up`) or clean.
    pub fn dirty(&mut self, block: u64, up: bool) {
        let Some(r) = self.region(block) else { return };
        self.dirty[r] = if up {
            self.dirty[r] + 1
        } else {
            self.dirty[r] - 1
        };
    }

    pub fn heap_bytes(&self) -> u64 {
        (self.cached.capacity() * 4 + self.dirty.capacity() * 4) as u64
    }
}

/// Accesses per region.
pub struct Accesses {
    region_blocks: u64,
    limit: u64,
    counts: Vec<AtomicU64>,
}

impl Accesses {
    /// As `RegionCounts::new`.
    pub fn new(origin_blocks: u64, limit: u64) -> Accesses {
        Accesses {
            region_blocks: region_blocks(origin_blocks),
            limit,
            counts: (0..REGIONS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn accessed(&self, block: u64) {
        let Some(r) = region_of(block, self.region_blocks, self.limit) else {
            return;
        };
        self.counts[r].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    pub fn heap_bytes(&self) -> u64 {
        (self.counts.capacity() * 8) as u64
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
