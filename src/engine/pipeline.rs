//! One request pipeline: a request is validated and split into per-block
//! segments (`request.rs`), its blocks are locked, then `resolve` decides in
//! one place what the mode and admission make of it, and the request is
//! dispatched: reads to `read.rs`, writes to their route's file in
//! `modes/`. The fast paths for the NBD server's worker threads take the
//! same steps with try-locks and stop (returning `None`) where they would
//! have to wait.

use std::sync::atomic::Ordering;

use super::admission::Decision;
use super::device_io::ORIGIN_REQUESTS;
use super::modes::WriteRoute;
use super::observe::latency::Op;
use super::request::adjacent_slots;
use super::stats::bump;
use super::{Engine, EngineResult, Mode};
use crate::device::AlignedBuf;

/// What the mode and admission make of one request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub mode: Mode,
    /// Where a write goes.
    pub route: WriteRoute,
    /// Read misses may be promoted (before admission's say, per block).
    pub promote: bool,
    pub admission: Decision,
}

impl Plan {
    /// New blocks may enter the cache for this request.
    pub fn admits(&self) -> bool {
        self.admission.admits()
    }
}

/// Largest request `warm` makes.
const WARM_CHUNK_BYTES: u64 = 1 << 20;

/// Who asks for a read, which decides what a miss may promote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadKind {
    /// A client's read: the mode and admission decide.
    Client,
    /// NBD_CMD_CACHE: promotes in every mode but passthrough; admission
    /// still decides.
    Prefetch,
    /// `warm`: the operator asked for this range in the cache, so it is
    /// admitted whatever the sequential cutoff, promotion count or guard
    /// say (not while admission is stopped after cache errors).
    Warm,
}

impl Engine {
    /// Resolves a request of `len` bytes at `offset`: the mode's route and
    /// read rule, and the admission decision.
    pub(crate) fn resolve(&self, offset: u64, len: u64, write: bool, kind: ReadKind) -> Plan {
        let mode = self.mode();
        let prefetch = kind != ReadKind::Client;
        let admission = if kind == ReadKind::Warm && self.admitting() {
            Decision::Admit
        } else if self.admitting() {
            self.admission.decide(offset, len, write, || {
                let m = self.meta.lock();
                m.table.used() * 100 / m.table.slot_count().max(1)
            })
        } else {
            Decision::Stopped
        };
        match admission {
            Decision::Sequential => bump(&self.stats.sequential_bypasses, 1),
            Decision::Guard => bump(&self.stats.guard_bypasses, 1),
            _ => {}
        }
        Plan {
            mode,
            route: mode.write_route(),
            promote: mode.promotes_reads() || (prefetch && mode != Mode::Passthrough),
            admission,
        }
    }

    /// Runs a request, timing it for the latency histograms: a hit if it
    /// made no origin request.
    pub(crate) fn timed_request<T>(&self, op: Op, f: impl FnOnce() -> T) -> T {
        let before = ORIGIN_REQUESTS.with(|c| c.get());
        let t = self.clock.now_ns();
        let r = f();
        let hit = ORIGIN_REQUESTS.with(|c| c.get()) == before;
        self.observe
            .latency
            .request(op, hit, self.clock.since_ns(t));
        r
    }

    /// A request reached its blocks: the heat map and the miss-ratio curve
    /// see each block once.
    fn note_blocks(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let bs = self.block_bytes;
        for block in offset / bs..=(offset + len - 1) / bs {
            self.observe.accessed(block);
        }
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: u64) -> EngineResult<AlignedBuf> {
        self.timed_request(Op::Read, || self.read_inner(offset, len, ReadKind::Client))
    }

    /// Copies a range into the cache (NBD_CMD_CACHE); returns nothing.
    pub fn prefetch(&self, offset: u64, len: u64) -> EngineResult<()> {
        self.read_inner(offset, len, ReadKind::Prefetch).map(|_| ())
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
        let end = offset.saturating_add(len).min(self.volume_bytes);
        let total = end.saturating_sub(offset);
        let mut at = offset;
        while at < end {
            // Chunks end on chunk boundaries, so they stay block-aligned.
            let next = ((at / WARM_CHUNK_BYTES + 1) * WARM_CHUNK_BYTES).min(end);
            self.read_inner(at, next - at, ReadKind::Warm)?;
            at = next;
            progress(at - offset, total);
        }
        Ok(())
    }

    pub(crate) fn read_inner(
        &self,
        offset: u64,
        len: u64,
        kind: ReadKind,
    ) -> EngineResult<AlignedBuf> {
        self.check_open()?;
        let segs = self.segments(offset, len, false)?;
        bump(&self.stats.read_requests, 1);
        let Some(first) = segs.first() else {
            return Ok(AlignedBuf::zeroed(len as usize));
        };
        let _guard = self
            .locks
            .lock_range(first.block, segs.last().expect("non-empty").block);
        let plan = self.resolve(offset, len, false, kind);
        if kind == ReadKind::Client {
            self.note_blocks(offset, len);
        }
        // The block locks are held: these mappings cannot change under us
        // (eviction and writeback only take blocks they can lock).
        // Passthrough reads the origin, except a dirty block, whose only
        // current copy is in the cache: set-mode and detach switch to
        // passthrough before they write the dirty blocks back.
        let cached = self.lookup_accessed(&segs, |dirty| dirty || plan.mode.reads_cache());
        self.read_locked(&segs, len, &plan, &cached)
    }

