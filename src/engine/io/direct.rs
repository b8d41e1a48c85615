//! Requests whose cache device I/O the caller makes: the ublk queue reads
//! hits straight into the request's buffer, and writes what the cache
//! takes at once straight from it, on its own io_uring (`volume::Direct`),
//! so they cost no hand-off between threads, no thread blocked on the
//! device and no copy. The engine does what its fast paths do up to the
//! device I/O (`try_read_hits`, `try_write_cached`: the request resolved,
//! its blocks try-locked and looked up), says where the data lies or goes,
//! and keeps the blocks locked (and new slots taken) until the caller
//! reports back (`hit_reads_done`, `cache_writes_done`): no eviction or
//! writeback can move the data meanwhile, and a write's records are
//! appended only once its data is on the device, as `store_in_new_slots`
//! and the in-place path do. Only a cache device that is a plain file or
//! block device (`FileDevice`) is used this way.

use std::os::fd::{AsRawFd, RawFd};

use crate::device::DeviceRef;
use crate::engine::admission::Dev;
use crate::engine::cache::Cache;
use crate::engine::modes::WriteRoute;
use crate::engine::observe::latency::Op;
use crate::engine::request::{adjacent_slots, Fast, Lookup, ReadKind, Request, Segment};
use crate::engine::stats::bump;
use crate::engine::EngineResult;
use crate::volume::{Piece, Pieces};

/// What a direct request holds from its start until the caller reports
/// back: the cache device (kept open), the request, its blocks
/// (`first..=last`, locked once taken) and when it started (the clock's
/// ns).
struct Hold {
    /// Keeps the descriptor the caller uses open.
    _dev: DeviceRef,
    req: Request,
    first: u64,
    last: u64,
    t: u64,
}

/// The cache device reads of a read of hits, the blocks locked.
pub struct HitReads {
    /// The cache device's descriptor; the hold keeps it open.
    pub fd: RawFd,
    pub pieces: Pieces,
    hold: Hold,
}

impl Cache {
    /// A read of `len` bytes at `offset` that only hits unlocked blocks,
    /// as `try_read_hits` would do it, with the device reads left to the
    /// caller. `None` if the cache device is not a plain file or block
    /// device (nothing done); `Pending` if the read is not all hits or a
    /// block is locked (the request resolved and carried, for
    /// `read_request`).
    pub fn try_hit_reads(&self, offset: u64, len: u64) -> Option<Fast<HitReads>> {
        let (fd, mut h) = match self.direct_start(offset, len, false, false) {
            Ok(start) => start,
            Err(r) => return r,
        };
        let locks = self.origins.of_key(h.first).locks();
        let Some(guard) = locks.try_lock_range(h.first, h.last) else {
            return Some(Fast::Pending(h.req));
        };
        let plan = self.resolve(&mut h.req);
        let cached = self.lookup(&mut h.req, |dirty| dirty || plan.mode.reads_cache());
        if !cached.iter().all(|c| c.is_some_and(|h| h.valid)) {
            return Some(Fast::Pending(h.req));
        }
        let segs = &h.req.segs;
        let mut pieces = Pieces::new();
        let mut i = 0;
        while i < segs.len() {
            let run = adjacent_slots(&cached[i..], |h| h.valid).max(1);
            let (seg, slot) = (&segs[i], cached[i].expect("all hits").slot);
            pieces.push(Piece {
                at: self.regions.slot_offset(slot) + seg.in_block,
                buf: seg.buf.start..segs[i + run - 1].buf.end,
            });
            i += run;
        }
        // Held until `hit_reads_done`, on this thread.
        guard.keep();
        Some(Fast::Done(Ok(HitReads {
            fd,
            pieces,
            hold: h,
        })))
    }

    /// The start both directions share: the cache device, if it is a
    /// plain file or block device, and the request checked, with its
    /// blocks. `Err` holds what the caller returns: `None` (no such
    /// device: nothing done), the request's error, or a request of no
    /// blocks handed on.
    fn direct_start<T>(
        &self,
        offset: u64,
        len: u64,
        write: bool,
        fua: bool,
    ) -> Result<(RawFd, Hold), Option<Fast<T>>> {
        let dev = self.io.cache.clone();
        let fd = dev.as_file().ok_or(None)?.as_raw_fd();
        let t = self.clock.now_ns();
        let req = (self.request(offset, len, write, fua, ReadKind::Client))
            .map_err(|e| Some(Fast::Done(Err(e))))?;
        let Some((first, last)) = req.blocks() else {
            return Err(Some(Fast::Pending(req)));
        };
        let hold = Hold {
            _dev: dev,
            req,
            first,
            last,
            t,
        };
        Ok((fd, hold))
    }

