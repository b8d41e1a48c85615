//! The once-a-second sampler: rates and per-interval percentiles for the
//! dashboard's time series, the writeback rate for the metrics, and how hot
//! each heat-map region is now. It reads only counters and copies
//! (`Engine::status`, `Engine::observations`: the metadata lock is held to
//! copy, never across anything else), on its own thread, so a slow or
//! stuck HTTP client cannot delay it and it never delays a request.
//!
//! Memory is fixed: `HISTORY` samples and one float per region of each
//! volume.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex, Rank};
use serde::{Deserialize, Serialize};

use crate::engine::observe::latency::{HistogramSnapshot, LatencySnapshot};
use crate::engine::stats::StatsSnapshot;
use crate::engine::Engine;

/// Samples kept: ten minutes at one a second.
pub const HISTORY: usize = 600;
/// How much of a region's heat is left after one more second.
const HEAT_DECAY: f64 = 0.5;

/// One second of the volume's life.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the sampler started.
    pub t_s: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    /// Blocks read from the cache over blocks read, in this interval
    /// (absent without reads).
    pub read_hit_ratio: Option<f64>,
    pub used_ratio: f64,
    pub dirty_ratio: f64,
    pub writeback_bytes_per_s: f64,
    pub origin_read_iops: f64,
    pub origin_write_iops: f64,
    /// Request latency percentiles in this interval, reads and writes
    /// (hits and misses together); bucket upper bounds, seconds.
    pub read_p50_s: Option<f64>,
    pub read_p99_s: Option<f64>,
    pub write_p50_s: Option<f64>,
    pub write_p99_s: Option<f64>,
}

struct Previous {
    at: Instant,
    stats: StatsSnapshot,
    latency: LatencySnapshot,
    /// Each volume's accesses per region.
    accesses: Vec<Vec<u64>>,
}

struct State {
    history: VecDeque<Sample>,
    /// Each volume's accesses per second per region, decayed by
    /// `HEAT_DECAY` a second.
    heat: Vec<Vec<f64>>,
    previous: Option<Previous>,
}

/// Shared between the sampler thread and the endpoints.
pub struct Sampler {
    started: Instant,
    state: Mutex<State>,
    stop: AtomicBool,
    wake: (Mutex<()>, Condvar),
}

impl Sampler {
    pub fn new() -> Sampler {
        Sampler {
            started: Instant::now(),
            state: Mutex::new(
                Rank::Sampler,
                State {
                    history: VecDeque::with_capacity(HISTORY),
                    heat: Vec::new(),
                    previous: None,
                },
            ),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(Rank::Sampler, ()), Condvar::new()),
        }
    }

    /// Starts the sampling thread; it ends after `stop` or when the
    /// engine is gone.
    pub fn start(
        self: &Arc<Self>,
        engine: std::sync::Weak<Engine>,
        every: Duration,
    ) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("tiercache-sampler".into())
            .spawn(move || {
                while !me.stop.load(Ordering::Acquire) {
                    let Some(engine) = engine.upgrade() else {
                        return;
                    };
                    me.sample(&engine);
                    drop(engine);
                    let mut g = me.wake.0.lock();
                    if !me.stop.load(Ordering::Acquire) {
                        me.wake.1.wait_for(&mut g, every);
                    }
                }
            })
            .map(|_| ())
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _g = self.wake.0.lock();
        self.wake.1.notify_all();
    }

    /// Takes one sample now.
    pub fn sample(&self, engine: &Engine) {
        let status = engine.status();
        let obs = engine.observations();
        let accesses: Vec<Vec<u64>> = (obs.heats.into_iter()).map(|h| h.accesses).collect();
        let now = Instant::now();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.heat.resize(accesses.len(), Vec::new());
        for (heat, counts) in st.heat.iter_mut().zip(&accesses) {
            heat.resize(counts.len(), 0.0);
        }
        if let Some(prev) = &st.previous {
            let dt = now.duration_since(prev.at).as_secs_f64().max(1e-3);
            let s = &status.stats;
            let p = &prev.stats;
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            let hits = s.read_hits.saturating_sub(p.read_hits);
            let misses = s.read_misses.saturating_sub(p.read_misses);
            let total = status.cache_blocks_total.max(1) as f64;
            let (read, write) = interval_latency(&obs.latency, &prev.latency);
            let sample = Sample {
                t_s: now.duration_since(self.started).as_secs_f64(),
                read_iops: rate(s.read_requests, p.read_requests),
                write_iops: rate(s.write_requests, p.write_requests),
                read_hit_ratio: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
                used_ratio: status.cache_blocks_used as f64 / total,
                dirty_ratio: status.cache_blocks_dirty as f64 / total,
                writeback_bytes_per_s: rate(s.blocks_written_back, p.blocks_written_back)
                    * f64::from(status.block_bytes),
                origin_read_iops: rate(s.origin_reads, p.origin_reads),
                origin_write_iops: rate(s.origin_writes, p.origin_writes),
                read_p50_s: read.quantile_s(0.5),
                read_p99_s: read.quantile_s(0.99),
                write_p50_s: write.quantile_s(0.5),
                write_p99_s: write.quantile_s(0.99),
            };
            for (v, heat) in st.heat.iter_mut().enumerate() {
                let before = prev.accesses.get(v);
                for (i, h) in heat.iter_mut().enumerate() {
                    let now_n = accesses[v][i];
                    let was = before.and_then(|b| b.get(i)).copied().unwrap_or(now_n);
                    let rate = now_n.saturating_sub(was) as f64 / dt;
                    *h = *h * HEAT_DECAY + rate * (1.0 - HEAT_DECAY);
                }
            }
            if st.history.len() == HISTORY {
                st.history.pop_front();
            }
            st.history.push_back(sample);
        }
        st.previous = Some(Previous {
            at: now,
            stats: status.stats,
            latency: obs.latency,
            accesses,
        });
    }

    /// The last `n` samples, oldest first.
    pub fn history(&self, n: usize) -> Vec<Sample> {
        let st = self.state.lock();
        let skip = st.history.len().saturating_sub(n);
        st.history.iter().skip(skip).cloned().collect()
    }

    /// The latest sample, if two have been taken.
    pub fn latest(&self) -> Option<Sample> {
        self.state.lock().history.back().cloned()
    }

    /// Each volume's accesses per second per heat-map region, recently.
    pub fn heat(&self) -> Vec<Vec<f64>> {
        self.state.lock().heat.clone()
    }

    pub fn uptime_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

/// Read and write latency histograms (hits and misses merged) of the
/// requests completed between two copies.
fn interval_latency(
    now: &LatencySnapshot,
    before: &LatencySnapshot,
) -> (HistogramSnapshot, HistogramSnapshot) {
    let merged = |op: &str| {
        let mut out = HistogramSnapshot::default();
        for (o, kind, h) in now.requests.iter().filter(|(o, _, _)| o == op) {
            let prev = before
                .requests
                .iter()
                .find(|(po, pk, _)| po == o && pk == kind)
                .map(|(_, _, p)| p);
            if out.counts.len() < h.counts.len() {
                out.counts.resize(h.counts.len(), 0);
            }
            for (i, &c) in h.counts.iter().enumerate() {
                let was = prev.and_then(|p| p.counts.get(i)).copied().unwrap_or(0);
                out.counts[i] += c.saturating_sub(was);
            }
            out.sum_s += h.sum_s - prev.map_or(0.0, |p| p.sum_s);
        }
        out
    };
    (merged("read"), merged("write"))
}
