//! Origin reads started without blocking a thread: a read none of whose
//! blocks the cache holds or keeps (passthrough and writeonly, which do
//! not promote) goes to an origin whose requests complete on the origin's
//! own threads (`device::Submit`: librbd's `rbd_aio_read`) straight from
//! the caller's thread, and ends where the origin completes it. No thread
//! of ours waits for it: a read on the blocking pool costs a hand-off to
//! a pool thread and a wake-up of it, on top of the origin's own.
//!
//! The blocks are try-locked, resolved and looked up on the caller's
//! thread as `try_hit_reads` does, and stay locked until the read ends
//! (`BlockRangeGuard::hand_off`, `BlockLocks::unlock_handed`), as a
//! blocking read holds them; the origin counts it as foreground I/O
//! (`Origin::begin_foreground`) until then, so retiring the volume waits
//! for it. Anything else (a block cached, locked, or to be kept; an origin
//! that only blocks) is handed back for the blocking path.

use crate::device::{AlignedBuf, DeviceResult};
use crate::engine::admission::Dev;
use crate::engine::cache::Cache;
use crate::engine::io::data::DeviceTimer;
use crate::engine::observe::latency::Op;
use crate::engine::request::Request;
use crate::engine::stats::bump;
use crate::engine::EngineResult;

/// A read sent to the origin, its blocks (`first..=last`) locked until
/// `origin_read_done`.
pub struct OriginRead {
    first: u64,
    last: u64,
    /// The request's address and length (origin/address.rs).
    at: u64,
    len: usize,
    /// When it started.
    timer: DeviceTimer,
}

impl Cache {
    /// `req` (from a fast path that handed it on) as a read to send to
    /// its origin's `Submit` (`send_origin_read`), or handed back.
    pub(crate) fn start_origin_read(&self, mut req: Request) -> Result<OriginRead, Request> {
        let Some((first, last)) = req.blocks() else {
            return Err(req);
        };
        let origin = self.origins.at(req.offset);
        if origin.device().submitter().is_none() {
            return Err(req);
        }
        let Some(guard) = (self.origins.of_key(first).locks()).try_lock_range(first, last) else {
            return Err(req);
        };
        let plan = self.resolve(&mut req);
        if plan.promote {
            return Err(req);
        }
        // The read rule of `read_planned`: a dirty block is read from the
        // cache in every mode.
        let cached = self.lookup(&mut req, |dirty| dirty || plan.mode.reads_cache());
        if cached.iter().any(Option::is_some) {
            return Err(req);
        }
        if !origin.begin_foreground() {
            // Retired: the blocking path fails the read.
            origin.end_foreground(self.now_ms());
            return Err(req);
        }
        guard.hand_off();
        let misses = req.segs.len() as u64;
        bump(&self.stats.read_requests, 1);
        bump(&self.stats.read_misses, misses);
        bump(&self.stats.bypassed_ios, misses);
        bump(&self.stats.origin_reads, 1);
        bump(&self.stats.origin_reads_submitted, 1);
        self.origins.of_key(first).count_reads(0, misses);
        Ok(OriginRead {
            first,
            last,
            at: req.offset,
            len: req.len as usize,
            timer: self.device_timer(),
        })
    }

    /// Sends `r` to its origin; `reply` gets the data, or the error, on
    /// the thread the origin completes it on (or this one).
    pub(crate) fn send_origin_read(
        &self,
        r: OriginRead,
        reply: impl FnOnce(OriginRead, DeviceResult<AlignedBuf>) + Send + 'static,
    ) {
        let origin = self.origins.at(r.at);
        let local = origin.local(r.at);
        // Every byte is the origin's, or the read fails.
        let buf = AlignedBuf::to_overwrite(r.len);
        let submitter = (origin.device().submitter()).expect("start_origin_read checked");
        submitter.submit_read(
            buf,
            local,
            Box::new(move |buf, res| reply(r, res.map(|_| buf))),
        );
    }

    /// `r` is over: its blocks unlocked, the origin's foreground I/O and
    /// the request's latency counted, as a blocking read counts them.
    pub(crate) fn origin_read_done(
        &self,
        r: OriginRead,
        res: DeviceResult<AlignedBuf>,
    ) -> EngineResult<AlignedBuf> {
        let ns = self.device_timed(Dev::OriginRead, r.len, &r.timer, res.is_ok());
        self.origins.at(r.at).end_foreground(self.now_ms());
        (self.origins.of_key(r.first).locks()).unlock_handed(r.first, r.last);
        if let Err(e) = &res {
            self.origin_read_failed(e);
        }
        self.observe.latency.request(Op::Read, false, ns);
        Ok(res?)
    }
}
