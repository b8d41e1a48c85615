//! Byte-range locks that make the server's read-modify-write safe.
//!
//! The volume takes whole 512-byte sectors, so a write that covers part of
//! a sector is done as read sector, merge, write sector. Two of those on
//! one sector, or one and any other write to that sector, must not
//! interleave: the later write-back would put old bytes over the other
//! write's new ones. So every write-like request holds a lock on the range
//! it changes while it runs: shared for an aligned request (aligned writes
//! to one range may run together: NBD leaves their order to the server),
//! exclusive over the whole sector span for a read-modify-write.
//!
//! Invariants:
//! - Two overlapping entries of which one is exclusive are never both
//!   granted.
//! - Grants are first come, first served among conflicting entries: an
//!   entry waits only for granted entries and for conflicting entries with
//!   a smaller sequence number, so there is no cycle (no deadlock) and a
//!   read-modify-write is not starved by a stream of aligned writes.
//! - Cheap when unused: a shared request with no exclusive entry anywhere
//!   is granted without looking at the others.

use std::sync::Arc;

use crate::sync::{Mutex, Rank};
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u64,
    end: u64,
    exclusive: bool,
    granted: bool,
    seq: u64,
}

impl Entry {
    fn conflicts(&self, o: &Entry) -> bool {
        (self.exclusive || o.exclusive) && self.start < o.end && o.start < self.end
    }
}

#[derive(Default)]
struct Table {
    /// Slots; `None` is free (listed in `free`).
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
    next_seq: u64,
    /// Exclusive entries, granted or waiting.
    exclusive: usize,
    /// Entries not yet granted.
    waiting: usize,
}

impl Table {
    fn grantable(&self, slot: usize) -> bool {
        let e = self.entries[slot].expect("entry of a live guard");
        if !e.exclusive && self.exclusive == 0 {
            return true;
        }
        self.entries.iter().enumerate().all(|(i, o)| match o {
            Some(o) if i != slot && e.conflicts(o) => !o.granted && o.seq > e.seq,
            _ => true,
        })
    }
}

/// The locks of one export, shared by all its connections.
pub struct RangeLocks {
    table: Mutex<Table>,
    released: Notify,
}

impl Default for RangeLocks {
    fn default() -> Self {
        RangeLocks {
            table: Mutex::new(Rank::NbdRanges, Table::default()),
            released: Notify::new(),
        }
    }
}

/// A held (or, inside [`RangeLocks::lock`], awaited) range. Dropping it
/// releases the range, also when the waiting future is cancelled.
pub struct RangeGuard {
    locks: Arc<RangeLocks>,
    slot: usize,
}

impl RangeLocks {
    pub fn new() -> Arc<RangeLocks> {
        Arc::new(RangeLocks::default())
    }

    /// Locks bytes `[start, end)`, waiting for conflicting holders.
    pub async fn lock(self: &Arc<Self>, start: u64, end: u64, exclusive: bool) -> RangeGuard {
        assert!(start < end, "empty lock range {start}..{end}");
        let guard = {
            let mut t = self.table.lock();
            let seq = t.next_seq;
            t.next_seq += 1;
            let e = Entry {
                start,
                end,
                exclusive,
                granted: false,
                seq,
            };
            let slot = match t.free.pop() {
                Some(i) => {
                    t.entries[i] = Some(e);
                    i
                }
                None => {
                    t.entries.push(Some(e));
                    t.entries.len() - 1
                }
            };
            t.exclusive += usize::from(exclusive);
            t.waiting += 1;
            RangeGuard {
                locks: self.clone(),
                slot,
            }
        };
        loop {
            let released = {
                let mut t = self.table.lock();
                if t.grantable(guard.slot) {
                    t.entries[guard.slot].as_mut().expect("live entry").granted = true;
                    t.waiting -= 1;
                    return guard;
                }
                // Created under the table lock, before any release that
                // could unblock us: notify_waiters wakes it even unpolled.
                self.released.notified()
            };
            released.await;
        }
    }

    /// Entries held or awaited (for tests).
    pub fn len(&self) -> usize {
        let t = self.table.lock();
        t.entries.len() - t.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        let wake = {
            let mut t = self.locks.table.lock();
            let e = t.entries[self.slot].take().expect("entry of a live guard");
            t.free.push(self.slot);
            t.exclusive -= usize::from(e.exclusive);
            if !e.granted {
                t.waiting -= 1;
            }
            t.waiting > 0
        };
        if wake {
            self.locks.released.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn pending<F: std::future::Future>(f: F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn shared_share_exclusive_excludes() {
        let l = RangeLocks::new();
        let a = l.lock(0, 4096, false).await;
        let _b = l.lock(0, 4096, false).await;
        // Exclusive over an overlapping span waits for both.
        assert!(pending(l.lock(512, 1024, true)).await);
        assert_eq!(l.len(), 2, "a cancelled wait leaves nothing behind");
        // Disjoint ranges do not conflict.
        let _c = l.lock(4096, 8192, true).await;
        drop(a);
        assert!(pending(l.lock(512, 1024, true)).await);
    }

    #[tokio::test]
    async fn waiting_exclusive_is_not_starved() {
        let l = RangeLocks::new();
        let s1 = l.lock(0, 512, false).await;
        let l2 = l.clone();
        let x = tokio::spawn(async move {
            let _g = l2.lock(0, 512, true).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A shared request after the waiting exclusive one queues behind it.
        assert!(pending(l.lock(0, 512, false)).await);
        drop(s1);
        x.await.unwrap();
        let _s = l.lock(0, 512, false).await;
        assert_eq!(l.len(), 1);
    }

    #[tokio::test]
    async fn exclusive_holders_serialize() {
        let l = RangeLocks::new();
        let counter = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let (l, c) = (l.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                let _g = l.lock(100, 700, true).await;
                let inside = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(inside, 0, "two exclusive holders at once");
                tokio::task::yield_now().await;
                c.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(l.is_empty());
    }
}
