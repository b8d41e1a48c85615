//! Origin reads started without blocking a thread: a read none of whose
//! blocks the cache holds goes to an origin whose requests complete on the
//! origin's own threads (`device::Submit`: librbd's `rbd_aio_read`)
//! straight from the caller's thread. No thread of ours waits for it: a
//! read on the blocking pool costs a hand-off to a pool thread and a
//! wake-up of it, on top of the origin's own.
//!
//! The blocks are try-locked, resolved and looked up on the caller's
//! thread as `try_hit_reads` does, and stay locked until the read ends
//! (`BlockRangeGuard::hand_off`, `BlockLocks::unlock_handed`), as a
//! blocking read holds them; the origin counts it as foreground I/O
//! (`Origin::begin_foreground`) until then, so retiring the volume waits
//! for it. A read whose mode promotes it (writeback, writethrough) is
//! taken too if it is whole blocks: admission decides which to keep, as
//! for a blocking read, and `origin_read_done` stores them before it lets
//! the blocks go, on the thread that awaited the read (a tokio worker,
//! as the hits' fast path does its cache I/O; never the origin's thread).
//! Anything else (a block cached in whole or part, locked, a read not of
//! whole blocks that promotes; an origin that only blocks) is handed back
//! for the blocking path.
//!
//! Writes that go around the cache (passthrough, writearound) are sent the
//! same way when nothing must happen first: no block of theirs cached (no
//! copy to drop durably), none in a writeback still writing the origin
//! (origin order, origin/flights.rs), no older flush group to write back,
//! no dropped mapping waiting for its commit, no FUA and no full crash log
//! (both need a commit). They end on the origin's thread, which is cheap:
//! the range noted for the next origin flush (`Origin::wrote`, as
//! `origin_write` does), the blocks unlocked.

use crate::device::{AlignedBuf, BlockDevice, DeviceError, DeviceResult};
use crate::engine::admission::Dev;
use crate::engine::cache::Cache;
use crate::engine::io::data::DeviceTimer;
use crate::engine::modes::WriteRoute;
use crate::engine::observe::latency::Op;
use crate::engine::origin::locks::BlockRangeGuard;
use crate::engine::request::{block_runs, Plan, Request, Segment};
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
    /// Runs of blocks to keep (first block, offset in the buffer, how
    /// many; `promote_runs`): empty if none is kept.
    keep: Vec<(u64, usize, usize)>,
    /// Its blocks (all misses).
    misses: u64,
}

impl OriginRead {
    /// Bytes it reads.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it keeps some of what it reads.
    pub(crate) fn keeps(&self) -> bool {
        !self.keep.is_empty()
    }

    /// Keeps nothing after all (not yet counted: its blocks are counted
    /// as bypassed).
    pub(crate) fn keep_nothing(&mut self) {
        self.keep.clear();
    }
}

impl Cache {
    /// `req` (from a fast path that handed it on) as a read to send to
    /// its origin's `Submit` (`send_origin_read`), or handed back.
    pub(crate) fn start_origin_read(&self, mut req: Request) -> Result<OriginRead, Request> {
        match self.begin_origin_read(&mut req, |d| d.submitter().is_some()) {
            Some(r) => {
                self.count_origin_read(&r);
                bump(&self.stats.origin_reads_submitted, 1);
                Ok(r)
            }
            None => Err(req),
        }
    }

    /// `req` as an origin read nothing of ours waits for, if its origin
    /// device is one `takes` (a `Submit`, a plain file), none of its
    /// blocks is cached or locked, and a read that promotes is whole
    /// blocks: its blocks locked and handed off, the read counted. `None`:
    /// nothing done, for the blocking path.
    pub(crate) fn begin_origin_read(
        &self,
        req: &mut Request,
        takes: impl FnOnce(&dyn BlockDevice) -> bool,
    ) -> Option<OriginRead> {
        let (first, last, guard) = self.try_lock_origin(req, takes)?;
        let origin = self.origins.at(req.offset);
        let plan = self.resolve(req);
        let bs = self.block_bytes as usize;
        if plan.promote && req.segs.iter().any(|s| s.buf.len() != bs) {
            return None;
        }
        // The read rule of `read_planned`: a dirty block is read from the
        // cache in every mode.
        let cached = self.lookup(req, |dirty| dirty || plan.mode.reads_cache());
        if cached.iter().any(Option::is_some) {
            return None;
        }
        if !origin.begin_foreground() {
            // Retired: the blocking path fails the read.
            origin.end_foreground(self.now_ms());
            return None;
        }
        guard.hand_off();
        Some(OriginRead {
            first,
            last,
            at: req.offset,
            len: req.len as usize,
            timer: self.device_timer(),
            keep: self.kept_runs(&req.segs, &plan),
            misses: req.segs.len() as u64,
        })
    }

