//! Origin reads the caller makes itself: a read none of whose blocks the
//! cache holds, from an origin that is a plain file or block device, is
//! read by the ublk queue straight into the request's buffer on its own
//! io_uring (`volume::Direct`), as hits are (direct.rs). No thread of ours
//! waits for it and nothing is copied on the way to the reader: on the
//! blocking pool the same read costs a hand-off to a pool thread, its
//! wake-up, and a report back to the queue.
//!
//! The engine's part is the submitted read's (submitted.rs): blocks
//! try-locked, resolved, looked up and handed off; the origin counts the
//! read as foreground I/O until it ends. When the caller reports back:
//! - the read failed (or was short, or the caller dropped it: its queue
//!   stopped): nothing is counted, the blocks are let go and the request
//!   goes to the blocking path, which reads it again and reports any
//!   error;
//! - it keeps nothing: counted, unlocked, done;
//! - it keeps blocks (writeback, writethrough: a promotion): the data is
//!   copied out of the request's buffer, which goes back to the reader at
//!   once, and stored on the blocking pool with the blocks still locked,
//!   as a deferred promotion (cache/deferred.rs, whose budget bounds the
//!   copies held; past it the read keeps nothing).

use std::os::fd::{AsRawFd, RawFd};

use crate::device::{AlignedBuf, DeviceRef};
use crate::engine::cache::Cache;
use crate::engine::io::submitted::OriginRead;
use crate::engine::request::Request;
use crate::volume::{Piece, Pieces};

/// An origin read the caller makes, its blocks locked until
/// `direct_origin_read_done`.
pub struct DirectOriginRead {
    /// The origin device's descriptor; `_dev` keeps it open.
    pub fd: RawFd,
    /// One piece: the whole request, at its offset on the origin device
    /// (the caller takes it).
    pub pieces: Pieces,
    _dev: DeviceRef,
    read: OriginRead,
    /// For the blocking path, if the caller's read fails.
    req: Request,
}

/// What is left of a direct origin read once the caller's read is over.
pub enum OriginReadLeft {
    /// Nothing: the read is done.
    Nothing,
    /// Its promotion, for a thread that may block (`store_deferred`); the
    /// read is done.
    Store(DeferredStore),
    /// The read failed: the request goes to `read_request`.
    Again(Request),
}

/// A direct origin read's promotion: the copied data, its share of the
/// deferred budget (given back by `store_deferred`).
pub struct DeferredStore {
    read: OriginRead,
    data: AlignedBuf,
}

impl Cache {
    /// `req` (from a fast path that handed it on) as an origin read for
    /// the caller to make into the request's buffer, if its origin is a
    /// plain file or block device and nothing of it is cached or locked
    /// (`begin_origin_read`); else handed back.
    pub fn try_direct_origin_read(&self, mut req: Request) -> Result<DirectOriginRead, Request> {
        let Some(read) = self.begin_origin_read(&mut req, |d| d.as_file().is_some()) else {
            return Err(req);
        };
        let origin = self.origins.at(req.offset);
        let dev = origin.device().clone();
        let fd = (dev.as_file().expect("begin_origin_read took a file")).as_raw_fd();
        Ok(DirectOriginRead {
            fd,
            pieces: smallvec::smallvec![Piece {
                at: origin.local(req.offset),
                buf: 0..req.len as usize,
            }],
            _dev: dev,
            read,
            req,
        })
    }

    /// The caller's read of `r` is over (`ok`: all of it), its bytes in
    /// `data` (the request's buffer; shorter counts as a failure).
    pub fn direct_origin_read_done(
        &self,
        r: DirectOriginRead,
        ok: bool,
        data: &[u8],
    ) -> OriginReadLeft {
        let DirectOriginRead { mut read, req, .. } = r;
        if !ok || data.len() < read.len() {
            self.origin_read_let_go(read);
            return OriginReadLeft::Again(req);
        }
        if read.keeps() && !self.deferred.reserve(read.len() as u64, &self.closed) {
            read.keep_nothing();
        }
        self.count_origin_read(&read);
        if !read.keeps() {
            self.origin_read_over(read, Ok(data));
            return OriginReadLeft::Nothing;
        }
        OriginReadLeft::Store(DeferredStore {
            data: AlignedBuf::from_slice(&data[..read.len()]),
            read,
        })
    }

    /// Ends a direct origin read's promotion: stored (`store`), or dropped
    /// (its task never ran: the runtime is going), its blocks counted as
    /// bypassed; either way the read ends (its blocks unlocked) and its
    /// bytes go back to the deferred budget.
    pub fn end_deferred(&self, s: DeferredStore, store: bool) {
        let bytes = s.read.len() as u64;
        if store {
            self.origin_read_over(s.read, Ok(&s.data));
        } else {
            self.origin_read_abandoned(s.read, Ok(s.data));
        }
        self.deferred.release(bytes);
    }
}
