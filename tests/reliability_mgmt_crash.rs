//! Reliability scenario 3: the machine dies at the N-th device event (write,
//! flush or discard, across cache device and origin) of each management
//! operation — open (of a clean cache, and recovery after a crash), create
//! (on a blank device and over an older cache), set-mode (leaving writeback
//! with dirty data, entering writeback), set-writeback, flush (write back
//! everything), detach and clean shutdown (close) — for every N from 1
//! until the operation completes without reaching the crash.
//!
//! For every N:
//! - the operation reports an error exactly when it was cut (a crash switch
//!   fails the N-th event and everything after it, as a power loss);
//! - the crash images (the writes of each device's unflushed epoch all
//!   kept, all lost, or seeded random subsets torn and reordered, rebuilt
//!   from a recording of every device event) reopen to the old or the new
//!   state, never a mix: the data is always the data written (flushed
//!   writes present, nothing never written), mode / settings / clean flag /
//!   detached are the ones from before or after, dirty blocks only ever
//!   shrink during a writeback, and once the operation has reported success
//!   the new state is durable;
//! - writing everything back and detaching then leaves the origin equal to
//!   what the volume showed (no dirty block was taken for clean).

mod common;

use std::sync::Arc;

use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::recorder::{EventLog, Replay, Survival};
use tiercache::device::DeviceRef;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::recovery::check;
use tiercache::engine::{
    CreateOptions, Engine, EngineError, EngineResult, Mode, WritebackSettings,
};

use common::SectorModel;

const ORIGIN_BYTES: u64 = 1 << 20;
const SECTORS: u64 = ORIGIN_BYTES / 512;
const BS: u64 = 4096;
/// More events than any operation here needs; reaching it is a hang.
const MAX_EVENTS: u64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Create on a device that never held a cache.
    CreateBlank,
    /// Create with --force over a cache holding dirty data.
    CreateOverOld,
    SetModeToWritethrough,
    SetModeToWriteback,
    SetWriteback,
    Flush,
    Detach,
    Close,
    /// Open of a cache shut down cleanly (marks it in use).
    OpenClean,
    /// Open after a crash: journal replay and a fresh checkpoint.
    Recover,
}

impl Op {
    const ALL: [Op; 10] = [
        Op::OpenClean,
        Op::Recover,
        Op::CreateBlank,
        Op::CreateOverOld,
        Op::SetModeToWritethrough,
        Op::SetModeToWriteback,
        Op::SetWriteback,
        Op::Flush,
        Op::Detach,
        Op::Close,
    ];

    fn is_create(self) -> bool {
        matches!(self, Op::CreateBlank | Op::CreateOverOld)
    }

    fn is_open(self) -> bool {
        matches!(self, Op::OpenClean | Op::Recover)
    }

    /// The mode the cache is in before the operation.
    fn old_mode(self) -> Mode {
        match self {
            Op::SetModeToWriteback => Mode::Writethrough,
            _ => Mode::Writeback,
        }
    }

    /// True if a successful operation commits every earlier write.
    fn commits(self) -> bool {
        matches!(
            self,
            Op::SetModeToWritethrough | Op::Flush | Op::Detach | Op::Close
        )
    }
}

/// Writeback settings before and after `SetWriteback`.
const OLD_WB: WritebackSettings = WritebackSettings {
    high_pct: 100,
    low_pct: 0,
    max_age_secs: 3600,
    idle_secs: 0,
};
const NEW_WB: WritebackSettings = WritebackSettings {
    high_pct: 70,
    low_pct: 20,
    max_age_secs: 9,
    idle_secs: 0,
};
/// The mode `Create*` formats the new cache with (the old cache is writeback).
const NEW_CACHE_MODE: Mode = Mode::Writearound;

/// Durable images before the operation, and what the volume holds.
struct Before {
    cache: Vec<u8>,
    origin: Vec<u8>,
    model: SectorModel,
    dirty_blocks: u64,
}

