//! Reliability scenarios 4 and 5: the cache device fails in the middle of a
//! run; the origin fails.
//!
//! - Writethrough, writearound, passthrough: no request fails, every read
//!   returns the latest data, and the origin ends equal to the model.
//! - Writeback, writeonly: errors are returned, never wrong data; once the
//!   error limit is reached no block is admitted and status says so; when
//!   the device works again, flushing writes every dirty block back.
//! - A failed-over cache reopened after the device recovers serves no stale
//!   block (the clean mappings are dropped).
//! - Origin errors are returned, counted, and other blocks keep working.

mod common;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::fault::FaultDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions};

use common::{initial_origin, stamped, SectorModel};

const BS: u32 = 4096;
const ORIGIN_BYTES: u64 = 1 << 20;
const SECTORS: u64 = ORIGIN_BYTES / 512;
const ERROR_LIMIT: u64 = 8;

#[derive(Clone, Copy, Debug)]
enum Failure {
    /// Bad blocks: the data area fails, metadata still works.
    DataArea,
    /// The whole device fails, metadata included.
    Whole,
}

struct Rig {
    cache: Arc<FaultDevice>,
    origin: Arc<FaultDevice>,
    engine: Arc<Engine>,
    data_offset: u64,
}

fn rig(mode: Mode, seed: u64) -> Rig {
    let cache_bytes = common::cache_bytes_for(48, BS);
    let cache = Arc::new(FaultDevice::new("cache", cache_bytes, seed));
    let origin = Arc::new(FaultDevice::from_image(
        "origin",
        initial_origin(ORIGIN_BYTES),
        seed + 1,
    ));
    let (c, o): (DeviceRef, DeviceRef) = (cache.clone(), origin.clone());
    Engine::create(
        c.clone(),
        o.clone(),
        &CreateOptions {
            mode,
            cache_error_limit: ERROR_LIMIT,
            ..Default::default()
        },
    )
    .unwrap()
    .close()
    .unwrap();
    let engine = Engine::open(
        c,
        o,
        &OpenOptions {
            no_background: true,
            ..Default::default()
        },
    )
    .unwrap();
    let data_offset = Layout::compute(cache_bytes, BS).unwrap().data_offset;
    Rig {
        cache,
        origin,
        engine,
        data_offset,
    }
}

/// Per sector, the versions a read may return (common::SectorModel): one
/// after a completed write, old or new after a failed one. These tests
/// check live reads, not crash images, so a completed write settles its
/// sectors at once (`fua_done`) and flushes are never applied to the model.
fn new_model() -> SectorModel {
    SectorModel::new(SECTORS)
}

/// Writes stamped sectors through the engine and records the outcome.
fn write_stamped(
    engine: &Engine,
    model: &mut SectorModel,
    first: u64,
    n: u64,
    fua: bool,
) -> Result<(), tiercache::engine::EngineError> {
    let v = model.issue_write(first, n);
    let res = engine.write(first * 512, &stamped(first, n, v), fua);
    if res.is_ok() {
        model.fua_done(v);
    }
    res
}

/// Checks data read at sector `first` against the model.
fn check(model: &SectorModel, first: u64, data: &[u8], what: &str) {
    for (k, chunk) in data.chunks(512).enumerate() {
        if let Err(e) = model.check_sector(first + k as u64, chunk) {
            panic!("{what}: {e}");
        }
    }
}

#[derive(Default, Debug)]
struct Counts {
    ops: u64,
    failed_writes: u64,
    failed_reads: u64,
    ok_writes_after_failure: u64,
}

