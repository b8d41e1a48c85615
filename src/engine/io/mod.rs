//! The device part: the cache device, and what its failures have led to.
//! The data path's device requests, to the cache and to the origin (whose
//! device is `origin/`'s), go through `data.rs` (timed, errors counted, the
//! origin-write ordering rule); the journal's through `meta_write` and
//! `cache_flush` below; `failure.rs` decides what a failing cache device
//! leads to (admission stopped, failover).
//!
//! Its fields are private to this folder: other parts see the cache device
//! only through these methods.

pub mod data;
pub mod direct;
pub mod direct_origin;
pub mod failure;
pub(crate) mod gather;
pub mod submitted;
pub(crate) mod warnings;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::error::EngineResult;
use crate::device::DeviceRef;
use crate::engine::cache::Cache;
use crate::sync::{Mutex, Rank};

/// Called once when the cache fails over to the origin (`Engine::on_failover`).
pub type FailoverHook = Box<dyn Fn() + Send + Sync>;

/// The device part's state.
pub(crate) struct Io {
    cache: DeviceRef,
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
    /// A cache set's member-state epoch the table has followed
    /// (`failure.rs`); `u64::MAX` before the first look.
    set_epoch: AtomicU64,
}

impl Io {
    pub(crate) fn new(cache: DeviceRef, cache_error_limit: u64, gather: bool) -> Io {
        Io {
            cache,
            gather: gather.then(gather::Gather::new),
            cache_error_limit: AtomicU64::new(cache_error_limit),
            admission_stopped: AtomicBool::new(false),
            failed_over: AtomicBool::new(false),
            failover_hook: Mutex::new(Rank::FailoverHook, None),
            set_epoch: AtomicU64::new(u64::MAX),
            given_up: AtomicBool::new(false),
            resync: Mutex::new(Rank::Background, None),
        }
    }

    pub(crate) fn cache(&self) -> &DeviceRef {
        &self.cache
    }

    /// The admission stop (the error limit was reached) is in force.
    pub(crate) fn admission_stopped(&self) -> bool {
        self.admission_stopped.load(Ordering::Acquire)
    }

    pub(crate) fn cache_error_limit(&self) -> u64 {
        self.cache_error_limit.load(Ordering::Relaxed)
    }
}

impl Cache {
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
}
