//! The engine's door: a request is validated and split into per-block
//! segments (a `Request`, request.rs), its blocks are locked, then
//! `resolve` decides in one place what the mode and admission make of it and
//! counts it, once, and the request is dispatched: reads to `read.rs`,
//! writes to their route's file in `modes/`. The fast paths for the NBD
//! server's worker threads take the same steps with try-locks and stop
//! where they would have to wait, handing the request on (`Fast::Pending`)
//! with whatever they resolved: nothing is decided or counted twice.
//! The blocks are looked up here too (`lookup`), under their locks.

use super::admission::Decision;
use super::delivery::{Delivery, Lent, Made};
use super::io::data::ORIGIN_REQUESTS;
use super::modes::WriteRoute;
use super::observe::latency::Op;
use super::origin::address::{offset_in_volume, volume_of};
use super::request::{
    adjacent_slots, Cached, Fast, Lookup, Plan, ReadKind, Request, Segment, Segs,
};
use super::stats::bump;
use super::EngineError;
use super::{EngineResult, Mode};
use crate::device::AlignedBuf;
use crate::engine::cache::Cache;
use crate::volume::Dest;
use crate::volume::{pieces, PREFETCH_PIECE_BYTES};

/// Largest request `warm` makes.
const WARM_CHUNK_BYTES: u64 = 1 << 20;

impl Cache {
    /// Validates a request and splits it into per-block segments.
    pub(crate) fn segments(&self, offset: u64, len: u64, write: bool) -> EngineResult<Segs> {
        self.check_span(offset, len, write)?;
        let bs = self.block_bytes;
        let blocks = match len {
            0 => 0,
            _ => ((offset + len - 1) / bs - offset / bs + 1) as usize,
        };
        let mut out = Segs::with_capacity(blocks);
        let mut pos = offset;
        while pos < offset + len {
            let block = pos / bs;
            let in_block = pos % bs;
            let n = (bs - in_block).min(offset + len - pos);
            let start = (pos - offset) as usize;
            out.push(Segment {
                block,
                in_block,
                buf: start..start + n as usize,
            });
            pos += n;
        }
        Ok(out)
    }