    /// Unlocks a hold's blocks.
    fn let_go(&self, h: &Hold) {
        (self.origins.of_key(h.first).locks()).unlock_range(h.first, h.last);
    }

    /// The caller's device reads are over (`ok`: each read whole): the
    /// blocks are unlocked, and the read is counted as `try_read_hits`
    /// counts one. After a failure nothing is counted and the request is
    /// returned, for `read_request` (which reads the cache again and
    /// handles its error: a clean copy dropped and the origin read).
    pub fn hit_reads_done(&self, r: HitReads, ok: bool) -> Option<Request> {
        let ns = self.clock.since_ns(r.hold.t);
        self.let_go(&r.hold);
        let Hold { req, first, .. } = r.hold;
        if !ok {
            return Some(req);
        }
        let hits = req.segs.len() as u64;
        bump(&self.stats.read_requests, 1);
        bump(&self.stats.read_hits, hits);
        self.origins.of_key(first).count_reads(hits, 0);
        // The time includes the wait for the caller to see the completion:
        // shown, but not given to the admission guard, which compares the
        // cache device's own latency with the origin's.
        self.observe.latency.device(Dev::CacheRead as usize, ns);
        self.observe.latency.request(Op::Read, true, ns);
        None
    }
}

/// Where a direct write's segments go.
struct Placed {
    /// Per segment, its block's lookup if it is written in place over its
    /// slot; `None` if it goes into a new slot.
    over: Lookup,
    /// The new slots, one a `None` of `over`, in order.
    new: Vec<u32>,
}

impl Placed {
    /// Each segment's slot, in order.
    fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        let mut new = self.new.iter();
        (self.over.iter()).map(move |c| match c {
            Some(h) => h.slot,
            None => *new.next().expect("one new slot a segment not in place"),
        })
    }
}

/// The cache device writes of a write the cache takes at once, the blocks
/// locked and any new slots taken.
pub struct CacheWrites {
    /// The cache device's descriptor; the hold keeps it open.
    pub fd: RawFd,
    pub pieces: Pieces,
    hold: Hold,
    placed: Placed,
    /// Segments whose block was cached.
    hits: u64,
}

/// What is left of a direct write once its device writes are over.
pub enum WriteLeft {
    /// Nothing: the write is done.
    Nothing,
    /// Done, but the volume's mode no longer holds dirty data, or the crash
    /// log is nearly full: `write_tail` (writeback, a commit) must run
    /// where it may block.
    Tail(Request),
    /// A device write failed: nothing was recorded; the request goes to
    /// `write_request` with its data.
    Again(Request),
}

impl Cache {
    /// A write of `len` bytes at `offset` that the cache takes at once, as
    /// `try_write_cached` would (in place over adjacent writable slots, or
    /// whole blocks into new slots while free slots are plentiful), with
    /// the device writes left to the caller. `None` and `Pending` as for
    /// `try_hit_reads`.
    pub fn try_cache_writes(&self, offset: u64, len: u64, fua: bool) -> Option<Fast<CacheWrites>> {
        let (fd, mut h) = match self.direct_start(offset, len, true, fua) {
            Ok(start) => start,
            Err(r) => return r,
        };
        let (first, last) = (h.first, h.last);
        if h.req.fua
            || self.journal.pressed()
            || !h.req.segs.iter().all(|s| self.cacheable(s.block))
        {
            return Some(Fast::Pending(h.req));
        }
        let origin = self.origins.of_key(first);
        let Some(guard) = origin.locks().try_lock_range(first, last) else {
            return Some(Fast::Pending(h.req));
        };
        let Some((placed, hits)) = self.place_write(&mut h.req, first) else {
            return Some(Fast::Pending(h.req));
        };
        origin.flights().touch(first, last);
        let pieces = self.write_pieces(&h.req, &placed);
        // Held until `cache_writes_done`, on this thread.
        guard.keep();
        Some(Fast::Done(Ok(CacheWrites {
            fd,
            pieces,
            hold: h,
            placed,
            hits,
        })))
    }

