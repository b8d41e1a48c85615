//! The cache part: one per cache device or cache set. It holds the table
//! and its lock, the journal (checkpoints, superblock, crash log), the
//! cache device's I/O, admission, where new data goes (placement), the
//! counters and observations, writeback and its order, and the origins it
//! serves (`origin::Origins`, as Open CAS's cache holds its cores). The
//! engine (`mod.rs`) is a facade over one `Cache`.
//!
//! Its steps are `impl Cache` blocks in the files of the part whose state
//! they change: device requests and failover in `io/`, the commit and
//! checkpoints in `journal/commit.rs`, slots allocated, filled and evicted
//! in `table/slots.rs`, writeback in `writeback/` (the log's cleaner in
//! `clean.rs`), the door and the read path in `pipeline.rs` and `read.rs`,
//! the write routes in `modes/` and `write.rs`. `bell.rs` is how it calls
//! whoever cleans it.

mod bell;
mod deferred;

pub(crate) use bell::Bell;
pub(crate) use deferred::Deferred;

use std::sync::atomic::AtomicBool;

use super::admission::Admission;
use super::clock::Clock;
use super::format::Regions;
use super::io::Io;
use super::journal::Journal;
use super::observe::Observe;
use super::origin::Origins;
use super::placement::Placer;
use super::stats::Stats;
use super::table::lock::MetaLock;
use super::writeback::order::Order;
use super::writeback::Writeback;

pub(crate) struct Cache {
    /// The cache device, its error counts, the admission stop and
    /// failover (io/).
    pub(super) io: Io,
    /// Where the journal and the data region are (the slot count and the
    /// checkpoint areas grow with the cache device: the superblock's).
    pub(super) regions: Regions,
    pub(super) block_bytes: u64,
    /// The table (table/), under its lock.
    pub(super) meta: MetaLock,
    /// The commit lock's state, completed operations, the crash log's
    /// pressure (journal/).
    pub(super) journal: Journal,
    pub(super) admission: Admission,
    /// Where new data goes on the cache device (fixed at create; one file
    /// per placement in placement/).
    pub(super) placement: &'static dyn Placer,
    pub(super) stats: Stats,
    /// The origin part (origin/), one per volume, attached to this cache:
    /// the slow device, its geometry, block locks, writebacks in flight,
    /// stale blocks, what its next flush covers. Volume `v`'s blocks are
    /// keys `origin::address::base(v) / block_bytes ..` in the table.
    pub(super) origins: Origins,
    /// Time for every decision taken by time (clock.rs).
    pub(super) clock: Clock,
    /// Latency histograms, the heat map's accesses, the miss-ratio curves
    /// (observe/): of every volume the cache serves.
    pub(super) observe: Observe,
    /// What the cache tells whoever cleans it (bell.rs).
    pub(super) bell: Bell,
    /// The writeback part (writeback/): the background thread, its lanes,
    /// settings and cursors, writes waiting for a slot.
    pub(super) writeback: Writeback,
    /// The order dirty data reaches the origin in (fixed at create; one
    /// file per order in writeback/order/).
    pub(super) order: &'static dyn Order,
    /// Set at close: no request starts after it.
    pub(super) closed: AtomicBool,
    /// Promotions whose reads were answered before them (deferred.rs).
    pub(super) deferred: Deferred,
}
