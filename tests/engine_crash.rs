//! Power-loss test. A random write/flush/FUA workload runs with the
//! background's work (writeback, commits, checkpoints, time passing) as
//! steps a seeded scheduler picks (tests/common/sim.rs); a crash switch shared by the cache and the origin cuts power at
//! the N-th device write; each device then loses, keeps, tears or reorders
//! its unflushed writes (FaultDevice's power-loss model). After recovery:
//! every write acknowledged before the last completed flush, and every FUA
//! write, reads back; no sector holds data never written to it.
//!
//! Every sector written carries (sector, version) and a pattern derived from
//! them, so a read identifies exactly which write it came from.
//! Deterministic: a failure prints its seed, the command that replays it
//! bit for bit, and the last steps before the crash.

mod common;
#[path = "common/sim.rs"]
mod sim;

use std::sync::Arc;

use rand::Rng;
use sim::Sim;
use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::DeviceRef;
use tiercache::engine::journal::stale_map;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, Placement};

const ORIGIN_BYTES: u64 = 1 << 20;
const SECTORS: usize = (ORIGIN_BYTES / 512) as usize;

/// What a crash case leaves to compare between two runs of one seed.
struct Outcome {
    trace: String,
    digests: (u64, u64),
    volume: Vec<u8>,
}