fn write_blocks(engine: &Engine, model: &mut SectorModel, blocks: std::ops::Range<u64>) {
    for b in blocks {
        let (first, n) = (b * BS / 512, BS / 512);
        let v = model.issue_write(first, n);
        engine
            .write(first * 512, &common::stamped(first, n, v), false)
            .unwrap();
    }
}

/// A writeback cache holding clean blocks 0..4, dirty blocks 4..12 (4..6
/// superseding clean copies), five scattered dirty blocks (each its own
/// writeback run) and a partially rewritten dirty block 12, all durable,
/// shut down cleanly; then switched to `op.old_mode()`. `Op::CreateBlank`
/// starts from a zeroed device.
fn before(op: Op) -> Before {
    let cache_bytes = common::cache_bytes_for(24, BS as u32);
    let (cache, cache_ref) = common::fault_dev("cache", cache_bytes, 0);
    let origin = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(ORIGIN_BYTES),
        0,
    ));
    let mut model = SectorModel::new(SECTORS);
    if op == Op::CreateBlank {
        return Before {
            cache: cache.snapshot_current(),
            origin: origin.snapshot_current(),
            model,
            dirty_blocks: 0,
        };
    }
    let opts = CreateOptions {
        mode: Mode::Writeback,
        block_bytes: BS as u32,
        writeback: OLD_WB,
        ..Default::default()
    };
    Engine::create(cache_ref.clone(), origin.clone(), &opts)
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(cache_ref.clone(), origin.clone(), &common::no_bg()).unwrap();
    write_blocks(&engine, &mut model, 0..6);
    engine.write_back_all(&mut |_, _| {}).unwrap();
    write_blocks(&engine, &mut model, 4..12);
    for b in [20, 23, 26, 29, 32] {
        write_blocks(&engine, &mut model, b..b + 1);
    }
    let first = 12 * BS / 512 + 2;
    let v = model.issue_write(first, 3);
    engine
        .write(first * 512, &common::stamped(first, 3, v), false)
        .unwrap();
    engine.flush().unwrap();
    model.flush_done();
    let dirty_blocks = engine.dirty_blocks();
    assert_eq!(dirty_blocks, 14);
    if op.old_mode() != Mode::Writeback {
        // Entering writethrough writes everything back first.
        engine.set_mode(op.old_mode()).unwrap();
    }
    if op == Op::Recover {
        engine.abandon();
    } else {
        engine.close().unwrap();
    }
    Before {
        cache: cache.snapshot_current(),
        origin: origin.snapshot_current(),
        dirty_blocks: if op.old_mode() == Mode::Writeback {
            dirty_blocks
        } else {
            0
        },
        model,
    }
}

