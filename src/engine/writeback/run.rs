//! Background writeback and `write_back_all`.
//!
//! The background thread writes dirty blocks back, in ascending order,
//! adjacent blocks coalesced into one write, without holding the blocks'
//! locks during the origin write (origin/flights.rs). It yields to the client:
//!
//! - once clients have sent no request for `idle_secs` (2 s by default;
//!   Open CAS's ALRU waits 10 s) and the origin is quiet, it drains every
//!   dirty block at full speed, until a client request reaches the origin;
//! - while clients keep the origin busy (a request under way or ended a
//!   few request times ago), it writes back only what must go:
//!   past the high watermark (until the low one), pacing itself to a share
//!   of the origin's time that grows with the dirty share (a proportional
//!   controller: 10% just past the low watermark, all of it when every
//!   block is dirty), and blocks dirty longer than the maximum age, at a
//!   trickle (a quarter of the origin's time).
//!
//! In between (the origin quiet, not yet idle) it writes back past the
//! watermarks and aged blocks at full speed. It also keeps a reserve of free slots (evicting clean blocks ahead of
//! need) and commits buffered records at least once a second. `flush` and
//! mode switches write back at full speed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::lanes;
use super::order::RunLock;
use super::pace::Pace;
use super::State;
use crate::device::{AlignedBuf, DeviceError};
use crate::engine::admission::Dev;
use crate::engine::cache::Cache;
use crate::engine::format::Record;
use crate::engine::io::warnings::{BACKGROUND_COMMIT, BACKGROUND_WRITEBACK};
use crate::engine::origin::Origin;
use crate::engine::sectors::SECTOR_BYTES;
use crate::engine::stats::bump;
use crate::engine::{Engine, EngineError, EngineResult, Meta, MAX_AGE_SECS};

/// Longest a write waits for writeback to free a slot before it goes
/// around the cache.
const SLOT_WAIT: Duration = Duration::from_millis(500);
/// Largest coalesced origin write: an origin that charges per request
/// (a disk's seek, a network round trip) takes a few megabytes in one go.
const MAX_RUN_BYTES: u64 = 4 << 20;
/// A run's cache reads made one after another up to this many
/// (`read_run`); past it, `READERS` at a time.
const READ_ALONE: usize = 4;
const READERS: usize = 8;
/// Dirty blocks examined per writeback batch.
const BATCH_BLOCKS: usize = 256;
const TICK: Duration = Duration::from_millis(100);
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Share of the origin's time aged blocks get while clients keep it busy.
const AGED_SHARE: f64 = 0.25;
/// Least share past the high watermark.
const MIN_SHARE: f64 = 0.1;
/// Longest pause between two paced writebacks.
const MAX_PAUSE: Duration = Duration::from_millis(250);

pub(crate) fn start_background(engine: &Arc<Engine>) {
    let weak = engine.weak();
    start_lanes(engine);
    let handle = std::thread::Builder::new()
        .name("tiercache-bg".into())
        .spawn(move || loop {
            let Some(e) = weak.upgrade() else { break };
            if e.cache.closed.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            e.cache.background_tick();
            e.cache.bell.wait_woken(TICK);
        })
        .expect("spawn background thread");
    *engine.cache.writeback.thread.lock() = Some(handle);
}

/// Each origin's lane writes back its batches through the engine
/// (lanes.rs), which it does not keep alive.
fn start_lanes(engine: &Arc<Engine>) {
    let (write, wake) = (engine.weak(), engine.weak());
    engine.cache.writeback.lanes.start(lanes::Runner {
        write: Box::new(move |v, keys, pace| {
            let Some(e) = write.upgrade() else { return };
            if let Err(err) = e.cache.writeback_lane_batch(v, keys, pace) {
                BACKGROUND_WRITEBACK.warn(
                    e.cache.now_ms(),
                    format_args!("background writeback: {err}"),
                );
            }
        }),
        wake: Box::new(move || {
            if let Some(e) = wake.upgrade() {
                e.cache.bell.wake();
            }
        }),
    });
}

pub(crate) fn stop_background(engine: &Engine) {
    engine.cache.bell.wake();
    let handle = engine.cache.writeback.thread.lock().take();
    if let Some(h) = handle {
        if h.thread().id() != std::thread::current().id() {
            let _ = h.join();
        }
    }
    engine.cache.writeback.lanes.stop();
}

/// `f` of each item, each on a scoped thread of its own (inline if one
/// cannot be started), in the items' order.
fn on_threads<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let started: Vec<Result<std::thread::ScopedJoinHandle<'_, R>, &T>> = (items.iter())
            .map(|item| {
                std::thread::Builder::new()
                    .name("tiercache-wb".into())
                    .spawn_scoped(s, move || f(item))
                    .map_err(|_| item)
            })
            .collect();
        (started.into_iter())
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(item) => f(item),
            })
            .collect()
    })
}