    /// A request's range is 512-byte aligned and inside the volume.
    pub(crate) fn check_span(&self, offset: u64, len: u64, write: bool) -> EngineResult<()> {
        if !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            return Err(EngineError::InvalidRequest(format!(
                "{offset}+{len} is not 512-byte aligned"
            )));
        }
        // An address's volume is in its high bits (origin/address.rs): a
        // request past a volume's end never reaches the next one.
        let origin = self.origins.get(volume_of(offset));
        if let Some(o) = origin.filter(|o| o.retired()) {
            return Err(EngineError::InvalidRequest(format!(
                "volume {} was removed from the cache",
                o.name()
            )));
        }
        let at = offset_in_volume(offset);
        let bytes = origin.map_or(0, |o| o.bytes());
        if at.checked_add(len).is_none_or(|e| e > bytes) {
            let msg = match origin {
                Some(o) if self.origins.len() > 1 => {
                    format!("{at}+{len} beyond volume {}'s {bytes} bytes", o.name())
                }
                Some(_) => format!("{at}+{len} beyond {bytes} bytes"),
                None => format!("no volume {} in this cache", volume_of(offset)),
            };
            return Err(if write {
                EngineError::NoSpace(msg)
            } else {
                EngineError::InvalidRequest(msg)
            });
        }
        Ok(())
    }

    /// True if `block` can be cached (a partial last block never is).
    pub(crate) fn cacheable(&self, block: u64) -> bool {
        self.origins.of_key(block).cacheable(block)
    }

    pub(crate) fn full_block(&self, seg: &Segment) -> bool {
        seg.in_block == 0 && seg.len() == self.block_bytes
    }

    /// Looks up the request's blocks under one metadata lock, keeping the
    /// hits that `keep` accepts (given the block's dirty flag). The first
    /// lookup of a request tells the policy about each hit; a request
    /// handed on from a fast path is looked up again (its locks were let
    /// go) without telling the policy twice. The caller holds the blocks'
    /// locks, so the mappings stay valid.
    pub(crate) fn lookup(&self, req: &mut Request, keep: impl Fn(bool) -> bool) -> Lookup {
        let tell = !std::mem::replace(&mut req.policy_told, true);
        let mut told = 0;
        let mut m = self.meta.lock();
        let hits = req
            .segs
            .iter()
            .map(|seg| {
                let c = m.cached(seg.block, seg.run()).filter(|c| keep(c.dirty))?;
                if tell {
                    m.accessed(c.slot);
                    told += 1;
                }
                Some(c)
            })
            .collect();
        drop(m);
        bump(&self.stats.policy_accesses, told);
        hits
    }

    /// Resolves a request once: the mode's route and read rule and
    /// admission's decision, read and decided here and nowhere else. The
    /// first call records the request (admission's stream table, the bypass
    /// counters, the heat map and miss-ratio curve for a client's request);
    /// later calls return the same plan.
    pub(crate) fn resolve(&self, req: &mut Request) -> Plan {
        if let Some(plan) = req.plan {
            return plan;
        }
        // The request's volume's mode (a request never crosses a volume).
        let mode = self.origins.at(req.offset).mode();
        let admission = self.admission_for(req);
        match admission {
            Decision::Sequential => bump(&self.stats.sequential_bypasses, 1),
            Decision::Guard => bump(&self.stats.guard_bypasses, 1),
            _ => {}
        }
        if req.kind == ReadKind::Client {
            self.note_blocks(req.offset, req.len, !req.write);
        }
        let prefetch = req.kind != ReadKind::Client;
        let plan = Plan {
            mode,
            route: mode.write_route(),
            promote: mode.promotes_reads() || (prefetch && mode != Mode::Passthrough),
            admission,
        };
        req.plan = Some(plan);
        plan
    }

    /// Admission's decision for a request not yet resolved; the stream
    /// table learns it.
    fn admission_for(&self, req: &Request) -> Decision {
        if !self.admitting() {
            return Decision::Stopped;
        }
        if req.kind == ReadKind::Warm {
            return Decision::Admit;
        }
        (self.admission).decide_and_record(req.offset, req.len, req.write, || {
            let m = self.meta.lock();
            m.table().used() * 100 / self.usable_slots(&m).max(1)
        })
    }

    /// Runs a request, timing it for the latency histograms: a hit if it
    /// made no origin request.
    pub(crate) fn timed_request<T>(&self, op: Op, f: impl FnOnce() -> T) -> T {
        let started = self.started();
        let r = f();
        self.record_request(op, &started);
        r
    }

    /// A request's start, for `record_request`.
    fn started(&self) -> Started {
        Started {
            origin_requests: ORIGIN_REQUESTS.with(|c| c.get()),
            t: self.clock.now_ns(),
        }
    }

    /// Records a request's latency from `started` to now in the histograms:
    /// a hit if this thread made no origin request meanwhile.
    fn record_request(&self, op: Op, started: &Started) {
        let hit = ORIGIN_REQUESTS.with(|c| c.get()) == started.origin_requests;
        let ns = self.clock.since_ns(started.t);
        self.observe.latency.request(op, hit, ns);
    }

    /// A request reached its blocks: the heat map and the miss-ratio curve
    /// see each block once (the curve counts reads).
    fn note_blocks(&self, offset: u64, len: u64, read: bool) {
        if len == 0 {
            return;
        }
        let bs = self.block_bytes;
        for block in offset / bs..=(offset + len - 1) / bs {
            self.observe.accessed(block, read);
        }
    }

    /// Finishes a read a fast path handed on (`try_read_hits`), or starts one.
    pub fn read_request(&self, req: Request) -> EngineResult<AlignedBuf> {
        self.timed_request(Op::Read, || self.read_inner(req))
    }

    fn read_inner(&self, req: Request) -> EngineResult<AlignedBuf> {
        bump(&self.stats.read_requests, 1);
        let mut out = Made::default();
        self.read_planned(req, |_| true, &mut out)?;
        Ok(out.0.expect("a read that accepts every plan reads"))
    }

    /// `read_request` into the reader's buffer (`volume::Dest`, of the
    /// request's length), given back to `reply` with the outcome as soon
    /// as it is filled: what the read fetched to keep may be stored after
    /// that, still under the read's block locks (so a later request for
    /// those blocks waits for it), on this thread, within
    /// `cache/deferred.rs`'s budget.
    pub fn read_request_into(
        &self,
        req: Request,
        dest: Dest,
        reply: impl FnOnce(Dest, EngineResult<()>),
    ) {
        self.read_delivered(req, Lent::new(dest, reply));
    }

    /// Reads `req` into `d`, counted, its latency the delivery's.
    fn read_delivered(&self, req: Request, d: impl Delivery) {
        bump(&self.stats.read_requests, 1);
        let mut d = Timed {
            inner: d,
            cache: self,
            started: self.started(),
        };
        if let Err(e) = self.read_planned(req, |_| true, &mut d) {
            d.fail(e);
        }
    }

    /// Locks the request's blocks, resolves it, and reads it into `d` if
    /// `go_on` accepts the plan (false if not: nothing was read),
    /// delivering it before storing what the read keeps if `d` is early
    /// and the budget allows, else after (delivery.rs). An error is
    /// returned, not given to `d`.
    fn read_planned(
        &self,
        mut req: Request,
        go_on: impl FnOnce(&Plan) -> bool,
        d: &mut impl Delivery,
    ) -> EngineResult<bool> {
        let Some((first, last)) = req.blocks() else {
            d.fill(0, |_| ());
            d.deliver();
            return Ok(true);
        };
        let guard = self.origins.of_key(first).locks().lock_range(first, last);
        let plan = self.resolve(&mut req);
        if !go_on(&plan) {
            return Ok(false);
        }
        // The block locks are held: these mappings cannot change under us
        // (eviction and writeback only take blocks they can lock).
        // Passthrough reads the origin, except a dirty block, whose only
        // current copy is in the cache: set-mode and detach switch to
        // passthrough before they write the dirty blocks back.
        let cached = self.lookup(&mut req, |dirty| dirty || plan.mode.reads_cache());
        let promotion = d.fill(req.len as usize, |out| {
            self.read_locked(&req.segs, &plan, &cached, out)
        })?;
        let Some(promotion) = promotion else {
            // Unlocked first: a request the reader sends next for these
            // blocks finds them free.
            drop(guard);
            d.deliver();
            return Ok(true);
        };
        let ticket = (d.early())
            .then(|| self.deferred.begin(promotion.bytes(), &self.closed))
            .flatten();
        match ticket {
            Some(_ticket) => {
                d.deliver();
                if let Err(e) = self.promote(&promotion) {
                    log::warn!("a read's promotion, after its data went back: {e}");
                }
            }
            None => {
                self.promote(&promotion)?;
                drop(guard);
                d.deliver();
            }
        }
        Ok(true)
    }

    fn try_read_hits_locked(&self, req: &mut Request) -> Option<EngineResult<AlignedBuf>> {
        let (first, last) = req.blocks()?;
        let _guard = self
            .origins
            .of_key(first)
            .locks()
            .try_lock_range(first, last)?;
        let plan = self.resolve(req);
        let cached = self.lookup(req, |dirty| dirty || plan.mode.reads_cache());
        if !cached.iter().all(|c| c.is_some_and(|h| h.valid)) {
            return None;
        }
        bump(&self.stats.read_requests, 1);
        // Hits only: nothing to promote.
        let mut out = AlignedBuf::to_overwrite(req.len as usize);
        Some(
            self.read_locked(&req.segs, &plan, &cached, &mut out)
                .map(|_| out),
        )
    }

    /// The whole write goes in place, with one device write: every segment
    /// over its block's writable slot, the slots adjacent, and the
    /// placement lets these blocks be overwritten.
    pub(crate) fn all_in_place(
        &self,
        segs: &[Segment],
        cached: &[Option<Cached>],
        admits: bool,
    ) -> bool {
        let whole = segs.iter().filter(|s| self.full_block(s)).count();
        adjacent_slots(cached, |h| h.writable) == segs.len()
            && self.placement.overwrites_in_place(whole, admits)
    }

    /// How the cache takes one segment of a write at once (`lookup`'s
    /// `c`), if it does: `Some(true)` in place over its slot (part of a
    /// block, no clean sector of it written), `Some(false)` into a new
    /// slot (a whole block, or part of a block not cached; only if
    /// `admits`). `None`: part of a block whose slot holds clean data among
    /// the sectors written, which the slow path copies to a new slot
    /// (`store_part` reads the old one), or a new slot admission refuses.
    pub(crate) fn takes_at_once(
        &self,
        seg: &Segment,
        c: Option<Cached>,
        admits: bool,
    ) -> Option<bool> {
        match c {
            Some(h) if !self.full_block(seg) => {
                (h.writable && self.placement.overwrites_in_place(0, admits)).then_some(true)
            }
            _ => admits.then_some(false),
        }
    }

    /// Every segment is taken at once (`takes_at_once`), and the free slots
    /// hold those that need new ones above the background's reserve.
    fn fits_at_once(&self, segs: &[Segment], cached: &[Option<Cached>], admits: bool) -> bool {
        let mut new = 0;
        for (s, &c) in segs.iter().zip(cached) {
            match self.takes_at_once(s, c, admits) {
                Some(true) => {}
                Some(false) => new += 1,
                None => return false,
            }
        }
        new == 0 || {
            let m = self.meta.lock();
            m.free_slots() >= new + self.low_free_slots(&m)
        }
    }
}