/// Runs one crash case: a deterministic simulation (tests/common/sim.rs),
/// the background's work as steps a seeded scheduler picks.
fn crash_case(seed: u64, mode: Mode, block_bytes: u32, power_loss: bool, test: &str) -> Outcome {
    let mut sim = Sim::new(seed, sim::replay_command("engine_crash", test, seed));
    sim.note(format!(
        "mode {mode}, {block_bytes}-byte blocks, power loss {power_loss}"
    ));
    let switch = CrashSwitch::new();
    let cache_bytes = common::cache_bytes_for(20, block_bytes);
    let cache_dev =
        Arc::new(FaultDevice::new("cache", cache_bytes, seed).with_crash_switch(switch.clone()));
    let origin_dev = Arc::new(
        FaultDevice::from_image("origin", common::initial_origin(ORIGIN_BYTES), seed ^ 0x55)
            .with_crash_switch(switch.clone()),
    );
    let cache: DeviceRef = cache_dev.clone();
    let origin: DeviceRef = origin_dev.clone();
    let placement = if (seed / 3) % 2 == 1 {
        Placement::Log
    } else {
        Placement::InPlace
    };
    sim.note(format!("placement {}", placement.name()));
    let opts = CreateOptions {
        mode,
        block_bytes,
        writeback: common::eager_writeback(),
        placement,
        ..Default::default()
    };
    // The stale map lives off the cache device (a file that the crash
    // leaves as written: it is fsynced before each commit it must precede).
    let state = tempfile::tempdir().unwrap();
    let map_path = state.path().join("stale-maps").join("c.json");
    let keeping_map = OpenOptions {
        stale_map: Some(map_path.clone()),
        ..sim.open_options()
    };
    let engine = Engine::create_with(cache, origin, &opts, &keeping_map)
        .unwrap_or_else(|e| panic!("seed {seed}: create: {e}"));
    // Per sector: the versions it may hold after a crash. The first entry
    // is the last durable version; later ones were written since.
    let mut model = common::SectorModel::new(SECTORS as u64);
    let crash_at = sim.rng().gen_range(1..=250);
    sim.note(format!("power fails at device event {crash_at}"));
    switch.arm_after_events(crash_at);
    let max_sectors = (2 * block_bytes / 512) as u64;
    for _ in 0..300 {
        let r: u32 = sim.rng().gen_range(0..100);
        if r < 20 {
            if sim.background(&engine).is_err() {
                break;
            }
            continue;
        }
        sim.client_time();
        let ok = if r < 65 {
            let n = sim.rng().gen_range(1..=max_sectors);
            let first = sim.rng().gen_range(0..=SECTORS as u64 - n);
            let fua = r < 28;
            let v = model.issue_write(first, n);
            let res = engine.write(first * 512, &common::stamped(first, n, v), fua);
            sim.note_write(v, first, n, fua, &res.is_ok().to_string());
            if res.is_ok() && fua {
                model.fua_done(v);
            }
            res.is_ok()
        } else if r < 87 {
            // Reads fill blocks cached in part and promote others, writing
            // into slots in place: a crash in the middle must not leave a
            // sector served from the cache that it never held.
            let n = sim.rng().gen_range(1..=max_sectors);
            let first = sim.rng().gen_range(0..=SECTORS as u64 - n);
            let ok = engine.read(first * 512, n * 512).is_ok();
            sim.note(format!("read sectors {first}+{n}: {ok}"));
            ok
        } else {
            let res = engine.flush();
            sim.note(format!("flush: {}", res.is_ok()));
            if res.is_ok() {
                model.flush_done();
            }
            res.is_ok()
        };
        if !ok {
            break;
        }
    }
    switch.trip();
    engine.abandon();
    drop(engine);
    let digests = (cache_dev.io_digest(), origin_dev.io_digest());
    let (cache_img, origin_img) = if power_loss {
        (cache_dev.power_loss_image(), origin_dev.power_loss_image())
    } else {
        (cache_dev.snapshot_current(), origin_dev.snapshot_current())
    };
    let cache: DeviceRef = Arc::new(FaultDevice::from_image("cache", cache_img, seed + 1));
    let origin: DeviceRef = Arc::new(FaultDevice::from_image("origin", origin_img, seed + 2));
    let fail = |what: String| -> ! { panic!("{}{what}", sim.report(40)) };
    let engine = Engine::open(cache.clone(), origin.clone(), &sim.open_options())
        .unwrap_or_else(|e| fail(format!("recovery refused: {e}")));
    let verify = |engine: &Engine, when: &str| {
        let all = engine
            .read(0, ORIGIN_BYTES)
            .unwrap_or_else(|e| fail(format!("read after recovery: {e}")));
        if let Err(e) = model.verify(&all) {
            fail(format!("{when}: {e}"));
        }
        all
    };
    let first = verify(&engine, "after recovery");
    if let Err(e) = stale_map_covers(&first, &origin, &map_path) {
        fail(format!("stale map: {e}"));
    }
    // What recovery shows must stay: write everything back, restart, detach.
    engine
        .write_back_all(&mut |_, _| {})
        .unwrap_or_else(|e| fail(format!("write_back_all: {e}")));
    engine.close().unwrap();
    drop(engine);
    let engine = Engine::open(cache, origin.clone(), &sim.open_options()).unwrap();
    let second = verify(&engine, "after restart");
    if first[..] != second[..] {
        fail("volume changed across a clean restart".into());
    }
    engine.detach().unwrap();
    let mut back = vec![0u8; ORIGIN_BYTES as usize];
    origin.read_at(&mut back, 0).unwrap();
    if back[..] != first[..] {
        fail("origin after detach differs from the recovered volume".into());
    }
    Outcome {
        trace: sim.report(usize::MAX),
        digests,
        volume: first.to_vec(),
    }
}

/// Every sector where the origin differs from the recovered volume (what
/// would be lost with the cache device now) lies in a range the stale map
/// names (read before anything reopens the cache with the map).
fn stale_map_covers(
    volume: &[u8],
    origin: &DeviceRef,
    path: &std::path::Path,
) -> Result<(), String> {
    let mut on_origin = vec![0u8; volume.len()];
    origin
        .read_at(&mut on_origin, 0)
        .map_err(|e| e.to_string())?;
    let differ: Vec<u64> = (0..volume.len() / 512)
        .filter(|&i| volume[i * 512..(i + 1) * 512] != on_origin[i * 512..(i + 1) * 512])
        .map(|i| i as u64 * 512)
        .collect();
    let map = match stale_map::read(path) {
        Ok(map) => map,
        Err(stale_map::ReadError::Missing(_)) if differ.is_empty() => return Ok(()),
        Err(e) => return Err(format!("{e}, with the origin stale at {differ:?}")),
    };
    let ranges = &map.volumes[0].ranges;
    match (differ.iter()).find(|&&at| !ranges.iter().any(|&(o, n)| o <= at && at < o + n)) {
        Some(at) => Err(format!(
            "the origin is stale at byte {at}; the map names {ranges:?}"
        )),
        None => Ok(()),
    }
}

