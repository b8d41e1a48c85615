//! The commit protocol (docs/format.md, "Commit protocol").
//!
//! A commit makes durable every data write and every record that completed
//! before it started:
//! 1. flush the origin if foreground writes reached it since its last
//!    flush (writethrough's data reaches the disk before the records that
//!    cache it clean; writeback flushes its own writes before it marks
//!    blocks clean, so a commit in writeback waits for no origin);
//! 2. flush the cache device (cache data reaches the disk before the
//!    records that map it);
//! 3. write the buffered records as new journal pages, never overwriting a
//!    page of the live journal, or, when the journal is half full, a full
//!    checkpoint to the inactive checkpoint area plus a superblock pointing
//!    at it;
//! 4. flush the cache device.
//!
//! Slots freed by the committed records become reusable only after step 4.
//!
//! Commits are serialised by the commit lock; a caller whose writes were
//! already covered by a commit that started after them returns at once
//! (group commit).

use std::sync::atomic::Ordering;

use super::crash_log::{self, CrashLog, Point};
use super::CommitState;
use crate::device::AlignedBuf;
use crate::engine::cache::Cache;
use crate::engine::format::{
    checkpoint_page, entry_decode, entry_encode, journal_page, CheckpointData, Record, PAGE_BYTES,
    RECORDS_PER_PAGE,
};
use crate::engine::format::{Layout, Superblock, SB_FLAG_DISTRUST_CLEAN};
use crate::engine::stats::bump;
use crate::engine::table::Batch;
use crate::engine::EngineError;
use crate::engine::{EngineResult, Meta};

/// Checkpoint pages written per device request.
const CHECKPOINT_PAGES_PER_WRITE: usize = 256;

impl Cache {
    /// Makes every completed write and every applied record durable.
    pub fn commit(&self) -> EngineResult<()> {
        let r = self.commit_journal();
        // With the log placement, segments this commit freed are discarded
        // before they are used again (placement/log.rs).
        self.placement.after_commit(self);
        r
    }

    fn commit_journal(&self) -> EngineResult<()> {
        if self.failed_over() {
            // All data is on the origin; the cache takes no metadata.
            return self.origins.flush_foreground(&self.stats);
        }
        let wanted = self.journal.completed_ops.load(Ordering::Acquire);
        let mut cs = self.journal.state.lock();
        if cs.flushed_through >= wanted && wanted > 0 {
            return Ok(());
        }
        match self.commit_locked(&mut cs, None) {
            Err(e) => {
                drop(cs);
                if self.fail_over_after_commit_error(&e) {
                    return self.origins.flush_foreground(&self.stats);
                }
                Err(e)
            }
            ok => ok,
        }
    }

    /// With `checkpoint = Some(clean)`, always writes a checkpoint (marking
    /// the cache clean if asked) instead of journal pages.
    pub(crate) fn commit_locked(
        &self,
        cs: &mut CommitState,
        checkpoint: Option<bool>,
    ) -> EngineResult<()> {
        let covered = self.journal.completed_ops.load(Ordering::Acquire);
        let in_use = cs.next_page_seq - cs.sb.journal_replay_seq.get();
        let journal_pages = self.regions.journal_pages;
        let (batch, snapshot, target, stale) = {
            let mut m = self.meta.lock();
            let batch = m.take_batch();
            let pages = batch.records.len().div_ceil(RECORDS_PER_PAGE) as u64;
            let wanted = checkpoint.is_some() || in_use + pages > journal_pages / 2;
            let snapshot = self.checkpoint_snapshot(&mut m, wanted, in_use + pages);
            let target = self.commit_target(cs, snapshot.is_some(), pages);
            if let Some(log) = m.crash_log() {
                log.begin_commit(target, batch.records.len());
            }
            (batch, snapshot, target, self.stale_map_due(cs, &m))
        };
        if let (Some(map), Some(now)) = (cs.stale_map.as_mut(), stale) {
            // Before the records: the file names every region they make
            // durable as dirty (stale_map.rs).
            map.write(now, self.now_ms());
        }
        let result = self.commit_io(cs, &batch.records, snapshot, checkpoint.unwrap_or(false));
        match result {
            Ok(()) => {
                self.commit_succeeded(cs, batch, target, covered);
                Ok(())
            }
            Err(e) => {
                // Keep the records and the pending slots for the next try:
                // the in-memory state still depends on them.
                let mut m = self.meta.lock();
                if let Some(log) = m.crash_log() {
                    log.commit_failed();
                }
                m.batch_failed(batch);
                Err(e)
            }
        }
    }