    /// Counts `r` as a read request of misses, as the blocking path
    /// counts one.
    pub(crate) fn count_origin_read(&self, r: &OriginRead) {
        let kept: usize = r.keep.iter().map(|&(_, _, n)| n).sum();
        bump(&self.stats.read_requests, 1);
        bump(&self.stats.read_misses, r.misses);
        bump(&self.stats.bypassed_ios, r.misses - kept as u64);
        bump(&self.stats.origin_reads, 1);
        self.origins.of_key(r.first).count_reads(0, r.misses);
    }

    /// `req`'s blocks (`first`, `last`), try-locked, if its origin device
    /// is one `takes` and no other request holds any of them.
    fn try_lock_origin(
        &self,
        req: &Request,
        takes: impl FnOnce(&dyn BlockDevice) -> bool,
    ) -> Option<(u64, u64, BlockRangeGuard<'_>)> {
        let (first, last) = req.blocks()?;
        if !takes(self.origins.at(req.offset).device().as_ref()) {
            return None;
        }
        let guard = (self.origins.of_key(first).locks()).try_lock_range(first, last)?;
        Some((first, last, guard))
    }

    /// The runs of adjacent blocks of `segs` (whole blocks, none cached,
    /// locked) a read keeps, as `read_misses` decides them: the plan
    /// promotes, the block is cacheable and admission takes it.
    fn kept_runs(&self, segs: &[Segment], plan: &Plan) -> Vec<(u64, usize, usize)> {
        let kept = segs.iter().filter(|seg| {
            plan.promote && self.cacheable(seg.block) && self.keeps_miss(seg.block, plan)
        });
        block_runs(kept.map(|seg| (seg.block, seg.buf.start)))
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

    /// `r` is over but nobody wants its data any more (its awaiter went
    /// away): it ends without its promotion, so the cache write is not
    /// done on whatever thread dropped it (librbd's callback thread,
    /// which a cache device that stalls would then hold).
    pub(crate) fn origin_read_abandoned(&self, mut r: OriginRead, res: DeviceResult<AlignedBuf>) {
        let dropped: usize = r.keep.drain(..).map(|(_, _, n)| n).sum();
        bump(&self.stats.bypassed_ios, dropped as u64);
        let _ = self.origin_read_done(r, res);
    }

    /// `r` is over: what it keeps stored, its blocks unlocked, the
    /// origin's foreground I/O and the request's latency counted, as a
    /// blocking read counts them. A promotion that cannot be stored
    /// leaves its blocks uncached; the read still returns its data.
    pub(crate) fn origin_read_done(
        &self,
        r: OriginRead,
        res: DeviceResult<AlignedBuf>,
    ) -> EngineResult<AlignedBuf> {
        self.origin_read_over(r, res.as_ref().map(|b| &b[..]));
        Ok(res?)
    }

    /// `origin_read_done` with the origin's bytes wherever they are.
    pub(crate) fn origin_read_over(&self, r: OriginRead, res: Result<&[u8], &DeviceError>) {
        let ns = self.device_timed(Dev::OriginRead, r.len, &r.timer, res.is_ok());
        // Stored while the volume still counts the read as foreground I/O:
        // retiring it waits for the promotion too.
        if let (Ok(data), false) = (&res, r.keep.is_empty()) {
            if let Err(e) = self.promote_runs(data, &r.keep) {
                log::warn!("a read's promotion: {e}");
            }
        }
        self.origin_read_let_go(r);
        if let Err(e) = res {
            self.origin_read_failed(e);
        }
        self.observe.latency.request(Op::Read, false, ns);
    }

    /// Lets go of `r` with nothing recorded: its blocks unlocked, the
    /// origin's foreground I/O ended.
    pub(crate) fn origin_read_let_go(&self, r: OriginRead) {
        self.origins.at(r.at).end_foreground(self.now_ms());
        (self.origins.of_key(r.first).locks()).unlock_handed(r.first, r.last);
    }
}

/// A write sent to the origin, its blocks (`first..=last`) locked until
/// `origin_write_done`.
pub struct OriginWrite {
    first: u64,
    last: u64,
    /// The request's address and length (origin/address.rs).
    at: u64,
    len: usize,
    timer: DeviceTimer,
    /// The origin's loss epoch when the write started (`Origin::wrote`).
    epoch: u64,
}

impl Cache {
    /// `req`, a write a fast path handed on, as a write to send to its
    /// origin's `Submit` (`send_origin_write`), or handed back for the
    /// blocking path (module comment: when it must wait or commit first).
    pub(crate) fn start_origin_write(&self, mut req: Request) -> Result<OriginWrite, Request> {
        if req.fua || self.journal.pressed() {
            return Err(req);
        }
        let Some((first, last, guard)) = self.try_lock_origin(&req, |d| d.submitter().is_some())
        else {
            return Err(req);
        };
        let origin = self.origins.at(req.offset);
        if self.resolve(&mut req).route != WriteRoute::Around
            || self.order.older_groups_pending(self)
            || origin.flights().origin_writing(first, last)
            || self.releases_pending(first..=last)
            || self.lookup(&mut req, |_| true).iter().any(Option::is_some)
        {
            return Err(req);
        }
        if !origin.begin_foreground() {
            origin.end_foreground(self.now_ms());
            return Err(req);
        }
        origin.flights().touch(first, last);
        guard.hand_off();
        bump(&self.stats.write_requests, 1);
        self.count_write_hits(&req.segs);
        bump(&self.stats.bypassed_ios, 1);
        bump(&self.stats.origin_writes, 1);
        bump(&self.stats.origin_writes_submitted, 1);
        Ok(OriginWrite {
            first,
            last,
            at: req.offset,
            len: req.len as usize,
            timer: self.device_timer(),
            epoch: origin.loss_epoch(),
        })
    }

