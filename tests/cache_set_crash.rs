//! Power loss and kill with a cache set of two members (device/set/), one
//! of them lost at a seeded step: nothing acknowledged is ever lost.
//!
//! Each case is a deterministic simulation (tests/common/sim.rs): one
//! thread, the background's work (writeback, commits, checkpoints, time
//! passing) as steps a seeded scheduler interleaves with a client's stamped
//! writes (some FUA), flushes and reads (checked against the last version
//! written while the machine is up). Both members and the origin are
//! `FaultDevice`s on one `CrashSwitch`. At a seeded step one member (0 or
//! 1, seeded) is told to fail every I/O after a seeded number of further
//! operations, so the loss lands anywhere, a commit included; the set must
//! hide it. The power fails (or the process is killed) at a seeded device
//! event, or a few events behind the loss (while the set records it in the
//! survivor's label), or after the workload.
//!
//! The restart takes the survivor's and the origin's crash images (power
//! loss: `power_loss_image`; kill: what the devices completed, and the
//! crash log as the dead process left it). The lost member is omitted,
//! given back as it was when it failed, or given back still failing every
//! I/O. `CacheSet::open` must then take the survivor without `--degraded`
//! exactly when its label names the lost member failed (a member still
//! failing is left out, as one that cannot be opened is); a refusal must
//! say why and name the member left out. After recovery the whole volume is checked against `SectorModel`
//! (power loss: every write made durable by a completed flush or FUA; kill:
//! every acknowledged write; never data not written to a sector), written
//! back, closed, reopened and detached, and checked again each time. The
//! volume must also agree with itself: read twice, across the clean
//! restart, and with the origin after detach. (The two copies of a
//! mirrored block may differ after a crash, a write cut between them; the
//! engine resyncs them after an unclean open, reading one copy until then.
//! `a_write_cut_between_the_two_copies_reads_back_one_version` is the
//! smallest case; it and the agreement checks failed before the resync.)
//!
//! With two origins (one set in front of both, a volume per origin, the
//! second in another mode) the requests fall on both volumes, numbered as
//! one model (volume `v`'s sector `s` is model sector `v * SECTORS + s`,
//! stamped so), and every check above covers every volume and, after
//! detach, every origin. A volume is drawn only when there are several, so
//! the seeds of one origin replay as before volumes.
//!
//! An operation counts as acknowledged only if it returned before the
//! switch tripped: a machine without power, or a killed process, sends no
//! reply (the set may complete a request on one member after the other
//! failed with the power).
//!
//! A failure prints its seed, the command that replays it bit for bit
//! (`a_seed_replays_bit_for_bit` proves the replay with `io_digest`) and
//! the last steps before the crash. `TIERCACHE_LONG=1` runs more cases.

mod common;
#[path = "common/sim.rs"]
mod sim;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::seq::SliceRandom;
use rand::Rng;
use sim::Sim;
use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::set::{CacheSet, MemberState, LABEL_BYTES};
use tiercache::device::{BlockDevice, DeviceRef, DeviceResult};
use tiercache::engine::format::Layout;
use tiercache::engine::origin::address::base;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, Placement};

use common::SectorModel;

const FILE: &str = "cache_set_crash";
const ORIGIN_BYTES: u64 = 1 << 20;
const SECTORS: u64 = ORIGIN_BYTES / 512;
/// Client requests and background steps per case.
const STEPS: usize = 300;
const SET_ID: u64 = 0x5e7_c4a5;
/// Blocks at the start of the volume that half the requests go to.
const HOT_BLOCKS: u64 = 6;
/// The modes of the volumes after the first of a cache of several origins.
const MIXED_MODES: [Mode; 3] = [Mode::Writethrough, Mode::Writeback, Mode::Writearound];

/// How the machine stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crash {
    /// Power loss: each device keeps its flushed writes and a seeded part
    /// of the others.
    PowerLoss,
    /// The process dies (kill -9): the devices keep every write they
    /// completed; the crash log keeps the records not yet journalled.
    Kill,
}

/// When the switch trips.
#[derive(Clone, Copy, Debug)]
enum CrashPoint {
    /// At the n-th device event (write, flush or discard, on any device).
    AtEvent(u64),
    /// n events after the lost member's first failed I/O: the set is then
    /// recording the loss in the survivor's label (a label write and a
    /// flush). At the end of the workload if the loss never came.
    BehindLoss(u64),
    /// After the workload.
    AtEnd,
}