    /// The state a checkpoint writes, if this commit writes one (`wanted`:
    /// asked for, or the journal would pass half full with `pages_after`
    /// pages in use). The snapshot is taken together with the records so
    /// it equals the state those records lead to. A checkpoint keeps no
    /// closed flush group (table/groups.rs): while one is pending it waits
    /// (the background writes them back meanwhile), until the journal
    /// would pass seven eighths.
    fn checkpoint_snapshot(
        &self,
        m: &mut Meta,
        wanted: bool,
        pages_after: u64,
    ) -> Option<CheckpointData> {
        if !wanted {
            return None;
        }
        let groups_pending = m.groups().and_then(|g| g.closed_pending()).is_some();
        if groups_pending && pages_after <= self.regions.journal_pages / 8 * 7 {
            self.journal.want_checkpoint(true);
            return None;
        }
        if groups_pending {
            bump(&self.stats.group_orders_lost, 1);
            log::warn!(
                "the journal is nearly full while flush groups wait for writeback: \
                 checkpointing without them (their order is kept only until the next \
                 crash)"
            );
        }
        self.journal.want_checkpoint(false);
        Some(m.snapshot())
    }

    /// The dirty regions to write to the stale map before this commit, if
    /// it is due (taken under `Meta` with the records: 16 words a volume).
    fn stale_map_due(
        &self,
        cs: &CommitState,
        m: &Meta,
    ) -> Option<Vec<crate::engine::observe::heat::DirtyRegions>> {
        let map = cs.stale_map.as_ref()?;
        let now = m.table().regions.dirty_regions();
        map.due(&now, self.now_ms()).then_some(now)
    }

    /// A commit to `target` is durable: its batch's slots are released,
    /// the crash log's records up to it are done, and `covered` completed
    /// operations are flushed.
    fn commit_succeeded(&self, cs: &mut CommitState, batch: Batch, target: Point, covered: u64) {
        let freed = batch.frees_slots();
        let through = batch.releases_through();
        {
            let mut m = self.meta.lock();
            if let Some(log) = m.crash_log() {
                log.commit_done(target);
                if log.len() < log.capacity() / 4 * 3 {
                    self.journal.pressed.store(false, Ordering::Relaxed);
                }
            }
            m.batch_durable(batch);
        }
        if freed {
            // Writes waiting for a slot (slots.rs) try again.
            self.bell.slots_freed();
        }
        cs.flushed_through = covered;
        cs.releases_durable = through;
        cs.last_commit_ms = self.now_ms();
        bump(&self.stats.commits, 1);
    }

    /// The on-disk point a commit leads to (`crash_log::Point`): a
    /// checkpoint bumps the checkpoint generation and starts replay where
    /// the journal was written to; journal pages advance the sequence.
    fn commit_target(&self, cs: &CommitState, checkpoint: bool, pages: u64) -> Point {
        let generation = cs.sb.checkpoint_generation.get();
        if checkpoint {
            Point {
                checkpoint_generation: generation + 1,
                journal_seq: self.checkpoint_replay_seq(cs),
            }
        } else {
            Point {
                checkpoint_generation: generation,
                journal_seq: cs.next_page_seq + pages,
            }
        }
    }

    /// Where replay starts after a checkpoint written now: past every
    /// journal page ever written, so that pages of a commit that failed
    /// after writing some of them are never replayed over the checkpoint
    /// (their records were applied in memory since, and later records may
    /// have undone them).
    fn checkpoint_replay_seq(&self, cs: &CommitState) -> u64 {
        cs.next_page_seq.max(cs.journal_written_end)
    }

    /// The durable point of the cache as it stands (for the crash log).
    pub(crate) fn durable_point(&self, cs: &CommitState) -> Point {
        Point {
            checkpoint_generation: cs.sb.checkpoint_generation.get(),
            journal_seq: cs.next_page_seq,
        }
    }