    /// Sends `w` with its data to the origin; `reply` gets the outcome on
    /// the thread the origin completes it on (or this one).
    pub(crate) fn send_origin_write(
        &self,
        w: OriginWrite,
        data: AlignedBuf,
        reply: impl FnOnce(OriginWrite, DeviceResult<()>) + Send + 'static,
    ) {
        let origin = self.origins.at(w.at);
        let local = origin.local(w.at);
        let submitter = (origin.device().submitter()).expect("start_origin_write checked");
        submitter.submit_write(data, local, Box::new(move |_, res| reply(w, res)));
    }

    /// `w` is over: a write that reached the origin is noted for the next
    /// origin flush and makes its range current (`heal_stale`), as
    /// `origin_write` does; its blocks unlocked, the origin's foreground
    /// I/O and the request's latency counted. Never blocks (it runs on the
    /// origin's completion thread).
    pub(crate) fn origin_write_done(
        &self,
        w: OriginWrite,
        res: DeviceResult<()>,
    ) -> EngineResult<()> {
        let ns = self.device_timed(Dev::OriginWrite, w.len, &w.timer, res.is_ok());
        let origin = self.origins.at(w.at);
        match &res {
            Ok(()) => {
                let local = origin.local(w.at);
                origin.wrote(local..local + w.len as u64, w.epoch);
                origin.heal_stale(w.at, w.len as u64);
            }
            Err(e) => self.origin_write_failed(e),
        }
        self.journal.note_completed();
        origin.end_foreground(self.now_ms());
        (self.origins.of_key(w.first).locks()).unlock_handed(w.first, w.last);
        self.observe.latency.request(Op::Write, false, ns);
        Ok(res?)
    }
}
