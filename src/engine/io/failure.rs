//! When the cache device fails.
//!
//! - Every cache device error is counted. Once `cache_error_limit` errors
//!   have happened, no new blocks are admitted: cached blocks are still
//!   served and dirty ones written back, writes to other blocks go to the
//!   origin, read misses are not promoted. Reopening the cache resets this.
//! - If a commit cannot write the cache metadata while the cache holds no
//!   dirty data (writethrough, writearound, passthrough), the cache is
//!   *failed over* to the origin: every request goes to the origin and
//!   succeeds if the origin does, so the failure stays invisible to the
//!   user. Before failing over, a
//!   superblock flag is written (best effort) that makes the next open drop
//!   every clean mapping, since the origin may change under them.
//! - With dirty data (writeback, writeonly), errors are returned to the
//!   caller: the cache holds the only copy of that data, and a device that
//!   answers again loses nothing. Past the error limit, `status` lists the
//!   origin ranges those dirty blocks make stale. If the operator says the
//!   device is gone (`give_up_cache`), the cache fails over, those ranges
//!   stay *stale* (`origin/stale.rs`): reads of them fail, `status` lists them,
//!   the rest of the volume is served from the origin. (A cache set gets
//!   here only when every copy failed.)

use std::sync::atomic::Ordering;

use crate::device::members::Members;
use crate::device::DeviceError;
use crate::engine::cache::Cache;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::format::SB_FLAG_DISTRUST_CLEAN;
use crate::engine::io::FailoverHook;
use crate::engine::stats::bump;

impl Cache {
    /// Replaces member `member` of the cache set with `new` and rebuilds
    /// its copies online (`CacheSet::replace`); `progress` gets bytes
    /// copied and bytes to copy. Its own slots take clean blocks again
    /// once it is healthy.
    pub(crate) fn replace_member(
        &self,
        member: usize,
        new: crate::device::DeviceRef,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        let Some(set) = self.io.cache.members() else {
            return Err(EngineError::Config(format!(
                "{} is one cache device, not a cache set: there is no member to replace",
                self.io.cache.name()
            )));
        };
        let r = set.replace(member, new, progress);
        self.follow_cache_set();
        Ok(r?)
    }

    /// The operator's word that the cache device is gone for good: its
    /// dirty blocks are lost. The cache fails over to the origin, their
    /// origin ranges become stale (reads of them fail, `status` lists
    /// them; a write of a whole block makes it current again), and the
    /// table is emptied. Returns how many blocks were lost.
    pub(crate) fn give_up(&self) -> EngineResult<u64> {
        if self.given_up() {
            return Ok(0);
        }
        let lost = self.meta.all_dirty();
        if !lost.is_empty() {
            self.lose_dirty(&lost, "the cache device was given up");
        }
        // Nothing in the cache is read again: the stale list says what the
        // origin lacks, and writes go to the origin. Requests under way
        // append nothing from now on (`given_up`).
        self.io.given_up.store(true, Ordering::Release);
        self.fail_over("the cache device was given up");
        self.meta.forget_all();
        Ok(lost.len() as u64)
    }
}

impl Cache {
    /// Changes the cache error limit (0: never stop admitting); persisted in
    /// the superblock. Reaching it takes effect at the next cache error.
    pub fn set_cache_error_limit(&self, limit: u64) -> EngineResult<()> {
        self.io.cache_error_limit.store(limit, Ordering::Relaxed);
        self.update_superblock(|sb| sb.cache_error_limit.set(limit))
    }

    /// Counts a cache device error; at the limit, stops admitting blocks.
    /// On a cache set, an error is a member's failure; the set serves on
    /// without it and the error counts against the limit only if the set
    /// could not hide it.
    pub(crate) fn note_cache_error(&self) {
        self.follow_cache_set();
        bump(&self.stats.cache_errors, 1);
        let limit = self.io.cache_error_limit.load(Ordering::Relaxed);
        let errors = self.stats.cache_errors.load(Ordering::Relaxed);
        if limit > 0 && errors >= limit && !self.io.admission_stopped.swap(true, Ordering::AcqRel) {
            log::error!(
                "{}: {errors} cache device errors (limit {limit}): no new blocks will be cached",
                self.io.cache.name()
            );
        }
    }

    /// Follows a cache set's member states (a no-op on a single device or
    /// when nothing changed): the own slots of members that are not
    /// healthy become unusable and their clean blocks are dropped (read
    /// from the origin again); those of members healthy again are free.
    /// Mirrored slots need nothing: the set serves them from the copy left.
    pub(crate) fn follow_cache_set(&self) {
        let Some(set) = self.io.cache.members() else {
            return;
        };
        let epoch = set.epoch();
        if self.io.set_epoch.load(Ordering::Acquire) == epoch {
            return;
        }
        if self.retire_slots(set.unusable_slots()) {
            self.io.set_epoch.store(epoch, Ordering::Release);
        }
    }

