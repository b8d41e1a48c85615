//! Reliability scenario 1: power loss at every flush point.
//!
//! A workload (writes, FUA writes, flushes, reads that promote, trims,
//! background writeback and eviction) runs on a cache whose two devices are
//! wrapped by one `EventLog`: every write, flush and discard of the cache
//! device and the origin lands in a single ordered log, with markers for
//! what the workload sent and what was acknowledged. Afterwards, for every
//! device flush in the log, the log prefix just before and just after it is
//! replayed onto the initial images; the writes of each device's unflushed
//! epoch are kept, dropped, or (seeded) kept in random subsets, torn at
//! 512-byte sectors and reordered. Each image pair is checked (`check` must
//! pass), recovered (`Engine::open`) and verified sector by sector: every
//! write made durable by a completed flush or FUA is there, and no sector
//! holds data that was never written to it.
//!
//! With several origins (one cache, a volume per origin), each origin is a
//! device of the log, the workload's operations fall on every volume, and
//! the model numbers the volumes' sectors one after the other (volume `v`'s
//! sector `s` is model sector `v * SECTORS + s`, stamped so), so data that
//! lands on another volume is caught too.
//!
//! Short form by default; `TIERCACHE_LONG=1` runs more workloads and more
//! random outcomes per crash point. A failure names the workload seed
//! (rerun one with TIERCACHE_SEED=N).

mod common;
#[path = "common/sim.rs"]
mod sim;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sim::Sim;
use tiercache::device::fault::FaultDevice;
use tiercache::device::recorder::{Event, EventLog, Replay, Survival};
use tiercache::device::DeviceRef;
use tiercache::engine::recovery::check;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, Placement};

use common::SectorModel;

const ORIGIN_BYTES: u64 = 1 << 20;
const SECTORS: u64 = ORIGIN_BYTES / 512;
/// Device indices in the log (creation order): the cache, then origin `v`
/// at `ORIGIN + v`.
const CACHE: usize = 0;
const ORIGIN: usize = 1;

/// What the workload did, in log-marker order.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write { first: u64, n: u64, version: u64 },
    FuaDone { version: u64 },
    FlushDone,
    Trim { first: u64, n: u64 },
}

struct Recorded {
    initial: Vec<Vec<u8>>,
    events: Vec<Event>,
    ops: Vec<Op>,
}

#[derive(Clone, Copy, Debug)]
struct Workload {
    seed: u64,
    mode: Mode,
    block_bytes: u32,
    /// The engine's own background thread on the real clock (it needs
    /// real threads: writeback and commits racing the workload; timing
    /// decides the interleaving) instead of the background's work as steps
    /// a seeded scheduler picks on a simulated clock (tests/common/sim.rs:
    /// a seed replays bit for bit), its twin.
    background_thread: bool,
    /// Where new data goes on the cache device.
    placement: Placement,
    ops: usize,
    /// Origins (volumes) of the one cache.
    origins: usize,
    /// Volume `v > 0` gets `MIXED_MODES[v % 3]` after create (volume 0
    /// keeps `mode`): the volumes of one cache in different modes.
    mixed_modes: bool,
}

/// The modes of the volumes of a `mixed_modes` workload.
const MIXED_MODES: [Mode; 3] = [Mode::Writeback, Mode::Writethrough, Mode::Writearound];

