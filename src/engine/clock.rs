//! The engine's time: real, or simulated for deterministic tests.
//!
//! Every decision the engine takes by time (a dirty block's age, the commit
//! interval, how long clients have been away, whether the cache device has
//! stayed slower than the origin, how long writeback pauses) reads this
//! clock. A real clock counts from when the engine opened. A simulated one
//! moves only when its owner advances it, so a test that drives the
//! engine's steps from one thread with a seeded scheduler replays bit for
//! bit: the same seed gives the same decisions and the same device events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a simulated clock's Unix time starts (2026-01-01).
const SIM_EPOCH_UNIX_SECS: u64 = 1_767_225_600;

/// Simulated time, in nanoseconds; clones share it.
#[derive(Clone, Debug, Default)]
pub struct SimClock(Arc<AtomicU64>);

impl SimClock {
    pub fn new() -> SimClock {
        SimClock::default()
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_nanos() as u64, Ordering::AcqRel);
    }

    pub fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// Where the engine reads the time.
#[derive(Clone, Debug)]
pub struct Clock {
    start: Instant,
    sim: Option<SimClock>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::real()
    }
}

impl Clock {
    /// Wall-clock time since now.
    pub fn real() -> Clock {
        Clock {
            start: Instant::now(),
            sim: None,
        }
    }

    /// Time that moves only when `sim` is advanced.
    pub fn sim(sim: SimClock) -> Clock {
        Clock {
            start: Instant::now(),
            sim: Some(sim),
        }
    }

    pub fn is_sim(&self) -> bool {
        self.sim.is_some()
    }

    /// Nanoseconds since the clock started.
    pub fn now_ns(&self) -> u64 {
        match &self.sim {
            Some(s) => s.now_ns(),
            None => self.start.elapsed().as_nanos() as u64,
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// Seconds since the Unix epoch (a cache's creation time): the
    /// system's, or for a simulated clock a fixed date plus its time.
    pub fn unix_secs(&self) -> u64 {
        match &self.sim {
            Some(s) => SIM_EPOCH_UNIX_SECS + s.now_ns() / 1_000_000_000,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// Nanoseconds from `since` (a `now_ns` reading) to now.
    pub fn since_ns(&self, since: u64) -> u64 {
        self.now_ns().saturating_sub(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sim_clock_moves_only_when_advanced() {
        let sim = SimClock::new();
        let clock = Clock::sim(sim.clone());
        let t = clock.now_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(clock.since_ns(t), 0);
        sim.advance(Duration::from_millis(1500));
        assert_eq!(clock.now_ms(), 1500);
        assert_eq!(clock.since_ns(t), 1_500_000_000);
    }

    #[test]
    fn a_real_clock_moves() {
        let clock = Clock::real();
        let t = clock.now_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.since_ns(t) >= 2_000_000);
    }
}