/// How the lost member comes to the restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Back {
    /// Not given to `CacheSet::open`.
    Omitted,
    /// Given back readable, holding what it held when it failed.
    Stale,
    /// Given back, still failing every I/O.
    StillFailing,
}

/// Everything a seed decides before the workload.
#[derive(Clone, Copy, Debug)]
struct Case {
    seed: u64,
    crash: Crash,
    mode: Mode,
    block_bytes: u32,
    lost: usize,
    /// The client step at which the member starts to count down.
    loss_step: usize,
    /// Operations the member still completes after that.
    loss_after_ops: u64,
    crash_point: CrashPoint,
    back: Back,
    placement: Placement,
}

impl Case {
    fn draw(seed: u64, crash: Crash, sim: &mut Sim) -> Case {
        let r = sim.rng();
        let mode = match r.gen_range(0..10) {
            0..=4 => Mode::Writeback,
            5..=6 => Mode::Writeonly,
            7..=8 => Mode::Writethrough,
            _ => Mode::Writearound,
        };
        let crash_point = match r.gen_range(0..10) {
            0..=5 => CrashPoint::AtEvent(r.gen_range(1..=600)),
            6..=8 => CrashPoint::BehindLoss(r.gen_range(0..=6)),
            _ => CrashPoint::AtEnd,
        };
        Case {
            seed,
            crash,
            mode,
            block_bytes: [4096, 8192][r.gen_range(0..2)],
            lost: r.gen_range(0..2),
            // A step past the workload now and then: the member is lost
            // with the power only.
            loss_step: r.gen_range(0..STEPS + STEPS / 8),
            loss_after_ops: r.gen_range(0..40),
            crash_point,
            back: [Back::Omitted, Back::Stale, Back::StillFailing][r.gen_range(0..3)],
            placement: [Placement::InPlace, Placement::Log][r.gen_range(0..2)],
        }
    }

    fn survivor(&self) -> usize {
        1 - self.lost
    }
}

/// Notes the lost member's first failed I/O before the power fails, and
/// may cut the power a few device events behind it.
struct LossWatch {
    switch: CrashSwitch,
    seen: AtomicBool,
    crash_behind: Option<u64>,
}

/// A member as the set sees it: its `FaultDevice`, watched.
struct Watched {
    dev: Arc<FaultDevice>,
    watch: Option<Arc<LossWatch>>,
}

impl Watched {
    fn observe(&self, r: DeviceResult<()>) -> DeviceResult<()> {
        if let (Err(_), Some(w)) = (&r, &self.watch) {
            // A failure with the power on is the member's loss.
            if !w.switch.is_tripped() && !w.seen.swap(true, Ordering::AcqRel) {
                if let Some(n) = w.crash_behind {
                    w.switch.arm_after_events(n);
                }
            }
        }
        r
    }
}

