//! Errors of the cache engine.

use crate::device::DeviceError;
use crate::volume::{ErrorKind, VolumeError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A device I/O error that could not be hidden from the caller.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The cache device failed while metadata was being written.
    #[error("cache metadata write failed: {0}")]
    CacheMetadata(#[source] DeviceError),
    /// The cache device holds no tiercache superblock.
    #[error("{device} is not a tiercache cache device ({reason})")]
    NotACache { device: String, reason: String },
    /// The cache device already holds a cache; creating would destroy it.
    #[error("{device} already holds a tiercache cache (mode {mode}, {dirty_hint}); pass --wipe to create over it")]
    AlreadyACache {
        device: String,
        mode: String,
        dirty_hint: String,
    },
    /// On-disk metadata failed validation; it is never served.
    #[error("metadata on {device} is corrupted: {what}; run `tiercache check` for details")]
    Corrupt { device: String, what: String },
    /// The origin given is not the one this cache was created for.
    #[error("origin mismatch: {what}; the cache was created for another origin (pass --force only if you are sure)")]
    OriginMismatch { what: String },
    /// Bad parameters (block size, mode, sizes).
    #[error("{0}")]
    Config(String),
    /// No volume of that name (or index) in this cache.
    #[error("{0}")]
    NoSuchVolume(String),
    /// A request outside the volume or not 512-byte aligned.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A write beyond the end of the volume.
    #[error("write beyond the end of the volume: {0}")]
    NoSpace(String),
    /// Writeback on a volatile (RAM) cache without accepting data loss.
    #[error("refusing {mode} mode on volatile cache device {device}: dirty data would be lost on exit; pass --allow-data-loss to accept that")]
    VolatileWriteback { device: String, mode: String },
    /// A read of origin blocks whose current data was lost with a failed
    /// cache device (engine/origin/stale.rs).
    #[error("stale data: {0}")]
    StaleData(String),
    /// The engine is closed or detached.
    #[error("the cache is shut down")]
    ShutDown,
    /// Writeback in flush order: the write must go to the origin, and
    /// older flush groups must get there first. Never reaches a client:
    /// the request releases its block locks, the closed groups are written
    /// back, and the request starts again (pipeline.rs).
    #[error("older flush groups must reach the origin first")]
    DrainFirst,
    /// The origin may have lost foreground writes it acknowledged: a flush
    /// covering them failed, or the origin was reconnected (or failed a
    /// flush) after they were sent (engine/origin/sync.rs).
    #[error("{0}")]
    OriginWritesLost(String),
    /// The crash log could not be opened (or another process holds it).
    #[error(transparent)]
    CrashLog(#[from] super::crash_log::CrashLogError),
}

pub type EngineResult<T> = Result<T, EngineError>;

impl From<EngineError> for VolumeError {
    fn from(e: EngineError) -> VolumeError {
        let kind = match &e {
            EngineError::InvalidRequest(_) => ErrorKind::Invalid,
            EngineError::NoSpace(_) => ErrorKind::NoSpace,
            EngineError::ShutDown => ErrorKind::ShuttingDown,
            _ => ErrorKind::Io,
        };
        VolumeError::new(kind, e.to_string())
    }
}
