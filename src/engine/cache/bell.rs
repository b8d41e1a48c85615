//! What the cache tells whoever cleans it: "come now" (a crash log half
//! full, a cache short of free slots) and "slots were freed" (a commit or
//! the cleaner released some). The writeback thread waits on the first,
//! writes waiting for a slot on the second (`writeback/mod.rs`).

use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex, Rank};

pub(crate) struct Bell {
    /// The background thread's wake-up flag.
    wake: (Mutex<bool>, Condvar),
    slots_freed: (Mutex<()>, Condvar),
}

impl Default for Bell {
    fn default() -> Bell {
        Bell {
            wake: (Mutex::new(Rank::Background, false), Condvar::new()),
            slots_freed: (Mutex::new(Rank::SlotsFreed, ()), Condvar::new()),
        }
    }
}

impl Bell {
    /// Wakes the background thread for a round now.
    pub(crate) fn wake(&self) {
        let (lock, cv) = &self.wake;
        *lock.lock() = true;
        cv.notify_one();
    }

    /// The background thread between rounds: waits up to `d` for `wake`
    /// (not at all if it rang since the last round), and takes the ring.
    pub(crate) fn wait_woken(&self, d: Duration) {
        let (lock, cv) = &self.wake;
        let mut woken = lock.lock();
        if !*woken {
            cv.wait_for(&mut woken, d);
        }
        *woken = false;
    }

    /// A pause within a round: waits up to `d`, less if `wake` rings (or
    /// rang), not at all if `stop()` holds; leaves the ring for the round's
    /// end.
    pub(crate) fn pause(&self, d: Duration, stop: impl Fn() -> bool) {
        let (lock, cv) = &self.wake;
        let mut woken = lock.lock();
        if !*woken && !stop() {
            cv.wait_for(&mut woken, d);
        }
    }

    /// A commit made slots free: writes waiting for one try again.
    pub(crate) fn slots_freed(&self) {
        let _g = self.slots_freed.0.lock();
        self.slots_freed.1.notify_all();
    }

    /// Waits until `freed()` holds or the deadline passes or `closed()`
    /// does, ringing `wake` all along; false if it gave up.
    pub(crate) fn wait_freed(
        &self,
        deadline: Instant,
        freed: impl Fn() -> bool,
        closed: impl Fn() -> bool,
    ) -> bool {
        loop {
            self.wake();
            let (lock, cv) = &self.slots_freed;
            let mut g = lock.lock();
            if freed() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || closed() {
                return false;
            }
            cv.wait_for(&mut g, (deadline - now).min(Duration::from_millis(50)));
        }
    }
}