/// What a writeback that wrote `written` blocks reports: the first error
/// only if it wrote none (otherwise a warning: what was written counts).
fn partial_result(written: usize, first_err: Option<EngineError>) -> EngineResult<usize> {
    match first_err {
        Some(e) if written == 0 => Err(e),
        Some(e) => {
            log::warn!("writeback: {e}");
            Ok(written)
        }
        None => Ok(written),
    }
}

impl Cache {
    /// A background commit is due: records wait and the last commit is a
    /// `COMMIT_INTERVAL` old, or the crash log is half full.
    pub(crate) fn commit_due(&self) -> bool {
        let (waiting, log_half_full) = self.meta.commit_pressure();
        log_half_full
            || waiting
                && self.now_ms().saturating_sub(self.journal.last_commit_ms())
                    >= COMMIT_INTERVAL.as_millis() as u64
    }

    /// Gives the pages of crash-log records that commits made durable back
    /// to the system (crash_log.rs): chosen under the metadata lock,
    /// punched after it is released.
    pub fn trim_crash_log(&self) {
        loop {
            let trim = self.meta.plan_crash_log_trim();
            match trim {
                Some(t) => t.run(),
                None => return,
            }
        }
    }

    /// Free slots the background keeps ahead of need.
    pub(crate) fn reserve_slots(&self, m: &Meta) -> usize {
        (m.table().dirty_slots() as usize / 50).max(8)
    }

    /// Free slots below which the free list runs low: the background then
    /// commits pending releases at once, and the worker-thread write path
    /// leaves new slots to the full path.
    pub(crate) fn low_free_slots(&self, m: &Meta) -> usize {
        self.reserve_slots(m) / 2
    }

    /// Keeps a reserve of free slots: evicts clean blocks when free and
    /// pending slots fall below it, and commits at once when the free list
    /// runs low, so that writes to clean blocks (which need new slots) find
    /// one without evicting and committing themselves.
    fn keep_reserve(&self) {
        // The log placement frees whole segments instead of single slots.
        if self.placement.clean_ahead(self) > 0 {
            return;
        }
        let commit_now = {
            let mut m = self.meta.lock();
            let reserve = self.reserve_slots(&m);
            let have = m.free_slots() + m.waiting_slots();
            if have < reserve {
                self.evict(&mut m, reserve - have);
            }
            m.free_slots() < self.low_free_slots(&m) && m.waiting_slots() > 0
        };
        if commit_now {
            if let Err(e) = self.commit() {
                BACKGROUND_COMMIT.warn(self.now_ms(), format_args!("background commit: {e}"));
            }
        }
    }