    fn commit_io(
        &self,
        cs: &mut CommitState,
        records: &[Record],
        snapshot: Option<CheckpointData>,
        clean: bool,
    ) -> EngineResult<()> {
        // Only foreground origin writes need the origin here: writeback
        // flushed its own before marking blocks clean (writeback/run.rs),
        // so in writeback a frozen origin holds no commit back.
        self.origins.flush_foreground(&self.stats)?;
        self.cache_flush()?;
        if let Some(data) = snapshot {
            let next = self.checkpoint_replay_seq(cs);
            return self.write_checkpoint(cs, &data, next, clean);
        }
        if records.is_empty() {
            return Ok(());
        }
        let first = cs.next_page_seq;
        let n_pages = records.len().div_ceil(RECORDS_PER_PAGE) as u32;
        let pages: Vec<Vec<u8>> = records
            .chunks(RECORDS_PER_PAGE)
            .enumerate()
            .map(|(i, chunk)| journal_page(first + i as u64, first, n_pages, chunk))
            .collect();
        cs.journal_written_end = cs.journal_written_end.max(first + pages.len() as u64);
        // Write runs of pages that are contiguous in the ring.
        let mut i = 0;
        while i < pages.len() {
            let seq = first + i as u64;
            let ring_left = self.regions.journal_pages - seq % self.regions.journal_pages;
            let n = (pages.len() - i).min(ring_left as usize);
            let mut buf = AlignedBuf::zeroed(n * PAGE_BYTES as usize);
            for (k, p) in pages[i..i + n].iter().enumerate() {
                buf[k * PAGE_BYTES as usize..(k + 1) * PAGE_BYTES as usize].copy_from_slice(p);
            }
            self.meta_write(&buf, self.regions.journal_page_offset(seq))?;
            i += n;
        }
        self.cache_flush()?;
        cs.next_page_seq = first + pages.len() as u64;
        Ok(())
    }

    /// Writes `data` as a checkpoint into the inactive area, then a
    /// superblock that makes it current with journal replay starting at
    /// `replay_seq`. The old checkpoint stays intact until the superblock
    /// is durable. The checkpoint that grows the cache (`cs.grow_to`) goes
    /// to the first area of the grown layout instead, and its superblock
    /// records that layout (entries past `data`'s are free).
    pub(crate) fn write_checkpoint(
        &self,
        cs: &mut CommitState,
        data: &CheckpointData,
        replay_seq: u64,
        clean: bool,
    ) -> EngineResult<()> {
        let grow = cs.grow_to.take();
        let (layout, area) = match grow {
            Some((grown, _)) => (grown, 0),
            None => (cs.sb.layout(), 1 - cs.sb.checkpoint_area.get() as usize),
        };
        let generation = cs.sb.checkpoint_generation.get() + 1;
        self.write_checkpoint_pages(&layout, area, generation, data)?;
        if grow.is_some() {
            // The other new area holds whatever the device held there: with
            // its first page zeroed it never reads as a whole checkpoint.
            let zero = AlignedBuf::zeroed(PAGE_BYTES as usize);
            self.meta_write(&zero, layout.checkpoint_offset[1])?;
        }
        self.cache_flush()?;
        self.write_superblock(cs, |sb| {
            if let Some((grown, device_bytes)) = grow {
                sb.set_layout(&grown, device_bytes);
            }
            sb.checkpoint_area.set(area as u32);
            sb.checkpoint_generation.set(generation);
            sb.journal_replay_seq.set(replay_seq);
            sb.clean_shutdown.set(clean as u32);
            sb.checkpoint_open_group.set(data.open_group);
        })?;
        if grow.is_some() {
            // Both copies name the grown layout: a copy damaged later
            // cannot leave one naming areas that no longer hold the newest
            // checkpoint (a crash before this write is no damage: the newer
            // copy is whole).
            self.write_superblock(cs, |_| ())?;
        }
        cs.next_page_seq = replay_seq;
        cs.journal_written_end = replay_seq;
        bump(&self.stats.checkpoints, 1);
        Ok(())
    }