impl BlockDevice for Watched {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.observe(self.dev.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        self.observe(self.dev.write_at(buf, offset))
    }
    fn flush(&self) -> DeviceResult<()> {
        self.observe(self.dev.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        self.observe(self.dev.discard(offset, len))
    }
    fn name(&self) -> &str {
        self.dev.name()
    }
    fn identity(&self) -> u64 {
        self.dev.identity()
    }
}

fn member_name(i: usize) -> String {
    format!("member{i}")
}

/// Bytes of each member: the set's metadata and about 40 blocks, half of
/// them mirrored. With the 256 or 128 blocks of the origin, eviction and
/// writeback never stop.
fn member_bytes(block_bytes: u32) -> u64 {
    LABEL_BYTES + common::cache_bytes_for(40, block_bytes)
}

/// The devices of one case, on one crash switch.
struct Machine {
    switch: CrashSwitch,
    members: Vec<Arc<FaultDevice>>,
    /// One origin per volume.
    origins: Vec<Arc<FaultDevice>>,
    watch: Arc<LossWatch>,
    log_path: PathBuf,
    /// The crash log's bytes at the instant the switch tripped (kill).
    saved_log: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Machine {
    /// The set's members and `origins` origins. Volume `v`'s origin is
    /// stamped as model sectors `v * SECTORS..`, so data on the wrong
    /// origin reads as another sector's.
    fn new(case: &Case, dir: &Path, origins: usize) -> Machine {
        let switch = CrashSwitch::new();
        let bytes = member_bytes(case.block_bytes);
        let members = (0..2)
            .map(|i| {
                let d = FaultDevice::new(&member_name(i), bytes, case.seed ^ (i as u64 + 1));
                Arc::new(d.with_crash_switch(switch.clone()))
            })
            .collect();
        let origins = common::stamped_origins(origins as u64, SECTORS, case.seed, &switch);
        let crash_behind = match case.crash_point {
            CrashPoint::BehindLoss(n) => Some(n),
            _ => None,
        };
        Machine {
            watch: Arc::new(LossWatch {
                switch: switch.clone(),
                seen: AtomicBool::new(false),
                crash_behind,
            }),
            origins,
            switch,
            members,
            log_path: dir.join("live.crashlog"),
            saved_log: Arc::default(),
        }
    }

    fn member_refs(&self, lost: usize) -> Vec<DeviceRef> {
        (0..2)
            .map(|i| {
                let watch = (i == lost).then(|| self.watch.clone());
                Arc::new(Watched {
                    dev: self.members[i].clone(),
                    watch,
                }) as DeviceRef
            })
            .collect()
    }

    /// Formats the set, creates the cache on it and opens it as the
    /// workload's engine (with the crash log for a kill).
    fn start(&self, case: &Case, sim: &Sim) -> Result<Arc<Engine>, String> {
        let bytes = vec![member_bytes(case.block_bytes); 2];
        let g = Layout::set_geometry(&bytes, case.block_bytes, 50)
            .map_err(|e| format!("geometry: {e}"))?;
        let set = CacheSet::format(self.member_refs(case.lost), g, SET_ID)
            .map_err(|e| format!("format: {e}"))?;
        // One thread: the loss is seen, and the crash armed, at the same
        // event in every replay.
        set.write_copies_in_turn();
        let set: DeviceRef = Arc::new(set);
        let origins: Vec<DeviceRef> = self
            .origins
            .iter()
            .map(|o| o.clone() as DeviceRef)
            .collect();
        let create = CreateOptions {
            mode: case.mode,
            block_bytes: case.block_bytes,
            writeback: common::eager_writeback(),
            placement: case.placement,
            ..Default::default()
        };
        let named = (origins.iter().enumerate())
            .map(|(v, o)| (format!("vol{v}"), o.clone()))
            .collect();
        let engine = Engine::create_volumes(set.clone(), named, &create, &sim.open_options())
            .map_err(|e| format!("create: {e}"))?;
        // The volumes after the first in modes of their own (by seed, no
        // draw): writeback beside writethrough or writearound.
        for v in 1..origins.len() {
            let mode = MIXED_MODES[(case.seed as usize + v) % MIXED_MODES.len()];
            engine
                .set_volume_mode(v, mode)
                .map_err(|e| format!("set volume {v}'s mode: {e}"))?;
        }
        if case.crash == Crash::PowerLoss {
            return Ok(engine);
        }
        engine
            .close()
            .map_err(|e| format!("close after create: {e}"))?;
        drop(engine);
        let opts = OpenOptions {
            crash_log: Some(self.log_path.clone()),
            ..sim.open_options()
        };
        let engine = Engine::open_volumes(set, origins, &opts)
            .map_err(|e| format!("open with the crash log: {e}"))?;
        // One thread: the trip happens inside one of its device calls, and
        // the log's file is what a process killed there leaves.
        let (saved, path) = (self.saved_log.clone(), self.log_path.clone());
        self.switch.on_trip(Box::new(move || {
            *saved.lock() = Some(std::fs::read(&path).expect("the crash log file"));
        }));
        Ok(engine)
    }
}

/// What the workload leaves for the restart.
struct Stopped {
    /// Crash images of member 0 and member 1.
    members: [Vec<u8>; 2],
    /// Crash images of the origins, by volume.
    origins: Vec<Vec<u8>>,
    log: Option<Vec<u8>>,
    model: SectorModel,
    /// The set had recorded the loss (lost member failed, survivor healthy)
    /// while the power was on: the survivor's label must say so.
    recorded: bool,
    /// The lost member failed an I/O before the crash.
    lost_before_crash: bool,
    /// `io_digest` of member 0, member 1 and each origin.
    digests: Vec<u64>,
}

/// The client's view while the machine is up: the version each sector
/// was last written with, `None` where a write failed (old or new). Its
/// sectors are the model's: volume `v`'s sector `s` is `v * SECTORS + s`.
struct Client {
    origins: u64,
    model: SectorModel,
    latest: Vec<Option<u64>>,
}

impl Client {
    fn new(origins: usize) -> Client {
        let sectors = SECTORS * origins as u64;
        Client {
            origins: origins as u64,
            model: SectorModel::new(sectors),
            latest: vec![Some(0); sectors as usize],
        }
    }

