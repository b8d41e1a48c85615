//! Promotions left until after their read's data went back to the reader
//! (`Cache::read_request_into`, pipeline.rs; `Promotion`, read.rs): the bytes they hold are bounded
//! (a client whose reads end early could otherwise queue any number), and
//! closing waits for them, so none stores after the checkpoint.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The most bytes of origin data deferred promotions hold at once, per
/// cache; a read past it stores before its data goes back, as before.
pub(crate) const DEFER_MAX_BYTES: u64 = 64 << 20;

/// How long closing waits for deferred promotions (each is a cache write
/// and a record; only a cache device that stopped answering takes longer).
const CLOSE_WAIT: Duration = Duration::from_secs(30);

#[derive(Default)]
pub(crate) struct Deferred {
    /// Bytes held by the promotions under way.
    bytes: AtomicU64,
}

/// A deferred promotion under way: its bytes count until it drops.
pub(crate) struct Ticket<'a> {
    deferred: &'a Deferred,
    bytes: u64,
}

impl Deferred {
    /// A ticket for a promotion of `bytes`, if they fit the budget and the
    /// cache is not closed. (Closing sets `closed`, then waits for the
    /// count: a ticket is either seen by that wait or sees `closed`.)
    pub(crate) fn begin<'a>(&'a self, bytes: u64, closed: &AtomicBool) -> Option<Ticket<'a>> {
        // Made only once reserved: a ticket's drop gives its bytes back.
        if !self.reserve(bytes, closed) {
            return None;
        }
        Some(Ticket {
            deferred: self,
            bytes,
        })
    }

    /// `begin` for a promotion that outlives the borrow of the cache (a
    /// task on the blocking pool: io/direct_origin.rs): true if `bytes`
    /// are taken, which the promotion gives back with `release` once
    /// stored.
    pub(crate) fn reserve(&self, bytes: u64, closed: &AtomicBool) -> bool {
        let before = self.bytes.fetch_add(bytes, Ordering::SeqCst);
        if before + bytes > DEFER_MAX_BYTES || closed.load(Ordering::SeqCst) {
            self.release(bytes);
            return false;
        }
        true
    }

    /// Gives back bytes `reserve` took.
    pub(crate) fn release(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// Waits for the promotions under way (at close, `closed` set), at most
    /// `CLOSE_WAIT`; false if some are still going.
    pub(crate) fn wait_idle(&self) -> bool {
        crate::sync::poll_until(CLOSE_WAIT, || self.bytes() == 0)
    }

    /// Bytes held now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.deferred.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_bounds_the_bytes_and_closing_refuses() {
        let d = Deferred::default();
        let open = AtomicBool::new(false);
        let a = d.begin(DEFER_MAX_BYTES - 4096, &open).expect("fits");
        assert!(d.begin(8192, &open).is_none(), "past the budget");
        let b = d.begin(4096, &open).expect("fits exactly");
        assert_eq!(d.bytes(), DEFER_MAX_BYTES);
        drop((a, b));
        assert_eq!(d.bytes(), 0);
        assert!(d.wait_idle());
        assert!(d.begin(4096, &AtomicBool::new(true)).is_none(), "closed");
        assert_eq!(d.bytes(), 0);
    }

    #[test]
    fn closing_waits_for_a_promotion_under_way() {
        let d = std::sync::Arc::new(Deferred::default());
        let open = AtomicBool::new(false);
        let t = d.begin(4096, &open).unwrap();
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                drop(t);
            });
            assert!(d.wait_idle());
        });
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