    /// The read, done on the caller's thread, if every block it touches is
    /// unlocked and holds the requested sectors: one cache device read per
    /// run of adjacent slots, never an origin read or a wait for another
    /// request. `None` (nothing done) otherwise. For the NBD server's async
    /// workers, which must not block for long.
    pub fn try_read_hits(&self, offset: u64, len: u64) -> Option<EngineResult<AlignedBuf>> {
        let t = self.clock.now_ns();
        let r = self.try_read_hits_untimed(offset, len)?;
        self.observe
            .latency
            .request(Op::Read, true, self.clock.since_ns(t));
        Some(r)
    }

    fn try_read_hits_untimed(&self, offset: u64, len: u64) -> Option<EngineResult<AlignedBuf>> {
        let (segs, _guard) = match self.try_lock_request(offset, len, false)? {
            Ok(locked) => locked,
            Err(e) => return Some(Err(e)),
        };
        let plan = self.resolve(offset, len, false, ReadKind::Client);
        let cached = self.lookup_accessed(&segs, |dirty| dirty || plan.mode.reads_cache());
        if !cached.iter().all(|c| c.is_some_and(|h| h.valid)) {
            return None;
        }
        bump(&self.stats.read_requests, 1);
        self.note_blocks(offset, len);
        Some(self.read_locked(&segs, len, &plan, &cached))
    }

    /// Writes `data` at `offset`; with `fua`, durable on return.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> EngineResult<()> {
        self.timed_request(Op::Write, || self.write_untimed(offset, data, fua))
    }

    fn write_untimed(&self, offset: u64, data: &[u8], fua: bool) -> EngineResult<()> {
        self.check_open()?;
        let segs = self.segments(offset, data.len() as u64, true)?;
        bump(&self.stats.write_requests, 1);
        if let Some(first) = segs.first() {
            let last = segs.last().expect("non-empty").block;
            let _guard = self.locks.lock_range(first.block, last);
            self.flights.touch(first.block, last);
            let plan = self.resolve(offset, data.len() as u64, true, ReadKind::Client);
            self.note_blocks(offset, data.len() as u64);
            match plan.route {
                WriteRoute::Cache => {
                    let cached = self.lookup_accessed(&segs, |_| true);
                    self.write_cached_dirty_with(&segs, data, &cached, plan.admits())?
                }
                WriteRoute::Through => {
                    self.write_writethrough(offset, &segs, data, plan.admits())?
                }
                WriteRoute::Around => self.write_around_cache(offset, &segs, data)?,
            }
        }
        if fua || self.crash_log_pressed.load(Ordering::Relaxed) {
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
    /// a reserve, so no eviction or commit is needed). `None` (nothing done)
    /// otherwise, and for FUA.
    pub fn try_write_cached(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Option<EngineResult<()>> {
        let t = self.clock.now_ns();
        let r = self.try_write_cached_untimed(offset, data, fua)?;
        self.observe
            .latency
            .request(Op::Write, true, self.clock.since_ns(t));
        Some(r)
    }

    fn try_write_cached_untimed(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Option<EngineResult<()>> {
        if fua
            || self.mode().write_route() != WriteRoute::Cache
            || self.crash_log_pressed.load(Ordering::Relaxed)
        {
            return None;
        }
        let (segs, _guard) = match self.try_lock_request(offset, data.len() as u64, true)? {
            Ok(locked) => locked,
            Err(e) => return Some(Err(e)),
        };
        if !segs.iter().all(|s| self.cacheable(s.block)) {
            return None;
        }
        let plan = self.resolve(offset, data.len() as u64, true, ReadKind::Client);
        let cached = self.lookup_accessed(&segs, |_| true);
        let in_place = adjacent_slots(&cached, |h| h.writable) == segs.len();
        let to_new_slots = || {
            plan.admits()
                && segs
                    .iter()
                    .zip(&cached)
                    .all(|(s, c)| self.full_block(s) || c.is_none())
                && {
                    let m = self.meta.lock();
                    m.free.len() >= segs.len() + self.low_free_slots(&m)
                }
        };
        if plan.route != WriteRoute::Cache || !(in_place || to_new_slots()) {
            return None;
        }
        bump(&self.stats.write_requests, 1);
        self.note_blocks(offset, data.len() as u64);
        self.flights
            .touch(segs[0].block, segs[segs.len() - 1].block);
        Some(self.write_cached_dirty_with(&segs, data, &cached, plan.admits()))
    }
}