    /// The pages of a checkpoint of `data` into `area` of `layout`.
    fn write_checkpoint_pages(
        &self,
        layout: &Layout,
        area: usize,
        generation: u64,
        data: &CheckpointData,
    ) -> EngineResult<()> {
        let pages_total = layout.checkpoint_pages as usize;
        let mut page_index = 0usize;
        while page_index < pages_total {
            let n = (pages_total - page_index).min(CHECKPOINT_PAGES_PER_WRITE);
            let mut buf = AlignedBuf::zeroed(n * PAGE_BYTES as usize);
            for k in 0..n {
                let idx = (page_index + k) as u64;
                let page = checkpoint_page(layout, generation, idx, data);
                buf[k * PAGE_BYTES as usize..(k + 1) * PAGE_BYTES as usize].copy_from_slice(&page);
            }
            let off = layout.checkpoint_offset[area] + page_index as u64 * PAGE_BYTES;
            self.meta_write(&buf, off)?;
            page_index += n;
        }
        Ok(())
    }

    /// Grows the cache to the layout of a cache device that now measures
    /// `device_bytes` (`Engine::grow_cache`; `Layout::grown`), under the
    /// commit lock: a commit that writes its checkpoint to the grown
    /// layout's first area and a superblock naming that layout (entries
    /// past the old slots free), then the in-memory table takes the new
    /// slots. A crash before the superblock write leaves the cache as it
    /// was; after it, grown. No new slot is handed out before the
    /// superblock naming it is durable, so no record (journal or crash
    /// log) names one before. Returns the slots before and after (the same
    /// if another grow took `device_bytes` first), or `None` when flush
    /// groups wait for the origin (a checkpoint keeps none: the commit
    /// wrote journal pages instead, and nothing grew).
    pub(crate) fn checkpoint_grown(&self, device_bytes: u64) -> EngineResult<Option<(u64, u64)>> {
        let mut cs = self.journal.state.lock();
        let was = cs.sb.slot_count.get();
        if cs.sb.cache_device_bytes.get() >= device_bytes {
            // Another grow took this size while this one waited for the
            // lock (two `resize --cache` at once): nothing is left to do.
            return Ok(Some((was, was)));
        }
        let layout = cs.sb.layout();
        let grown = Layout::grown(&layout, device_bytes)
            .filter(|g| g.slot_count > was)
            .ok_or_else(|| {
                let needed = Layout::with_grown_slots(&layout, was + 1).end_bytes();
                EngineError::Config(format!(
                    "the cache device measures {device_bytes} bytes, too few for one more block \
                     once its checkpoint areas move past the data region: it needs {needed}"
                ))
            })?;
        cs.grow_to = Some((grown, device_bytes));
        let result = self.commit_locked(&mut cs, Some(false));
        cs.grow_to = None;
        result?;
        if cs.sb.slot_count.get() == was {
            return Ok(None);
        }
        self.meta.grow_slots(grown.slot_count);
        Ok(Some((was, grown.slot_count)))
    }

    /// Makes everything durable, then writes a clean checkpoint of the
    /// table without volume `v` (whose blocks are all dropped:
    /// `Engine::remove_volume`), the volumes after it moved down one place
    /// with their keys, and with it the superblock without `v`'s record:
    /// the one superblock write that makes the checkpoint current changes
    /// both, so a crash leaves the cache with `v` or without it, whole.
    /// The engine is closed: its volumes are not the cache's any more.
    pub(crate) fn checkpoint_without_volume(&self, v: usize) -> EngineResult<()> {
        let mut cs = self.journal.state.lock();
        self.commit_locked(&mut cs, Some(false))?;
        let mut data = self.meta.snapshot();
        let keys = self.origins.key_space();
        for (slot, e) in data.entries.iter_mut().enumerate() {
            let Some((block, dirty)) = entry_decode(*e) else {
                continue;
            };
            let Some(key) = keys.key_without(v, block) else {
                return Err(EngineError::Config(format!(
                    "slot {slot} still holds a block of the volume being removed"
                )));
            };
            *e = entry_encode(key, dirty);
        }
        let mut list = cs.sb.volume_list();
        list.remove(v);
        // Written by the checkpoint's superblock write below.
        cs.sb.set_volume_list(&list);
        let replay = cs.next_page_seq;
        self.write_checkpoint(&mut cs, &data, replay, true)
    }