    /// A request's span: (model sector, sectors, engine address). With
    /// several origins, a volume first (none drawn for one, so the seeds of
    /// one origin replay as before volumes).
    fn pick(&self, sim: &mut Sim, block_bytes: u64) -> (u64, u64, u64) {
        let vol = if self.origins > 1 {
            sim.rng().gen_range(0..self.origins)
        } else {
            0
        };
        let n = sim.rng().gen_range(1..=2 * block_bytes / 512);
        // Half the requests go to a hot area of a few blocks (of each
        // volume), so dirty blocks are overwritten in place and clean ones
        // superseded.
        let span = if sim.rng().gen_bool(0.5) {
            HOT_BLOCKS * block_bytes / 512
        } else {
            SECTORS
        };
        let first = sim.rng().gen_range(0..=span - n);
        (vol * SECTORS + first, n, base(vol as usize) + first * 512)
    }

    /// A stamped write of `span` (from `pick`); acknowledged if it returned
    /// with the power on.
    fn write(
        &mut self,
        sim: &mut Sim,
        engine: &Engine,
        m: &Machine,
        (first, n, at): (u64, u64, u64),
        fua: bool,
        crash: Crash,
    ) -> Result<(), tiercache::engine::EngineError> {
        let v = self.model.issue_write(first, n);
        let res = engine.write(at, &common::stamped(first, n, v), fua);
        let acked = res.is_ok() && !m.switch.is_tripped();
        let outcome = if acked {
            "acknowledged"
        } else {
            "not acknowledged"
        };
        sim.note_write(v, first, n, fua, outcome);
        let latest = res.is_ok().then_some(v);
        self.latest[first as usize..(first + n) as usize].fill(latest);
        if acked && (fua || crash == Crash::Kill) {
            self.model.fua_done(v);
        }
        res.map(|_| ())
    }

