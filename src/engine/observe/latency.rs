//! Latency histograms: per operation (read, write, flush, trim), hits and
//! misses apart (a miss made an origin request on the request's thread; a
//! flush, whose commit flushes the origin, and a trim that discards on the
//! origin count as hits unless they wrote to it), and per device (cache
//! and origin, reads and writes).
//! Buckets are powers of two of microseconds (1 us .. 2^25 us, about 33 s,
//! and one above), counted with relaxed atomics; a snapshot gives
//! Prometheus-style cumulative buckets and percentiles.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

pub const BUCKETS: usize = 27;

/// The upper bound of bucket `i`, in seconds (the last is unbounded).
pub fn bucket_upper_s(i: usize) -> f64 {
    if i + 1 >= BUCKETS {
        f64::INFINITY
    } else {
        (1u64 << i) as f64 / 1e6
    }
}

#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

/// A copy of a histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    /// Count per bucket (not cumulative); bucket i holds latencies up to
    /// 2^i us.
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
                return Some(bucket_upper_s(i).min((1u64 << (BUCKETS - 1)) as f64 / 1e6));
            }
        }
        None
    }
}

impl Histogram {
    pub fn record_ns(&self, ns: u64) {
        let us = ns / 1000;
        // Bucket i: us <= 2^i.
        let i = if us <= 1 {
            0
        } else {
            (64 - (us - 1).leading_zeros()) as usize
        };
        self.counts[i.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
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
    /// (op, "hit" or "miss", histogram)
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
        let kinds = ["hit", "miss"];
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
        assert_eq!(s.counts[2], 1); // 3 us -> <= 4 us
        assert_eq!(s.counts[7], 3); // 100 us -> <= 128 us
        assert_eq!(s.quantile_s(0.5), Some(128e-6));
        assert_eq!(s.quantile_s(1.0), Some(8192e-6));
        assert!((s.sum_s - 5.306e-3).abs() < 1e-9);
        assert_eq!(HistogramSnapshot::default().quantile_s(0.5), None);
    }
}