/// Runs the workload on recording devices and returns the log.
fn record(w: &Workload) -> Recorded {
    let mut rng = ChaCha8Rng::seed_from_u64(w.seed);
    let mut sim = Sim::new(w.seed, format!("TIERCACHE_SEED={}", w.seed));
    let open_opts = if w.background_thread {
        OpenOptions::default()
    } else {
        sim.open_options()
    };
    let bs = w.block_bytes as u64;
    // A cache of 24 blocks over an origin of 256 (4 KiB) or 16 (64 KiB)
    // blocks: eviction and writeback never stop.
    let cache_bytes = common::cache_bytes_for(24, w.block_bytes);
    let (cache0, cache0_ref) = common::fault_dev("cache", cache_bytes, 0);
    let origins0: Vec<Arc<FaultDevice>> = (0..w.origins)
        .map(|v| {
            let image = common::stamped(v as u64 * SECTORS, SECTORS, 0);
            Arc::new(FaultDevice::from_image(&common::origin_name(v), image, 0))
        })
        .collect();
    let opts = CreateOptions {
        mode: w.mode,
        block_bytes: w.block_bytes,
        writeback: common::eager_writeback(),
        placement: w.placement,
        ..Default::default()
    };
    let named = (0..w.origins)
        .map(|v| (format!("vol{v}"), origins0[v].clone() as DeviceRef))
        .collect();
    let created = Engine::create_volumes(cache0_ref, named, &opts, &open_opts).unwrap();
    for v in (1..w.origins).filter(|_| w.mixed_modes) {
        created.set_volume_mode(v, MIXED_MODES[v % 3]).unwrap();
    }
    created.close().unwrap();
    let mut initial = vec![cache0.snapshot_current()];
    initial.extend(origins0.iter().map(|o| o.snapshot_current()));

    let log = EventLog::new();
    let cache = log.record(Arc::new(FaultDevice::from_image(
        "cache",
        initial[CACHE].clone(),
        0,
    )));
    assert_eq!(cache.index(), CACHE);
    let mut origins: Vec<DeviceRef> = Vec::new();
    for v in 0..w.origins {
        let image = initial[ORIGIN + v].clone();
        let o = log.record(Arc::new(FaultDevice::from_image(
            &common::origin_name(v),
            image,
            0,
        )));
        assert_eq!(o.index(), ORIGIN + v);
        origins.push(Arc::new(o));
    }
    let engine = Engine::open_volumes(Arc::new(cache), origins, &open_opts).unwrap();
    let bases: Vec<u64> = engine.volumes().iter().map(|v| v.1).collect();
    // The address of model sector `s` (volume s / SECTORS).
    let at = |s: u64| bases[(s / SECTORS) as usize] + (s % SECTORS) * 512;
    let volumes = w.origins as u64;
    let mut ops = Vec::new();
    let mark = |op: Op, ops: &mut Vec<Op>| {
        log.mark(ops.len() as u64);
        ops.push(op);
    };
    let mut next_version = 1u64;
    // Most writes go to a hot area of a few blocks, so dirty blocks are
    // overwritten in place and clean ones superseded.
    let hot_sectors = (6 * bs / 512).min(SECTORS);
    let max_sectors = 2 * bs / 512;
    for _ in 0..w.ops {
        let r = rng.gen_range(0..100u32);
        sim.client_time();
        // The volume this operation falls on (none drawn for one, so the
        // seeds of one origin replay as before volumes).
        let vol = if volumes > 1 {
            rng.gen_range(0..volumes) * SECTORS
        } else {
            0
        };
        if r < 60 {
            let n = rng.gen_range(1..=max_sectors);
            let span = if rng.gen_bool(0.6) {
                hot_sectors
            } else {
                SECTORS
            };
            let first = vol + rng.gen_range(0..=span.max(n) - n);
            let fua = rng.gen_bool(0.15);
            let v = next_version;
            next_version += 1;
            mark(
                Op::Write {
                    first,
                    n,
                    version: v,
                },
                &mut ops,
            );
            engine
                .write(at(first), &common::stamped(first, n, v), fua)
                .unwrap();
            if fua {
                mark(Op::FuaDone { version: v }, &mut ops);
            }
        } else if r < 72 {
            engine.flush().unwrap();
            mark(Op::FlushDone, &mut ops);
        } else if r < 82 {
            let n = rng.gen_range(1..=4 * bs / 512);
            let first = vol + rng.gen_range(0..=SECTORS - n);
            engine.read(at(first), n * 512).unwrap();
        } else if r < 85 {
            // Whole blocks or a part of one.
            let (first, n) = if rng.gen_bool(0.5) {
                let b = rng.gen_range(0..ORIGIN_BYTES / bs - 1);
                (vol + b * bs / 512, bs / 512 * rng.gen_range(1..=2))
            } else {
                let n = rng.gen_range(1..bs / 512);
                (vol + rng.gen_range(0..=SECTORS - n), n)
            };
            mark(Op::Trim { first, n }, &mut ops);
            engine.trim(at(first), n * 512, false).unwrap();
        } else if !w.background_thread {
            sim.background(&engine).unwrap();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
    engine.abandon();
    drop(engine);
    Recorded {
        initial,
        events: log.events(),
        ops,
    }
}

/// Per crash image, each device's survival: the cache's, then each
/// origin's.
fn survivals(
    replay: &Replay,
    devices: usize,
    seed: u64,
    random_variants: u64,
) -> Vec<Vec<Survival>> {
    let all = |s: Survival| vec![s; devices];
    if (0..devices).all(|d| replay.unflushed(d) == 0) {
        return vec![all(Survival::AllSurvive)];
    }
    let mut v = vec![all(Survival::NoneSurvive), all(Survival::AllSurvive)];
    for k in 0..random_variants {
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k << 1);
        // The first origin's as before volumes: s ^ 0xABCD.
        let each = (0..devices as u64).map(|d| match d {
            0 => Survival::Random(s),
            d => Survival::Random(s ^ (0xABCD * d)),
        });
        v.push(each.collect());
    }
    v
}

#[derive(Default)]
struct Counts {
    workloads: AtomicU64,
    flush_points: AtomicU64,
    images: AtomicU64,
    deep: AtomicU64,
}

/// Recovers one crash image set (the cache's, then each origin's) and
/// verifies it, writes everything back and detaches; `deep` also restarts
/// cleanly in between.
fn verify_image(mut images: Vec<Vec<u8>>, model: &SectorModel, deep: bool) -> Result<(), String> {
    let (_, cache) = common::restart_dev("cache", images.remove(0), 1);
    let origins: Vec<DeviceRef> = (images.into_iter().enumerate())
        .map(|(v, img)| common::restart_dev(&common::origin_name(v), img, 2 + v as u64).1)
        .collect();
    let report = check(&cache, Some(ORIGIN_BYTES));
    if !report.ok {
        return Err(format!(
            "check fails on the crash image: {:?}",
            report.findings
        ));
    }
    let engine = Engine::open_volumes(cache.clone(), origins.clone(), &common::no_bg())
        .map_err(|e| format!("recovery refused: {e}"))?;
    let used = engine.status().cache_blocks_used;
    if report.cache_blocks_used != used {
        return Err(format!(
            "check counted {} cached blocks, recovery {used}",
            report.cache_blocks_used
        ));
    }
    let first = common::read_volumes(&engine)?;
    model
        .verify(&first)
        .map_err(|e| format!("after recovery: {e}"))?;
    // What recovery shows must stay: write everything back (a clean copy
    // that disagrees with the origin shows up here), restart cleanly
    // (`deep` only), detach, and the origin must hold it.
    engine
        .write_back_all(&mut |_, _| {})
        .map_err(|e| format!("write_back_all: {e}"))?;
    let engine = if deep {
        engine.close().map_err(|e| format!("close: {e}"))?;
        drop(engine);
        let report = check(&cache, Some(ORIGIN_BYTES));
        if !report.ok || report.cache_blocks_dirty != 0 {
            return Err(format!(
                "check after flush and close: {:?}",
                report.findings
            ));
        }
        let engine = Engine::open_volumes(cache, origins.clone(), &common::no_bg())
            .map_err(|e| format!("reopen: {e}"))?;
        let second = common::read_volumes(&engine)?;
        if first != second {
            return Err("the volume changed across a clean restart".into());
        }
        engine
    } else {
        engine
    };
    engine.detach().map_err(|e| format!("detach: {e}"))?;
    let mut back = vec![0u8; origins.len() * ORIGIN_BYTES as usize];
    for (o, part) in origins.iter().zip(back.chunks_mut(ORIGIN_BYTES as usize)) {
        o.read_at(part, 0).unwrap();
    }
    // Trimmed sectors are unspecified: a trim drops a clean cached copy in
    // memory and discards the origin at once, so after a crash the copy
    // may come back over the discarded origin bytes.
    let differs = (0..back.len() / 512).find(|&s| {
        !model.trimmed(s as u64) && back[s * 512..(s + 1) * 512] != first[s * 512..(s + 1) * 512]
    });
    if let Some(s) = differs {
        let show = |d: &[u8]| {
            common::decode_sector(&d[s * 512..(s + 1) * 512])
                .map_or("unstamped".to_string(), |(sec, v)| {
                    format!("sector {sec} version {v}")
                })
        };
        return Err(format!(
            "the origin after detach differs from the recovered volume: sector {s} reads {} on the volume, {} on the origin",
            show(&first),
            show(&back)
        ));
    }
    Ok(())
}

/// Replays the log of one workload and verifies every crash image.
fn verify_workload(w: &Workload, random_variants: u64, counts: &Counts) {
    let rec = record(w);
    let flushes: Vec<usize> = rec
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Event::Flush { .. }))
        .map(|(i, _)| i)
        .collect();
    // Crash positions (events applied): just before and just after each flush.
    let positions: BTreeSet<usize> = flushes.iter().flat_map(|&i| [i, i + 1]).collect();
    let mut replay = Replay::new(rec.initial.clone());
    let mut model = SectorModel::new(SECTORS * w.origins as u64);
    let devices = 1 + w.origins;
    let mut images = 0u64;
    let mut deep = 0u64;
    for pos in 0..=rec.events.len() {
        if positions.contains(&pos) {
            let variants = survivals(&replay, devices, w.seed ^ pos as u64, random_variants);
            for (k, each) in variants.into_iter().enumerate() {
                // Every 16th image also goes through a clean restart.
                let is_deep = (pos + k) % 16 == 0;
                let set = (0..devices).map(|d| replay.image(d, each[d])).collect();
                let r = verify_image(set, &model, is_deep);
                if let Err(e) = r {
                    panic!(
                        "power loss: {w:?}: crash after {pos} of {} events (cache, origins: {each:?}): {e}\nrerun with TIERCACHE_SEED={}",
                        rec.events.len(),
                        w.seed
                    );
                }
                images += 1;
                deep += u64::from(is_deep);
            }
        }
        if let Some(e) = rec.events.get(pos) {
            replay.apply(e);
            if let Event::Mark(tag) = e {
                match rec.ops[*tag as usize] {
                    Op::Write { first, n, version } => {
                        assert_eq!(model.issue_write(first, n), version);
                    }
                    Op::FuaDone { version } => model.fua_done(version),
                    Op::FlushDone => model.flush_done(),
                    Op::Trim { first, n } => model.issue_trim(first, n),
                }
            }
        }
    }
    counts.workloads.fetch_add(1, Ordering::Relaxed);
    counts
        .flush_points
        .fetch_add(flushes.len() as u64, Ordering::Relaxed);
    counts.images.fetch_add(images, Ordering::Relaxed);
    counts.deep.fetch_add(deep, Ordering::Relaxed);
}