/// Runs `op` with the crash switch armed at event `n`; returns the result,
/// whether the switch tripped, the recorded log and the model of the data
/// (including writes the operation's prelude sent without a flush).
fn run_cut(
    op: Op,
    before: &Before,
    n: u64,
) -> (
    EngineResult<()>,
    bool,
    Vec<tiercache::device::recorder::Event>,
    SectorModel,
) {
    let switch = CrashSwitch::new();
    let log = EventLog::new();
    let dev = |name: &str, image: &[u8]| -> DeviceRef {
        Arc::new(log.record(Arc::new(
            FaultDevice::from_image(name, image.to_vec(), n).with_crash_switch(switch.clone()),
        )))
    };
    let cache = dev("cache", &before.cache);
    let origin = dev("origin", &before.origin);
    let mut model = before.model.clone();
    if op.is_create() {
        switch.arm_after_events(n);
        let r = Engine::create(
            cache,
            origin,
            &CreateOptions {
                mode: NEW_CACHE_MODE,
                block_bytes: BS as u32,
                policy: PolicyKind::Fifo,
                force: true,
                ..Default::default()
            },
        );
        if let Ok(e) = &r {
            e.abandon();
        }
        let tripped = switch.is_tripped();
        return (r.map(|_| ()), tripped, log.events(), model);
    }
    if op.is_open() {
        switch.arm_after_events(n);
        let r = Engine::open(cache, origin, &common::no_bg());
        if let Ok(e) = &r {
            e.abandon();
        }
        let tripped = switch.is_tripped();
        return (r.map(|_| ()), tripped, log.events(), model);
    }
    let engine = Engine::open(cache, origin, &common::no_bg()).unwrap();
    // Prelude: writes not yet flushed (a new block, an overwrite of a dirty
    // block in place and of a clean one, superseding its slot), so the
    // operation has records to commit and a release to make durable.
    write_blocks(&engine, &mut model, 50..51);
    write_blocks(&engine, &mut model, 5..6);
    write_blocks(&engine, &mut model, 1..2);
    switch.arm_after_events(n);
    let r = match op {
        Op::SetModeToWritethrough => engine.set_mode(Mode::Writethrough),
        Op::SetModeToWriteback => engine.set_mode(Mode::Writeback),
        Op::SetWriteback => engine.set_writeback(NEW_WB),
        Op::Flush => engine.write_back_all(&mut |_, _| {}),
        Op::Detach => engine.detach(),
        Op::Close => engine.close(),
        Op::CreateBlank | Op::CreateOverOld | Op::OpenClean | Op::Recover => unreachable!(),
    };
    let tripped = switch.is_tripped();
    engine.abandon();
    (r, tripped, log.events(), model)
}

/// Checks one crash image pair; returns a description of a violation.
fn verify(
    op: Op,
    before: &Before,
    model: &SectorModel,
    completed: bool,
    cache_img: Vec<u8>,
    origin_img: Vec<u8>,
) -> Result<(), String> {
    let (_, cache) = common::restart_dev("cache", cache_img, 1);
    let (_, origin) = common::restart_dev("origin", origin_img, 2);
    let report = check(&cache, Some(ORIGIN_BYTES));
    let opened = Engine::open(cache.clone(), origin.clone(), &common::no_bg());
    let engine = match opened {
        Ok(e) => e,
        Err(EngineError::NotACache { .. }) => {
            // No cache: allowed while creating (the old superblocks are gone
            // and the new ones not yet written) and after detach's wipe.
            let allowed = op.is_create() && !completed || op == Op::Detach;
            if !allowed {
                return Err("the cache is gone".into());
            }
            if op == Op::Detach {
                // Detached: the origin alone holds every write.
                let mut all = vec![0u8; ORIGIN_BYTES as usize];
                origin.read_at(&mut all, 0).unwrap();
                return model
                    .verify(&all)
                    .map_err(|e| format!("origin after detach: {e}"));
            }
            return Ok(());
        }
        Err(e) => return Err(format!("open refused: {e}")),
    };
    if !report.ok {
        return Err(format!("check fails: {:?}", report.findings));
    }
    let st = engine.status();
    let volume = common::read_volume(&engine)?;
    if op.is_create() {
        if st.mode == NEW_CACHE_MODE {
            if st.cache_blocks_used != 0 {
                return Err("a new cache that is not empty".into());
            }
            if op == Op::CreateOverOld {
                // The old cache's dirty data is gone (that is what --force
                // means); the volume is the origin.
                let mut o = vec![0u8; ORIGIN_BYTES as usize];
                origin.read_at(&mut o, 0).unwrap();
                return (o == volume)
                    .then_some(())
                    .ok_or_else(|| "new cache: volume differs from origin".into());
            }
        } else if completed {
            return Err(format!(
                "create succeeded but the old cache ({}) opens",
                st.mode
            ));
        } else if op == Op::CreateBlank {
            return Err("a cache appeared that was never created".into());
        }
        // Otherwise the old cache, intact: verified below.
    } else {
        let new_mode = match op {
            Op::SetModeToWritethrough => Mode::Writethrough,
            Op::SetModeToWriteback => Mode::Writeback,
            _ => op.old_mode(),
        };
        if st.mode != op.old_mode() && st.mode != new_mode {
            return Err(format!("mode {} is neither old nor new", st.mode));
        }
        if completed && st.mode != new_mode {
            return Err(format!("{op:?} succeeded but the mode is {}", st.mode));
        }
        if st.mode == new_mode && !new_mode.holds_dirty() && st.cache_blocks_dirty != 0 {
            return Err(format!(
                "mode {} with {} dirty blocks",
                st.mode, st.cache_blocks_dirty
            ));
        }
        // The prelude added at most two dirty blocks (50 and 1; 5 was dirty).
        if st.cache_blocks_dirty > before.dirty_blocks + 2 {
            return Err(format!(
                "{} dirty blocks, more than before",
                st.cache_blocks_dirty
            ));
        }
        if completed && matches!(op, Op::Flush | Op::Detach) && st.cache_blocks_dirty != 0 {
            return Err("writeback succeeded but dirty blocks remain".into());
        }
        if st.writeback != OLD_WB && st.writeback != NEW_WB {
            return Err(format!("writeback settings {:?}", st.writeback));
        }
        if completed && op == Op::SetWriteback && st.writeback != NEW_WB {
            return Err("set-writeback succeeded but the old settings came back".into());
        }
        if completed && op == Op::Detach {
            return Err("detach succeeded but a cache opens".into());
        }
        if completed && op == Op::Close && report.clean_shutdown != Some(true) {
            return Err("close succeeded but the cache is not marked clean".into());
        }
    }
    model.verify(&volume).map_err(|e| format!("volume: {e}"))?;
    common::detach_and_compare(&engine, &*origin, &volume)
}

