//! An online miss-ratio curve: what hit ratio an LRU cache of each size
//! would have on the requests seen, from spatially sampled reuse distances
//! (SHARDS: Waldspurger et al., "Efficient MRC Construction with SHARDS",
//! FAST'15).
//!
//! A block is sampled when a hash of its number falls below a threshold:
//! every access of a sampled block is seen, so reuse distances among
//! sampled blocks, scaled by the sampling rate, estimate the true ones.
//! Memory is bounded (the fixed-size variant of the paper): at most
//! `max_tracked` sampled blocks; when one more would exceed it, the
//! threshold is lowered to drop the block with the largest hash, and the
//! rate with it. Each reference is weighted by the inverse of the rate in
//! force when it was counted. The shortfall between that weight and the
//! number of all references (most often: hot blocks that were not sampled)
//! counts as hits at distance zero, as in the paper's SHARDS-adj, which
//! removes most of the bias sampling brings to small cache sizes.
//!
//! Reuse distance of an access = distinct sampled blocks accessed since the
//! same block's previous access, counted with a Fenwick tree over access
//! times (compacted when the times run out of room): O(log n) per sampled
//! access. The curve estimates LRU; tiercache's default policy is S3-FIFO,
//! which does at least as well on most workloads with scans.

use std::collections::HashMap;

/// Hash values live in [0, 2^24).
const HASH_SPACE: u64 = 1 << 24;

fn hash24(block: u64) -> u64 {
    let mut z = block.wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 40
}

