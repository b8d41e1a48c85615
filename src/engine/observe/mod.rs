//! What the engine shows about itself beyond its counters: latency
//! histograms per operation (hits and misses apart) and per device, an LBA
//! heat map of the volume (cached, dirty, accessed), and an online
//! miss-ratio curve. Everything here is bounded in memory and updated
//! without the metadata lock, except the heat map's cached and dirty
//! counts, which the table keeps in step under it (O(1) per record).

pub mod heat;
pub mod latency;
pub mod mrc;

use crate::sync::{Mutex, Rank};
use serde::{Deserialize, Serialize};

use heat::Accesses;
use latency::Histograms;
use mrc::Shards;

/// Blocks the miss-ratio sampler tracks at most (about 0.4 MiB).
const MRC_MAX_TRACKED: usize = 8192;
/// Initial sampling rate: 1% of blocks.
const MRC_RATE: f64 = 0.01;
/// Cache sizes of the curve, as multiples of the cache's own size.
pub const MRC_SIZES: [f64; 7] = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0];

/// The observations of one engine.
pub struct Observe {
    pub latency: Histograms,
    pub accesses: Accesses,
    mrc: Mutex<Shards>,
    /// `Shards::threshold`, read without the lock to skip unsampled blocks.
    mrc_threshold: std::sync::atomic::AtomicU64,
    /// Every block access counted, sampled or not.
    all_refs: std::sync::atomic::AtomicU64,
    slot_count: u64,
}

/// One point of the miss-ratio curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MrcPoint {
    /// Cache size as a multiple of this cache's.
    pub size_factor: f64,
    pub size_blocks: u64,
    /// Estimated hit ratio (LRU) of a cache of that size, 0..=1.
    pub hit_ratio: f64,
}

/// The miss-ratio curve as `status` reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mrc {
    pub points: Vec<MrcPoint>,
    /// Fraction of blocks sampled now.
    pub sample_rate: f64,
    pub tracked_blocks: u64,
    pub memory_bytes: u64,
}

impl Observe {
    /// For a cache of `slot_count` slots over the volumes of `keys`.
    pub fn new(slot_count: u64, keys: &crate::engine::origin::address::KeySpace) -> Observe {
        let shards = Shards::new(MRC_RATE, MRC_MAX_TRACKED, slot_count * 8);
        Observe {
            latency: Histograms::default(),
            accesses: Accesses::new(keys),
            mrc_threshold: std::sync::atomic::AtomicU64::new(shards.threshold()),
            mrc: Mutex::new(Rank::Mrc, shards),
            all_refs: Default::default(),
            slot_count,
        }
    }

    /// An access of `block` by a request, for the curve and the heat map.
    /// The curve estimates the read hit ratio: a write places the block
    /// but is not counted.
    pub fn accessed(&self, block: u64, read: bool) {
        self.accesses.accessed(block);
        if read {
            self.all_refs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let t = self
            .mrc_threshold
            .load(std::sync::atomic::Ordering::Relaxed);
        if Shards::sampled(t, block) {
            let mut m = self.mrc.lock();
            if read {
                m.access(block);
            } else {
                m.write(block);
            }
            self.mrc_threshold
                .store(m.threshold(), std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn mrc(&self) -> Mrc {
        let all = self.all_refs.load(std::sync::atomic::Ordering::Relaxed);
        let m = self.mrc.lock();
        Mrc {
            points: MRC_SIZES
                .iter()
                .filter_map(|&f| {
                    let size_blocks = (self.slot_count as f64 * f) as u64;
                    m.hit_ratio(size_blocks, all).map(|hit_ratio| MrcPoint {
                        size_factor: f,
                        size_blocks,
                        hit_ratio,
                    })
                })
                .collect(),
            sample_rate: m.rate(),
            tracked_blocks: m.tracked() as u64,
            memory_bytes: m.heap_bytes(),
        }
    }

    pub fn heap_bytes(&self) -> u64 {
        self.mrc.lock().heap_bytes() + self.accesses.heap_bytes()
    }
}