/// The case a seed stands for.
fn case_of(seed: u64) -> (u32, bool) {
    (
        [4096u32, 8192, 65536][(seed % 3) as usize],
        !seed.is_multiple_of(5),
    )
}

fn run(mode: Mode, cases: u64, salt: u64, test: &str) {
    let seeds: Vec<u64> = match std::env::var("TIERCACHE_SEED") {
        Ok(s) => vec![s.parse().expect("TIERCACHE_SEED must be a number")],
        Err(_) => (0..cases).map(|i| salt * 1_000_000 + i).collect(),
    };
    for seed in seeds {
        let (block_bytes, power_loss) = case_of(seed);
        crash_case(seed, mode, block_bytes, power_loss, test);
    }
}

/// A seed replays bit for bit: the same steps and device events.
#[test]
fn a_seed_replays_bit_for_bit() {
    for seed in [5_000_001u64, 5_000_002, 5_000_003, 5_000_004] {
        let (block_bytes, power_loss) = case_of(seed);
        let test = "a_seed_replays_bit_for_bit";
        let a = crash_case(seed, Mode::Writeback, block_bytes, power_loss, test);
        let b = crash_case(seed, Mode::Writeback, block_bytes, power_loss, test);
        assert_eq!(a.trace, b.trace, "seed {seed}: the steps differ");
        assert_eq!(
            a.digests, b.digests,
            "seed {seed}: the device events differ"
        );
        assert!(a.volume == b.volume, "seed {seed}: the volumes differ");
    }
}

// 1,200 crash points in all (6,000 in the long form).
#[test]
fn crash_writeback() {
    run(
        Mode::Writeback,
        common::scaled(600, 3000),
        1,
        "crash_writeback",
    );
}
#[test]
fn crash_writeonly() {
    run(
        Mode::Writeonly,
        common::scaled(200, 1000),
        2,
        "crash_writeonly",
    );
}
#[test]
fn crash_writethrough() {
    run(
        Mode::Writethrough,
        common::scaled(200, 1000),
        3,
        "crash_writethrough",
    );
}
#[test]
fn crash_writearound() {
    run(
        Mode::Writearound,
        common::scaled(200, 1000),
        4,
        "crash_writearound",
    );
}

