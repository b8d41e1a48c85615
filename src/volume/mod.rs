//! The asynchronous block-volume API that front ends (the NBD server, later
//! ublk) call. The cache engine implements it; so does a plain device, for
//! tests of the front ends against a simple reference volume.
//!
//! Contract: many requests may be in flight at once; requests for different
//! blocks never wait on each other; a completed `flush` makes every write
//! that completed before the flush was issued durable; a write with `fua`
//! is durable when it completes.

use std::future::Future;

mod device_volume;
mod direct;
pub use device_volume::DeviceVolume;
pub use direct::{
    BlockingRead, Dest, Direct, DirectRead, DirectWrite, Later, LaterRead, Piece, Pieces,
    ReadStart, Reply, Start, WriteStart,
};

use crate::device::AlignedBuf;

/// Error classes a front end maps onto its wire errors (NBD errno values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// An I/O error on a device that could not be hidden.
    Io,
    /// A request that is malformed or out of range.
    Invalid,
    /// A write beyond the end of the volume.
    NoSpace,
    /// A write to a read-only volume.
    ReadOnly,
    /// The operation is not supported (e.g. fast zeroing).
    NotSupported,
    /// The volume is shutting down.
    ShuttingDown,
}

/// An error returned by a [`Volume`] operation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct VolumeError {
    pub kind: ErrorKind,
    pub message: String,
}

impl VolumeError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        VolumeError {
            kind,
            message: message.into(),
        }
    }
}

pub type VolumeResult<T> = Result<T, VolumeError>;

/// The most bytes of its range a [`Volume::prefetch`] holds in memory at
/// once: a prefetch of any length works through its range in pieces of at
/// most this size, so a front end can charge it against its buffers.
pub const PREFETCH_PIECE_BYTES: u64 = 1 << 20;

/// The most bytes of its range a [`Volume::trim`] or
/// [`Volume::write_zeroes`] keeps bookkeeping for at once: one of any
/// length works through its range in pieces of at most this size (the
/// engine splits a piece into a segment per block before it starts; a
/// 4 GiB trim of 4 KiB blocks in one piece would hold 32 MiB of them).
/// NBD proto.md "Block size constraints" lets these commands exceed the
/// maximum payload, so a front end charges them one piece's worth.
pub const EFFECT_PIECE_BYTES: u64 = 64 << 20;

/// `[start, end)` in pieces of at most `piece` bytes that end on multiples
/// of `piece` (so they stay block-aligned): (offset, length) each.
pub fn pieces(start: u64, end: u64, piece: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut at = start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let next = ((at / piece + 1) * piece).min(end);
        let p = (at, next - at);
        at = next;
        Some(p)
    })
}

/// The most extents one [`Volume::allocation`] or [`Volume::cache_state`]
/// call returns: as many as an NBD block status reply carries (tiercache
/// answers at most 1,024 per chunk), so none is built to be thrown away.
pub const EXTENTS_PER_CALL_MAX: usize = 1024;

/// A run of bytes of one status, as [`Volume::allocation`] and
/// [`Volume::cache_state`] report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub flags: u32,
}

/// [`Volume::allocation`] flags (the values of NBD's base:allocation).
/// The range is not allocated on the backing store.
pub const ALLOC_HOLE: u32 = 1 << 0;
/// The range reads as zeroes.
pub const ALLOC_ZERO: u32 = 1 << 1;
/// [`Volume::cache_state`] flags: the range is held by the cache device.
pub const CACHE_CACHED: u32 = 1 << 0;
/// The range is dirty: in the cache and not yet written to the origin.
pub const CACHE_DIRTY: u32 = 1 << 1;

/// A block volume with an asynchronous request API.
pub trait Volume: Send + Sync + 'static {
    /// Size of the volume in bytes (a multiple of 512).
    fn size_bytes(&self) -> u64;
    /// The preferred I/O size: requests aligned to it avoid read-modify-write.
    fn preferred_block_bytes(&self) -> u32;
    /// True if a flush persists the completed writes of every client, not
    /// only of the one that sent it (NBD CAN_MULTI_CONN).
    fn flush_is_global(&self) -> bool {
        true
    }
    /// Reads `len` bytes at `offset` (both multiples of 512).
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = VolumeResult<AlignedBuf>> + Send;
    /// Starts a read for a front end that can make device reads itself
    /// (direct.rs). Call inside the runtime the volume's futures run on.
    /// The default leaves the read to `read`.
    fn start_read(&self, offset: u64, len: u32) -> ReadStart {
        let _ = (offset, len);
        Start::Default
    }
    /// Starts a write of `data` as `start_read` starts a read (a `Later`
    /// holds its own copy of `data`). The default leaves it to `write`.
    fn start_write(&self, offset: u64, data: &[u8], fua: bool) -> WriteStart {
        let _ = (offset, data, fua);
        Start::Default
    }
    /// Writes `data` at `offset`; with `fua` durable on completion.
    fn write(
        &self,
        offset: u64,
        data: AlignedBuf,
        fua: bool,
    ) -> impl Future<Output = VolumeResult<()>> + Send;
    /// Makes every write completed before this call durable.
    fn flush(&self) -> impl Future<Output = VolumeResult<()>> + Send;
    /// Discards a range: its contents are unspecified until written again.
    /// Works in pieces of at most [`EFFECT_PIECE_BYTES`].
    fn trim(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> impl Future<Output = VolumeResult<()>> + Send;
    /// Writes zeroes over a range, in pieces of at most
    /// [`EFFECT_PIECE_BYTES`].
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> impl Future<Output = VolumeResult<()>> + Send;
    /// Prefetches a range into the cache (a hint; no data is returned). It
    /// holds at most [`PREFETCH_PIECE_BYTES`] of buffers at once, and may
    /// do less than asked (NBD proto.md NBD_CMD_CACHE leaves open "whether
    /// there is a limit on how much can be cached at once").
    fn prefetch(&self, offset: u64, len: u64) -> impl Future<Output = VolumeResult<()>> + Send;

    /// Allocation of the range from `offset` (within the volume, `len` >
    /// 0): extents in order from `offset`, covering at least one byte and
    /// at most `len` (the caller asks again for the rest), at most
    /// [`EXTENTS_PER_CALL_MAX`] of them. Must be cheap
    /// (no device I/O). The default, one allocated extent of unknown
    /// content, is true of every volume.
    fn allocation(&self, offset: u64, len: u64) -> Vec<Extent> {
        let _ = offset;
        vec![Extent { len, flags: 0 }]
    }

    /// Cache state of the range, under the same rules as `allocation`:
    /// which sectors the cache holds, and which of them are dirty. The
    /// default, nothing cached, is true of a volume without a cache.
    fn cache_state(&self, offset: u64, len: u64) -> Vec<Extent> {
        let _ = offset;
        vec![Extent { len, flags: 0 }]
    }
}