    /// A read while the machine is up sees the last write of each sector.
    fn check_read(&self, first: u64, data: &[u8]) -> Result<(), String> {
        for (k, got) in data.chunks(512).enumerate() {
            let s = first + k as u64;
            match self.latest[s as usize] {
                Some(v) if common::decode_sector(got) != Some((s, v)) => {
                    let seen = common::decode_sector(got)
                        .map_or("unstamped data".into(), |(sec, v)| format!("({sec}, v{v})"));
                    return Err(format!("read of sector {s} returned {seen}, wrote v{v}"));
                }
                Some(_) => {}
                None => self.model.check_sector(s, got)?,
            }
        }
        Ok(())
    }
}

/// One client request or background step; `Err` is a broken rule seen
/// while the machine was up.
fn step(
    sim: &mut Sim,
    engine: &Engine,
    m: &Machine,
    client: &mut Client,
    case: &Case,
) -> Result<(), String> {
    let r: u32 = sim.rng().gen_range(0..100);
    let up = |m: &Machine| !m.switch.is_tripped();
    if r < 20 {
        let res = sim.background(engine);
        return match res {
            Err(e) if up(m) => Err(format!("background step failed with the power on: {e}")),
            _ => Ok(()),
        };
    }
    sim.client_time();
    let (first, n, at) = client.pick(sim, case.block_bytes as u64);
    let res = if r < 65 {
        client.write(sim, engine, m, (first, n, at), r < 28, case.crash)
    } else if r < 87 {
        let res = engine.read(at, n * 512);
        sim.note(format!("read sectors {first}+{n}: ok {}", res.is_ok()));
        if let (Ok(data), true) = (&res, up(m)) {
            client.check_read(first, data)?;
        }
        res.map(|_| ())
    } else {
        let res = engine.flush();
        sim.note(format!("flush: ok {}", res.is_ok() && up(m)));
        if res.is_ok() && up(m) {
            client.model.flush_done();
        }
        res
    };
    match res {
        Err(e) if up(m) => Err(format!(
            "a request failed with the power on (the set must hide the loss of member {}): {e}",
            case.lost
        )),
        _ => Ok(()),
    }
}

/// Runs the workload on a cache of `origins` volumes until the crash;
/// `Err` is a rule broken before it.
fn run_workload(sim: &mut Sim, case: &Case, dir: &Path, origins: usize) -> Result<Stopped, String> {
    let m = Machine::new(case, dir, origins);
    let engine = m.start(case, sim)?;
    if let CrashPoint::AtEvent(n) = case.crash_point {
        m.switch.arm_after_events(n);
    }
    let mut client = Client::new(origins);
    let mut recorded = false;
    for i in 0..STEPS {
        if i == case.loss_step {
            sim.note(format!(
                "member {} fails after {} more operations",
                case.lost, case.loss_after_ops
            ));
            m.members[case.lost].fail_after_ops(case.loss_after_ops);
        }
        if m.switch.is_tripped() {
            break;
        }
        step(sim, &engine, &m, &mut client, case)?;
        if !m.switch.is_tripped() {
            let set = (engine.cache_device().members().expect("a set").as_any())
                .downcast_ref::<CacheSet>()
                .expect("a cache set");
            let states = set.members();
            recorded |= states[case.lost].state == MemberState::Failed
                && states[case.survivor()].state == MemberState::Healthy;
        }
    }
    sim.note(format!(
        "crash ({:?}); the loss was {}",
        case.crash,
        if recorded { "recorded" } else { "not recorded" }
    ));
    m.switch.trip();
    engine.abandon();
    drop(engine);
    let image = |d: &FaultDevice| match case.crash {
        Crash::PowerLoss => d.power_loss_image(),
        Crash::Kill => d.snapshot_current(),
    };
    let log = m.saved_log.lock().take();
    let devices = || m.members.iter().chain(&m.origins);
    Ok(Stopped {
        members: [image(&m.members[0]), image(&m.members[1])],
        origins: m.origins.iter().map(|o| image(o)).collect(),
        log,
        model: client.model,
        recorded,
        lost_before_crash: m.watch.seen.load(Ordering::Acquire),
        digests: devices().map(|d| d.io_digest()).collect(),
    })
}

/// The restarted machine's devices.
struct Restarted {
    members: Vec<DeviceRef>,
    origins: Vec<DeviceRef>,
}

fn restart(case: &Case, s: &Stopped) -> Restarted {
    let members = (0..2)
        .map(|i| {
            let (d, r) = common::restart_dev(&member_name(i), s.members[i].clone(), case.seed + 1);
            if i == case.lost && case.back == Back::StillFailing {
                d.fail_after_ops(0);
            }
            r
        })
        .collect();
    let origins = (s.origins.iter().enumerate())
        .map(|(v, img)| {
            common::restart_dev(
                &common::origin_name(v),
                img.clone(),
                case.seed + 2 + v as u64,
            )
            .1
        })
        .collect();
    Restarted { members, origins }
}

/// Whether the survivor's label names the lost member failed.
fn names_lost_failed(case: &Case, survivor: &DeviceRef, sim: &mut Sim) -> Result<bool, String> {
    let label = CacheSet::read_label(survivor)
        .map_err(|e| format!("reading the survivor's label: {e}"))?
        .map_err(|e| format!("the survivor has no valid label: {e}"))?;
    let named = label.stale_mask & (1 << case.lost) != 0;
    sim.note(format!(
        "restart: the survivor's label (generation {}) {} member {}",
        label.generation,
        if named {
            "names failed"
        } else {
            "does not name"
        },
        case.lost
    ));
    Ok(named)
}

/// A set opened at the restart.
struct Opened {
    set: CacheSet,
    /// The members it was opened with.
    devs: Vec<DeviceRef>,
    /// How it came to open, for the summary.
    how: &'static str,
}

/// Opens the set as an operator would: the members at hand, then, if
/// refused, without an unreadable one, then with `--degraded`. Checks each
/// answer against what the survivor's label says.
fn open_set(case: &Case, r: &Restarted, sim: &mut Sim) -> Result<Opened, String> {
    let survivor = r.members[case.survivor()].clone();
    let named_failed = names_lost_failed(case, &survivor, sim)?;
    let mut devs = r.members.clone();
    devs.shuffle(sim.rng());
    let mut how = "survivor alone";
    if case.back != Back::Omitted {
        match CacheSet::open(devs.clone(), false) {
            Ok(set) => {
                let how = if named_failed {
                    "both given, the lost one named stale"
                } else {
                    "both given, both current"
                };
                return Ok(Opened { set, devs, how });
            }
            Err(e) if case.back == Back::StillFailing => {
                let e = e.to_string();
                sim.note(format!("open with the failing member refused: {e}"));
                if !e.contains(&member_name(case.lost)) {
                    return Err(format!("the refusal does not name the failing member: {e}"));
                }
                how = "the failing member refused, survivor alone";
            }
            Err(e) => return Err(format!("open with both members refused: {e}")),
        }
    }
    let alone = vec![survivor];
    match CacheSet::open(alone.clone(), false) {
        Ok(_) if !named_failed => Err(format!(
            "opened without member {} although no label names it failed (it may hold the only current copies)",
            case.lost
        )),
        Ok(set) => Ok(Opened {
            set,
            devs: alone,
            how,
        }),
        Err(e) if named_failed => Err(format!(
            "refused without member {} although the survivor's label names it failed: {e}",
            case.lost
        )),
        Err(e) => {
            let e = e.to_string();
            if !(e.contains("missing") && e.contains("--degraded")) {
                return Err(format!("the refusal does not say why: {e}"));
            }
            sim.note("refused without --degraded, as it must be; opening degraded");
            let set = CacheSet::open(alone.clone(), true)
                .map_err(|e| format!("open with --degraded refused: {e}"))?;
            Ok(Opened {
                set,
                devs: alone,
                how: "survivor alone, --degraded needed",
            })
        }
    }
}

/// Every volume, one after the other, checked against the model.
fn read_volumes(engine: &Engine, model: &SectorModel, when: &str) -> Result<Vec<u8>, String> {
    let all = common::read_volumes(engine)?;
    model.verify(&all).map_err(|e| format!("{when}: {e}"))?;
    Ok(all)
}

/// Reads every volume again, each block twice in a row: the set serves a
/// mirrored block from its two copies in turn, so both copies are read,
/// and each must hold what the first read (`first`, the volumes one after
/// the other) showed.
fn read_again(engine: &Engine, first: &[u8], bs: u64) -> Result<(), String> {
    let blocks = (engine.volumes().into_iter().enumerate())
        .flat_map(|(v, (_, at, bytes))| (0..bytes / bs).map(move |b| (v as u64, at + b * bs)));
    for (k, (v, at)) in blocks.enumerate() {
        let want = &first[k * bs as usize..(k + 1) * bs as usize];
        for pass in 0..2 {
            let got = engine
                .read(at, bs)
                .map_err(|e| format!("reading volume {v}'s block at {at:#x} again: {e}"))?;
            let Some(i) = (0..(bs / 512) as usize)
                .find(|&i| got[i * 512..(i + 1) * 512] != want[i * 512..(i + 1) * 512])
            else {
                continue;
            };
            let show = |d: &[u8]| {
                common::decode_sector(&d[i * 512..(i + 1) * 512])
                    .map_or("unstamped data".into(), |(sec, v)| format!("({sec}, v{v})"))
            };
            return Err(format!(
                "sector {} read {} and then {} (read {} of its block since): the two copies differ",
                k as u64 * bs / 512 + i as u64,
                show(want),
                show(&got),
                pass + 1
            ));
        }
    }
    Ok(())
}

/// Restarts from the crash images and checks everything; `Err` says what
/// was wrong. The volume must agree with itself (read twice, across a
/// clean restart, and with the origin after detach).
fn recover(
    case: &Case,
    s: &Stopped,
    sim: &mut Sim,
    dir: &Path,
) -> Result<(Vec<u8>, &'static str), String> {
    let r = restart(case, s);
    let Opened { set, devs, how } = open_set(case, &r, sim)?;
    if s.recorded && set.members()[case.lost].state != MemberState::Failed {
        return Err(format!(
            "the set had recorded member {}'s loss before the crash, yet it is not failed after the restart",
            case.lost
        ));
    }
    let log = s.log.as_ref().map(|bytes| {
        let path = dir.join("replay.crashlog");
        std::fs::write(&path, bytes).unwrap();
        path
    });
    let opts = OpenOptions {
        crash_log: log,
        ..sim.open_options()
    };
    let engine = Engine::open_volumes(Arc::new(set), r.origins.clone(), &opts)
        .map_err(|e| format!("recovery refused: {e}"))?;
    let first = read_volumes(&engine, &s.model, "after recovery")?;
    read_again(&engine, &first, case.block_bytes as u64)?;
    // What recovery shows must stay: write back, restart (the labels now
    // name every member not present failed: no --degraded), detach.
    engine
        .write_back_all(&mut |_, _| {})
        .map_err(|e| format!("write_back_all: {e}"))?;
    engine.close().map_err(|e| format!("close: {e}"))?;
    drop(engine);
    let set = CacheSet::open(devs, false).map_err(|e| format!("reopen after close: {e}"))?;
    let engine = Engine::open_volumes(Arc::new(set), r.origins.clone(), &sim.open_options())
        .map_err(|e| format!("reopen after close: {e}"))?;
    let second = read_volumes(&engine, &s.model, "after a clean restart")?;
    if first != second {
        return Err("the volume changed across a clean restart".into());
    }
    engine.detach().map_err(|e| format!("detach: {e}"))?;
    let mut back = vec![0u8; r.origins.len() * ORIGIN_BYTES as usize];
    for (o, part) in r.origins.iter().zip(back.chunks_mut(ORIGIN_BYTES as usize)) {
        o.read_at(part, 0).unwrap();
    }
    s.model
        .verify(&back)
        .map_err(|e| format!("the origins after detach: {e}"))?;
    if back != first {
        return Err("the origins after detach differ from the recovered volumes".into());
    }
    Ok((first, how))
}

/// What a case leaves to compare between two runs of one seed.
struct Outcome {
    how: &'static str,
    trace: String,
    digests: Vec<u64>,
    /// Every volume, one after the other.
    volume: Vec<u8>,
    lost_before_crash: bool,
    recorded: bool,
}

/// Runs one case on a cache of `origins` volumes; panics with the seed,
/// the replay command and the last steps if a rule is broken.
fn run_case(seed: u64, crash: Crash, test: &str, origins: usize) -> Outcome {
    let mut sim = Sim::new(seed, sim::replay_command(FILE, test, seed));
    let case = Case::draw(seed, crash, &mut sim);
    sim.note(format!("{case:?}"));
    if origins > 1 {
        let modes = (1..origins).map(|v| MIXED_MODES[(seed as usize + v) % MIXED_MODES.len()]);
        let modes: Vec<Mode> = modes.collect();
        sim.note(format!(
            "{origins} origins, the volumes after the first in {modes:?}"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let stopped = match run_workload(&mut sim, &case, dir.path(), origins) {
        Ok(s) => s,
        Err(e) => panic!("{}before the crash: {e}", sim.report(40)),
    };
    match recover(&case, &stopped, &mut sim, dir.path()) {
        Ok((volume, how)) => Outcome {
            how,
            trace: sim.report(usize::MAX),
            digests: stopped.digests,
            volume,
            lost_before_crash: stopped.lost_before_crash,
            recorded: stopped.recorded,
        },
        Err(e) => panic!("{}after the restart: {e}", sim.report(40)),
    }
}

/// `cases` seeds from `salt * 1_000_000` (the one of TIERCACHE_SEED if
/// set), each crashed as `crash(seed)` says, on a cache of `origins`
/// volumes.
fn run(crash: fn(u64) -> Crash, cases: u64, salt: u64, test: &str, origins: usize) {
    let seeds: Vec<u64> = match std::env::var("TIERCACHE_SEED") {
        Ok(s) => vec![s.parse().expect("TIERCACHE_SEED must be a number")],
        Err(_) => (0..cases).map(|i| salt * 1_000_000 + i).collect(),
    };
    let (mut lost, mut recorded) = (0, 0);
    let mut opened = std::collections::BTreeMap::new();
    for &seed in &seeds {
        let o = run_case(seed, crash(seed), test, origins);
        lost += u64::from(o.lost_before_crash);
        recorded += u64::from(o.recorded);
        *opened.entry(o.how).or_insert(0u64) += 1;
    }
    eprintln!(
        "{test}: {} cases (seeds from {}): a member lost before the crash in {lost}, \
         the loss recorded with the power on in {recorded}; restarts: {opened:?}",
        seeds.len(),
        seeds[0]
    );
}

#[test]
fn power_loss_with_a_member_lost() {
    let test = "power_loss_with_a_member_lost";
    run(|_| Crash::PowerLoss, common::scaled(250, 5000), 1, test, 1);
}

#[test]
fn kill_with_a_member_lost() {
    let test = "kill_with_a_member_lost";
    run(|_| Crash::Kill, common::scaled(120, 2500), 2, test, 1);
}

/// One set in front of two origins (the second volume in another mode):
/// every volume recovers, power loss (even seeds) or kill (odd).
#[test]
fn crash_with_a_member_lost_two_origins() {
    let test = "crash_with_a_member_lost_two_origins";
    let crash = |seed: u64| {
        if seed.is_multiple_of(2) {
            Crash::PowerLoss
        } else {
            Crash::Kill
        }
    };
    run(crash, common::scaled(100, 2500), 3, test, 2);
}

/// A seed replays bit for bit: the same steps, the same device events,
/// the same volumes after recovery (one origin, then two).
#[test]
fn a_seed_replays_bit_for_bit() {
    let test = "a_seed_replays_bit_for_bit";
    for (seed, crash, origins) in [
        (7_000_001u64, Crash::PowerLoss, 1),
        (7_000_002, Crash::PowerLoss, 1),
        (7_000_003, Crash::Kill, 1),
        (7_000_004, Crash::Kill, 1),
        (7_000_005, Crash::PowerLoss, 2),
        (7_000_006, Crash::Kill, 2),
    ] {
        let a = run_case(seed, crash, test, origins);
        let b = run_case(seed, crash, test, origins);
        let rerun = sim::replay_command(FILE, test, seed);
        assert_eq!(a.trace, b.trace, "seed {seed}: the steps differ ({rerun})");
        assert_eq!(
            a.digests, b.digests,
            "seed {seed}: the device events differ ({rerun})"
        );
        assert!(
            a.volume == b.volume,
            "seed {seed}: the volumes differ ({rerun})"
        );
    }
}

/// The two copies of a mirrored block must not differ after a crash: the
/// set reads them in turn, so a block whose copies differ reads old data,
/// then new, then old, with no write in between, and writeback copies
/// whichever it happens to read.
///
/// The smallest case: a dirty block (FUA, on both members) is overwritten
/// in place, and the process dies between the write to member 0 and the
/// one to member 1. Either version is allowed (the write was never
/// acknowledged); both in turn are not. (Failed before the engine resynced
/// the copies after an unclean open.)
#[test]
fn a_write_cut_between_the_two_copies_reads_back_one_version() {
    let switch = CrashSwitch::new();
    let bytes = member_bytes(4096);
    let members: Vec<Arc<FaultDevice>> = (0..2)
        .map(|i| {
            let d = FaultDevice::new(&member_name(i), bytes, i as u64);
            Arc::new(d.with_crash_switch(switch.clone()))
        })
        .collect();
    let origin = Arc::new(
        FaultDevice::from_image("origin", common::initial_origin(ORIGIN_BYTES), 9)
            .with_crash_switch(switch.clone()),
    );
    let refs: Vec<DeviceRef> = members.iter().map(|m| m.clone() as DeviceRef).collect();
    let g = Layout::set_geometry(&[bytes; 2], 4096, 50).unwrap();
    let set: DeviceRef = Arc::new(CacheSet::format(refs, g, SET_ID).unwrap());
    let engine = Engine::create_with(
        set,
        origin.clone(),
        &CreateOptions::default(),
        &common::no_bg(),
    )
    .unwrap();
    engine.write(0, &common::stamped(0, 8, 1), true).unwrap();
    // The in-place overwrite is one write per member: member 0's goes
    // through, member 1's meets the kill.
    switch.arm_after_writes(2);
    let _ = engine.write(0, &common::stamped(0, 8, 2), false);
    assert!(switch.is_tripped());
    engine.abandon();
    drop(engine);
    let restarted: Vec<DeviceRef> = (0..2)
        .map(|i| common::restart_dev(&member_name(i), members[i].snapshot_current(), 1).1)
        .collect();
    let (_, origin) = common::restart_dev("origin", origin.snapshot_current(), 2);
    let set = CacheSet::open(restarted, false).expect("both members, labels untouched");
    let engine = Engine::open(Arc::new(set), origin, &common::no_bg()).unwrap();
    let reads: Vec<u64> = (0..4)
        .map(|_| {
            let data = engine.read(0, 4096).unwrap();
            common::decode_sector(&data[..512]).expect("stamped").1
        })
        .collect();
    assert!(
        reads.windows(2).all(|w| w[0] == w[1]),
        "block 0 read versions {reads:?} in turn with no write in between"
    );
}