impl Cache {
    /// A client request of `len` bytes at `offset`: the engine is open and
    /// the range valid.
    pub(crate) fn request(
        &self,
        offset: u64,
        len: u64,
        write: bool,
        fua: bool,
        kind: ReadKind,
    ) -> EngineResult<Request> {
        self.check_open()?;
        let segs = self.segments(offset, len, write)?;
        if !write {
            self.origins.at(offset).refuse_stale(offset, len)?;
        }
        Ok(Request {
            offset,
            len,
            segs,
            write,
            fua,
            kind,
            plan: None,
            policy_told: false,
        })
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: u64) -> EngineResult<AlignedBuf> {
        let req = self.request(offset, len, false, false, ReadKind::Client)?;
        self.read_request(req)
    }

    /// Reads `dest.len()` bytes at `offset` into the reader's buffer
    /// (`read_request_into`).
    pub fn read_into(&self, offset: u64, dest: Dest, reply: impl FnOnce(Dest, EngineResult<()>)) {
        match self.request(offset, dest.len() as u64, false, false, ReadKind::Client) {
            Ok(req) => self.read_request_into(req, dest, reply),
            Err(e) => reply(dest, Err(e)),
        }
    }

    /// Copies a range into the cache (NBD_CMD_CACHE); returns nothing. It
    /// goes in pieces of `PREFETCH_PIECE_BYTES`, so it holds that much
    /// memory whatever its length (read whole, two pipelined 1 GiB CACHE
    /// requests took the daemon to 4.28 GB). It stops at the cache's
    /// capacity, since more would evict its own first pieces, and at the
    /// first piece whose plan lets nothing new in (passthrough, the
    /// sequential cutoff, the guard, admission stopped): the rest would be
    /// read from the origin only to be dropped.
    pub fn prefetch(&self, offset: u64, len: u64) -> EngineResult<()> {
        self.check_open()?;
        self.check_span(offset, len, false)?;
        self.origins.at(offset).refuse_stale(offset, len)?;
        bump(&self.stats.read_requests, 1);
        let capacity_bytes = {
            let m = self.meta.lock();
            self.usable_slots(&m) * self.block_bytes
        };
        let end = offset + len.min(capacity_bytes);
        for (at, n) in pieces(offset, end, PREFETCH_PIECE_BYTES) {
            let req = self.request(at, n, false, false, ReadKind::Prefetch)?;
            let admitted = self.read_planned(
                req,
                |plan| plan.promote && plan.admits(),
                &mut Made::default(),
            )?;
            if !admitted {
                break;
            }
        }
        Ok(())
    }