/// Systematic: crash at every device event (write or flush) of one flush
/// that commits a batch of writes, for many power-loss outcomes each.
#[test]
fn crash_at_every_event_of_a_flush() {
    let mut cases = 0;
    for mode in [Mode::Writeback, Mode::Writeonly, Mode::Writethrough] {
        for event in 1..=8u64 {
            for seed in 0..40u64 {
                let switch = CrashSwitch::new();
                let cache_dev = Arc::new(
                    FaultDevice::new("cache", common::cache_bytes_for(20, 4096), seed)
                        .with_crash_switch(switch.clone()),
                );
                let origin_dev = Arc::new(
                    FaultDevice::from_image(
                        "origin",
                        common::initial_origin(ORIGIN_BYTES),
                        seed ^ 7,
                    )
                    .with_crash_switch(switch.clone()),
                );
                let engine = Engine::create_with(
                    cache_dev.clone(),
                    origin_dev.clone(),
                    &CreateOptions {
                        mode,
                        ..Default::default()
                    },
                    &Sim::new(seed, String::new()).open_options(),
                )
                .unwrap();
                let sectors = 64u64;
                for k in 0..sectors / 8 {
                    let mut data = vec![0u8; 4096];
                    for s in 0..8 {
                        data[s * 512..(s + 1) * 512]
                            .copy_from_slice(&common::sector_content(k * 8 + s as u64, 1));
                    }
                    engine.write(k * 4096, &data, false).unwrap();
                }
                switch.arm_after_events(event);
                let flushed = engine.flush().is_ok();
                if std::env::var("TIERCACHE_TRACE").is_ok() {
                    eprintln!(
                        "event {event} seed {seed} flushed {flushed} unflushed cache {} tripped {}",
                        cache_dev.unflushed_writes(),
                        switch.is_tripped()
                    );
                }
                switch.trip();
                engine.abandon();
                drop(engine);
                let cache: DeviceRef = Arc::new(FaultDevice::from_image(
                    "cache",
                    cache_dev.power_loss_image(),
                    1,
                ));
                let origin: DeviceRef = Arc::new(FaultDevice::from_image(
                    "origin",
                    origin_dev.power_loss_image(),
                    2,
                ));
                let engine = Engine::open(
                    cache,
                    origin,
                    &OpenOptions {
                        no_background: true,
                        ..Default::default()
                    },
                )
                .unwrap_or_else(|e| {
                    panic!("mode {mode} event {event} seed {seed}: recovery refused: {e}")
                });
                if std::env::var("TIERCACHE_TRACE").is_ok() {
                    eprintln!(
                        "  used after recovery {}",
                        engine.status().cache_blocks_used
                    );
                }
                let all = engine.read(0, sectors * 512).unwrap();
                for s in 0..sectors as usize {
                    let got = common::decode_sector(&all[s * 512..(s + 1) * 512]);
                    let ctx = format!("mode {mode} event {event} seed {seed} sector {s}");
                    let (sector, version) =
                        got.unwrap_or_else(|| panic!("{ctx}: data never written"));
                    assert_eq!(sector, s as u64, "{ctx}: another sector's data");
                    if flushed {
                        assert_eq!(version, 1, "{ctx}: flushed write lost");
                    }
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 3 * 8 * 40);
}

/// A block cached clean is rewritten (the new data goes to a new slot) and
/// written back; the machine dies at every device event of that writeback.
/// The superseded clean copy must never come back over origin bytes that
/// the writeback already changed: the volume after recovery must equal the
/// origin after detach.
#[test]
fn writeback_of_a_rewritten_clean_block_never_revives_the_old_copy() {
    for event in 1..=8u64 {
        for power_loss in [false, true] {
            let ctx = format!("event {event} power loss {power_loss}");
            let switch = CrashSwitch::new();
            let cache_dev = Arc::new(
                FaultDevice::new("cache", common::cache_bytes_for(20, 4096), event)
                    .with_crash_switch(switch.clone()),
            );
            let origin_dev = Arc::new(
                FaultDevice::from_image("origin", common::initial_origin(ORIGIN_BYTES), event)
                    .with_crash_switch(switch.clone()),
            );
            let opts = CreateOptions::default();
            let no_bg = Sim::new(event, String::new()).open_options();
            Engine::create_with(cache_dev.clone(), origin_dev.clone(), &opts, &no_bg)
                .unwrap()
                .close()
                .unwrap();
            let engine = Engine::open(cache_dev.clone(), origin_dev.clone(), &no_bg).unwrap();
            let block = |v: u64| -> Vec<u8> {
                (0..8u64)
                    .flat_map(|s| common::sector_content(s, v))
                    .collect()
            };
            engine.write(0, &block(1), false).unwrap();
            engine.write_back_all(&mut |_, _| {}).unwrap(); // block 0 now clean, durably
            engine.write(0, &block(2), false).unwrap(); // copied to a new slot, dirty
            switch.arm_after_events(event);
            let _ = engine.write_back_all(&mut |_, _| {});
            switch.trip();
            drop(engine);
            let image = |d: &FaultDevice| {
                if power_loss {
                    d.power_loss_image()
                } else {
                    d.snapshot_current()
                }
            };
            let cache: DeviceRef = Arc::new(FaultDevice::from_image("cache", image(&cache_dev), 1));
            let origin: DeviceRef =
                Arc::new(FaultDevice::from_image("origin", image(&origin_dev), 2));
            let engine = Engine::open(cache, origin.clone(), &no_bg)
                .unwrap_or_else(|e| panic!("{ctx}: recovery refused: {e}"));
            let seen = engine.read(0, 4096).unwrap();
            engine.detach().unwrap();
            let mut back = vec![0u8; 4096];
            origin.read_at(&mut back, 0).unwrap();
            assert!(
                back == seen[..],
                "{ctx}: the volume showed one version and the origin holds another: a stale clean copy came back"
            );
        }
    }
}