/// Fenwick (binary indexed) tree of counts over positions 0..n.
struct Fenwick {
    tree: Vec<u32>,
}

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick {
            tree: vec![0; n + 1],
        }
    }

    fn add(&mut self, pos: usize, delta: i32) {
        let mut i = pos + 1;
        while i < self.tree.len() {
            self.tree[i] = (self.tree[i] as i64 + delta as i64) as u32;
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of positions 0..=pos.
    fn prefix(&self, pos: usize) -> u64 {
        let mut i = pos + 1;
        let mut s = 0u64;
        while i > 0 {
            s += self.tree[i] as u64;
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// The sampled state: the last access time of each tracked block.
pub struct Shards {
    max_tracked: usize,
    /// Sample a block when its hash is below this.
    threshold: u64,
    /// Tracked block -> (its hash, its last access time).
    last: HashMap<u64, (u64, usize)>,
    /// Access times in use, for the distance count.
    times: Fenwick,
    /// Which block holds each time slot (u64::MAX: none).
    time_owner: Vec<u64>,
    next_time: usize,
    /// Weighted reuse distances: `hist[i]` holds the weight of references
    /// whose distance (in blocks, scaled) falls in bucket i (see `bucket`).
    hist: Vec<f64>,
    /// Weight of first references (cold misses) and of all references.
    cold_weight: f64,
    total_weight: f64,
    /// Blocks per histogram bucket.
    bucket_blocks: u64,
}

/// Histogram buckets: enough for distances up to 8x the largest size asked.
const BUCKETS: usize = 4096;

impl Shards {
    /// Tracks at most `max_tracked` blocks, starting at `rate` (0..=1),
    /// for curves up to `max_size_blocks`.
    pub fn new(rate: f64, max_tracked: usize, max_size_blocks: u64) -> Shards {
        let cap = 4 * max_tracked.max(16);
        Shards {
            max_tracked: max_tracked.max(16),
            threshold: ((rate.clamp(0.0, 1.0) * HASH_SPACE as f64) as u64).max(1),
            last: HashMap::with_capacity(max_tracked + 1),
            times: Fenwick::new(cap),
            time_owner: vec![u64::MAX; cap],
            next_time: 0,
            hist: vec![0.0; BUCKETS],
            cold_weight: 0.0,
            total_weight: 0.0,
            bucket_blocks: max_size_blocks.div_ceil(BUCKETS as u64).max(1),
        }
    }

    /// The current sampling rate.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / HASH_SPACE as f64
    }

    pub fn tracked(&self) -> usize {
        self.last.len()
    }

    /// Heap bytes held (bounded by `max_tracked`).
    pub fn heap_bytes(&self) -> u64 {
        (self.last.capacity() * 33
            + self.times.tree.capacity() * 4
            + self.time_owner.capacity() * 8
            + self.hist.capacity() * 8) as u64
    }

    /// True if `block` is sampled at the current rate (cheap: callers test
    /// this before taking any lock).
    pub fn sampled(threshold: u64, block: u64) -> bool {
        hash24(block) < threshold
    }

    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// A read of `block`, which the caller found sampled: it counts
    /// toward the curve.
    pub fn access(&mut self, block: u64) {
        self.reference(block, true);
    }

    /// A write of `block`, which the caller found sampled: the block becomes
    /// the most recently used (a write puts it in the cache) but the curve
    /// counts reads only, as the hit ratio it is set beside does.
    pub fn write(&mut self, block: u64) {
        self.reference(block, false);
    }

    fn reference(&mut self, block: u64, counted: bool) {
        let h = hash24(block);
        if h >= self.threshold {
            return;
        }
        let weight = if counted { 1.0 / self.rate() } else { 0.0 };
        self.total_weight += weight;
        if self.next_time == self.time_owner.len() {
            self.compact();
        }
        let now = self.next_time;
        self.next_time += 1;
        match self.last.get(&block).copied() {
            Some((_, t0)) => {
                // Distinct tracked blocks accessed after t0.
                let after = self.times.prefix(now.saturating_sub(1)) - self.times.prefix(t0);
                let distance = (after as f64 / self.rate()) as u64;
                let b = ((distance / self.bucket_blocks) as usize).min(BUCKETS - 1);
                self.hist[b] += weight;
                self.times.add(t0, -1);
                self.time_owner[t0] = u64::MAX;
            }
            None => {
                self.cold_weight += weight;
            }
        }
        self.times.add(now, 1);
        self.time_owner[now] = block;
        self.last.insert(block, (h, now));
        if self.last.len() > self.max_tracked {
            self.lower_threshold();
        }
    }

    /// Drops the tracked block with the largest hash and samples below it
    /// from now on.
    fn lower_threshold(&mut self) {
        let (&victim, &(h, t)) = self
            .last
            .iter()
            .max_by_key(|(_, (h, _))| *h)
            .expect("over the limit, so not empty");
        self.threshold = h.max(1);
        self.last.remove(&victim);
        self.times.add(t, -1);
        self.time_owner[t] = u64::MAX;
    }

    /// Renumbers the times in use to 0..n, in order.
    fn compact(&mut self) {
        let cap = self.time_owner.len();
        let mut order: Vec<(usize, u64)> = self
            .time_owner
            .iter()
            .enumerate()
            .filter(|(_, &b)| b != u64::MAX)
            .map(|(t, &b)| (t, b))
            .collect();
        order.sort_unstable_by_key(|&(t, _)| t);
        self.times = Fenwick::new(cap);
        self.time_owner = vec![u64::MAX; cap];
        for (new_t, &(_, b)) in order.iter().enumerate() {
            self.times.add(new_t, 1);
            self.time_owner[new_t] = b;
            if let Some(e) = self.last.get_mut(&b) {
                e.1 = new_t;
            }
        }
        self.next_time = order.len();
    }

    /// Estimated LRU hit ratio (0..=1) of a cache of `size_blocks`, given
    /// the number of all references (sampled or not) seen so far.
    pub fn hit_ratio(&self, size_blocks: u64, all_refs: u64) -> Option<f64> {
        if self.total_weight <= 0.0 || all_refs == 0 || size_blocks == 0 {
            return None;
        }
        // A reference with distance d hits a cache of more than d blocks.
        // The last bucket holds every distance past the histogram's range
        // too: never hits.
        let full = (size_blocks / self.bucket_blocks) as usize;
        let hits: f64 = self.hist[..full.min(BUCKETS - 1)].iter().sum();
        let adjust = all_refs as f64 - self.total_weight;
        Some(((hits + adjust) / all_refs as f64).clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Exact LRU hit ratios at `sizes` (stack distances, Fenwick over time).
    fn exact(trace: &[u64], sizes: &[u64]) -> Vec<f64> {
        let mut last: HashMap<u64, usize> = HashMap::new();
        let mut f = Fenwick::new(trace.len());
        let mut dist: Vec<u64> = Vec::new();
        for (t, &b) in trace.iter().enumerate() {
            if let Some(t0) = last.insert(b, t) {
                let after = f.prefix(t.saturating_sub(1)) - f.prefix(t0);
                dist.push(after);
                f.add(t0, -1);
            }
            f.add(t, 1);
        }
        sizes
            .iter()
            .map(|&c| dist.iter().filter(|&&d| d < c).count() as f64 / trace.len() as f64)
            .collect()
    }

    fn zipf_trace(seed: u64, n: usize, blocks: u64) -> Vec<u64> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        // Zipf-like: block = blocks * u^3 concentrates on low numbers; a
        // tenth of the accesses are a sequential scan.
        let mut scan = 0u64;
        (0..n)
            .map(|i| {
                if i % 10 == 0 {
                    scan += 1;
                    blocks + scan % (blocks / 2)
                } else {
                    let u: f64 = rng.gen();
                    (blocks as f64 * u * u * u) as u64
                }
            })
            .collect()
    }

    /// A write puts its block in the cache but the curve counts reads: a
    /// read of every block just written hits in a cache that holds them
    /// all, and writes add no misses of their own.
    #[test]
    fn writes_place_blocks_and_only_reads_count() {
        let mut s = Shards::new(1.0, 1000, 1000);
        for b in 0..100 {
            s.write(b);
        }
        for b in 0..100 {
            s.access(b);
        }
        // Each read's block was last touched 99 distinct blocks ago.
        assert_eq!(s.hit_ratio(200, 100), Some(1.0));
        assert!(s.hit_ratio(50, 100).unwrap() < 0.05);
    }

    #[test]
    fn the_sampled_curve_is_within_0_05_of_exact() {
        let blocks = 200_000u64;
        let trace = zipf_trace(7, 1_000_000, blocks);
        let cache = 20_000u64;
        let sizes: Vec<u64> = [1, 2, 4, 8, 16, 32, 64]
            .iter()
            .map(|k| cache * k / 8)
            .collect();
        let want = exact(&trace, &sizes);
        let mut s = Shards::new(0.01, 8192, cache * 8);
        for &b in &trace {
            if Shards::sampled(s.threshold(), b) {
                s.access(b);
            }
        }
        for (k, &c) in sizes.iter().enumerate() {
            let got = s.hit_ratio(c, trace.len() as u64).unwrap();
            assert!(
                (got - want[k]).abs() <= 0.05,
                "size {c}: sampled {got:.3}, exact {:.3}",
                want[k]
            );
        }
        assert!(s.tracked() <= 8192);
        assert!(s.heap_bytes() < 2 << 20, "{} bytes", s.heap_bytes());
    }

    #[test]
    fn a_tight_bound_lowers_the_rate_and_stays_close() {
        let trace = zipf_trace(3, 400_000, 100_000);
        let sizes = [2_000u64, 10_000, 40_000];
        let want = exact(&trace, &sizes);
        let mut s = Shards::new(0.1, 1000, 80_000);
        for &b in &trace {
            if Shards::sampled(s.threshold(), b) {
                s.access(b);
            }
        }
        assert!(s.rate() < 0.1, "the bound lowered the rate");
        assert!(s.tracked() <= 1000);
        for (k, &c) in sizes.iter().enumerate() {
            let got = s.hit_ratio(c, trace.len() as u64).unwrap();
            assert!(
                (got - want[k]).abs() <= 0.05,
                "size {c}: {got:.3} vs {:.3}",
                want[k]
            );
        }
    }

    #[test]
    fn exact_lru_on_a_known_sequence() {
        // a b c a b c: distances 2, 2, 2 for the repeats.
        let t = [1u64, 2, 3, 1, 2, 3];
        assert_eq!(exact(&t, &[2, 3]), vec![0.0, 0.5]);
        let mut s = Shards::new(1.0, 100, 16);
        for &b in &t {
            s.access(b);
        }
        assert_eq!(s.hit_ratio(2, 6), Some(0.0));
        assert_eq!(s.hit_ratio(3, 6), Some(0.5));
    }
}