    /// `warm` of `len` bytes at `offset` of volume `v`.
    pub fn warm_volume(
        &self,
        v: usize,
        offset: u64,
        len: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        let origin = self.volume(v)?;
        let at = super::origin::address::in_volume(origin.base(), offset);
        self.warm(at, len, progress)
    }

    /// Promotes `len` bytes at `offset` into the cache ahead of use (see
    /// `ReadKind::Warm`), in requests of `WARM_CHUNK_BYTES` so that block
    /// locks are held briefly; `progress` gets (bytes done, bytes to do).
    /// A range past the volume's end is cut at the end.
    pub fn warm(
        &self,
        offset: u64,
        len: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        let volume_end = self
            .origins
            .get(volume_of(offset))
            .map_or(offset, |o| o.base() + o.bytes());
        let end = offset.saturating_add(len).min(volume_end);
        let total = end.saturating_sub(offset);
        for (at, n) in pieces(offset, end, WARM_CHUNK_BYTES) {
            let req = self.request(at, n, false, false, ReadKind::Warm)?;
            self.read_inner(req)?;
            progress(at + n - offset, total);
        }
        Ok(())
    }

    /// The read, done on the caller's thread, if every block it touches is
    /// unlocked and holds the requested sectors: one cache device read per
    /// run of adjacent slots, never an origin read or a wait for another
    /// request. Otherwise nothing is done and the request is handed on
    /// (`read_request` finishes it). For the NBD server's async workers,
    /// which must not block for long.
    pub fn try_read_hits(&self, offset: u64, len: u64) -> Fast<AlignedBuf> {
        let t = self.clock.now_ns();
        let mut req = match self.request(offset, len, false, false, ReadKind::Client) {
            Ok(req) => req,
            Err(e) => return Fast::Done(Err(e)),
        };
        let Some(r) = self.try_read_hits_locked(&mut req) else {
            return Fast::Pending(req);
        };
        self.observe
            .latency
            .request(Op::Read, true, self.clock.since_ns(t));
        Fast::Done(r)
    }

