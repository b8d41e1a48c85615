//! The journal part: what makes the table durable and brings it back.
//!
//! It owns the commit lock's state (the superblock as last written, the
//! journal position, what the last commit covered), the count of completed
//! operations a commit covers, and the crash log's pressure flag. The crash
//! log itself (`crash_log.rs`) is kept under the metadata lock, beside the
//! records it mirrors, and changed only through its own methods.
//!
//! - `commit.rs`: the commit protocol, checkpoints, superblock writes, and
//!   the journal's start at open and end at detach (`impl Engine`).
//! - `crash_log.rs`: records not yet journalled, kept in shared memory so a
//!   killed daemon loses no acknowledged write.
//! - `stale_map.rs`: which origin regions hold dirty data, in a file off
//!   the cache device, written before each durable point that adds one.

pub mod commit;
pub mod crash_log;
pub mod stale_map;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::format::{Layout, Superblock, SB_FLAG_ALLOW_VOLATILE_WRITEBACK};
use crate::sync::{Mutex, Rank};

/// The journal part's state.
pub(crate) struct Journal {
    /// The commit lock (rank `Commit`).
    state: Mutex<CommitState>,
    /// Counts completed data writes and appended records; a commit that
    /// starts after value v makes everything counted up to v durable.
    completed_ops: AtomicU64,
    /// The crash log is three quarters full: writers commit before they
    /// return (set by an append, cleared by a commit that empties it).
    pressed: AtomicBool,
    /// A checkpoint is due but waits for closed flush groups to reach the
    /// origin (commit.rs): the background writes them back now.
    checkpoint_waits: AtomicBool,
}

/// State under the commit lock: the journal position and the superblock.
pub(crate) struct CommitState {
    sb: Superblock,
    next_page_seq: u64,
    /// `completed_ops` value covered by the last completed commit.
    flushed_through: u64,
    /// The last release (`releases.rs`) covered by a completed commit.
    releases_durable: u64,
    /// One past the highest journal sequence ever written, including by a
    /// commit that failed: a checkpoint starts replay there, so pages of a
    /// failed commit (records since applied differently) are never
    /// replayed over it.
    journal_written_end: u64,
    /// When the last commit completed (`Engine::now_ms`).
    last_commit_ms: u64,
    /// The next checkpoint is the one that grows the cache
    /// (`Cache::checkpoint_grown`): its layout and the device's size.
    grow_to: Option<(Layout, u64)>,
    /// The stale map this cache keeps, if its opener named a file.
    stale_map: Option<stale_map::StaleMap>,
}

impl Journal {
    /// The journal of a cache opened with superblock `sb`, whose journal
    /// was read up to (not including) page `journal_end_seq`.
    pub(crate) fn new(sb: Superblock, journal_end_seq: u64) -> Journal {
        Journal {
            state: Mutex::new(
                Rank::Commit,
                CommitState {
                    sb,
                    next_page_seq: journal_end_seq,
                    flushed_through: 0,
                    releases_durable: 0,
                    journal_written_end: journal_end_seq,
                    last_commit_ms: 0,
                    grow_to: None,
                    stale_map: None,
                },
            ),
            completed_ops: AtomicU64::new(0),
            pressed: AtomicBool::new(false),
            checkpoint_waits: AtomicBool::new(false),
        }
    }

    /// Keep the stale map in `path` from the next commit on.
    pub(crate) fn keep_stale_map(&self, path: std::path::PathBuf, block_bytes: u64) {
        self.state.lock().stale_map = Some(stale_map::StaleMap::new(path, block_bytes));
    }

    /// A data write completed or a record was appended: the next commit
    /// that starts covers it.
    pub(crate) fn note_completed(&self) {
        self.completed_ops.fetch_add(1, Ordering::AcqRel);
    }

    /// Writers commit before they return (the crash log is nearly full).
    pub(crate) fn pressed(&self) -> bool {
        self.pressed.load(Ordering::Relaxed)
    }

    /// A checkpoint waits for the closed flush groups (or no longer).
    pub(crate) fn want_checkpoint(&self, waits: bool) {
        self.checkpoint_waits.store(waits, Ordering::Relaxed);
    }

    /// A checkpoint waits for the closed flush groups.
    pub(crate) fn checkpoint_waits(&self) -> bool {
        self.checkpoint_waits.load(Ordering::Relaxed)
    }

    pub(crate) fn press(&self) {
        self.pressed.store(true, Ordering::Relaxed);
    }

    /// The last release made durable by a commit (`releases.rs`).
    pub(crate) fn releases_durable(&self) -> u64 {
        self.state.lock().releases_durable
    }

    /// When the last commit completed (engine ms).
    pub(crate) fn last_commit_ms(&self) -> u64 {
        self.state.lock().last_commit_ms
    }

    /// The superblock as last written.
    pub(crate) fn superblock(&self) -> Superblock {
        self.state.lock().sb
    }

    /// The cache was created accepting data loss on a volatile device.
    pub(crate) fn allow_data_loss(&self) -> bool {
        self.superblock().flags.get() & SB_FLAG_ALLOW_VOLATILE_WRITEBACK != 0
    }
}