/// Random writes, reads, flushes and writeback; the cache device fails at
/// op 150 of 500. Returns what happened.
fn run(mode: Mode, failure: Failure, seed: u64) -> (Rig, SectorModel, Counts) {
    let r = rig(mode, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model = new_model();
    let mut counts = Counts::default();
    let hides_errors = !mode.holds_dirty();
    let ctx = format!("{mode} {failure:?} seed {seed}");
    for op in 0..500u64 {
        counts.ops += 1;
        if op == 150 {
            let from = match failure {
                Failure::DataArea => r.data_offset,
                Failure::Whole => 0,
            };
            r.cache.fail_reads_in(from, u64::MAX / 2);
            r.cache.fail_writes_in(from, u64::MAX / 2);
        }
        let failed = op >= 150;
        // Mostly a working set of 96 blocks (twice the cache), so hits,
        // promotions and evictions all happen.
        let first = rng.gen_range(0..96 * 8u64);
        let n = rng.gen_range(1..=16u64).min(SECTORS - first);
        match rng.gen_range(0..10) {
            0..=4 => {
                let res = write_stamped(&r.engine, &mut model, first, n, rng.gen_bool(0.05));
                if hides_errors {
                    res.as_ref()
                        .unwrap_or_else(|e| panic!("{ctx}: write failed: {e}"));
                }
                if res.is_err() {
                    counts.failed_writes += 1;
                } else if failed {
                    counts.ok_writes_after_failure += 1;
                }
            }
            5..=8 => match r.engine.read(first * 512, n * 512) {
                Ok(data) => check(&model, first, &data, &ctx),
                Err(e) => {
                    assert!(!hides_errors, "{ctx}: read failed: {e}");
                    counts.failed_reads += 1;
                }
            },
            _ => {
                let res = r.engine.flush();
                if hides_errors {
                    res.unwrap_or_else(|e| panic!("{ctx}: flush failed: {e}"));
                }
            }
        }
        if op % 25 == 0 {
            r.engine.background_tick();
        }
    }
    (r, model, counts)
}

fn check_origin(origin: &FaultDevice, model: &SectorModel, what: &str) {
    check(model, 0, &origin.snapshot_current(), what);
}

fn check_volume(engine: &Engine, model: &SectorModel, what: &str) {
    check(model, 0, &engine.read(0, ORIGIN_BYTES).unwrap(), what);
}

#[test]
fn cache_failure_is_invisible_without_dirty_data() {
    let mut cases = 0;
    for mode in [Mode::Writethrough, Mode::Writearound, Mode::Passthrough] {
        for failure in [Failure::DataArea, Failure::Whole] {
            for seed in 0..3 {
                let (r, model, counts) = run(mode, failure, seed);
                let what = format!("{mode} {failure:?} seed {seed}");
                assert_eq!(counts.failed_writes + counts.failed_reads, 0);
                r.engine.flush().unwrap();
                check_volume(&r.engine, &model, &what);
                // No dirty data in these modes: the origin is the truth.
                check_origin(&r.origin, &model, &what);
                let st = r.engine.status();
                if matches!(failure, Failure::Whole) && mode != Mode::Passthrough {
                    assert!(!st.admitting, "{what}: {}", st.admission);
                    assert!(
                        st.admission.contains("failed over"),
                        "{what}: {}",
                        st.admission
                    );
                }
                if st.stats.cache_errors >= ERROR_LIMIT {
                    assert!(!st.admitting, "{what}: {}", st.admission);
                }
                r.engine.close().unwrap();
                cases += 1;
            }
        }
    }
    eprintln!(
        "cache failure without dirty data: {cases} runs of 500 ops, no error seen by the user"
    );
}

#[test]
fn cache_failure_with_dirty_data_returns_errors_and_loses_nothing() {
    let mut cases = 0;
    let mut totals = Counts::default();
    for mode in [Mode::Writeback, Mode::Writeonly] {
        for failure in [Failure::DataArea, Failure::Whole] {
            for seed in 10..13 {
                let (r, model, counts) = run(mode, failure, seed);
                let what = format!("{mode} {failure:?} seed {seed}");
                let st = r.engine.status();
                assert!(
                    st.stats.cache_errors >= ERROR_LIMIT,
                    "{what}: only {} cache errors",
                    st.stats.cache_errors
                );
                assert!(!st.admitting, "{what}: still admitting");
                assert!(st.admission.contains("stopped"), "{what}: {}", st.admission);
                if matches!(failure, Failure::DataArea) {
                    // Blocks that are not cached go to the origin.
                    assert!(counts.ok_writes_after_failure > 0, "{what}: {counts:?}");
                }
                // The device comes back: every dirty block reaches the origin.
                r.cache.clear_faults();
                r.engine.set_mode(Mode::Writethrough).unwrap();
                assert_eq!(r.engine.dirty_blocks(), 0, "{what}");
                check_origin(&r.origin, &model, &what);
                check_volume(&r.engine, &model, &what);
                r.engine.close().unwrap();
                cases += 1;
                totals.failed_writes += counts.failed_writes;
                totals.failed_reads += counts.failed_reads;
                totals.ok_writes_after_failure += counts.ok_writes_after_failure;
            }
        }
    }
    eprintln!(
        "cache failure with dirty data: {cases} runs of 500 ops; {} writes and {} reads returned errors, {} writes after the failure succeeded, no data lost",
        totals.failed_writes, totals.failed_reads, totals.ok_writes_after_failure
    );
}

#[test]
fn a_failed_over_cache_reopened_after_the_device_recovers_serves_nothing_stale() {
    for (seed, mark_on_device) in [(20u64, true), (21, false)] {
        let r = rig(Mode::Writethrough, seed);
        let mut model = new_model();
        // Cache every block of the first 32 with version 1.
        write_stamped(&r.engine, &mut model, 0, 32 * 8, false).unwrap();
        r.engine.read(0, 32 * 8 * 512).unwrap();
        r.engine.flush().unwrap();
        // The whole device fails (or only the data and journal, leaving the
        // superblock writable so the device-side mark lands).
        let from = if mark_on_device { 2 * 4096 } else { 0 };
        r.cache.fail_writes_in(from, u64::MAX / 2);
        r.cache.fail_reads_in(from, u64::MAX / 2);
        write_stamped(&r.engine, &mut model, 0, 32 * 8, false).unwrap();
        r.engine.flush().unwrap();
        assert!(r.engine.failed_over());
        check_origin(&r.origin, &model, "origin while failed over");
        r.engine.abandon();
        // The device works again. Without the mark, the journal would map
        // version 1 of those blocks.
        r.cache.clear_faults();
        let (c, o): (DeviceRef, DeviceRef) = (r.cache.clone(), r.origin.clone());
        let engine = Engine::open(
            c,
            o,
            &OpenOptions {
                no_background: true,
                // What the daemon's registry records when the device-side
                // mark cannot be written.
                distrust_clean: !mark_on_device,
                ..Default::default()
            },
        )
        .unwrap();
        check_volume(&engine, &model, &format!("reopened, seed {seed}"));
        engine.close().unwrap();
    }
}

#[test]
fn origin_errors_are_returned_counted_and_contained() {
    for mode in Mode::ALL {
        let r = rig(mode, 30);
        let what = format!("{mode}");
        // Blocks 100..104 of the origin fail; the rest works.
        let bad = 100 * BS as u64..104 * BS as u64;
        r.origin.fail_reads_in(bad.start, bad.end - bad.start);
        r.origin.fail_writes_in(bad.start, bad.end - bad.start);
        let mut model = new_model();
        assert!(r.engine.read(bad.start, 4096).is_err(), "{what}");
        let before = r.engine.status().stats.origin_errors;
        assert!(before >= 1, "{what}: origin error not counted");
        // Other blocks: reads and writes work, before and after.
        let mut rng = ChaCha8Rng::seed_from_u64(30);
        for _ in 0..200 {
            let block = loop {
                let b = rng.gen_range(0..200u64);
                if !(96..108).contains(&b) {
                    break b;
                }
            };
            let first = block * 8;
            if rng.gen_bool(0.5) {
                write_stamped(&r.engine, &mut model, first, 8, false)
                    .unwrap_or_else(|e| panic!("{what}: write of a good block failed: {e}"));
            } else {
                let d = r.engine.read(first * 512, 4096).unwrap();
                check(&model, first, &d, &what);
            }
        }
        // A write to a bad block fails where it must reach the origin now.
        let res = r.engine.write(bad.start, &stamped(800, 8, 9999), true);
        if matches!(
            mode,
            Mode::Writethrough | Mode::Writearound | Mode::Passthrough
        ) {
            assert!(res.is_err(), "{what}: origin write error hidden");
        }
        r.engine.flush().ok();
        let after = r.engine.status().stats.origin_errors;
        assert!(after > before || mode.holds_dirty(), "{what}: not counted");
        r.origin.clear_faults();
        r.engine.abandon();
    }
}
