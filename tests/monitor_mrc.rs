//! The miss-ratio curve as users see it: a trace of reads through a live
//! engine, and the curve in `status` and in the Prometheus metrics, against
//! an exact LRU stack simulation of the same trace: within 0.05 at every
//! size from 1/8x to 8x the cache, with the sampler's memory bounded.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use tiercache::device::{open_device, BlockDevice, DeviceRef, DeviceResult};
use tiercache::engine::{CreateOptions, Engine, Mode};
use tiercache::monitor::Monitor;

/// An origin of zeroes that stores nothing: the curve needs no data.
struct Zeroes(u64);

impl BlockDevice for Zeroes {
    fn size_bytes(&self) -> u64 {
        self.0
    }
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> DeviceResult<()> {
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> DeviceResult<()> {
        Ok(())
    }
    fn flush(&self) -> DeviceResult<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        "zeroes"
    }
}

/// Exact LRU hit ratios at `sizes`: reuse distances counted with a
/// Fenwick tree over access times.
fn exact_lru(trace: &[u64], sizes: &[u64]) -> Vec<f64> {
    let n = trace.len();
    let mut tree = vec![0i64; n + 1];
    let add = |tree: &mut Vec<i64>, pos: usize, d: i64| {
        let mut i = pos + 1;
        while i <= n {
            tree[i] += d;
            i += i & i.wrapping_neg();
        }
    };
    let prefix = |tree: &Vec<i64>, pos: usize| {
        let mut i = pos + 1;
        let mut s = 0;
        while i > 0 {
            s += tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    let mut last = std::collections::HashMap::new();
    let mut distances = Vec::new();
    for (t, &b) in trace.iter().enumerate() {
        if let Some(t0) = last.insert(b, t) {
            distances.push((prefix(&tree, t.saturating_sub(1)) - prefix(&tree, t0)) as u64);
            add(&mut tree, t0, -1);
        }
        add(&mut tree, t, 1);
    }
    sizes
        .iter()
        .map(|&c| distances.iter().filter(|&&d| d < c).count() as f64 / n as f64)
        .collect()
}

/// Skewed reads (block = N * u^3) with a sequential scan in every tenth.
fn trace(seed: u64, n: usize, blocks: u64) -> Vec<u64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut scan = 0;
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

#[test]
fn the_served_curve_is_within_0_05_of_exact_lru() {
    let seed = 11;
    let blocks = 100_000u64;
    let t = trace(seed, 400_000, blocks);
    let origin: DeviceRef = Arc::new(Zeroes((blocks * 2) * 4096));
    let cache = open_device("ram:16M").unwrap();
    let engine = Engine::create(
        cache,
        origin,
        &CreateOptions {
            mode: Mode::Writethrough,
            ..CreateOptions::default()
        },
    )
    .unwrap();
    for &b in &t {
        engine.read(b * 4096, 4096).unwrap();
    }
    let status = engine.status();
    let slots = status.cache_blocks_total;
    let mrc = &status.mrc;
    assert_eq!(mrc.points.len(), 7, "1/8x to 8x");
    let sizes: Vec<u64> = mrc.points.iter().map(|p| p.size_blocks).collect();
    let want = exact_lru(&t, &sizes);
    let metrics = Monitor::new(&engine, "t").take_now().unwrap();
    let text = metrics.metrics_text();
    for (p, w) in mrc.points.iter().zip(&want) {
        eprintln!(
            "size {:>6} blocks ({}x of {slots}): sampled {:.3}, exact {:.3}",
            p.size_blocks, p.size_factor, p.hit_ratio, w
        );
        assert!(
            (p.hit_ratio - w).abs() <= 0.05,
            "seed {seed}: size {}x: sampled {:.3}, exact {w:.3}",
            p.size_factor,
            p.hit_ratio
        );
        // The same point in the metrics.
        let name = format!(
            "tiercache_mrc_hit_ratio{{cache=\"t\",size_ratio=\"{}\"}} ",
            p.size_factor
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(&name))
            .unwrap_or_else(|| panic!("no {name} in the metrics"));
        let v: f64 = line[name.len()..].parse().unwrap();
        assert!((v - p.hit_ratio).abs() < 1e-9, "{line}");
    }
    // The curve is not flat: the trace was chosen so sizes matter.
    assert!(want[6] - want[0] > 0.2, "{want:?}");
    assert!(mrc.memory_bytes < 2 << 20, "{} bytes", mrc.memory_bytes);
    assert!(mrc.tracked_blocks <= 8192);
    engine.close().unwrap();
}
