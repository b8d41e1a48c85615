//! The order dirty data reaches the origin in, one file per order, each an
//! `Order` (docs/engine.md, "Ordered writeback"):
//!
//! - `address.rs`: whatever order is cheapest (by watermark, age and
//!   address), the volumes' batches side by side;
//! - `flush.rs`: group by group, the writes between two client flushes
//!   reaching the origin only after every earlier group.
//!
//! The engine holds the order its superblock names (`of`, at open); the
//! rest of writeback asks it through the trait and never tests which one
//! it is. A new order is a file implementing `Order`, a `WritebackOrder`
//! setting (options.rs, a superblock flag) and its line in `of`.

mod address;
mod flush;

use crate::engine::cache::Cache;
use crate::engine::origin::locks::BlockLocks;
use crate::engine::{EngineResult, WritebackOrder};

/// What writeback does that depends on its order. The methods are handed
/// the `Cache` they work on, whose steps they use.
pub(crate) trait Order: Send + Sync {
    /// The setting this order is (`create --writeback-order`, the
    /// superblock flag, `status`).
    fn setting(&self) -> WritebackOrder;

    /// One background writeback step, the free-slot reserve kept: writes
    /// back what is due now. Returns the blocks written back (or handed to
    /// the origins' lanes); 0 when nothing was due.
    fn background_step(&self, e: &Cache) -> EngineResult<usize>;

    /// Writes back the dirty blocks `wanted` accepts, and whatever this
    /// order must write with them, until only writes that arrived
    /// meanwhile are left (`write_back_all`, `write_back_volume`; the
    /// caller commits after).
    fn write_back(
        &self,
        e: &Cache,
        wanted: &dyn Fn(u64) -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()>;

    /// The volumes' batches of one writeback may run on threads of their
    /// own, at once (run.rs, `side_by_side`).
    fn side_by_side(&self) -> bool;

    /// Takes block `b`'s lock for a writeback run, without waiting:
    /// `None` if another holds it (the run ends there).
    fn lock_for_run(&self, locks: &BlockLocks, b: u64) -> Option<RunLock>;

    /// Before a run of locked blocks is read from the cache and sent to
    /// the origin.
    fn before_run_sent(&self, e: &Cache) -> EngineResult<()>;

    /// Ends a sent run's flights, its blocks locked again: with `clean`
    /// (the origin has them for good), marks clean the ones no write or
    /// trim touched meanwhile, and returns how many. `mine`: blocks whose
    /// locks this thread held before the run (`RunLock::HeldHere`).
    fn finish_run(
        &self,
        e: &Cache,
        run: &[(u64, u32)],
        mine: &dyn Fn(u64) -> bool,
        clean: bool,
    ) -> usize;

    /// Dirty data of a closed flush group is not yet on the origin: a
    /// foreground write to the origin would overtake it.
    fn older_groups_pending(&self, e: &Cache) -> bool;

    /// A client flush (`Engine::flush`): the writes acknowledged so far
    /// are a state the origin may show.
    fn client_flush(&self, e: &Cache);

    /// Before a foreground write to the origin, with its blocks' locks
    /// held: what must reach the origin before it.
    fn before_foreground_write(&self, e: &Cache) -> EngineResult<()>;

    /// Writes back what must be on the origin before a checkpoint, which
    /// would lose its order otherwise (at open after a crash, at close, and
    /// for a write that gave up its locks with `EngineError::DrainFirst`).
    fn write_back_closed(&self, e: &Cache) -> EngineResult<()>;

    /// After a volume's write back, before its blocks are dropped
    /// (`Engine::remove_volume`): fails if dirty data this order keeps
    /// together with the volume's is left.
    fn check_written_back(&self, e: &Cache) -> EngineResult<()>;

    /// Refuses to take a volume out while the cache is served
    /// (`Engine::remove_volume_served`) where this order keeps every
    /// volume's dirty data together.
    fn removes_served(&self) -> EngineResult<()>;
}

/// How a writeback run holds a block's lock (`Order::lock_for_run`).
pub(crate) enum RunLock {
    /// Taken for the run, which releases it.
    Taken,
    /// Held by this thread already (a foreground write waiting for older
    /// flush groups writes back the blocks it holds itself): the run
    /// neither takes nor releases it.
    HeldHere,
}

/// The order a cache created with `setting` writes back in.
pub(crate) fn of(setting: WritebackOrder) -> &'static dyn Order {
    match setting {
        WritebackOrder::Address => &address::Address,
        WritebackOrder::Flush => &flush::Flush,
    }
}