fn run(mode: Mode, salt: u64, workloads: u64, ops: usize) {
    run_with(mode, salt, workloads, ops, 1)
}

fn run_with(mode: Mode, salt: u64, workloads: u64, ops: usize, origins: usize) {
    run_volumes(mode, salt, workloads, ops, origins, false)
}

fn run_volumes(
    mode: Mode,
    salt: u64,
    workloads: u64,
    ops: usize,
    origins: usize,
    mixed_modes: bool,
) {
    let random_variants = common::scaled(3, 4);
    let counts = Counts::default();
    let seeds: Vec<u64> = match std::env::var("TIERCACHE_SEED") {
        Ok(s) => vec![s.parse().expect("TIERCACHE_SEED must be a number")],
        Err(_) => (0..workloads).map(|i| salt * 1_000_000 + i).collect(),
    };
    for seed in seeds {
        let w = Workload {
            seed,
            mode,
            block_bytes: if seed % 4 == 2 { 65536 } else { 4096 },
            background_thread: seed % 4 == 3,
            placement: if (seed / 4) % 2 == 1 {
                Placement::Log
            } else {
                Placement::InPlace
            },
            ops,
            origins,
            mixed_modes,
        };
        verify_workload(&w, random_variants, &counts);
    }
    eprintln!(
        "power-loss {mode}{}, {origins} origins: {} workloads, {} flush points, {} crash images recovered and verified (all written back and detached, {} also restarted cleanly)",
        if mixed_modes { " (and others)" } else { "" },
        counts.workloads.load(Ordering::Relaxed),
        counts.flush_points.load(Ordering::Relaxed),
        counts.images.load(Ordering::Relaxed),
        counts.deep.load(Ordering::Relaxed),
    );
}

