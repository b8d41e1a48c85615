//! One writeback lane per origin: the background hands each volume's part
//! of a batch to its origin's lane and goes on, so an origin that hangs (a
//! frozen NBD server, a disk deep in error recovery) holds up its own lane
//! and nothing else. The other volumes' batches, the commits and the
//! free-slot reserve go on; a lane still at its last batch is passed over
//! until it is done (its origin's blocks wait for the next round), and a
//! lane that finishes wakes the background for the next one.
//!
//! A lane is a thread that lives as long as the background does, started
//! when its volume first has a batch (`Engine::add_volume` needs nothing
//! more). Only the background uses lanes: `flush` and the other writebacks
//! that wait for their result run each volume's batch on a thread of their
//! own and wait for it (`run.rs`, `on_threads`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use super::pace::Pace;
use crate::sync::{Condvar, Mutex, Rank};

/// What a lane's thread does: writes a batch of volume `v` back (errors
/// are the writer's to report), and wakes the background once the lane
/// is free again.
pub(crate) struct Runner {
    pub write: WriteBatch,
    pub wake: Box<dyn Fn() + Send + Sync>,
}

/// Writes a batch of volume `v`'s keys back at a pace.
pub(crate) type WriteBatch = Box<dyn Fn(usize, &[u64], Pace) + Send + Sync>;

/// A lane and its thread.
type Started = (Arc<Lane>, Option<JoinHandle<()>>);

/// Every origin's lane and its thread, by volume (the list's lock is
/// never held while a lane's is taken), and what they run (set when the
/// background starts: no lanes before).
pub(crate) struct Lanes {
    list: Mutex<Vec<Started>>,
    runner: OnceLock<Arc<Runner>>,
}

/// One origin's lane: the batch it was handed.
struct Lane {
    /// The batch to write back (keys of one volume, sorted), until the
    /// thread takes it.
    job: Mutex<Option<(Vec<u64>, Pace)>>,
    handed: Condvar,
    /// From the hand-over to the batch's end.
    busy: AtomicBool,
    stop: AtomicBool,
}

impl Default for Lanes {
    fn default() -> Lanes {
        Lanes {
            list: Mutex::new(Rank::WritebackLane, Vec::new()),
            runner: OnceLock::new(),
        }
    }
}

impl Lanes {
    /// From now on lanes run `runner`'s batches.
    pub(crate) fn start(&self, runner: Runner) {
        let _ = self.runner.set(Arc::new(runner));
    }

    /// True once `start`ed.
    pub(crate) fn started(&self) -> bool {
        self.runner.get().is_some()
    }

    /// Hands `keys` (volume `v`'s) to its lane, started if it is not yet,
    /// unless the lane is still at its last batch or lanes are not
    /// started: true if handed.
    pub(crate) fn hand(&self, v: usize, keys: Vec<u64>, pace: Pace) -> bool {
        let Some(runner) = self.runner.get() else {
            return false;
        };
        let lane = self.lane(runner, v);
        if lane.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        *lane.job.lock() = Some((keys, pace));
        lane.handed.notify_one();
        true
    }

    /// Volume `v`'s lane, its thread started the first time.
    fn lane(&self, runner: &Arc<Runner>, v: usize) -> Arc<Lane> {
        let mut list = self.list.lock();
        while list.len() <= v {
            let lane = Arc::new(Lane {
                job: Mutex::new(Rank::WritebackLane, None),
                handed: Condvar::new(),
                busy: AtomicBool::new(false),
                stop: AtomicBool::new(false),
            });
            let (me, runner) = (lane.clone(), runner.clone());
            let volume = list.len();
            let spawned = std::thread::Builder::new()
                .name(format!("tiercache-wb{volume}"))
                .spawn(move || me.run(&runner, volume));
            // Without a thread the lane stays busy: its volume is passed
            // over, and `flush` still writes it back.
            if spawned.is_err() {
                lane.busy.store(true, Ordering::Release);
            }
            list.push((lane, spawned.ok()));
        }
        list[v].0.clone()
    }

    /// Stops every lane and waits for it (each ends its batch first).
    pub(crate) fn stop(&self) {
        let lanes: Vec<Started> = self.list.lock().drain(..).collect();
        for (lane, _) in &lanes {
            lane.stop.store(true, Ordering::Release);
            let _g = lane.job.lock();
            lane.handed.notify_one();
        }
        for (_, handle) in lanes {
            // A lane whose batch held the engine's last reference ends it
            // on its own thread: it is not waited for by itself.
            match handle {
                Some(h) if h.thread().id() != std::thread::current().id() => {
                    let _ = h.join();
                }
                _ => {}
            }
        }
    }
}

impl Drop for Lanes {
    /// An engine dropped without a close or an abandon (a test's) leaves
    /// no lane waiting.
    fn drop(&mut self) {
        self.stop();
    }
}

impl Lane {
    /// The lane's thread: each batch handed over is written back to
    /// volume `v`'s origin, then the background is woken.
    fn run(&self, runner: &Runner, v: usize) {
        while let Some((keys, pace)) = self.next() {
            (runner.write)(v, &keys, pace);
            self.busy.store(false, Ordering::Release);
            (runner.wake)();
        }
    }

    /// Waits for the next batch; `None` once stopped.
    fn next(&self) -> Option<(Vec<u64>, Pace)> {
        let mut job = self.job.lock();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            if let Some(j) = job.take() {
                return Some(j);
            }
            self.handed.wait(&mut job);
        }
    }
}
