//! The read path and the pieces every mode's write path shares: device
//! access with error accounting, slot allocation and eviction, records.

use std::ops::Range;

use super::format::Record;
use super::locks::RangeGuard;
use super::policy::Verdict;
use super::stats::bump;
use super::{Engine, EngineError, EngineResult, Meta, Mode};
use crate::device::{AlignedBuf, DeviceError};

/// Clean blocks evicted at once when no slot is free.
const EVICT_BATCH: usize = 64;
/// Candidates examined per eviction.
const EVICT_SCAN: usize = 4096;

/// The part of a request that falls in one cache block.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub block: u64,
    /// Offset within the block.
    pub in_block: u64,
    /// Range within the request's buffer.
    pub buf: Range<usize>,
}

/// Why `store_in_new_slots` stopped (`Yes`: it stored every block).
pub(crate) enum Stored {
    Yes,
    /// Every cache block is dirty or busy.
    NoSlot,
    /// The cache device failed the write (counted); the slot stays free.
    CacheError(DeviceError),
}

impl Segment {
    pub fn len(&self) -> u64 {
        self.buf.len() as u64
    }
}

impl Engine {
    /// Validates a request and splits it into per-block segments.
    pub(crate) fn segments(
        &self,
        offset: u64,
        len: u64,
        write: bool,
    ) -> EngineResult<Vec<Segment>> {
        if !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            return Err(EngineError::InvalidRequest(format!(
                "{offset}+{len} is not 512-byte aligned"
            )));
        }
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.volume_bytes) {
            let msg = format!("{offset}+{len} beyond {} bytes", self.volume_bytes);
            return Err(if write {
                EngineError::NoSpace(msg)
            } else {
                EngineError::InvalidRequest(msg)
            });
        }
        let bs = self.block_bytes;
        let mut out = Vec::new();
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

    /// True if `block` can be cached (a partial last block never is).
    pub(crate) fn cacheable(&self, block: u64) -> bool {
        block < self.origin_blocks
    }

    pub(crate) fn full_block(&self, seg: &Segment) -> bool {
        seg.in_block == 0 && seg.len() == self.block_bytes
    }

    pub(crate) fn cache_read(
        &self,
        slot: u32,
        in_block: u64,
        buf: &mut [u8],
    ) -> Result<(), DeviceError> {
        self.cache
            .read_at(buf, self.layout.slot_offset(slot) + in_block)
            .inspect_err(|e| {
                self.note_cache_error();
                log::warn!("cache read error: {e}");
            })
    }

    pub(crate) fn cache_write(
        &self,
        slot: u32,
        in_block: u64,
        buf: &[u8],
    ) -> Result<(), DeviceError> {
        let r = self
            .cache
            .write_at(buf, self.layout.slot_offset(slot) + in_block)
            .inspect_err(|e| {
                self.note_cache_error();
                log::warn!("cache write error: {e}");
            });
        self.note_completed();
        r
    }

    pub(crate) fn origin_read(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.origin.read_at(buf, offset).inspect_err(|e| {
            bump(&self.stats.origin_errors, 1);
            log::warn!("origin read error: {e}");
        })
    }

    /// Every origin write goes through here. A mapping removed in memory
    /// (unmapped, or superseded by a newer slot) must be durable before the
    /// origin changes: until then a crash would bring back the old clean
    /// copy over the new origin bytes.
    /// Waits first for background writebacks still writing these blocks to
    /// the origin (flights.rs), so the origin sees writes in order.
    pub(crate) fn origin_write(&self, buf: &[u8], offset: u64) -> EngineResult<()> {
        if !buf.is_empty() {
            let bs = self.block_bytes;
            self.flights
                .wait_origin(offset / bs, (offset + buf.len() as u64 - 1) / bs);
        }
        self.origin_write_now(buf, offset)
    }

    /// `origin_write` without the wait: for a writeback's own flight.
    pub(crate) fn origin_write_now(&self, buf: &[u8], offset: u64) -> EngineResult<()> {
        let bs = self.block_bytes;
        let blocks = offset / bs..=(offset + (buf.len() as u64).max(1) - 1) / bs;
        if self.releases_pending(blocks) {
            self.commit()?;
        }
        let r = self.origin.write_at(buf, offset).inspect_err(|e| {
            bump(&self.stats.origin_errors, 1);
            log::warn!("origin write error: {e}");
        });
        self.note_completed();
        Ok(r?)
    }

    /// Applies a record to the in-memory state and queues it for the journal.
    pub(crate) fn append(&self, m: &mut Meta, r: Record) {
        debug_assert!(m.table.validate(&r).is_ok(), "invalid record {r:?}");
        // When the block was already dirty (in this slot or the one a Map
        // supersedes), it keeps its age: rewrites must not postpone the
        // max-age writeback forever.
        let dirty_since = match r {
            Record::Map {
                block, dirty: true, ..
            } => Some(match m.table.lookup(block) {
                Some((old, true)) => m.dirty_since_s[old as usize],
                _ => (self.now_ms() / 1000) as u16,
            }),
            _ => None,
        };
        let unmapped_block = match r {
            Record::Unmap { slot } => m.table.slot_block(slot).map(|(b, _)| b),
            _ => None,
        };
        let applied = m.table.apply(&r);
        match r {
            Record::Map { slot, .. } => {
                m.policy.inserted(slot);
                if let Some(t) = dirty_since {
                    m.dirty_since_s[slot as usize] = t;
                }
            }
            Record::Unmap { slot } => {
                m.policy.removed(slot);
                m.pending_free.push(slot);
            }
            Record::Clean { .. } => {}
        }
        if let Some(old) = applied.released {
            m.policy.removed(old);
            m.pending_free.push(old);
        }
        let released_block = match r {
            Record::Map { block, .. } if applied.released.is_some() => Some(block),
            _ => unmapped_block,
        };
        if let Some(b) = released_block {
            m.releases_appended += 1;
            let seq = m.releases_appended;
            m.released_blocks.insert(b, seq);
        }
        m.records.push(r);
        self.note_completed();
    }

    /// Up to `n` slots free on disk (adjacent where the free slots allow),
    /// evicting clean blocks (and committing their release) if none is
    /// free. Empty if every block is dirty or busy.
    pub(crate) fn alloc_slots(&self, n: usize) -> EngineResult<Vec<u32>> {
        for _ in 0..3 {
            {
                let mut m = self.meta.lock();
                if !m.free.is_empty() {
                    let before = m.free.len();
                    let slots = m.free.take(n);
                    // Running low: the background evicts and commits ahead.
                    let low = self.low_free_slots(&m);
                    if before > low && m.free.len() <= low {
                        self.wake_background();
                    }
                    return Ok(slots);
                }
                if m.pending_free.is_empty() && self.evict(&mut m, EVICT_BATCH) == 0 {
                    return Ok(Vec::new());
                }
            }
            self.commit()?;
        }
        Ok(self.meta.lock().free.take(n))
    }

    /// Evicts up to `want` clean, unlocked blocks; returns how many. Their
    /// slots become reusable after the next commit.
    pub(crate) fn evict(&self, m: &mut Meta, want: usize) -> usize {
        let Meta { table, policy, .. } = m;
        let victims = policy.select(want, EVICT_SCAN, &mut |slot| match table.slot_block(slot) {
            None => Verdict::Take,
            Some((_, true)) => Verdict::Rotate,
            Some((block, false)) => {
                if self.locks.try_lock(block) {
                    Verdict::Take
                } else {
                    Verdict::Skip
                }
            }
        });
        let mut n = 0;
        for slot in victims {
            if let Some((block, _)) = m.table.slot_block(slot) {
                self.append(m, Record::Unmap { slot });
                self.locks.unlock(block);
                bump(&self.stats.demotions, 1);
                n += 1;
            }
        }
        n
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: u64) -> EngineResult<AlignedBuf> {
        self.read_inner(offset, len, false)
    }

    /// Copies a range into the cache (NBD_CMD_CACHE); returns nothing.
    pub fn prefetch(&self, offset: u64, len: u64) -> EngineResult<()> {
        self.read_inner(offset, len, true).map(|_| ())
    }

    /// The read, done on the caller's thread, if every block it touches is
    /// unlocked and cached: one cache device read per run of adjacent
    /// slots, never an origin read or a wait for another request. `None`
    /// (nothing done) otherwise. For the NBD server's async workers, which
    /// must not block for long.
    pub fn try_read_hits(&self, offset: u64, len: u64) -> Option<EngineResult<AlignedBuf>> {
        let (segs, _guard) = match self.try_lock_request(offset, len, false)? {
            Ok(locked) => locked,
            Err(e) => return Some(Err(e)),
        };
        let mode = self.mode();
        let cached = self.lookup_accessed(&segs, |dirty| dirty || mode.reads_cache());
        if cached.iter().any(Option::is_none) {
            return None;
        }
        bump(&self.stats.read_requests, 1);
        Some(self.read_locked(&segs, len, false, mode, &cached))
    }

    /// The write, done on the caller's thread, if the mode holds dirty data,
    /// every block it touches is unlocked, and it needs no origin I/O and no
    /// commit: blocks all dirty in adjacent slots are rewritten in place
    /// with one cache write; whole blocks otherwise go to new slots with one
    /// cache write while free slots are plentiful (the background keeps a
    /// reserve, so no eviction or commit is needed). `None` (nothing done)
    /// otherwise, and for FUA.
    pub fn try_write_cached(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Option<EngineResult<()>> {
        if fua || !self.mode().holds_dirty() {
            return None;
        }
        let (segs, _guard) = match self.try_lock_request(offset, data.len() as u64, true)? {
            Ok(locked) => locked,
            Err(e) => return Some(Err(e)),
        };
        if !segs.iter().all(|s| self.cacheable(s.block)) {
            return None;
        }
        let cached = self.lookup_accessed(&segs, |_| true);
        let in_place = adjacent_slots(&cached, |dirty| dirty) == segs.len();
        // (Not when admission has stopped: the store would go around the
        // cache to the origin, on this thread.)
        let to_new_slots = || {
            self.admitting() && segs.iter().all(|s| self.full_block(s)) && {
                let m = self.meta.lock();
                m.free.len() >= segs.len() + self.low_free_slots(&m)
            }
        };
        if !(in_place || to_new_slots()) || !self.mode().holds_dirty() {
            return None;
        }
        bump(&self.stats.write_requests, 1);
        self.flights
            .touch(segs[0].block, segs[segs.len() - 1].block);
        Some(self.write_cached_dirty_with(&segs, data, &cached))
    }

    /// A request's segments and a guard over their block locks, taken only
    /// if none of them is held (`None` otherwise, and for an empty
    /// request); `Some(Err)` for a request that is not valid.
    fn try_lock_request(
        &self,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Option<EngineResult<(Vec<Segment>, RangeGuard<'_>)>> {
        let segs = match self
            .check_open()
            .and_then(|_| self.segments(offset, len, write))
        {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        let guard = self
            .locks
            .try_lock_range(segs.first()?.block, segs.last()?.block)?;
        Some(Ok((segs, guard)))
    }

    fn read_inner(&self, offset: u64, len: u64, prefetch: bool) -> EngineResult<AlignedBuf> {
        self.check_open()?;
        let segs = self.segments(offset, len, false)?;
        bump(&self.stats.read_requests, 1);
        let Some(first) = segs.first() else {
            return Ok(AlignedBuf::zeroed(len as usize));
        };
        let _guard = self
            .locks
            .lock_range(first.block, segs.last().expect("non-empty").block);
        let mode = self.mode();
        // The block locks are held: these mappings cannot change under us
        // (eviction and writeback only take blocks they can lock).
        // Passthrough reads the origin, except a dirty block, whose only
        // current copy is in the cache: set-mode and detach switch to
        // passthrough before they write the dirty blocks back.
        let cached = self.lookup_accessed(&segs, |dirty| dirty || mode.reads_cache());
        self.read_locked(&segs, len, prefetch, mode, &cached)
    }

    /// The read of `segs` (non-empty) while their block locks are held.
    /// (`cached`: `lookup_accessed` of `segs` under these locks, hits kept
    /// as `mode` reads them.)
    fn read_locked(
        &self,
        segs: &[Segment],
        len: u64,
        prefetch: bool,
        mode: Mode,
        cached: &[Option<(u32, bool)>],
    ) -> EngineResult<AlignedBuf> {
        let mut out = AlignedBuf::zeroed(len as usize);
        let promote = mode.promotes_reads() || (prefetch && mode != Mode::Passthrough);
        let mut i = 0;
        while i < segs.len() {
            let seg = &segs[i];
            if let Some((slot, _)) = cached[i] {
                // Hits in adjacent slots: one device read.
                let run = adjacent_slots(&cached[i..], |_| true);
                if run > 1 {
                    let end = segs[i + run - 1].buf.end;
                    if self
                        .cache_read(slot, seg.in_block, &mut out[seg.buf.start..end])
                        .is_ok()
                    {
                        bump(&self.stats.read_hits, run as u64);
                        i += run;
                        continue;
                    }
                    // Fall back to block by block, which handles errors.
                }
            }
            if let Some((slot, dirty)) = cached[i] {
                bump(&self.stats.read_hits, 1);
                if let Err(e) = self.cache_read(slot, seg.in_block, &mut out[seg.buf.clone()]) {
                    if dirty {
                        return Err(e.into());
                    }
                    // A clean copy is only a copy: serve the origin.
                    self.invalidate_failed(seg.block, slot);
                    self.origin_read(
                        &mut out[seg.buf.clone()],
                        seg.block * self.block_bytes + seg.in_block,
                    )?;
                }
                i += 1;
                continue;
            }
            // A run of consecutive misses: one origin read.
            let run = cached[i..].iter().take_while(|c| c.is_none()).count();
            self.read_miss_run(&segs[i..i + run], &mut out, promote)?;
            i += run;
        }
        Ok(out)
    }

    /// Looks up the segments' blocks under one metadata lock, keeping the
    /// hits that `keep` accepts (given the dirty flag) and telling the
    /// policy about each. The caller holds the blocks' locks, so the
    /// mappings stay valid.
    pub(crate) fn lookup_accessed(
        &self,
        segs: &[Segment],
        keep: impl Fn(bool) -> bool,
    ) -> Vec<Option<(u32, bool)>> {
        let mut m = self.meta.lock();
        segs.iter()
            .map(|seg| {
                let hit = m.table.lookup(seg.block).filter(|&(_, dirty)| keep(dirty));
                if let Some((slot, _)) = hit {
                    m.policy.accessed(slot);
                }
                hit
            })
            .collect()
    }

    /// Drops a clean cached copy after a cache read error.
    fn invalidate_failed(&self, block: u64, slot: u32) {
        let mut m = self.meta.lock();
        if m.table.lookup(block) == Some((slot, false)) {
            self.append(&mut m, Record::Unmap { slot });
        }
    }

    fn read_miss_run(
        &self,
        segs: &[Segment],
        out: &mut AlignedBuf,
        promote: bool,
    ) -> EngineResult<()> {
        let bs = self.block_bytes;
        let first = &segs[0];
        let last = segs.last().expect("non-empty");
        bump(&self.stats.read_misses, segs.len() as u64);
        let whole_blocks = promote && self.cacheable(last.block);
        if !whole_blocks {
            if !promote {
                bump(&self.stats.bypassed_ios, 1);
            }
            let off = first.block * bs + first.in_block;
            return Ok(self.origin_read(&mut out[first.buf.start..last.buf.end], off)?);
        }
        let n_blocks = (last.block - first.block + 1) as usize;
        let mut tmp = AlignedBuf::zeroed(n_blocks * bs as usize);
        self.origin_read(&mut tmp, first.block * bs)?;
        for (k, seg) in segs.iter().enumerate() {
            let at = k * bs as usize + seg.in_block as usize;
            out[seg.buf.clone()].copy_from_slice(&tmp[at..at + seg.buf.len()]);
        }
        // A full cache or a cache error only leaves the rest uncached.
        let (stored, _) = self.store_in_new_slots(first.block, &tmp, false)?;
        bump(&self.stats.promotions, stored as u64);
        Ok(())
    }

    /// Stores consecutive whole blocks starting at `first_block` (`data` is
    /// a multiple of the block size) in slots free on disk, writing runs of
    /// adjacent slots with one device write, then maps them (the records
    /// become durable only after the data: see commit.rs). Returns how many
    /// leading blocks were stored and, if not all, why it stopped.
    pub(crate) fn store_in_new_slots(
        &self,
        first_block: u64,
        data: &[u8],
        dirty: bool,
    ) -> EngineResult<(usize, Stored)> {
        let bs = self.block_bytes as usize;
        let n = data.len() / bs;
        if n == 0 {
            return Ok((0, Stored::Yes));
        }
        if !self.admitting() {
            // The cache device failed too often: callers treat this like a
            // full cache (write around it, skip the promotion).
            return Ok((0, Stored::NoSlot));
        }
        let slots = self.alloc_slots(n)?;
        if slots.is_empty() {
            return Ok((0, Stored::NoSlot));
        }
        let mut written = 0;
        let mut failure = None;
        while written < slots.len() {
            let mut run = 1;
            while written + run < slots.len() && slots[written + run] == slots[written] + run as u32
            {
                run += 1;
            }
            let bytes = &data[written * bs..(written + run) * bs];
            if let Err(e) = self.cache_write(slots[written], 0, bytes) {
                failure = Some(e);
                break;
            }
            written += run;
        }
        let mut m = self.meta.lock();
        m.free.extend(slots[written..].iter().copied());
        for (k, &slot) in slots[..written].iter().enumerate() {
            let block = first_block + k as u64;
            self.append(&mut m, Record::Map { slot, block, dirty });
        }
        drop(m);
        let why = match failure {
            Some(e) => Stored::CacheError(e),
            None if written < n => Stored::NoSlot,
            None => Stored::Yes,
        };
        Ok((written, why))
    }

    /// Writes `data` at `offset`; with `fua`, durable on return.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> EngineResult<()> {
        self.check_open()?;
        let segs = self.segments(offset, data.len() as u64, true)?;
        bump(&self.stats.write_requests, 1);
        if let Some(first) = segs.first() {
            let last = segs.last().expect("non-empty").block;
            let _guard = self.locks.lock_range(first.block, last);
            self.flights.touch(first.block, last);
            match self.mode() {
                Mode::Writeback => self.write_writeback(&segs, data)?,
                Mode::Writeonly => self.write_writeonly(&segs, data)?,
                Mode::Writethrough => self.write_writethrough(offset, &segs, data)?,
                Mode::Writearound => self.write_writearound(offset, &segs, data)?,
                Mode::Passthrough => self.write_passthrough(offset, &segs, data)?,
            }
        }
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    /// Writes zeroes over a range.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.segments(offset, len, true)?;
        let chunk_bytes = (1u64 << 20).max(self.block_bytes);
        let zeroes = AlignedBuf::zeroed(chunk_bytes.min(len) as usize);
        let mut pos = offset;
        while pos < offset + len {
            // Keep chunks block-aligned so full blocks avoid read-modify-write.
            let next = ((pos / chunk_bytes) + 1) * chunk_bytes;
            let n = (next.min(offset + len) - pos) as usize;
            self.write(pos, &zeroes[..n], false)?;
            pos += n as u64;
        }
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    /// Discards a range: cached copies of whole blocks in it are dropped
    /// (dirty ones too: their contents no longer matter) and the origin is
    /// told. The range reads as unspecified data until written again.
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.check_open()?;
        let segs = self.segments(offset, len, true)?;
        bump(&self.stats.trim_requests, 1);
        if let Some(first) = segs.first() {
            let last = segs.last().expect("non-empty").block;
            let _guard = self.locks.lock_range(first.block, last);
            self.flights.touch(first.block, last);
            // Ranges to discard on the origin: whole blocks, and parts of
            // blocks that are not cached. A cached block trimmed in part
            // keeps its origin bytes, so cache and origin never disagree.
            let mut discard: Vec<(u64, u64)> = Vec::new();
            {
                let mut m = self.meta.lock();
                for seg in &segs {
                    let cached = m.table.lookup(seg.block);
                    if self.full_block(seg) {
                        if let Some((slot, _)) = cached {
                            self.append(&mut m, Record::Unmap { slot });
                        }
                    } else if cached.is_some() {
                        continue;
                    }
                    let off = seg.block * self.block_bytes + seg.in_block;
                    match discard.last_mut() {
                        Some((o, l)) if *o + *l == off => *l += seg.len(),
                        _ => discard.push((off, seg.len())),
                    }
                }
            }
            self.flights.wait_origin(first.block, last);
            for (off, l) in discard {
                if let Err(e) = self.origin.discard(off, l) {
                    log::debug!("origin discard failed (ignored, discard is a hint): {e}");
                }
            }
        }
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    /// Makes every completed write durable (NBD FLUSH).
    pub fn flush(&self) -> EngineResult<()> {
        self.check_open()?;
        bump(&self.stats.flush_requests, 1);
        self.commit()
    }

    /// Full block contents for a partial write: the cached copy if there is
    /// one (falling back to the origin if it is clean and unreadable), else
    /// the origin's block, with the segment merged in.
    pub(crate) fn merged_block(
        &self,
        seg: &Segment,
        data: &[u8],
        cached: Option<(u32, bool)>,
    ) -> EngineResult<AlignedBuf> {
        let bs = self.block_bytes;
        let mut full = AlignedBuf::zeroed(bs as usize);
        if !self.full_block(seg) {
            let from_cache = match cached {
                Some((slot, dirty)) => match self.cache_read(slot, 0, &mut full) {
                    Ok(()) => true,
                    Err(e) if dirty => return Err(e.into()),
                    Err(_) => false,
                },
                None => false,
            };
            if !from_cache {
                self.origin_read(&mut full, seg.block * bs)?;
            }
        }
        full[seg.in_block as usize..(seg.in_block + seg.len()) as usize]
            .copy_from_slice(&data[seg.buf.clone()]);
        Ok(full)
    }

    /// Writes back dirty blocks among `segs` (rare outside writeback modes:
    /// only after a failed writeback), then drops every cached copy in them;
    /// `origin_write` makes the drops durable before the origin changes.
    pub(crate) fn invalidate_before_origin_write(&self, segs: &[Segment]) -> EngineResult<()> {
        for seg in segs {
            let cached = self.meta.lock().table.lookup(seg.block);
            let Some((slot, dirty)) = cached else {
                continue;
            };
            if dirty {
                self.write_back_one(seg.block, slot)?;
            }
            let mut m = self.meta.lock();
            if let Some((slot, _)) = m.table.lookup(seg.block) {
                self.append(&mut m, Record::Unmap { slot });
            }
        }
        Ok(())
    }

    /// Writes `data` at `offset` to the origin, after dropping (durably)
    /// every cached copy of `segs`: the one way any mode changes the origin
    /// for a foreground write.
    pub(crate) fn write_origin_invalidating(
        &self,
        segs: &[Segment],
        data: &[u8],
        offset: u64,
    ) -> EngineResult<()> {
        self.invalidate_before_origin_write(segs)?;
        self.origin_write(data, offset)
    }

    pub(crate) fn count_write_hits(&self, segs: &[Segment]) {
        let m = self.meta.lock();
        let hits = segs
            .iter()
            .filter(|s| m.table.lookup(s.block).is_some())
            .count() as u64;
        drop(m);
        bump(&self.stats.write_hits, hits);
        bump(&self.stats.write_misses, segs.len() as u64 - hits);
    }

    /// True if the mapping of some block in `blocks` was removed (unmapped,
    /// or superseded by a newer slot) in memory and that removal is not yet
    /// durable. Only those blocks matter: an origin write to other blocks
    /// cannot meet a revived old copy.
    pub(crate) fn releases_pending(&self, blocks: std::ops::RangeInclusive<u64>) -> bool {
        let durable = self.commit_state.lock().releases_durable;
        let m = self.meta.lock();
        if m.released_blocks.len() as u64 <= blocks.end() - blocks.start() {
            m.released_blocks
                .iter()
                .any(|(b, &seq)| seq > durable && blocks.contains(b))
        } else {
            blocks
                .into_iter()
                .any(|b| m.released_blocks.get(&b).is_some_and(|&seq| seq > durable))
        }
    }
}

/// How many leading lookups, starting with `cached[0]`, are hits in adjacent
/// slots (slot, slot + 1, ...) that satisfy `also` (given the dirty flag):
/// one device I/O covers them all. 0 if `cached[0]` is no such hit.
pub(crate) fn adjacent_slots(cached: &[Option<(u32, bool)>], also: impl Fn(bool) -> bool) -> usize {
    let Some(Some((first, _))) = cached.first() else {
        return 0;
    };
    cached
        .iter()
        .enumerate()
        .take_while(|&(k, c)| matches!(*c, Some((s, d)) if s == first + k as u32 && also(d)))
        .count()
}