#[test]
fn power_loss_at_every_flush_writeback() {
    run(
        Mode::Writeback,
        1,
        common::scaled(6, 40),
        common::scaled(150, 300) as usize,
    );
}

#[test]
fn power_loss_at_every_flush_writethrough() {
    run(
        Mode::Writethrough,
        2,
        common::scaled(4, 30),
        common::scaled(150, 300) as usize,
    );
}

#[test]
fn power_loss_at_every_flush_writeonly() {
    run(
        Mode::Writeonly,
        3,
        common::scaled(2, 15),
        common::scaled(150, 300) as usize,
    );
}

#[test]
fn power_loss_at_every_flush_writearound() {
    run(
        Mode::Writearound,
        4,
        common::scaled(2, 15),
        common::scaled(150, 300) as usize,
    );
}

/// One cache for two and three origins: every crash image of a workload
/// spread over the volumes recovers each volume's flushed writes, and
/// detach leaves each origin with its own volume.
#[test]
fn power_loss_at_every_flush_two_origins_writeback() {
    run_with(
        Mode::Writeback,
        11,
        common::scaled(4, 30),
        common::scaled(200, 400) as usize,
        2,
    );
}

/// Three volumes in writeback, writethrough and writearound.
#[test]
fn power_loss_at_every_flush_three_origins_in_three_modes() {
    run_volumes(
        Mode::Writeback,
        13,
        common::scaled(1, 15),
        common::scaled(200, 400) as usize,
        3,
        true,
    );
}

#[test]
fn power_loss_at_every_flush_three_origins() {
    run_with(
        Mode::Writeback,
        12,
        common::scaled(2, 15),
        common::scaled(200, 400) as usize,
        3,
    );
    run_with(
        Mode::Writethrough,
        13,
        common::scaled(1, 10),
        common::scaled(200, 400) as usize,
        3,
    );
}