    /// Where a write whose blocks are locked goes, if the cache takes it at
    /// once, and how many of its blocks were cached: as
    /// `try_write_cached_locked` takes it, all in place over adjacent
    /// writable slots (`all_in_place`), or else segment by segment
    /// (`takes_at_once`): whole blocks into new slots (one device write
    /// where the new slots are adjacent), parts of blocks in place over
    /// writable slots, parts of blocks not cached into new slots.
    fn place_write(&self, req: &mut Request, first: u64) -> Option<(Placed, u64)> {
        let plan = self.resolve(req);
        if plan.route != WriteRoute::Cache {
            return None;
        }
        let cached = self.lookup(req, |_| true);
        let hits = cached.iter().filter(|c| c.is_some()).count() as u64;
        if self.all_in_place(&req.segs, &cached, plan.admits()) {
            let placed = Placed {
                over: cached,
                new: Vec::new(),
            };
            return Some((placed, hits));
        }
        let mut over = Lookup::new();
        for (seg, &c) in req.segs.iter().zip(&cached) {
            let in_place = self.takes_at_once(seg, c, plan.admits())?;
            over.push(c.filter(|_| in_place));
        }
        let new = match over.iter().filter(|c| c.is_none()).count() {
            0 => Vec::new(),
            n => self.take_free_slots(n, first)?,
        };
        Some((Placed { over, new }, hits))
    }

    /// The device writes of a placed write: one a segment, joined where
    /// one ends on the device where the next begins.
    fn write_pieces(&self, req: &Request, placed: &Placed) -> Pieces {
        let mut pieces = Pieces::new();
        for (seg, slot) in req.segs.iter().zip(placed.slots()) {
            let at = self.regions.slot_offset(slot) + seg.in_block;
            match pieces.last_mut() {
                Some(p) if p.at + p.buf.len() as u64 == at && p.buf.end == seg.buf.start => {
                    p.buf.end = seg.buf.end
                }
                _ => pieces.push(Piece {
                    at,
                    buf: seg.buf.clone(),
                }),
            }
        }
        pieces
    }

    /// Records a placed write whose device writes are over (`ok`), as the
    /// in-place path and `store_in_new_slots` record theirs; after a
    /// failure its new slots are given back. Only a write with segments
    /// of both kinds sorts them.
    fn record_placed(&self, segs: &[Segment], placed: &Placed, ok: bool) {
        if placed.new.is_empty() {
            if ok {
                self.record_in_place(segs, &placed.over);
            }
            return;
        }
        if placed.new.len() == segs.len() {
            return self.settle_new_slots(&placed.new, segs, ok);
        }
        type Segs = smallvec::SmallVec<[Segment; 2]>;
        let (mut put, mut hit, mut news) = (Segs::new(), Lookup::new(), Segs::new());
        for (seg, c) in segs.iter().zip(&placed.over) {
            match c {
                Some(_) => {
                    put.push(seg.clone());
                    hit.push(*c);
                }
                None => news.push(seg.clone()),
            }
        }
        if ok {
            self.record_in_place(&put, &hit);
        }
        self.settle_new_slots(&placed.new, &news, ok);
    }

    /// The caller's device writes are over (`ok`: each written whole):
    /// the write is recorded as `try_write_cached` records one and the
    /// blocks unlocked; after a failure new slots are given back, nothing
    /// is recorded or counted, and the request is returned.
    pub fn cache_writes_done(&self, w: CacheWrites, ok: bool) -> WriteLeft {
        let ns = self.clock.since_ns(w.hold.t);
        let segs = &w.hold.req.segs;
        self.record_placed(segs, &w.placed, ok);
        if ok {
            self.journal.note_completed();
            bump(&self.stats.write_requests, 1);
            bump(&self.stats.write_hits, w.hits);
            bump(&self.stats.write_misses, segs.len() as u64 - w.hits);
        }
        self.let_go(&w.hold);
        let Hold { req, first, .. } = w.hold;
        if !ok {
            // The write again meets the device's error, and counts it.
            return WriteLeft::Again(req);
        }
        // As for reads: not for the admission guard.
        self.observe.latency.device(Dev::CacheWrite as usize, ns);
        self.observe.latency.request(Op::Write, true, ns);
        let mode = self.origins.of_key(first).mode();
        match mode.holds_dirty() && !self.journal.pressed() {
            true => WriteLeft::Nothing,
            false => WriteLeft::Tail(req),
        }
    }

    /// What a direct write leaves (`WriteLeft::Tail`): its blocks written
    /// back if the mode changed meanwhile, a commit if the crash log is
    /// nearly full.
    pub fn write_tail(&self, req: &Request) -> EngineResult<()> {
        if let Some((first, last)) = req.blocks() {
            let _guard = self.origins.of_key(first).locks().lock_range(first, last);
            self.write_back_if_mode_changed(&req.segs)?;
        }
        if self.journal.pressed() {
            self.commit()?;
        }
        Ok(())
    }
}
