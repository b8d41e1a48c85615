//! The device part: the cache and origin devices, and what their failures
//! have led to. The data path's device requests go through `data.rs`
//! (timed, errors counted, the origin-write ordering rule); the journal's
//! through `meta_write` and the flushes below; `failure.rs` decides what a
//! failing cache device leads to (admission stopped, failover).
//!
//! Its fields are private to this folder: other parts see the devices only
//! through these methods.

pub mod data;
pub mod failure;
pub(crate) mod gather;
pub(crate) mod origin_sync;
pub(crate) mod stale;
pub(crate) mod warnings;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::stats::bump;
use super::{Engine, EngineError, EngineResult, FailoverHook};
use crate::device::DeviceRef;
use crate::sync::{Mutex, Rank};

/// The device part's state.
pub(crate) struct Io {
    cache: DeviceRef,
    origin: DeviceRef,
    /// With the log placement, data writes to the cache are gathered into
    /// runs (`gather.rs`).
    gather: Option<gather::Gather>,
    /// See `CreateOptions::cache_error_limit`.
    cache_error_limit: AtomicU64,
    /// Set once the cache device has failed `cache_error_limit` times: the
    /// engine keeps serving (hits, writeback, origin I/O) but puts no new
    /// blocks in the cache until it is reopened.
    admission_stopped: AtomicBool,
    /// Set when the cache metadata could not be written in a mode without
    /// dirty data: all I/O goes to the origin until the cache is reopened.
    failed_over: AtomicBool,
    /// Called once when the cache fails over, before any origin write
    /// that follows (the daemon records it outside the failed device).
    failover_hook: Mutex<Option<FailoverHook>>,
    /// A cache set's resync thread (`failure.rs`), joined at close.
    resync: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set when the cache is given up holding dirty data (failure.rs).
    given_up: AtomicBool,
    /// Origin blocks whose only current copy was lost with the cache
    /// (`stale.rs`); empty unless the cache failed over holding dirty data.
    stale: Mutex<stale::StaleBlocks>,
    /// A cache set's member-state epoch the table has followed
    /// (`failure.rs`); `u64::MAX` before the first look.
    set_epoch: AtomicU64,
    /// Foreground origin writes the next commit's origin flush covers, and
    /// those a failed one may have lost (`origin_sync.rs`).
    origin_sync: origin_sync::OriginSync,
}

impl Io {
    pub(crate) fn new(
        cache: DeviceRef,
        origin: DeviceRef,
        cache_error_limit: u64,
        gather: bool,
    ) -> Io {
        Io {
            cache,
            origin,
            gather: gather.then(gather::Gather::new),
            cache_error_limit: AtomicU64::new(cache_error_limit),
            admission_stopped: AtomicBool::new(false),
            failed_over: AtomicBool::new(false),
            failover_hook: Mutex::new(Rank::FailoverHook, None),
            set_epoch: AtomicU64::new(u64::MAX),
            given_up: AtomicBool::new(false),
            resync: Mutex::new(Rank::Background, None),
            stale: Mutex::new(Rank::StaleBlocks, Default::default()),
            origin_sync: Default::default(),
        }
    }

    pub(crate) fn cache(&self) -> &DeviceRef {
        &self.cache
    }

    pub(crate) fn origin(&self) -> &DeviceRef {
        &self.origin
    }

    /// The admission stop (the error limit was reached) is in force.
    pub(crate) fn admission_stopped(&self) -> bool {
        self.admission_stopped.load(Ordering::Acquire)
    }

    pub(crate) fn cache_error_limit(&self) -> u64 {
        self.cache_error_limit.load(Ordering::Relaxed)
    }
}

impl Engine {
    /// Writes journal, checkpoint or superblock bytes to the cache device
    /// (a failure is counted and tagged as a metadata error).
    pub(crate) fn meta_write(&self, buf: &[u8], offset: u64) -> EngineResult<()> {
        crate::sync::assert_unheld(Rank::Meta, "a metadata write");
        self.io
            .cache
            .write_at(buf, offset)
            .map_err(|e| self.cache_meta_error(e))
    }

    /// Flushes the cache device for the journal.
    pub(crate) fn cache_flush(&self) -> EngineResult<()> {
        crate::sync::assert_unheld(Rank::Meta, "a cache flush");
        self.io.cache.flush().map_err(|e| self.cache_meta_error(e))
    }

    /// True while the origin says it cannot be reached (an NBD server
    /// down: its device fails requests at once and reconnects by itself,
    /// device/nbd/link.rs). Background writeback waits meanwhile.
    pub(crate) fn origin_unreachable(&self) -> bool {
        !self.io.origin.is_reachable()
    }

    /// Flushes the origin (errors counted).
    pub(crate) fn origin_flush(&self) -> EngineResult<()> {
        crate::sync::assert_unheld(Rank::Meta, "an origin flush");
        bump(&self.stats.origin_flushes, 1);
        self.io.origin.flush().inspect_err(|_| {
            bump(&self.stats.origin_errors, 1);
            bump(&self.stats.origin_flush_losses, 1);
        })?;
        Ok(())
    }

    /// The origin's loss epoch (`BlockDevice::loss_epoch`).
    pub(crate) fn origin_loss_epoch(&self) -> u64 {
        self.io.origin.loss_epoch()
    }

    /// Makes writeback's origin writes sent since `epoch` was read durable:
    /// an origin flush, which fails if the origin may have lost them
    /// meanwhile (a reconnect, a failed flush). Their blocks are marked
    /// clean only after this succeeds.
    pub(crate) fn origin_flush_since(&self, epoch: u64) -> EngineResult<()> {
        self.origin_flush()?;
        if self.origin_loss_epoch() != epoch {
            bump(&self.stats.origin_flush_losses, 1);
            return Err(EngineError::OriginWritesLost(
                "the origin was reconnected or failed a flush while writeback wrote to it: \
                 the blocks stay dirty and are written again"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A foreground origin write of `range` succeeded; `epoch` was read
    /// before it was sent (`origin_sync.rs`).
    pub(crate) fn origin_wrote(&self, range: std::ops::Range<u64>, epoch: u64) {
        self.io.origin_sync.wrote(range, epoch);
    }

    /// Makes the foreground origin writes that ended so far durable (a
    /// commit's first step): an origin flush only if there are some, so a
    /// commit in writeback needs the origin only when clients wrote to it.
    pub(crate) fn origin_flush_foreground(&self) -> EngineResult<()> {
        self.io
            .origin_sync
            .flush_pending(|| self.origin_flush(), || self.origin_loss_epoch())
            .inspect_err(|e| {
                if matches!(e, EngineError::OriginWritesLost(_)) {
                    bump(&self.stats.origin_flush_losses, 1);
                }
            })
    }

    /// Fails while foreground origin writes a failed flush covered are not
    /// written again (a client's FLUSH and FUA report it).
    pub(crate) fn origin_writes_lost(&self) -> EngineResult<()> {
        self.io.origin_sync.check_lost()
    }
}