    /// Writes the superblock copy not holding the current generation, then
    /// flushes. A torn write leaves the other copy valid.
    pub(crate) fn write_superblock(
        &self,
        cs: &mut CommitState,
        change: impl FnOnce(&mut Superblock),
    ) -> EngineResult<()> {
        let mut sb = cs.sb;
        change(&mut sb);
        sb.generation.set(sb.generation.get() + 1);
        sb.seal();
        let copy = sb.generation.get() % 2;
        let buf = AlignedBuf::from_slice(&sb.to_page());
        self.meta_write(&buf, copy * PAGE_BYTES)?;
        self.cache_flush()?;
        cs.sb = sb;
        Ok(())
    }

    /// Commits, then writes a checkpoint of the whole table, emptying the
    /// journal (the background does this when the journal passes half
    /// full; tests schedule it as a step of its own).
    pub fn checkpoint(&self) -> EngineResult<()> {
        if self.failed_over() {
            return self.commit();
        }
        self.checkpoint_now(false)
    }

    /// Commits, then writes a checkpoint of the whole table (with the clean
    /// flag for a clean shutdown), emptying the journal.
    pub(crate) fn checkpoint_now(&self, clean: bool) -> EngineResult<()> {
        let mut cs = self.journal.state.lock();
        self.commit_locked(&mut cs, Some(clean))
    }

    /// Changes the superblock (written to the copy not holding the current
    /// generation, then flushed) under the commit lock.
    pub(crate) fn update_superblock(
        &self,
        change: impl FnOnce(&mut Superblock),
    ) -> EngineResult<()> {
        self.update_superblock_then(change, || ())
    }

    /// `update_superblock`, then `then` while the commit lock is still
    /// held, if the write succeeded: a setting changes in memory in the
    /// same order as on disk.
    pub(crate) fn update_superblock_then<T>(
        &self,
        change: impl FnOnce(&mut Superblock),
        then: impl FnOnce() -> T,
    ) -> EngineResult<T> {
        let mut cs = self.journal.state.lock();
        self.write_superblock(&mut cs, change)?;
        Ok(then())
    }

    /// The registered name the current superblock records.
    pub(crate) fn recorded_name(&self) -> Option<String> {
        self.journal.state.lock().sb.name()
    }

    /// `update_superblock_then` with a change that may be refused: `change`
    /// gets the current superblock and returns the next one or an error,
    /// under the commit lock, so no other change slips in between.
    pub(crate) fn update_superblock_checked<T>(
        &self,
        change: impl FnOnce(&Superblock) -> EngineResult<Superblock>,
        then: impl FnOnce() -> T,
    ) -> EngineResult<T> {
        let mut cs = self.journal.state.lock();
        let next = change(&cs.sb)?;
        self.write_superblock(&mut cs, |sb| *sb = next)?;
        Ok(then())
    }

    /// Makes the opened state durable before any request: a clean cache is
    /// marked in use; a recovered one gets a checkpoint that restarts the
    /// journal a full ring later. The crash log then starts empty at that
    /// state.
    pub(crate) fn start_journal(
        &self,
        clean: bool,
        distrust: bool,
        journal_end_seq: u64,
        log: Option<CrashLog>,
    ) -> EngineResult<()> {
        let mut cs = self.journal.state.lock();
        if clean {
            self.write_superblock(&mut cs, |sb| sb.clean_shutdown.set(0))?;
        } else {
            // Pages after the replayed ones may hold valid pages of an
            // interrupted commit; start the new journal a full ring later so
            // none of them can ever be taken for a new page.
            let data = self.meta.snapshot();
            let restart = journal_end_seq + self.regions.journal_pages;
            self.write_checkpoint(&mut cs, &data, restart, false)?;
            if distrust {
                self.write_superblock(&mut cs, |sb| {
                    sb.flags.set(sb.flags.get() & !SB_FLAG_DISTRUST_CLEAN)
                })?;
            }
        }
        if let Some(mut log) = log {
            log.reset(&crash_log::Identity::of(&cs.sb), self.durable_point(&cs));
            self.meta.set_crash_log(log);
        }
        Ok(())
    }
}
