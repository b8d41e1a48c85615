//! The writeback part: writing dirty blocks back to the origin.
//!
//! It owns the background thread and its wake-up, the settings and cursors
//! of background writeback and the writes waiting for it to free a slot.
//! Other parts reach it only through the methods below. The writebacks in
//! flight and the foreground activity it yields to are the origin's
//! (`origin/flights.rs`, `Origin::quiet_ms`).
//!
//! - `run.rs`: the background's rounds and steps, `write_back_all`, and
//!   writing a run of dirty blocks back (`impl Engine`).
//! - `lanes.rs`: a lane per origin, so that background writeback to an
//!   origin that hangs holds up that origin alone.
//! - `order/`: the order dirty data reaches the origin in, one file per
//!   order behind the `Order` trait (`address.rs`, `flush.rs`: group after
//!   group); the engine holds the one its superblock names.
//! - `clean.rs`: the log placement's cleaner, freeing and discarding whole
//!   segments ahead of the cursor (run by `placement/log.rs`).

pub mod clean;
pub(crate) mod lanes;
pub(crate) mod order;
pub(crate) mod pace;
pub mod run;

use crate::engine::cache::Bell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use super::WritebackSettings;
use crate::sync::{Mutex, Rank};

pub(crate) use run::{start_background, stop_background};

/// The writeback part's state.
pub(crate) struct Writeback {
    /// Settings and cursors (rank `WritebackState`: taken before the
    /// metadata lock).
    state: Mutex<State>,
    /// Writeback in flush order: one thread writes back at a time (rank
    /// `WritebackOrder`: after block locks, which it only try-locks); it
    /// holds where the sweep through a group's blocks goes on.
    order_turn: Mutex<u64>,
    /// Writes waiting for writeback to free a slot, and where they wait.
    slot_waiters: AtomicU32,
    /// The background thread's handle (it waits on the cache's bell).
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Each origin's lane (`lanes.rs`), started with the background.
    lanes: lanes::Lanes,
}

/// What background writeback decides by, kept between its rounds.
struct State {
    settings: WritebackSettings,
    /// Where the next scan for aged dirty blocks starts (slot index), and
    /// when the last scan that found them all ran.
    aged_scan_cursor: u32,
    aged_scan_done_s: Option<u64>,
    /// (Each volume's watermark sweep keeps its place in its `Origin`.)
    /// Watermark writeback is running (set above high, cleared at low).
    active: bool,
    /// Client requests counted when the writeback thread last looked, and
    /// when that count last changed (engine ms): how long clients have
    /// been away.
    client_requests_seen: (u64, u64),
}

impl Writeback {
    pub(crate) fn new(settings: WritebackSettings) -> Writeback {
        Writeback {
            state: Mutex::new(
                Rank::WritebackState,
                State {
                    settings,
                    aged_scan_cursor: 0,
                    aged_scan_done_s: None,
                    active: false,
                    client_requests_seen: (0, 0),
                },
            ),
            order_turn: Mutex::new(Rank::WritebackOrder, 0),
            slot_waiters: AtomicU32::new(0),
            thread: Mutex::new(Rank::Background, None),
            lanes: lanes::Lanes::default(),
        }
    }

    pub(crate) fn settings(&self) -> WritebackSettings {
        self.state.lock().settings
    }

    pub(crate) fn set_settings(&self, w: WritebackSettings) {
        self.state.lock().settings = w;
    }

    /// True while a background thread runs.
    fn has_thread(&self) -> bool {
        self.thread.lock().is_some()
    }

    /// Writes are waiting for a free slot.
    fn writes_waiting(&self) -> bool {
        self.slot_waiters.load(Ordering::Acquire) > 0
    }

    /// Waits on `bell` until `freed()` holds, the deadline passes or
    /// `closed()`, waking the background all along; false if it gave up.
    /// Counted as a waiter meanwhile (writeback then runs at full speed).
    fn wait_slots(
        &self,
        bell: &Bell,
        deadline: Instant,
        freed: impl Fn() -> bool,
        closed: impl Fn() -> bool,
    ) -> bool {
        self.slot_waiters.fetch_add(1, Ordering::AcqRel);
        let got = bell.wait_freed(deadline, freed, closed);
        self.slot_waiters.fetch_sub(1, Ordering::AcqRel);
        got
    }
}
