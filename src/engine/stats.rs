//! Counters a person can watch (`tiercache status`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident),* $(,)?) => {
        /// Live counters, updated without locks.
        #[derive(Default)]
        pub struct Stats { $($(#[doc = $doc])* pub $name: AtomicU64,)* }

        /// A point-in-time copy of [`Stats`].
        #[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
        pub struct StatsSnapshot { $($(#[doc = $doc])* pub $name: u64,)* }

        impl Stats {
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl StatsSnapshot {
            /// Every counter as (name, its documentation, value), in
            /// declaration order: the metrics endpoint exports them all.
            pub fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($name), concat!($($doc),*).trim_ascii(), self.$name),)*]
            }
        }
    };
}

counters! {
    /// Blocks read from the cache.
    read_hits,
    /// Blocks read from the origin because they were not cached.
    read_misses,
    /// Blocks written while cached.
    write_hits,
    /// Blocks written while not cached.
    write_misses,
    /// Blocks copied from the origin into the cache.
    promotions,
    /// Clean blocks evicted from the cache.
    demotions,
    /// Dirty blocks written back to the origin.
    blocks_written_back,
    /// Pauses background writeback took to leave the busy origin to clients.
    writeback_pauses,
    /// Writeback batches written because the origin was idle.
    idle_drains,
    /// Writes that waited for writeback to free a slot (every block dirty).
    slot_waits,
    /// Requests (or parts) that went to the origin without using the cache.
    bypassed_ios,
    /// Requests that admission kept out of the cache: part of a long
    /// sequential stream.
    sequential_bypasses,
    /// Requests that admission kept out of the cache: the cache device was
    /// slower than the origin.
    guard_bypasses,
    /// Read-missed blocks not promoted: not missed often enough yet.
    cold_bypasses,
    /// Cached blocks requests used, as the replacement policy was told of
    /// them: once per block per request.
    policy_accesses,
    /// Cache device I/O errors.
    cache_errors,
    /// Origin device I/O errors.
    origin_errors,
    /// Read requests sent to the origin device.
    origin_reads,
    /// Of those, reads started without a blocked thread: submitted to an
    /// origin that completes them on its own threads (`rbd://`).
    origin_reads_submitted,
    /// Write requests sent to the origin device.
    origin_writes,
    /// Of those, writes started without a blocked thread (`rbd://`).
    origin_writes_submitted,
    /// Metadata commits (journal or checkpoint writes).
    commits,
    /// Checkpoints written.
    checkpoints,
    /// Records the crash log could not hold (it was full): until the next
    /// commit, a daemon that dies may lose writes it acknowledged.
    crash_log_overflows,
    /// Records applied from the crash log when this cache was opened: what
    /// a daemon that died had acknowledged but not yet journalled.
    crash_log_records_recovered,
    /// Read requests served.
    read_requests,
    /// Write requests served.
    write_requests,
    /// Flush requests served.
    flush_requests,
    /// Trim requests served.
    trim_requests,
    /// Log placement: segments the cleaner chose to empty.
    segments_cleaned,
    /// Log placement: blocks the cleaner moved to the cursor (dirty, or
    /// used since they were stored).
    blocks_moved,
    /// Log placement: free segments discarded on the cache device.
    segments_discarded,
    /// Log placement: cache writes that queued behind another in their
    /// 1 MiB lane and went to the device in a batch (engine/io/gather.rs).
    gathered_writes,
    /// Log placement: device writes those batches took (adjacent writes
    /// of a batch are one device write).
    gathered_device_writes,
    /// Writeback in flush order: groups (the writes between two client
    /// flushes) written to the origin and flushed there, oldest first.
    groups_written_back,
    /// Writeback in flush order: older versions of blocks, kept because a
    /// later group overwrote them, written back with their group.
    shadows_written_back,
    /// Writeback in flush order: checkpoints taken while a closed group was
    /// not on the origin (the journal was nearly full): until that group
    /// is, a crash loses its order (not its data).
    group_orders_lost,
    /// Writeback in flush order: origin discards not sent because an older
    /// group was not on the origin yet (a discard is a hint).
    discards_held_back,
    /// Flushes sent to the origin: after each writeback batch (its blocks
    /// are marked clean only then), and by commits that followed foreground
    /// origin writes.
    origin_flushes,
    /// Origin flushes that failed, or after which the origin had been
    /// reconnected: what they covered may be lost. Written-back blocks stay
    /// dirty and go again; a client's flush fails until foreground writes
    /// they covered are written again.
    origin_flush_losses,
}

pub fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