    /// The open of a cache set is done. From now on a metadata page that
    /// fails its checks counts against the member that returned it
    /// (`device/set/health.rs`: the open has repaired what a crash can
    /// leave different). After an unclean shutdown the mirrored copies may
    /// differ (a crash cut a write between them): they are made equal, in
    /// a thread of its own while clients go on (reads use one copy until
    /// then), or at once without a background (`no_background`: tests,
    /// short-lived commands).
    pub(crate) fn cache_set_opened(&self, unclean: bool, background: bool) {
        let Some(set) = self.io.cache.members() else {
            return;
        };
        set.count_meta_damage();
        if unclean {
            set.begin_resync();
        }
        if !set.resync_pending() {
            return;
        }
        let resync = |set: &dyn Members| {
            if let Err(e) = set.resync(&mut |_, _| {}) {
                log::warn!("{}: resync: {e}", set.set_name());
            }
        };
        if !background {
            resync(set);
            return;
        }
        let dev = self.io.cache.clone();
        let spawned = std::thread::Builder::new()
            .name("tc-resync".into())
            .spawn(move || resync(dev.members().expect("a cache set")));
        match spawned {
            Ok(h) => *self.io.resync.lock() = Some(h),
            Err(e) => log::warn!("{}: no resync thread: {e}", set.set_name()),
        }
    }

    /// Stops and joins a running resync (close).
    pub(crate) fn stop_resync(&self) {
        if let Some(set) = self.io.cache.members() {
            set.stop_resync();
        }
        let handle = self.io.resync.lock().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// A cache device error in the metadata path: counted, and tagged so a
    /// commit can tell it from an origin error.
    pub(crate) fn cache_meta_error(&self, e: DeviceError) -> EngineError {
        self.note_cache_error();
        EngineError::CacheMetadata(e)
    }

    /// Sets the function called when the cache fails over to the origin. It should
    /// record, somewhere other than the cache device, that the next open
    /// must pass `OpenOptions::distrust_clean`: the device-side flag is
    /// only best effort.
    pub fn on_failover(&self, hook: FailoverHook) {
        *self.io.failover_hook.lock() = Some(hook);
    }

    /// False once the cache error limit was reached or the cache failed over.
    pub fn admitting(&self) -> bool {
        !self.io.admission_stopped.load(Ordering::Acquire)
    }

    /// True once the cache was given up holding dirty data (see the
    /// module comment): the table is empty and takes no records.
    pub(crate) fn given_up(&self) -> bool {
        self.io.given_up.load(Ordering::Acquire)
    }

    /// True once the cache failed over to the origin (see the module comment).
    pub fn failed_over(&self) -> bool {
        self.io.failed_over.load(Ordering::Acquire)
    }

    /// After a failed commit: fail over to the origin if that hides the
    /// failure without losing anything, which is when no block is dirty.
    /// With dirty blocks the error reaches the caller and the cache keeps
    /// them: a device that answers again loses nothing. Meanwhile `status`
    /// lists the origin ranges they make stale; `give_up_cache` is the
    /// operator's word that the device is gone.
    pub(crate) fn fail_over_after_commit_error(&self, e: &EngineError) -> bool {
        if !matches!(e, EngineError::CacheMetadata(_)) {
            return false;
        }
        {
            let m = self.meta.lock();
            if self.origins.any_holds_dirty() || m.table().dirty_count() > 0 {
                return false;
            }
        }
        self.fail_over(&e.to_string());
        true
    }

    /// Every request goes to the origin from now on (see the module
    /// comment); the next open drops every clean block.
    fn fail_over(&self, why: &str) {
        if self.io.failed_over.swap(true, Ordering::AcqRel) {
            return;
        }
        self.io.admission_stopped.store(true, Ordering::Release);
        if let Some(hook) = self.io.failover_hook.lock().as_ref() {
            hook();
        }
        // Passthrough in memory only: reads skip the cache, writes go to the
        // origin; the mode recorded on the device is unchanged.
        self.swap_mode(crate::engine::Mode::Passthrough);
        log::error!(
            "{}: failing over to the origin until the cache is reopened: {why}",
            self.io.cache.name()
        );
        // Best effort: if this write fails too, the device is unusable and
        // opening it again fails as well (open writes the superblock).
        let flagged =
            self.update_superblock(|sb| sb.flags.set(sb.flags.get() | SB_FLAG_DISTRUST_CLEAN));
        if let Err(e) = flagged {
            log::error!(
                "{}: could not mark the cache for invalidation: {e}",
                self.io.cache.name()
            );
        }
    }

    /// The cache failed holding the dirty blocks `lost` (sorted): their
    /// origin blocks are stale from now on.
    fn lose_dirty(&self, lost: &[u64], e: &str) {
        for (origin, keys) in self.origins.split(lost) {
            let ranges = origin.set_stale(keys);
            if keys.is_empty() {
                continue;
            }
            let shown: Vec<String> = ranges
                .iter()
                .take(16)
                .map(|(offset, len)| format!("{offset}+{len}"))
                .collect();
            log::error!(
                "{}: {e}, holding {} dirty blocks of {}: their data is lost and these origin \
                 byte ranges are stale (reads of them fail): {}{}",
                self.io.cache.name(),
                keys.len(),
                origin.name(),
                shown.join(" "),
                if ranges.len() > 16 { " ..." } else { "" }
            );
        }
    }

    /// Per volume, the stale origin ranges (byte offset, bytes) and how
    /// many blocks: those of a cache given up; or, while the cache device
    /// is failing (past the error limit) with dirty blocks, theirs: the
    /// origin has older data there, and the only current copy is on a
    /// failing device.
    pub(crate) fn stale_ranges(&self) -> Vec<(Vec<(u64, u64)>, u64)> {
        if self.given_up() || !self.io.admission_stopped() {
            return self.origins.iter().map(|o| o.stale_ranges()).collect();
        }
        let dirty = self.meta.all_dirty();
        let split = self.origins.split(&dirty);
        split.map(|(o, keys)| o.would_be_stale(keys)).collect()
    }
}