/// All N for one operation; returns (events the operation needs, images).
fn crash_every_event(op: Op, random_variants: u64) -> (u64, u64) {
    let before = before(op);
    let mut images = 0;
    for n in 1..=MAX_EVENTS {
        let (result, cut, events, mut model) = run_cut(op, &before, n);
        let ctx = format!("{op:?}, crash at event {n}");
        assert_eq!(
            result.is_err(),
            cut,
            "{ctx}: the operation returned {result:?} but the crash switch {} tripped",
            if cut { "had" } else { "had not" }
        );
        let completed = !cut;
        if completed && op.commits() {
            model.flush_done();
        }
        let mut replay = Replay::new(vec![before.cache.clone(), before.origin.clone()]);
        events.iter().for_each(|e| replay.apply(e));
        let mut survivals = vec![
            (Survival::AllSurvive, Survival::AllSurvive),
            (Survival::NoneSurvive, Survival::NoneSurvive),
        ];
        survivals.extend(
            (0..random_variants).map(|k| (Survival::Random(n * 100 + k), Survival::Random(k))),
        );
        for (sc, so) in survivals {
            let r = verify(
                op,
                &before,
                &model,
                completed,
                replay.image(0, sc),
                replay.image(1, so),
            );
            if let Err(e) = r {
                panic!("{ctx} (cache {sc:?}, origin {so:?}; operation returned {result:?}): {e}");
            }
            images += 1;
        }
        if completed {
            return (n - 1, images);
        }
    }
    panic!("{op:?} did not complete within {MAX_EVENTS} device events");
}

#[test]
fn crash_at_every_event_of_each_management_operation() {
    let random_variants = common::scaled(6, 24);
    let mut total_points = 0;
    let mut total_images = 0;
    for op in Op::ALL {
        let (events, images) = crash_every_event(op, random_variants);
        eprintln!("mgmt-crash {op:?}: {events} device events, {events} crash points + completion, {images} crash images verified");
        total_points += events + 1;
        total_images += images;
    }
    eprintln!(
        "mgmt-crash: {} operations, {total_points} crash points, {total_images} crash images verified",
        Op::ALL.len()
    );
}
