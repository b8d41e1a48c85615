//! Latency histograms: per operation (read, write, flush, trim), hits and
//! misses apart (a miss made an origin request on the request's thread; a
//! flush, whose commit flushes the origin, and a trim that discards on the
//! origin count as hits unless they wrote to it), and per device (cache
//! and origin, reads and writes).
//! Buckets are log-linear, as HdrHistogram's: up to 4 us one per
//! microsecond, then each power of two of microseconds in four equal
//! steps (5, 6, 7, 8, 10, 12, 14, 16, 20, ... us) up to 2^25 us (about
//! 33 s), and one above. A bucket's upper bound is at most 25% above any
//! latency in it, so a percentile read from the bounds is within 25% (the
//! old power-of-two buckets made "4.10 ms" mean anything from 2 to 4 ms).
//! Counted with relaxed atomics; a snapshot gives Prometheus-style
//! cumulative buckets and percentiles.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Steps per power of two.
const STEPS: usize = 4;
/// The largest power of two (of microseconds) with buckets of its own.
const TOP_POWER: usize = 25;
/// 4 one-microsecond buckets, 4 steps for each power from 2^2 to 2^24
/// (ending at 2^25 us), and one unbounded.
pub const BUCKETS: usize = STEPS + STEPS * (TOP_POWER - 2) + 1;

/// The upper bound of bucket `i`, in seconds (the last is unbounded).
pub fn bucket_upper_s(i: usize) -> f64 {
    if i + 1 >= BUCKETS {
        return f64::INFINITY;
    }
    bucket_upper_us(i) as f64 / 1e6
}

/// The upper bound of bucket `i` (not the last), in microseconds.
fn bucket_upper_us(i: usize) -> u64 {
    if i < STEPS {
        return i as u64 + 1;
    }
    let power = 2 + (i - STEPS) / STEPS;
    let step = (i - STEPS) % STEPS;
    (1u64 << power) + (step as u64 + 1) * (1u64 << (power - 2))
}

/// The bucket of a latency of `us` microseconds.
fn bucket_of(us: u64) -> usize {
    if us <= STEPS as u64 {
        return us.saturating_sub(1) as usize;
    }
    // us - 1 lies in [2^power, 2^(power+1)), in step `step` of four (the
    // two bits below its top bit): bucket 4 + 4 (power - 2) + step.
    let power = (63 - (us - 1).leading_zeros()) as usize;
    let step = ((us - 1) >> (power - 2)) as usize & (STEPS - 1);
    (STEPS * (power - 1) + step).min(BUCKETS - 1)
}

pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A copy of a histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    /// Count per bucket (not cumulative); bucket i holds latencies up to
    /// `bucket_upper_s(i)`.
    pub counts: Vec<u64>,
    pub sum_s: f64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The upper bound (seconds) of the bucket holding quantile `q`.
    pub fn quantile_s(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let want = (q * n as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(bucket_upper_s(i).min((1u64 << TOP_POWER) as f64 / 1e6));
            }
        }
        None
    }
}

impl Histogram {
    pub fn record_ns(&self, ns: u64) {
        // Whole microseconds, as before (a fraction is below the
        // resolution of any bucket but the first four).
        let i = bucket_of(ns / 1000);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_s: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// Request operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
}

/// Every histogram of an engine.
#[derive(Default)]
pub struct Histograms {
    /// [op][hit = 0, miss = 1]
    requests: [[Histogram; 2]; 4],
    /// cache read, cache write, origin read, origin write
    devices: [Histogram; 4],
}

/// All histograms, copied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySnapshot {
    /// (op, "cache" or "origin", histogram): whether the request made an
    /// origin request.
    pub requests: Vec<(String, String, HistogramSnapshot)>,
    /// (device "cache" or "origin", "read" or "write", histogram)
    pub devices: Vec<(String, String, HistogramSnapshot)>,
}

impl Histograms {
    /// A request of `op` took `ns`; `hit`: it needed no origin I/O.
    pub fn request(&self, op: Op, hit: bool, ns: u64) {
        self.requests[op as usize][!hit as usize].record_ns(ns);
    }

    /// A device request took `ns` (`dev` as in `admission::Dev`).
    pub fn device(&self, dev: usize, ns: u64) {
        self.devices[dev].record_ns(ns);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let ops = ["read", "write", "flush", "trim"];
        // Requests, not blocks: "cache" when the request made no origin
        // request, "origin" when it did. Not "hit" and "miss": those count
        // blocks (`write_hits`: blocks written while cached), and a write
        // of new blocks in writeback is a write miss served by the cache.
        let kinds = ["cache", "origin"];
        let devs = [
            ("cache", "read"),
            ("cache", "write"),
            ("origin", "read"),
            ("origin", "write"),
        ];
        LatencySnapshot {
            requests: ops
                .iter()
                .enumerate()
                .flat_map(|(o, op)| {
                    kinds.iter().enumerate().map(move |(k, kind)| {
                        (
                            op.to_string(),
                            kind.to_string(),
                            self.requests[o][k].snapshot(),
                        )
                    })
                })
                .collect(),
            devices: devs
                .iter()
                .enumerate()
                .map(|(d, (dev, rw))| (dev.to_string(), rw.to_string(), self.devices[d].snapshot()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_quantiles() {
        let h = Histogram::default();
        for us in [1u64, 2, 3, 100, 100, 100, 5000] {
            h.record_ns(us * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 7);
        assert_eq!(s.counts[0], 1); // 1 us
        assert_eq!(s.counts[1], 1); // 2 us
        assert_eq!(s.counts[2], 1); // 3 us
        assert_eq!(s.counts[bucket_of(100)], 3); // 100 us -> <= 112 us
        assert_eq!(s.quantile_s(0.5), Some(112e-6));
        assert_eq!(s.quantile_s(1.0), Some(5120e-6));
        assert!((s.sum_s - 5.306e-3).abs() < 1e-9);
        assert_eq!(HistogramSnapshot::default().quantile_s(0.5), None);
    }

    /// Every latency lands in the bucket whose bounds hold it, and the
    /// upper bound is within 25% of it: a percentile read within 25%.
    #[test]
    fn buckets_are_within_a_quarter() {
        let mut us = 1u64;
        while us < 1 << 26 {
            let i = bucket_of(us);
            if i + 1 < BUCKETS {
                let upper = bucket_upper_us(i);
                assert!(us <= upper, "{us} us above bucket {i}'s {upper}");
                assert!(
                    i == 0 || us > bucket_upper_us(i - 1),
                    "{us} us below bucket {i}"
                );
                assert!(upper as f64 <= us as f64 * 1.25, "{us} us: bound {upper}");
            } else {
                assert!(us > 1 << TOP_POWER, "{us} us in the last bucket");
            }
            us += 1 + us / 97;
        }
        assert_eq!(bucket_upper_us(BUCKETS - 2), 1 << TOP_POWER);
        let increasing = (1..BUCKETS - 1).all(|i| bucket_upper_us(i) > bucket_upper_us(i - 1));
        assert!(increasing);
    }
}