    /// Milliseconds since the last foreground request to any origin ended
    /// (0 while one is under way).
    fn origin_quiet_ms(&self) -> u64 {
        let now = self.now_ms();
        self.origins
            .iter()
            .map(|o| o.quiet_ms(now))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// True while clients keep some origin busy (`busy_within`).
    pub(crate) fn origin_busy(&self) -> bool {
        self.origin_quiet_ms() < self.busy_window_ms()
    }

    /// True while clients keep `origin` busy: a foreground request to it is
    /// under way or ended within a few origin request times (2 ms to 100
    /// ms).
    fn busy(&self, origin: &Origin) -> bool {
        origin.quiet_ms(self.now_ms()) < self.busy_window_ms()
    }

    fn busy_window_ms(&self) -> u64 {
        let lat = &self.admission.latencies;
        let typical_ns = [Dev::OriginRead, Dev::OriginWrite]
            .iter()
            .filter_map(|&d| lat.get(d))
            .max()
            .unwrap_or(0);
        (4 * typical_ns / 1_000_000).clamp(2, 100)
    }

    /// True once neither the origin (`quiet_ms`) nor any client request
    /// has been seen for the idle time (0: never idle).
    fn clients_idle(&self, st: &mut State, quiet_ms: u64) -> bool {
        let idle_ms = st.settings.idle_secs as u64 * 1000;
        // Idle means no client request at all, not only none at the
        // origin: a drain while writes keep hitting the cache competes
        // with them for the cache device (4K random writes into a cache
        // with room to spare ran at 0.6x qemu-nbd while it drained).
        let requests = self.stats.read_requests.load(Ordering::Relaxed)
            + self.stats.write_requests.load(Ordering::Relaxed)
            + self.stats.trim_requests.load(Ordering::Relaxed)
            + self.stats.flush_requests.load(Ordering::Relaxed);
        let now_ms = self.now_ms();
        if st.client_requests_seen.0 != requests {
            st.client_requests_seen = (requests, now_ms);
        }
        let client_quiet_ms = now_ms.saturating_sub(st.client_requests_seen.1);
        idle_ms > 0 && quiet_ms >= idle_ms && client_quiet_ms >= idle_ms
    }

    /// The batch the watermarks, an idle origin or writes waiting for a
    /// slot call for, if any: idle, everything at full speed; past the high
    /// watermark, just enough to reach the low one, paced while the origin
    /// is busy.
    fn watermark_batch(
        &self,
        st: &mut State,
        m: &Meta,
        idle: bool,
        pressed: bool,
        busy: bool,
    ) -> Option<(Vec<u64>, Pace)> {
        // Of the slots that may hold dirty data (on a cache set, the
        // mirrored ones).
        let total = m.table().dirty_slots().max(1) as u64;
        let dirty = m.table().dirty_count();
        // In blocks, not whole percents: a low watermark of 0 drains to
        // none, not to under 1%.
        let low = st.settings.low_pct as u64;
        let low_blocks = total * low / 100;
        if dirty > 0 && dirty * 100 >= total * st.settings.high_pct as u64 {
            st.active = true;
        }
        if dirty <= low_blocks {
            st.active = false;
        }
        if dirty == 0 || !(idle || pressed || st.active) {
            return None;
        }
        let (want, pace) = if idle {
            (BATCH_BLOCKS, Pace::Drain)
        } else if pressed {
            (BATCH_BLOCKS, Pace::Full)
        } else {
            let pct = dirty as f64 * 100.0 / total as f64;
            let over = (pct - low as f64).max(0.0) / (100 - low.min(99)) as f64;
            let pace = if busy {
                Pace::Share(over.clamp(MIN_SHARE, 1.0))
            } else {
                Pace::Full
            };
            let want = (dirty.saturating_sub(low_blocks) as usize).clamp(1, BATCH_BLOCKS);
            (want, pace)
        };
        if idle {
            bump(&self.stats.idle_drains, 1);
        }
        // Address order, log placement too: writing back the dirty blocks
        // of the log's oldest segments first (so the cleaner could empty
        // them without moving them) scattered the origin writes: 3.2x the
        // origin writes and 2.4x the time on the emulated-HDD trace replay.
        let wants = self.volume_wants(m, want, idle || pressed);
        let cursors: Vec<u64> = self.origins.iter().map(|o| o.writeback_cursor()).collect();
        let v = m.table().dirty_from_each(&cursors, &wants);
        let v = self.extend_runs(m, v);
        for (origin, keys) in self.origins.split(&v) {
            if let Some(&last) = keys.last() {
                origin.writeback_went_to(last);
            }
        }
        Some((v, pace))
    }

    /// How many of a watermark batch's `want` blocks each volume gives:
    /// a whole batch each when draining at full speed (`full`: the
    /// volumes' writebacks run side by side, `writeback_blocks_in`),
    /// otherwise shares in proportion to their dirty blocks, so no volume's
    /// writeback waits behind another's.
    fn volume_wants(&self, m: &Meta, want: usize, full: bool) -> Vec<usize> {
        let totals = m.table().regions.totals();
        let dirty: u64 = totals.iter().map(|&(_, d)| d).sum::<u64>().max(1);
        (totals.iter())
            .map(|&(_, d)| match d {
                0 => 0,
                _ if full => want,
                _ => ((want as u64 * d).div_ceil(dirty) as usize).max(1),
            })
            .collect()
    }

    /// Blocks dirty for longer than the writeback age: at most one full
    /// pass over the slots per second.
    fn aged_batch(&self, st: &mut State, m: &Meta, busy: bool) -> (Vec<u64>, Pace) {
        let now_s = self.now_ms() / 1000;
        if st.aged_scan_done_s == Some(now_s) {
            return (Vec::new(), Pace::Full);
        }
        // Stamps have 1 s resolution, so a block may go up to 1 s early.
        let max_age = st.settings.max_age_secs.min(MAX_AGE_SECS) as u16;
        let (mut v, next) = m.aged_dirty(st.aged_scan_cursor, BATCH_BLOCKS, now_s as u16, max_age);
        match next {
            Some(slot) => st.aged_scan_cursor = slot,
            None => st.aged_scan_done_s = Some(now_s),
        }
        v.sort_unstable();
        let v = self.extend_runs(m, v);
        let pace = if busy {
            Pace::Share(AGED_SHARE)
        } else {
            Pace::Full
        };
        (v, pace)
    }

    /// Extends each run of adjacent blocks in `v` (ascending) with the dirty
    /// blocks that follow it, up to a full origin write per run, so a batch
    /// does not end in the middle of a run (which would cost the origin a
    /// second request for the rest). At most `4 * BATCH_BLOCKS` blocks, or
    /// one full run, in all.
    fn extend_runs(&self, m: &Meta, v: Vec<u64>) -> Vec<u64> {
        let max_run = (MAX_RUN_BYTES / self.block_bytes).max(1) as usize;
        let limit = (4 * BATCH_BLOCKS).max(max_run);
        let mut out: Vec<u64> = Vec::with_capacity(v.len());
        let mut i = 0;
        while i < v.len() {
            let start = out.len();
            out.push(v[i]);
            i += 1;
            while i < v.len() && v[i] == out[out.len() - 1] + 1 {
                out.push(v[i]);
                i += 1;
            }
            let mut next = out[out.len() - 1] + 1;
            while out.len() - start < max_run
                && out.len() < limit
                && v.get(i) != Some(&next)
                && m.table().is_dirty(next)
            {
                out.push(next);
                next += 1;
            }
        }
        out
    }

    /// The byte ranges of a locked run's buffer that writeback sends to the
    /// origin: its dirty sectors, merged across sectors holding clean data
    /// (equal to the origin's, so rewriting them is harmless) but never
    /// across sectors holding none. Whole dirty blocks make one range.
    fn dirty_extents(&self, run: &[(u64, u32)]) -> Vec<std::ops::Range<usize>> {
        let m = self.meta.lock();
        let spb = m.table().sectors();
        let sb = SECTOR_BYTES as usize;
        let mut extents: Vec<std::ops::Range<usize>> = Vec::new();
        // The open extent: its first sector and the sector after its last
        // dirty one.
        let mut open: Option<(usize, usize)> = None;
        for (k, &(_, slot)) in run.iter().enumerate() {
            let (valid, dirty) = m.table().sector_sets(slot);
            for s in 0..spb {
                let g = k * spb + s;
                if !valid.contains(s) {
                    extents.extend(open.take().map(|(a, b)| a * sb..b * sb));
                } else if dirty.contains(s) {
                    open = Some(open.map_or((g, g + 1), |(a, _)| (a, g + 1)));
                }
            }
        }
        extents.extend(open.map(|(a, b)| a * sb..b * sb));
        extents
    }

    /// The cache contents of locked, adjacent blocks, one device read per
    /// run of adjacent slots. Blocks written at random sit in scattered
    /// slots: with more than `READ_ALONE` reads, from a device that
    /// `reads_in_parallel`, they are made `READERS` at a time (on scoped
    /// threads, this one among them), so a busy cache device (1 ms a
    /// read) holds a run's locks, and the foreground writes that wait for
    /// them, for ~1/`READERS` of the time it took one read after another
    /// (docs/benchmarks.md: a 287 ms p99.9 write during `flush`).
    fn read_run(&self, run: &[(u64, u32)]) -> Result<AlignedBuf, DeviceError> {
        let bs = self.block_bytes as usize;
        // The pieces cover it; each is read, or the run fails.
        let mut buf = AlignedBuf::to_overwrite(run.len() * bs);
        // (first slot, its part of `buf`) of each run of adjacent slots.
        let mut pieces: Vec<(u32, &mut [u8])> = Vec::new();
        let mut rest: &mut [u8] = &mut buf;
        let mut k = 0;
        while k < run.len() {
            let mut n = 1;
            while k + n < run.len() && run[k + n].1 == run[k].1 + n as u32 {
                n += 1;
            }
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n * bs);
            pieces.push((run[k].1, piece));
            rest = tail;
            k += n;
        }
        if pieces.len() <= READ_ALONE || !self.io.cache().reads_in_parallel() {
            for (slot, piece) in pieces {
                self.cache_read(slot, 0, piece)?;
            }
            return Ok(buf);
        }
        // No more readers than reads: an empty share would start a thread
        // for nothing.
        let readers = READERS.min(pieces.len());
        let mut shares: Vec<Vec<(u32, &mut [u8])>> = (0..readers).map(|_| Vec::new()).collect();
        for (i, piece) in pieces.into_iter().enumerate() {
            shares[i % readers].push(piece);
        }
        let read_share = |share: Vec<(u32, &mut [u8])>| -> Result<(), DeviceError> {
            (share.into_iter()).try_for_each(|(slot, piece)| self.cache_read(slot, 0, piece))
        };
        let mut shares = shares.into_iter();
        let mine = shares.next().expect("more than READ_ALONE reads");
        std::thread::scope(|s| {
            let others: Vec<_> = shares
                .map(|share| {
                    std::thread::Builder::new()
                        .name("tiercache-wb".into())
                        .spawn_scoped(s, || read_share(share))
                })
                .collect();
            let mut r = read_share(mine);
            for h in others {
                let theirs = match h {
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    // The run stays dirty, for a later round.
                    Err(source) => Err(DeviceError::Io {
                        device: self.io.cache().name().to_string(),
                        what: "starting a writeback reader",
                        source,
                    }),
                };
                r = r.and(theirs);
            }
            r
        })?;
        Ok(buf)
    }