    /// Writes `data` at `offset`; with `fua`, durable on return.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> EngineResult<()> {
        let req = self.request(offset, data.len() as u64, true, fua, ReadKind::Client)?;
        self.write_request(req, data)
    }

    /// Finishes a write a fast path handed on (`try_write_cached`), or
    /// starts one; `data` is the request's.
    pub fn write_request(&self, req: Request, data: &[u8]) -> EngineResult<()> {
        self.timed_request(Op::Write, || self.write_untimed(req, data))
    }

    fn write_untimed(&self, mut req: Request, data: &[u8]) -> EngineResult<()> {
        bump(&self.stats.write_requests, 1);
        let (offset, len) = (req.offset, req.len);
        if let Some((first, last)) = req.blocks() {
            let mut to_origin;
            loop {
                let r = {
                    let _guard = self.origins.of_key(first).locks().lock_range(first, last);
                    self.origins.of_key(first).flights().touch(first, last);
                    let plan = self.resolve(&mut req);
                    to_origin = !matches!(plan.route, WriteRoute::Cache);
                    match plan.route {
                        WriteRoute::Cache => {
                            let cached = self.lookup(&mut req, |_| true);
                            self.write_cached_dirty_with(&req.segs, data, &cached, plan.admits())
                        }
                        WriteRoute::Through => {
                            self.write_writethrough(req.offset, &req.segs, data, plan.admits())
                        }
                        WriteRoute::Around => self.write_around_cache(req.offset, &req.segs, data),
                    }
                };
                match r {
                    // Writeback in flush order: with no block lock held (a
                    // writer waiting for the groups while holding blocks of
                    // theirs could stop them for good), the closed groups
                    // go to the origin; then the write again (rewriting
                    // what it already stored is harmless).
                    Err(EngineError::DrainFirst) => self.order.write_back_closed(self)?,
                    r => break r?,
                }
            }
            // Only data that reached the origin makes a stale block
            // current: a write the cache took while it was being given up
            // is dropped with the table.
            if to_origin {
                self.origins.at(offset).heal_stale(offset, len);
            }
        }
        if req.fua || self.journal.pressed() {
            self.commit()?;
        }
        Ok(())
    }

    /// The write, done on the caller's thread, if it goes into the cache,
    /// every block it touches is unlocked, and it needs no origin I/O and no
    /// commit: segments that are all dirty or empty sectors of adjacent
    /// slots are written in place with one cache write; whole blocks, and
    /// parts of blocks not cached, otherwise go to new slots while free
    /// slots are plentiful and admission lets them in (the background keeps
    /// a reserve, so no eviction or commit is needed). Otherwise, and for
    /// FUA, nothing is done and the request is handed on (`write_request`
    /// finishes it).
    pub fn try_write_cached(&self, offset: u64, data: &[u8], fua: bool) -> Fast<()> {
        let t = self.clock.now_ns();
        let mut req = match self.request(offset, data.len() as u64, true, fua, ReadKind::Client) {
            Ok(req) => req,
            Err(e) => return Fast::Done(Err(e)),
        };
        let r = match self.try_write_cached_locked(&mut req, data) {
            // The slow path writes the closed groups back without locks.
            None | Some(Err(EngineError::DrainFirst)) => return Fast::Pending(req),
            Some(r) => r,
        };
        self.observe
            .latency
            .request(Op::Write, true, self.clock.since_ns(t));
        Fast::Done(r)
    }

    fn try_write_cached_locked(&self, req: &mut Request, data: &[u8]) -> Option<EngineResult<()>> {
        if req.fua || self.journal.pressed() {
            return None;
        }
        let (first, last) = req.blocks()?;
        if !req.segs.iter().all(|s| self.cacheable(s.block)) {
            return None;
        }
        let _guard = self
            .origins
            .of_key(first)
            .locks()
            .try_lock_range(first, last)?;
        let plan = self.resolve(req);
        if plan.route != WriteRoute::Cache {
            return None;
        }
        let cached = self.lookup(req, |_| true);
        let in_place = self.all_in_place(&req.segs, &cached, plan.admits());
        if !(in_place || self.fits_at_once(&req.segs, &cached, plan.admits())) {
            return None;
        }
        bump(&self.stats.write_requests, 1);
        self.origins.of_key(first).flights().touch(first, last);
        Some(self.write_cached_dirty_with(&req.segs, data, &cached, plan.admits()))
    }
}

/// When a request started: this thread's origin requests then, and the
/// clock's ns (`Cache::started`, `record_request`).
struct Started {
    origin_requests: u64,
    t: u64,
}

/// A delivery that records the read's latency when it is delivered (or
/// fails): a hit if it made no origin request by then.
struct Timed<'a, D: Delivery> {
    inner: D,
    cache: &'a Cache,
    started: Started,
}

impl<D: Delivery> Timed<'_, D> {
    fn record(&self) {
        self.cache.record_request(Op::Read, &self.started);
    }
}

impl<D: Delivery> Delivery for Timed<'_, D> {
    fn fill<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        self.inner.fill(len, fill)
    }
    fn deliver(&mut self) {
        self.record();
        self.inner.deliver();
    }
    fn fail(&mut self, e: EngineError) {
        self.record();
        self.inner.fail(e);
    }
    fn early(&self) -> bool {
        self.inner.early()
    }
}
