//! What the engine shows about itself beyond its counters: latency
//! histograms per operation (hits and misses apart) and per device, an LBA
//! heat map of the volume (cached, dirty, accessed), and an online
//! miss-ratio curve. Everything here is bounded in memory and updated
//! without the metadata lock, except the heat map's cached and dirty
//! counts, which the table keeps in step under it (O(1) per record).

pub mod heat;
pub mod latency;
pub mod mrc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::engine::origin::address::{KeySpace, MAX_VOLUMES};
use crate::sync::{Mutex, Rank};
use serde::{Deserialize, Serialize};

use heat::Accesses;
use latency::Histograms;
use mrc::Shards;

/// Blocks the miss-ratio sampler tracks at most (about 0.4 MiB).
const MRC_MAX_TRACKED: usize = 8192;
/// Blocks each volume's own sampler tracks at most (about 0.2 MiB a
/// volume, kept only for a cache of several), and its initial rate: 10%,
/// so that a small volume's working set is sampled too (the rate falls
/// by itself once more blocks than that are tracked).
const VOLUME_MRC_MAX_TRACKED: usize = 4096;
const VOLUME_MRC_RATE: f64 = 0.1;
/// Initial sampling rate: 1% of blocks.
const MRC_RATE: f64 = 0.01;
/// Cache sizes of the curve, as multiples of the cache's own size.
pub const MRC_SIZES: [f64; 7] = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0];

/// The observations of one engine.
pub struct Observe {
    pub latency: Histograms,
    pub accesses: Accesses,
    /// The whole cache's curve.
    whole: Curve,
    /// The cache's slots (it grows with the cache device; the curves keep
    /// the range they were started with).
    slot_count: AtomicU64,
    /// Each volume's own curve, for a cache of several (the shares'
    /// split, policy/share.rs): a slot per volume the cache can hold, set
    /// once there are two; none for a cache of one.
    curves: Box<[OnceLock<Curve>]>,
}

/// One sampled curve: the sampler, its threshold (`Shards::threshold`,
/// read without the lock to skip unsampled blocks), and every read it is a
/// curve of, sampled or not.
struct Curve {
    shards: Mutex<Shards>,
    threshold: AtomicU64,
    reads: AtomicU64,
}

impl Curve {
    fn new(rate: f64, max_tracked: usize, max_size_blocks: u64) -> Curve {
        let shards = Shards::new(rate, max_tracked, max_size_blocks);
        Curve {
            threshold: AtomicU64::new(shards.threshold()),
            shards: Mutex::new(Rank::Mrc, shards),
            reads: AtomicU64::new(0),
        }
    }

    fn accessed(&self, block: u64, read: bool) {
        if read {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        if Shards::sampled(self.threshold.load(Ordering::Relaxed), block) {
            let mut m = self.shards.lock();
            if read {
                m.access(block);
            } else {
                m.write(block);
            }
            self.threshold.store(m.threshold(), Ordering::Relaxed);
        }
    }
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
    pub fn new(slot_count: u64, keys: &KeySpace) -> Observe {
        let o = Observe {
            latency: Histograms::default(),
            accesses: Accesses::new(keys),
            whole: Curve::new(MRC_RATE, MRC_MAX_TRACKED, slot_count * 8),
            slot_count: AtomicU64::new(slot_count),
            curves: (0..MAX_VOLUMES).map(|_| OnceLock::new()).collect(),
        };
        o.volumes_now(keys.volumes());
        o
    }

    /// The cache has `n` volumes now (one was added online): with two or
    /// more, each has its own curve (a volume's starts when it is added,
    /// or when the cache's second is).
    pub fn volumes_now(&self, n: usize) {
        if n < 2 {
            return;
        }
        for c in &self.curves[..n] {
            c.get_or_init(|| {
                Curve::new(VOLUME_MRC_RATE, VOLUME_MRC_MAX_TRACKED, self.slot_count())
            });
        }
    }

    /// The cache's slots now.
    pub fn slot_count(&self) -> u64 {
        self.slot_count.load(Ordering::Relaxed)
    }

    /// The cache device grew to `slot_count` slots.
    pub fn slots_grew(&self, slot_count: u64) {
        self.slot_count.store(slot_count, Ordering::Relaxed);
    }

    fn curve(&self, v: usize) -> Option<&Curve> {
        self.curves.get(v)?.get()
    }

    /// Volume `v`'s reads so far and its estimated LRU hit ratio at each
    /// of `sizes` (blocks; 0 where nothing is known yet); `None` for a
    /// cache of one volume (the cache's curve is its own).
    pub fn volume_curve(&self, v: usize, sizes: &[u64]) -> Option<(u64, Vec<f64>)> {
        let c = self.curve(v)?;
        let reads = c.reads.load(Ordering::Relaxed);
        let m = c.shards.lock();
        let hits = sizes.iter().map(|&b| m.hit_ratio(b, reads).unwrap_or(0.0));
        Some((reads, hits.collect()))
    }

    /// Volume `v`'s curve at the cache's sizes up to the whole cache (its
    /// sampler counts no further), as `status` shows it.
    pub fn volume_mrc(&self, v: usize) -> Option<Mrc> {
        let c = self.curve(v)?;
        let reads = c.reads.load(Ordering::Relaxed);
        let mut mrc = curve_points(&c.shards.lock(), reads, self.slot_count());
        mrc.points.retain(|p| p.size_factor <= 1.0);
        Some(mrc)
    }

    /// An access of `block` by a request, for the curve and the heat map.
    /// The curve estimates the read hit ratio: a write places the block
    /// but is not counted.
    pub fn accessed(&self, block: u64, read: bool) {
        self.accesses.accessed(block);
        if let Some(c) = self.curve(self.accesses.volume_of(block)) {
            c.accessed(block, read);
        }
        self.whole.accessed(block, read);
    }

    pub fn mrc(&self) -> Mrc {
        let all = self.whole.reads.load(Ordering::Relaxed);
        curve_points(&self.whole.shards.lock(), all, self.slot_count())
    }

    pub fn heap_bytes(&self) -> u64 {
        let curves: u64 = (self.curves.iter().filter_map(OnceLock::get))
            .map(|c| c.shards.lock().heap_bytes())
            .sum();
        self.whole.shards.lock().heap_bytes() + self.accesses.heap_bytes() + curves
    }
}

/// The curve of `m` (of `all` reads) at `MRC_SIZES` of a cache of
/// `slot_count`.
fn curve_points(m: &Shards, all: u64, slot_count: u64) -> Mrc {
    Mrc {
        points: MRC_SIZES
            .iter()
            .filter_map(|&f| {
                let size_blocks = (slot_count as f64 * f) as u64;
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
