//! Locks with a rank, and a checker of the order they are taken in.
//!
//! Every lock of the engine has a rank (`Rank`, docs/concurrency.md lists
//! them). A thread may take a lock only while every lock it holds has a
//! lower rank; two threads that follow this rule can never wait for each
//! other in a cycle. Debug builds (the whole test suite) keep each thread's
//! held ranks and panic at the first acquisition that breaks the rule,
//! naming both locks; release builds keep nothing and check nothing.
//!
//! A `try_lock` never waits, so it cannot close a cycle: it is not checked,
//! but what it takes counts as held. `Rank::Blocks` is a set of locks of one
//! rank (the per-block locks): a thread may hold several, taken in
//! ascending block order (engine/origin/locks.rs), so taking one while holding
//! another of that rank is allowed.

#[cfg(debug_assertions)]
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

/// The ranks, outermost first. Declaration order is the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// The per-block locks (engine/origin/locks.rs): held across a request.
    Blocks,
    /// Writeback in flush order's turn (engine/writeback/order/flush.rs): one
    /// thread writes a group back at a time; under it block locks are only
    /// try-locked.
    WritebackOrder,
    /// The commit lock: the journal position and the superblock.
    Commit,
    /// The foreground origin flush's turn (engine/origin/sync.rs):
    /// held across the origin flush a commit makes for foreground writes.
    OriginFlush,
    /// Background writeback's settings and cursors (engine/writeback/).
    WritebackState,
    /// Where writes wait for writeback to free a slot.
    SlotsFreed,
    /// The cache-write gatherer's lanes (engine/io/gather.rs): which 1 MiB
    /// lanes of the cache device have a write under way and what queues
    /// behind it; never held across device I/O.
    Gather,
    /// A cache set's rebuild fence (device/set/rebuild.rs): held across a
    /// chunk copy and across a client write to the member being rebuilt.
    Rebuild,
    /// A cache set's member states and label generation (device/set/):
    /// held while labels are written, never on the data path.
    CacheSet,
    /// A test device's own state (device/fault.rs, recorder.rs,
    /// latency.rs): taken inside a device call, under `Blocks` or `Commit`,
    /// never under `Meta`. A set: a device that wraps another holds its
    /// lock across the inner device's call.
    Device,
    /// The power switch test devices share (device/fault.rs): taken under a
    /// device's lock; its trip hook copies the crash log under `Meta`.
    PowerSwitch,
    /// The metadata lock: the table, the free slots, the records, the
    /// crash log.
    Meta,
    /// Writebacks in flight (engine/origin/flights.rs).
    Flights,
    /// The per-block locks' shard tables (engine/origin/locks.rs, internal).
    BlockShard,
    /// Admission's settings and sequential-stream table.
    Admission,
    /// The miss-ratio curve's sample.
    Mrc,
    /// The background thread's wake-up flag and its handle.
    Background,
    /// A writeback lane's batch, and the list of lanes and their threads
    /// (engine/writeback/lanes.rs): one at a time, never across I/O.
    WritebackLane,
    /// The hook run when the cache fails over to the origin (it writes the
    /// registry).
    FailoverHook,
    /// Origin blocks made stale by a lost cache (engine/origin/stale.rs).
    StaleBlocks,
    /// Foreground origin writes not yet flushed, and those a failed flush
    /// may have lost (engine/origin/sync.rs).
    OriginWrites,
    /// The NBD client origin's connections and reachability
    /// (device/nbd/link.rs): which connection a request takes, since when
    /// none is up, when the next reconnect attempt is due.
    NbdLink,
    /// The NBD client origin's request table (device/nbd/conn.rs): which
    /// requests wait for which reply; its condition variable waits for a
    /// free request slot.
    NbdClient,
    /// The NBD client origin's socket writer: one request's bytes at a time.
    NbdClientWriter,
    /// The error a TLS relay task of the NBD client left.
    NbdRelay,
    /// The NBD server's byte-range table (frontend/nbd/ranges.rs): held
    /// only to register, grant or drop a range, never across an await.
    NbdRanges,
    /// The NBD server's export list (frontend/nbd/server.rs): held only to
    /// copy it or append a volume added online.
    NbdExports,
    /// The metrics sampler's history and its wake-up (monitor/sampler.rs).
    Sampler,
}