    /// Marks clean the blocks of a written-back run that still map to the
    /// slot that was read (and are not `skip`ped); returns how many.
    pub(super) fn mark_clean(&self, run: &[(u64, u32)], skip: &[bool]) -> usize {
        let mut m = self.meta.lock();
        let mut n = 0;
        for (k, &(b, slot)) in run.iter().enumerate() {
            if !skip.get(k).copied().unwrap_or(false) && m.table().lookup(b) == Some((slot, true)) {
                self.append(&mut m, Record::Clean { slot });
                n += 1;
            }
        }
        bump(&self.stats.blocks_written_back, n as u64);
        n
    }

    /// A write back of the blocks `wanted` accepts is done: every dirty one
    /// left belongs to a volume whose mode keeps dirty data (writes that
    /// came meanwhile). A volume whose mode keeps none (a mode switch under
    /// way) must have none left.
    pub(super) fn settled(&self, wanted: &dyn Fn(u64) -> bool) -> bool {
        if self.origins.iter().all(|o| o.mode().holds_dirty()) {
            return true;
        }
        let dirty = self.meta.all_dirty();
        !(dirty.into_iter()).any(|k| wanted(k) && !self.origins.of_key(k).mode().holds_dirty())
    }
}

impl Cache {
    /// Waits `d`, or less if the engine closes or the background is woken.
    fn pause_background(&self, d: Duration) {
        (self.bell).pause(d, || self.closed.load(Ordering::Acquire));
    }

