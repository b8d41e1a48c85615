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
use tiercache::engine::recovery::check;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, Placement};

use common::SectorModel;

const ORIGIN_BYTES: u64 = 1 << 20;
const SECTORS: u64 = ORIGIN_BYTES / 512;
/// Device indices in the log (creation order).
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
}

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
    let origin0 = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(ORIGIN_BYTES),
        0,
    ));
    let opts = CreateOptions {
        mode: w.mode,
        block_bytes: w.block_bytes,
        writeback: common::eager_writeback(),
        placement: w.placement,
        ..Default::default()
    };
    Engine::create_with(cache0_ref, origin0.clone(), &opts, &open_opts)
        .unwrap()
        .close()
        .unwrap();
    let initial = vec![cache0.snapshot_current(), origin0.snapshot_current()];

    let log = EventLog::new();
    let cache = log.record(Arc::new(FaultDevice::from_image(
        "cache",
        initial[CACHE].clone(),
        0,
    )));
    let origin = log.record(Arc::new(FaultDevice::from_image(
        "origin",
        initial[ORIGIN].clone(),
        0,
    )));
    assert_eq!((cache.index(), origin.index()), (CACHE, ORIGIN));
    let engine = Engine::open(Arc::new(cache), Arc::new(origin), &open_opts).unwrap();
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
        if r < 60 {
            let n = rng.gen_range(1..=max_sectors);
            let span = if rng.gen_bool(0.6) {
                hot_sectors
            } else {
                SECTORS
            };
            let first = rng.gen_range(0..=span.max(n) - n);
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
                .write(first * 512, &common::stamped(first, n, v), fua)
                .unwrap();
            if fua {
                mark(Op::FuaDone { version: v }, &mut ops);
            }
        } else if r < 72 {
            engine.flush().unwrap();
            mark(Op::FlushDone, &mut ops);
        } else if r < 82 {
            let n = rng.gen_range(1..=4 * bs / 512);
            let first = rng.gen_range(0..=SECTORS - n);
            engine.read(first * 512, n * 512).unwrap();
        } else if r < 85 {
            // Whole blocks or a part of one.
            let (first, n) = if rng.gen_bool(0.5) {
                let b = rng.gen_range(0..ORIGIN_BYTES / bs - 1);
                (b * bs / 512, bs / 512 * rng.gen_range(1..=2))
            } else {
                let n = rng.gen_range(1..bs / 512);
                (rng.gen_range(0..=SECTORS - n), n)
            };
            mark(Op::Trim { first, n }, &mut ops);
            engine.trim(first * 512, n * 512, false).unwrap();
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

/// Per crash image: (cache survival, origin survival).
fn survivals(replay: &Replay, seed: u64, random_variants: u64) -> Vec<(Survival, Survival)> {
    if replay.unflushed(CACHE) == 0 && replay.unflushed(ORIGIN) == 0 {
        return vec![(Survival::AllSurvive, Survival::AllSurvive)];
    }
    let mut v = vec![
        (Survival::NoneSurvive, Survival::NoneSurvive),
        (Survival::AllSurvive, Survival::AllSurvive),
    ];
    for k in 0..random_variants {
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k << 1);
        v.push((Survival::Random(s), Survival::Random(s ^ 0xABCD)));
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

/// Recovers one crash image pair and verifies it, writes everything back
/// and detaches; `deep` also restarts cleanly in between.
fn verify_image(
    cache_img: Vec<u8>,
    origin_img: Vec<u8>,
    model: &SectorModel,
    deep: bool,
) -> Result<(), String> {
    let (_, cache) = common::restart_dev("cache", cache_img, 1);
    let (_, origin) = common::restart_dev("origin", origin_img, 2);
    let report = check(&cache, Some(ORIGIN_BYTES));
    if !report.ok {
        return Err(format!(
            "check fails on the crash image: {:?}",
            report.findings
        ));
    }
    let engine = Engine::open(cache.clone(), origin.clone(), &common::no_bg())
        .map_err(|e| format!("recovery refused: {e}"))?;
    let used = engine.status().cache_blocks_used;
    if report.cache_blocks_used != used {
        return Err(format!(
            "check counted {} cached blocks, recovery {used}",
            report.cache_blocks_used
        ));
    }
    let first = common::read_volume(&engine)?;
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
        let engine = Engine::open(cache, origin.clone(), &common::no_bg())
            .map_err(|e| format!("reopen: {e}"))?;
        let second = common::read_volume(&engine)?;
        if first != second {
            return Err("the volume changed across a clean restart".into());
        }
        engine
    } else {
        engine
    };
    engine.detach().map_err(|e| format!("detach: {e}"))?;
    let mut back = vec![0u8; ORIGIN_BYTES as usize];
    origin.read_at(&mut back, 0).unwrap();
    // Trimmed sectors are unspecified: a trim drops a clean cached copy in
    // memory and discards the origin at once, so after a crash the copy
    // may come back over the discarded origin bytes.
    let differs = (0..SECTORS as usize).find(|&s| {
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
    let mut model = SectorModel::new(SECTORS);
    let mut images = 0u64;
    let mut deep = 0u64;
    for pos in 0..=rec.events.len() {
        if positions.contains(&pos) {
            for (k, (sc, so)) in survivals(&replay, w.seed ^ pos as u64, random_variants)
                .into_iter()
                .enumerate()
            {
                // Every 16th image also goes through a clean restart.
                let is_deep = (pos + k) % 16 == 0;
                let r = verify_image(
                    replay.image(CACHE, sc),
                    replay.image(ORIGIN, so),
                    &model,
                    is_deep,
                );
                if let Err(e) = r {
                    panic!(
                        "power loss: {w:?}: crash after {pos} of {} events (cache {sc:?}, origin {so:?}): {e}\nrerun with TIERCACHE_SEED={}",
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
        };
        verify_workload(&w, random_variants, &counts);
    }
    eprintln!(
        "power-loss {mode}: {} workloads, {} flush points, {} crash images recovered and verified (all written back and detached, {} also restarted cleanly)",
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