impl Rank {
    /// Every rank, in order.
    pub const ALL: [Rank; 28] = [
        Rank::Blocks,
        Rank::WritebackOrder,
        Rank::Commit,
        Rank::OriginFlush,
        Rank::WritebackState,
        Rank::SlotsFreed,
        Rank::Gather,
        Rank::Rebuild,
        Rank::CacheSet,
        Rank::Device,
        Rank::PowerSwitch,
        Rank::Meta,
        Rank::Flights,
        Rank::BlockShard,
        Rank::Admission,
        Rank::Mrc,
        Rank::Background,
        Rank::WritebackLane,
        Rank::FailoverHook,
        Rank::StaleBlocks,
        Rank::OriginWrites,
        Rank::NbdLink,
        Rank::NbdClient,
        Rank::NbdClientWriter,
        Rank::NbdRelay,
        Rank::NbdRanges,
        Rank::NbdExports,
        Rank::Sampler,
    ];

    /// Several locks of this rank may be held at once.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    fn is_set(self) -> bool {
        matches!(self, Rank::Blocks | Rank::Device)
    }
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
}

/// Checks that `rank` may be taken now (unless `tried`), then counts it as
/// held by this thread.
#[inline]
pub fn acquired(rank: Rank, tried: bool) {
    #[cfg(debug_assertions)]
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if !tried {
            if let Some(&top) = h.iter().max() {
                if top > rank || (top == rank && !rank.is_set()) {
                    drop(h);
                    panic!(
                        "lock order broken: taking {rank:?} while holding {top:?} \
                         (docs/concurrency.md: a lock is taken only under locks of a lower rank)"
                    );
                }
            }
        }
        h.push(rank);
    });
    #[cfg(not(debug_assertions))]
    let _ = (rank, tried);
}

/// This thread no longer holds one lock of `rank`.
#[inline]
pub fn released(rank: Rank) {
    #[cfg(debug_assertions)]
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        let at = h.iter().rposition(|&r| r == rank);
        h.remove(at.expect("a released lock was held"));
    });
    #[cfg(not(debug_assertions))]
    let _ = rank;
}

/// Checks `done` every millisecond until it holds, for at most `limit`;
/// false if it never did. For waits on a counter of work under way that
/// is going to zero (no new work starts), with no condition variable to
/// wake the waiter: at close, retirement and a queue's end.
pub fn poll_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while !done() {
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Panics (debug builds) if this thread holds a lock of `rank`: for work
/// that must never run under it, such as device I/O under the metadata
/// lock (docs/concurrency.md).
#[inline]
pub fn assert_unheld(rank: Rank, what: &str) {
    #[cfg(debug_assertions)]
    HELD.with(|h| {
        if h.borrow().contains(&rank) {
            panic!("{what} under the {rank:?} lock (docs/concurrency.md)");
        }
    });
    #[cfg(not(debug_assertions))]
    let _ = (rank, what);
}

/// The ranks this thread holds (debug builds; empty otherwise).
pub fn held() -> Vec<Rank> {
    #[cfg(debug_assertions)]
    return HELD.with(|h| h.borrow().clone());
    #[cfg(not(debug_assertions))]
    Vec::new()
}

/// A mutex with a rank.
pub struct Mutex<T> {
    rank: Rank,
    inner: parking_lot::Mutex<T>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutex")
            .field("rank", &self.rank)
            .field("inner", &self.inner)
            .finish()
    }
}

/// A held `Mutex`.
pub struct MutexGuard<'a, T> {
    rank: Rank,
    inner: parking_lot::MutexGuard<'a, T>,
    /// When it was taken (lock statistics).
    #[cfg(feature = "lockstat")]
    at: std::time::Instant,
}

impl<T> Mutex<T> {
    pub const fn new(rank: Rank, value: T) -> Mutex<T> {
        Mutex {
            rank,
            inner: parking_lot::const_mutex(value),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        acquired(self.rank, false);
        #[cfg(feature = "lockstat")]
        let inner = self.inner.try_lock().unwrap_or_else(|| {
            let t = std::time::Instant::now();
            let g = self.inner.lock();
            crate::lockstat::waited(self.rank, t);
            g
        });
        #[cfg(not(feature = "lockstat"))]
        let inner = self.inner.lock();
        self.guard(inner)
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let inner = self.inner.try_lock()?;
        acquired(self.rank, true);
        Some(self.guard(inner))
    }

    fn guard<'a>(&'a self, inner: parking_lot::MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        #[cfg(feature = "lockstat")]
        crate::lockstat::taken(self.rank);
        MutexGuard {
            rank: self.rank,
            inner,
            #[cfg(feature = "lockstat")]
            at: std::time::Instant::now(),
        }
    }