    /// One round of background work: the curve split of the cache when
    /// due (origin/shares.rs), writeback batches until nothing is due (at
    /// most 64), the free-slot reserve, a commit when one is due, and
    /// giving back the crash log's durable pages. Each is a step of its own
    /// below, so a deterministic test can schedule them one by one.
    pub fn background_tick(&self) {
        self.follow_cache_set();
        let now_s = self.now_ms() / 1000;
        (self.origins).rebalance_if_due(&self.observe, self.observe.slot_count(), now_s);
        for _ in 0..64 {
            if self.closed.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            match self.writeback_step() {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    BACKGROUND_WRITEBACK
                        .warn(self.now_ms(), format_args!("background writeback: {e}"));
                    break;
                }
            }
        }
        self.keep_reserve();
        if self.commit_due() {
            if let Err(e) = self.commit() {
                BACKGROUND_COMMIT.warn(self.now_ms(), format_args!("background commit: {e}"));
            }
        }
        self.trim_crash_log();
    }

    /// One batch of background writeback: keeps the free-slot reserve,
    /// then writes back what the watermarks, ages and idle time call for
    /// now, as the writeback order takes it (`Order::background_step`).
    /// Returns the blocks written back (0: nothing was due); with lanes,
    /// those handed to them (`hand_to_lanes`).
    pub fn writeback_step(&self) -> EngineResult<usize> {
        // Between batches too: a round of writeback can take seconds
        // against a slow origin.
        self.keep_reserve();
        if self.origins.iter().all(|o| o.unreachable()) {
            return Ok(0); // every origin write would fail at once
        }
        self.order.background_step(self)
    }

    /// Background batches go to the origins' lanes (lanes.rs): with
    /// several volumes, a background thread, and side by side
    /// (`side_by_side`: not in flush order, not on a simulated clock).
    pub(super) fn lanes_on(&self) -> bool {
        self.origins.len() > 1 && self.side_by_side() && self.writeback.lanes.started()
    }

    /// Hands each volume's part of `blocks` to its origin's lane, passing
    /// over a lane still at its last batch; returns the blocks handed.
    pub(super) fn hand_to_lanes(&self, blocks: &[u64], pace: Pace) -> usize {
        let lanes = &self.writeback.lanes;
        let parts = self.origins.split(blocks).enumerate();
        (parts.filter(|(v, (_, keys))| !keys.is_empty() && lanes.hand(*v, keys.to_vec(), pace)))
            .map(|(_, (_, keys))| keys.len())
            .sum()
    }

    /// A lane's batch: volume `v`'s `keys` written back (lanes.rs).
    pub(crate) fn writeback_lane_batch(
        &self,
        v: usize,
        keys: &[u64],
        pace: Pace,
    ) -> EngineResult<usize> {
        let origin = self.volume(v)?;
        self.writeback_volume(origin, keys, pace, None)
    }

    /// Dirty blocks the background should write back now, ascending, and
    /// how to pace it.
    pub(super) fn writeback_candidates(&self) -> (Vec<u64>, Pace) {
        let busy = self.origin_busy();
        let quiet_ms = self.origin_quiet_ms();
        let mut st = self.writeback.state.lock();
        let m = self.meta.lock();
        let idle = self.clients_idle(&mut st, quiet_ms);
        // Writes are waiting for a slot: write back at full speed.
        let pressed = self.writeback.writes_waiting();
        if let Some(batch) = self.watermark_batch(&mut st, &m, idle, pressed, busy) {
            return batch;
        }
        self.aged_batch(&mut st, &m, busy)
    }

    /// Writes back the given dirty blocks (ascending), coalescing adjacent
    /// ones. Blocks that are busy or no longer dirty are skipped. Paced by
    /// `pace` between runs (see `Pace`). Returns how many were written
    /// back, or the first error (other runs are still tried).
    pub(crate) fn writeback_blocks(&self, blocks: &[u64], pace: Pace) -> EngineResult<usize> {
        self.writeback_blocks_in(blocks, pace, None)
    }

    /// `writeback_blocks`, of the blocks whose dirty data is in flush
    /// group `g` only, if given (writeback in flush order: a block
    /// rewritten in a later group since it was chosen is left alone).
    /// Blocks whose locks this thread already holds are written too where
    /// the order says so (`Order::lock_for_run`: a foreground write waiting
    /// for older flush groups), their locks neither taken nor released
    /// here.
    ///
    /// The runs' blocks are marked clean only after one origin flush at
    /// the end has made every run's write durable, and only if the origin
    /// lost nothing meanwhile (`Origin::flush_since`); until then their
    /// flights stay open, so a write to one keeps it dirty.
    ///
    /// Each volume's blocks go to its origin as a batch of their own, with
    /// its own flush and loss epoch, the volumes' batches side by side
    /// (`side_by_side`): draining two disks takes the slower one's time,
    /// not the sum.
    pub(crate) fn writeback_blocks_in(
        &self,
        blocks: &[u64],
        pace: Pace,
        group: Option<u64>,
    ) -> EngineResult<usize> {
        let batches: Vec<(&Origin, &[u64])> = (self.origins.split(blocks))
            .filter(|(_, keys)| !keys.is_empty())
            .collect();
        let one =
            |&(origin, keys): &(&Origin, &[u64])| self.writeback_volume(origin, keys, pace, group);
        let results: Vec<EngineResult<usize>> = if batches.len() > 1 && self.side_by_side() {
            on_threads(&batches, one)
        } else {
            batches.iter().map(one).collect()
        };
        let mut written = 0;
        let mut first_err = None;
        for r in results {
            match r {
                Ok(n) => written += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        partial_result(written, first_err)
    }

    /// Volumes' writeback batches run on threads of their own, at once:
    /// where the writeback order allows it (`Order::side_by_side`: not in
    /// flush order), and not under a simulated clock (a test that replays
    /// a seed wants one order of device events: clock.rs).
    fn side_by_side(&self) -> bool {
        self.order.side_by_side() && !self.clock.is_sim()
    }

    /// `writeback_blocks_in` for one volume's blocks.
    fn writeback_volume(
        &self,
        origin: &Origin,
        blocks: &[u64],
        pace: Pace,
        group: Option<u64>,
    ) -> EngineResult<usize> {
        let mut held_here = std::collections::HashSet::new();
        let epoch = origin.loss_epoch();
        let mut sent: Vec<Vec<(u64, u32)>> = Vec::new();
        let mut first_err: Option<EngineError> = None;
        let mut i = 0;
        while i < blocks.len() {
            let run = self.lock_run(blocks, &mut i, group, &mut held_here);
            if run.is_empty() {
                continue;
            }
            let started_ns = self.clock.now_ns();
            match self.send_run(&run, &|b| held_here.contains(&b)) {
                Ok(()) => sent.push(run),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            match pace {
                Pace::Share(share)
                    if share < 1.0 && self.busy(origin) && !self.writeback.writes_waiting() =>
                {
                    let took = self.clock.since_ns(started_ns) as f64 / 1e9;
                    let pause = Duration::from_secs_f64(took * (1.0 - share) / share);
                    bump(&self.stats.writeback_pauses, 1);
                    self.pause_background(pause.min(MAX_PAUSE));
                }
                // A client is back: the rest waits for the next round.
                Pace::Drain if self.busy(origin) => break,
                _ => {}
            }
        }
        let mine = |b| held_here.contains(&b);
        let written = self.finish_sent(origin, &sent, epoch, &mine, &mut first_err);
        partial_result(written, first_err)
    }

    /// Locks the next run of adjacent dirty blocks of `blocks` from `*i`
    /// on (advancing `*i`), at most a full origin write; empty if the
    /// block at `*i` is busy, clean, in flight or of another group.
    fn lock_run(
        &self,
        blocks: &[u64],
        i: &mut usize,
        group: Option<u64>,
        held_here: &mut std::collections::HashSet<u64>,
    ) -> Vec<(u64, u32)> {
        let max_run = (MAX_RUN_BYTES / self.block_bytes).max(1) as usize;
        let mut run: Vec<(u64, u32)> = Vec::new();
        while *i < blocks.len() && run.len() < max_run {
            let b = blocks[*i];
            if run.last().is_some_and(|&(last, _)| b != last + 1) {
                break;
            }
            match self.order.lock_for_run(self.origins.of_key(b).locks(), b) {
                Some(RunLock::Taken) => {}
                Some(RunLock::HeldHere) => {
                    held_here.insert(b);
                }
                None => {
                    *i += 1;
                    break;
                }
            }
            let dirty = {
                let m = self.meta.lock();
                match m.table().lookup(b) {
                    Some((slot, true))
                        if group.is_none_or(|g| {
                            m.groups().is_some_and(|gr| gr.group_of(slot) == g)
                        }) =>
                    {
                        Some(slot)
                    }
                    _ => None,
                }
            };
            *i += 1;
            match dirty {
                // Not already being written back by another thread.
                Some(slot) if !self.origins.of_key(b).flights().contains(b) => run.push((b, slot)),
                _ => {
                    if !held_here.contains(&b) {
                        self.origins.of_key(b).locks().unlock(b);
                    }
                    break;
                }
            }
        }
        run
    }

    /// Sends a run of locked, dirty, adjacent blocks to the origin, and
    /// unlocks them: does what the order asks first (`before_run_sent`:
    /// in flush order a commit), reads them from the cache, and releases
    /// their locks for the origin writes
    /// (origin/flights.rs). Their flights stay open for `finish_run`; a run whose
    /// origin write failed is finished here, its blocks left dirty.
    fn send_run(&self, run: &[(u64, u32)], mine: &dyn Fn(u64) -> bool) -> EngineResult<()> {
        let blocks = || run.iter().map(|&(b, _)| b);
        let unlock = || {
            blocks()
                .filter(|&b| !mine(b))
                .for_each(|b| self.origins.of_key(b).locks().unlock(b))
        };
        if let Err(e) = self.order.before_run_sent(self) {
            unlock();
            return Err(e);
        }
        let extents = self.dirty_extents(run);
        let buf = match self.read_run(run) {
            Ok(buf) => buf,
            Err(e) => {
                unlock();
                return Err(e.into());
            }
        };
        let origin = self.origins.of_key(run[0].0);
        origin.flights().start(blocks());
        unlock();
        let base = run[0].0 * self.block_bytes;
        let written = extents
            .iter()
            .try_for_each(|e| self.origin_write_now(&buf[e.clone()], base + e.start as u64));
        origin.flights().origin_written(blocks());
        if let Err(e) = written {
            self.finish_run(run, mine, false);
            return Err(e);
        }
        Ok(())
    }

    /// Makes the runs `send_run` sent durable on the origin (one flush for
    /// all, `epoch` read before the first was sent), then finishes them:
    /// marked clean if it succeeded, left dirty otherwise (the error goes
    /// to `first_err`). Returns how many blocks were marked clean.
    fn finish_sent(
        &self,
        origin: &Origin,
        sent: &[Vec<(u64, u32)>],
        epoch: u64,
        mine: &dyn Fn(u64) -> bool,
        first_err: &mut Option<EngineError>,
    ) -> usize {
        if sent.is_empty() {
            return 0;
        }
        let durable = origin.flush_since(&self.stats, epoch);
        let clean = durable.is_ok();
        if let Err(e) = durable {
            first_err.get_or_insert(e);
        }
        sent.iter()
            .map(|run| self.finish_run(run, mine, clean))
            .sum()
    }

    /// Ends a sent run's flights, locking its blocks again as the order
    /// does (`Order::finish_run`): with `clean`, marks clean the ones no
    /// write or trim touched meanwhile. Returns how many it marked clean.
    fn finish_run(&self, run: &[(u64, u32)], mine: &dyn Fn(u64) -> bool, clean: bool) -> usize {
        self.order.finish_run(self, run, mine, clean)
    }

    /// Writes one dirty block back while the caller holds its lock (the
    /// origin write waits for a flight of the same block, see origin/flights.rs),
    /// and flushes the origin before marking it clean.
    pub(crate) fn write_back_one(&self, block: u64, slot: u32) -> EngineResult<()> {
        let extents = self.dirty_extents(&[(block, slot)]);
        let buf = self.read_run(&[(block, slot)])?;
        let origin = self.origins.of_key(block);
        let epoch = origin.loss_epoch();
        for e in extents {
            self.origin_write(&buf[e.clone()], block * self.block_bytes + e.start as u64)?;
        }
        origin.flush_since(&self.stats, epoch)?;
        self.mark_clean(&[(block, slot)], &[]);
        Ok(())
    }

    /// Every slot is dirty or busy: waits up to `SLOT_WAIT` for background
    /// writeback to clean blocks and free their slots, which costs the
    /// origin one request per written-back run of blocks, where sending
    /// each write around the cache costs one request per write. True if a
    /// slot is free now; false at once if there is nothing to clean or the
    /// mode keeps no dirty data, or when no background thread runs. The
    /// caller may hold block locks: writeback only try-locks.
    pub(crate) fn wait_for_slots(&self) -> bool {
        if !self.origins.any_holds_dirty() || self.meta.dirty_count() == 0 {
            return false;
        }
        if !self.writeback.has_thread() || self.origins.iter().all(|o| o.unreachable()) {
            // Opened without background work (a command, a test), or the
            // origin is unreachable: nobody would write back while we wait.
            return false;
        }
        bump(&self.stats.slot_waits, 1);
        self.writeback.wait_slots(
            &self.bell,
            std::time::Instant::now() + SLOT_WAIT,
            || self.meta.free_slots() > 0,
            || self.closed.load(Ordering::Acquire),
        )
    }

    /// Writes back every block dirty when it is called (and, when the mode
    /// holds no dirty data, until none is left), then commits. `progress` is
    /// called with (blocks done, blocks to do). Blocks dirtied by writes that
    /// arrive meanwhile in writeback mode are left for later, so it always
    /// ends. (`tiercache flush` and lvmcache's flush mean this; the NBD
    /// FLUSH command, `Engine::flush`, only makes completed writes durable.)
    pub fn write_back_all(&self, progress: &mut dyn FnMut(u64, u64)) -> EngineResult<()> {
        self.write_back_where(&|_| true, progress)
    }

    /// `write_back_all` for volume `v` alone (`Engine::volume_index` finds
    /// it by name): the other volumes' dirty blocks stay. In flush order
    /// the groups hold every volume's writes and go to the origins whole,
    /// in order, so every volume is written back (`Order::write_back`).
    pub fn write_back_volume(
        &self,
        v: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        let origin = self.volume(v)?;
        self.write_back_where(&|key| origin.cacheable(key), progress)
    }

    /// Writes back the dirty blocks whose keys `wanted` accepts, as
    /// `write_back_all` says, in the writeback order's way
    /// (`Order::write_back`), then commits.
    fn write_back_where(
        &self,
        wanted: &dyn Fn(u64) -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        self.order.write_back(self, wanted, progress)?;
        self.commit()
    }

    /// One pass of a write back in address order over `blocks`
    /// (ascending): rounds of a batch from each volume, the volumes'
    /// batches side by side (`writeback_blocks_in`). Returns the blocks
    /// still dirty, ascending.
    pub(super) fn write_back_pass(
        &self,
        blocks: &[u64],
        total: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<Vec<u64>> {
        let mut queues: Vec<&[u64]> = self.origins.split(blocks).map(|(_, keys)| keys).collect();
        let mut next = Vec::new();
        loop {
            let round: Vec<u64> = (queues.iter_mut())
                .flat_map(|q| {
                    let (now, later) = q.split_at(q.len().min(BATCH_BLOCKS));
                    *q = later;
                    now.iter().copied()
                })
                .collect();
            if round.is_empty() {
                break;
            }
            self.writeback_blocks(&round, Pace::Full)?;
            let m = self.meta.lock();
            next.extend(round.iter().filter(|&&b| m.table().is_dirty(b)));
            drop(m);
            let untried: usize = queues.iter().map(|q| q.len()).sum();
            progress(total - (untried + next.len()) as u64, total);
        }
        next.sort_unstable();
        Ok(next)
    }
}
