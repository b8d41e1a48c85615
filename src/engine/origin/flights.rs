//! Writebacks in flight. Background writeback reads a run of dirty blocks
//! from the cache under their block locks, then releases the locks for the
//! slow origin write, so reads and writes of those blocks do not wait for
//! the origin. Two rules keep that safe:
//!
//! - *Touched*: every write or trim that takes the lock of a block in flight
//!   marks it touched (it may have changed the block). A touched block is
//!   not marked clean when its writeback ends; it stays dirty and is written
//!   back again later.
//! - *Origin order*: a foreground origin write or discard of a block whose
//!   writeback is still writing the origin waits for that write first, so
//!   older data never lands on the origin after newer data.
//!
//! The writeback marks its blocks clean only after it has taken their locks
//! again, so no write is between its lookup and its cache write then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::{Condvar, Mutex, Rank};

#[derive(Default)]
struct Flight {
    /// The origin write is still under way.
    writing: bool,
    /// A write or trim took the block's lock meanwhile.
    touched: bool,
}

pub struct Flights {
    map: Mutex<HashMap<u64, Flight>>,
    /// Blocks in flight; lets the common case skip the mutex.
    count: AtomicUsize,
    origin_done: Condvar,
}

impl Default for Flights {
    fn default() -> Self {
        Flights {
            map: Mutex::new(Rank::Flights, HashMap::new()),
            count: AtomicUsize::new(0),
            origin_done: Condvar::new(),
        }
    }
}

impl Flights {
    /// True if `block`'s writeback is in flight.
    pub fn contains(&self, block: u64) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.map.lock().contains_key(&block)
    }

    /// Puts blocks in flight, origin write pending. The caller holds their
    /// block locks and has read their data.
    pub fn start(&self, blocks: impl Iterator<Item = u64>) {
        let mut map = self.map.lock();
        for b in blocks {
            let old = map.insert(
                b,
                Flight {
                    writing: true,
                    touched: false,
                },
            );
            // Kept in release builds: two flights of one block could land
            // older data on the origin after newer.
            assert!(old.is_none(), "block {b} already in flight");
        }
        self.count.store(map.len(), Ordering::Release);
    }

    /// The origin write of these blocks has ended (either way): foreground
    /// origin writes to them may go ahead.
    pub fn origin_written(&self, blocks: impl Iterator<Item = u64>) {
        let mut map = self.map.lock();
        for b in blocks {
            if let Some(f) = map.get_mut(&b) {
                f.writing = false;
            }
        }
        self.origin_done.notify_all();
    }

    /// Takes blocks out of flight; for each, whether it was touched.
    pub fn finish(&self, blocks: impl Iterator<Item = u64>) -> Vec<bool> {
        let mut map = self.map.lock();
        let touched = blocks
            .map(|b| map.remove(&b).is_none_or(|f| f.touched))
            .collect();
        self.count.store(map.len(), Ordering::Release);
        // A waiter may still be looking for a block that was never written
        // (origin write failed before `origin_written`).
        self.origin_done.notify_all();
        touched
    }

    /// Marks the blocks in flight within `first..=last` touched. The caller
    /// holds the locks of that range.
    pub fn touch(&self, first: u64, last: u64) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.map.lock();
        for (_, f) in map.iter_mut().filter(|(b, _)| (first..=last).contains(*b)) {
            f.touched = true;
        }
    }

    /// True if some block within `first..=last` has its origin write under
    /// way: what `wait_origin` would wait for.
    pub fn origin_writing(&self, first: u64, last: u64) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        writing_in(&self.map.lock(), first, last)
    }

    /// Waits until no block within `first..=last` has its origin write
    /// under way. The caller holds the locks of that range, so no new
    /// flight can start in it.
    pub fn wait_origin(&self, first: u64, last: u64) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.map.lock();
        while writing_in(&map, first, last) {
            self.origin_done.wait(&mut map);
        }
    }
}

/// True if a flight in `map` within `first..=last` is still writing the
/// origin.
fn writing_in(map: &HashMap<u64, Flight>, first: u64, last: u64) -> bool {
    map.iter()
        .any(|(b, f)| f.writing && (first..=last).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn touched_blocks_are_reported() {
        let f = Flights::default();
        f.start([3, 4, 5].into_iter());
        assert!(f.contains(4) && !f.contains(6));
        f.touch(5, 9);
        f.origin_written([3, 4, 5].into_iter());
        assert_eq!(f.finish([3, 4, 5].into_iter()), vec![false, false, true]);
        assert!(!f.contains(4));
        // Once finished, touching is a no-op.
        f.touch(0, 100);
    }

    #[test]
    fn origin_waiters_wait_for_the_origin_write_only() {
        let f = Arc::new(Flights::default());
        f.start([7].into_iter());
        f.wait_origin(8, 9); // other blocks: no wait
        let f2 = f.clone();
        let t = std::thread::spawn(move || f2.wait_origin(0, 7));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!t.is_finished());
        f.origin_written([7].into_iter());
        t.join().unwrap();
        // Still in flight (not finished) but the origin write is done.
        assert!(f.contains(7));
        f.wait_origin(7, 7);
        f.finish([7].into_iter());
    }
}