    pub fn rank(&self) -> Rank {
        self.rank
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        released(self.rank);
        #[cfg(feature = "lockstat")]
        crate::lockstat::released(self.rank, self.at);
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// A condition variable for ranked mutexes. While a thread waits it takes
/// nothing, so its held ranks stay as they are.
#[derive(Default)]
pub struct Condvar(parking_lot::Condvar);

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar(parking_lot::Condvar::new())
    }

    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        self.0.wait(&mut guard.inner);
    }

    /// True if it timed out.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> bool {
        self.0.wait_for(&mut guard.inner, timeout).timed_out()
    }

    pub fn notify_one(&self) -> bool {
        self.0.notify_one()
    }

    pub fn notify_all(&self) -> usize {
        self.0.notify_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/concurrency.md lists every rank, in the order of `Rank`.
    #[test]
    fn the_concurrency_doc_lists_every_rank_in_order() {
        let doc = include_str!("../docs/concurrency.md");
        let listed: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .filter(|name| name.chars().all(|c| c.is_ascii_alphabetic()))
            .collect();
        let src = include_str!("sync.rs");
        let body = &src[src.find("pub enum Rank {").expect("the enum")..];
        let ranks: Vec<&str> = body[..body.find("\n}").expect("its end")]
            .lines()
            .filter_map(|l| l.trim().strip_suffix(','))
            .filter(|name| name.chars().all(|c| c.is_ascii_alphabetic()))
            .collect();
        assert!(ranks.len() >= 10, "{ranks:?}");
        assert_eq!(
            listed, ranks,
            "docs/concurrency.md's lock table against Rank"
        );
        assert_eq!(format!("{:?}", Rank::Sampler), *ranks.last().unwrap());
        let all: Vec<String> = Rank::ALL.iter().map(|r| format!("{r:?}")).collect();
        assert_eq!(all, ranks, "Rank::ALL against Rank");
    }

    #[test]
    fn ascending_ranks_are_allowed_and_released() {
        let commit = Mutex::new(Rank::Commit, ());
        let meta = Mutex::new(Rank::Meta, ());
        {
            let _c = commit.lock();
            let _m = meta.lock();
            assert_eq!(held(), [Rank::Commit, Rank::Meta]);
        }
        assert!(held().is_empty());
        // Taking them one at a time in any order is fine.
        drop(meta.lock());
        drop(commit.lock());
    }

    #[test]
    #[cfg(debug_assertions)]
    fn an_inversion_panics_naming_both_locks() {
        let commit = Mutex::new(Rank::Commit, ());
        let meta = Mutex::new(Rank::Meta, ());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _m = meta.lock();
            let _c = commit.lock();
        }));
        let msg = r.expect_err("an inversion must panic");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("taking Commit while holding Meta"), "{msg}");
        assert!(held().is_empty(), "guards released while unwinding");
    }

    #[test]
    #[cfg(debug_assertions)]
    fn the_same_rank_twice_panics_except_for_a_set() {
        let a = Mutex::new(Rank::Meta, ());
        let b = Mutex::new(Rank::Meta, ());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _a = a.lock();
            let _b = b.lock();
        }));
        assert!(r.is_err());
        acquired(Rank::Blocks, false);
        acquired(Rank::Blocks, false);
        released(Rank::Blocks);
        released(Rank::Blocks);
    }

    #[test]
    fn a_try_lock_is_not_checked_but_counts_as_held() {
        let commit = Mutex::new(Rank::Commit, ());
        let meta = Mutex::new(Rank::Meta, ());
        let _m = meta.lock();
        let c = commit.try_lock().expect("free");
        if cfg!(debug_assertions) {
            assert_eq!(held(), [Rank::Meta, Rank::Commit]);
        }
        drop(c);
    }
}
