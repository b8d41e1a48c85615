//! Lock statistics (cargo feature `lockstat`, off by default): for each
//! lock rank (`crate::sync::Rank`), how often it was taken, how often a
//! taker found it held and waited, how long it waited, and how long the
//! lock was held. `crate::sync::Mutex` and the per-block locks
//! (engine/origin/locks.rs, whose hold times are not kept: a block is held
//! across a request's device I/O) report here. Counters are process-wide
//! relaxed atomics; `snapshot` and `Snapshot::since` give a measured
//! stretch, `bench/lock_stats.rs` prints it per request
//! (docs/concurrency.md, "Scaling past two cores").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::sync::Rank;

/// More than there are ranks.
const SLOTS: usize = 40;

struct Counters {
    taken: [AtomicU64; SLOTS],
    waited: [AtomicU64; SLOTS],
    wait_ns: [AtomicU64; SLOTS],
    hold_ns: [AtomicU64; SLOTS],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

static COUNTERS: Counters = Counters {
    taken: [ZERO; SLOTS],
    waited: [ZERO; SLOTS],
    wait_ns: [ZERO; SLOTS],
    hold_ns: [ZERO; SLOTS],
};

fn add(a: &[AtomicU64; SLOTS], rank: Rank, n: u64) {
    a[(rank as usize).min(SLOTS - 1)].fetch_add(n, Ordering::Relaxed);
}

/// A lock of `rank` was taken.
pub fn taken(rank: Rank) {
    add(&COUNTERS.taken, rank, 1);
}

/// A taker of a lock of `rank` found it held and waited from `since`.
pub fn waited(rank: Rank, since: Instant) {
    add(&COUNTERS.waited, rank, 1);
    add(&COUNTERS.wait_ns, rank, since.elapsed().as_nanos() as u64);
}

/// A lock of `rank` taken at `at` was released.
pub fn released(rank: Rank, at: Instant) {
    add(&COUNTERS.hold_ns, rank, at.elapsed().as_nanos() as u64);
}

/// One rank's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankStat {
    pub taken: u64,
    pub waited: u64,
    pub wait_ns: u64,
    pub hold_ns: u64,
}

/// Every rank's counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot(pub Vec<(Rank, RankStat)>);

pub fn snapshot() -> Snapshot {
    let get = |a: &[AtomicU64; SLOTS], i: usize| a[i].load(Ordering::Relaxed);
    Snapshot(
        Rank::ALL
            .iter()
            .map(|&r| {
                let i = (r as usize).min(SLOTS - 1);
                let s = RankStat {
                    taken: get(&COUNTERS.taken, i),
                    waited: get(&COUNTERS.waited, i),
                    wait_ns: get(&COUNTERS.wait_ns, i),
                    hold_ns: get(&COUNTERS.hold_ns, i),
                };
                (r, s)
            })
            .collect(),
    )
}

impl Snapshot {
    /// What happened between `before` and this snapshot; ranks not taken
    /// are left out.
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        let diff = self.0.iter().zip(&before.0).map(|((r, a), (_, b))| {
            let s = RankStat {
                taken: a.taken - b.taken,
                waited: a.waited - b.waited,
                wait_ns: a.wait_ns - b.wait_ns,
                hold_ns: a.hold_ns - b.hold_ns,
            };
            (*r, s)
        });
        Snapshot(diff.filter(|(_, s)| s.taken > 0).collect())
    }

    /// A table: per rank, acquisitions per request (`requests`), the share
    /// that waited, the mean wait and the mean hold.
    pub fn table(&self, requests: u64) -> String {
        let mut out = String::from(
            "| lock (rank) | taken per request | waited | mean wait | mean hold |\n|---|--:|--:|--:|--:|\n",
        );
        for (r, s) in &self.0 {
            let per = |n: u64, d: u64| n as f64 / d.max(1) as f64;
            let hold = match *r {
                Rank::Blocks => "(a request)".to_string(),
                _ => format!("{:.0} ns", per(s.hold_ns, s.taken)),
            };
            out += &format!(
                "| {r:?} | {:.2} | {:.2}% | {:.0} ns | {hold} |\n",
                per(s.taken, requests),
                100.0 * per(s.waited, s.taken),
                per(s.wait_ns, s.waited),
            );
        }
        out
    }
}
