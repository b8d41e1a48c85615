//! Cache-device errors: in writethrough and writearound they are invisible
//! to the user (served from the origin, counted); in writeback they are
//! returned and never silently lose data.

mod common;

use std::sync::Arc;

use tiercache::device::fault::FaultDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::format::{Layout, PAGE_BYTES};
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions};

const ORIGIN_BYTES: u64 = 1 << 20;

fn setup(mode: Mode) -> (Arc<FaultDevice>, DeviceRef, Arc<Engine>, u64) {
    let cache_bytes = common::cache_bytes_for(64, 4096);
    let cache_dev = Arc::new(FaultDevice::new("cache", cache_bytes, 1));
    let origin: DeviceRef = Arc::new(FaultDevice::new("origin", ORIGIN_BYTES, 2));
    let cache: DeviceRef = cache_dev.clone();
    let engine = Engine::open(
        {
            Engine::create(
                cache.clone(),
                origin.clone(),
                &CreateOptions {
                    mode,
                    ..Default::default()
                },
            )
            .unwrap()
            .close()
            .unwrap();
            cache
        },
        origin.clone(),
        &OpenOptions {
            no_background: true,
            ..Default::default()
        },
    )
    .unwrap();
    let data_offset = Layout::compute(cache_bytes, 4096).unwrap().data_offset;
    (cache_dev, origin, engine, data_offset)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..64 * 1024u32)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn cache_errors_are_invisible_in_writethrough_and_writearound() {
    for mode in [Mode::Writethrough, Mode::Writearound] {
        let (cache_dev, _origin, engine, data_offset) = setup(mode);
        let data = pattern(1);
        engine.write(0, &data, false).unwrap();
        assert_eq!(engine.read(0, data.len() as u64).unwrap()[..], data[..]); // promotes (writearound) / hits
        cache_dev.fail_reads_in(data_offset, u64::MAX / 2);
        cache_dev.fail_writes_in(data_offset, u64::MAX / 2);
        assert_eq!(
            engine.read(0, data.len() as u64).unwrap()[..],
            data[..],
            "{mode}: read not served from origin"
        );
        let data2 = pattern(2);
        engine
            .write(0, &data2, false)
            .unwrap_or_else(|e| panic!("{mode}: cache error visible on write: {e}"));
        engine.flush().unwrap();
        assert_eq!(engine.read(0, data2.len() as u64).unwrap()[..], data2[..]);
        let miss = engine.read(512 * 1024, 64 * 1024).unwrap();
        assert!(miss.iter().all(|&b| b == 0));
        assert!(
            engine.status().stats.cache_errors > 0,
            "{mode}: cache errors not counted"
        );
    }
}

#[test]
fn cache_errors_are_returned_in_writeback_and_lose_nothing() {
    let (cache_dev, origin, engine, data_offset) = setup(Mode::Writeback);
    let data = pattern(3);
    engine.write(0, &data, false).unwrap();
    engine.flush().unwrap();
    // Reading dirty data from a failing cache: an error, never wrong data.
    cache_dev.fail_reads_in(data_offset, u64::MAX / 2);
    assert!(
        engine.read(0, 4096).is_err(),
        "dirty block read from a failing cache must fail"
    );
    // Writing to a failing cache: an error.
    cache_dev.fail_writes_in(data_offset, u64::MAX / 2);
    assert!(
        engine.write(128 * 1024, &pattern(4), false).is_err(),
        "write to failing cache must fail"
    );
    assert!(engine.status().stats.cache_errors > 0);
    // Writeback cannot proceed while reads fail: the data stays dirty.
    assert!(engine.write_back_all(&mut |_, _| {}).is_err());
    assert!(engine.dirty_blocks() > 0, "dirty data dropped after errors");
    // The cache recovers: nothing acknowledged was lost.
    cache_dev.clear_faults();
    assert_eq!(engine.read(0, data.len() as u64).unwrap()[..], data[..]);
    engine.detach().unwrap();
    let mut back = vec![0u8; data.len()];
    origin.read_at(&mut back, 0).unwrap();
    assert_eq!(
        back, data,
        "origin after detach lacks the acknowledged data"
    );
}

#[test]
fn wrong_origin_is_refused() {
    let (_c, _o, engine, _) = setup(Mode::Writeback);
    let cache = engine.cache_device().clone();
    engine.write(0, &pattern(5), false).unwrap();
    engine.flush().unwrap();
    drop(engine);
    let other: DeviceRef = Arc::new(FaultDevice::new("another-origin", ORIGIN_BYTES, 3));
    let err = Engine::open(cache.clone(), other, &OpenOptions::default())
        .err()
        .expect("wrong origin accepted");
    assert!(err.to_string().contains("origin mismatch"), "{err}");
    let small: DeviceRef = Arc::new(FaultDevice::new("origin", ORIGIN_BYTES / 2, 3));
    assert!(Engine::open(cache, small, &OpenOptions::default()).is_err());
}

#[test]
fn volatile_cache_refuses_writeback_without_consent() {
    let cache = tiercache::device::open_device("ram:8M").unwrap();
    let origin: DeviceRef = Arc::new(FaultDevice::new("origin", ORIGIN_BYTES, 2));
    let err = Engine::create(cache.clone(), origin.clone(), &CreateOptions::default())
        .err()
        .expect("accepted");
    assert!(err.to_string().contains("volatile"), "{err}");
    let e = Engine::create(
        cache.clone(),
        origin.clone(),
        &CreateOptions {
            mode: Mode::Writethrough,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(e.set_mode(Mode::Writeback).is_err());
    e.close().unwrap();
    let ok = CreateOptions {
        allow_data_loss: true,
        force: true,
        ..Default::default()
    };
    Engine::create(cache, origin, &ok).unwrap().close().unwrap();
}

#[test]
fn a_setting_that_cannot_be_persisted_is_not_applied() {
    for (from, to) in [
        (Mode::Writethrough, Mode::Writeback),
        (Mode::Writeback, Mode::Writethrough),
    ] {
        let (cache_dev, _origin, engine, _data_offset) = setup(from);
        let before = engine.status();
        // Both superblock copies fail to write; everything else works.
        cache_dev.fail_writes_in(0, 2 * PAGE_BYTES);
        assert!(engine.set_mode(to).is_err(), "{from:?} -> {to:?}");
        let mut w = before.writeback;
        w.high_pct = 90;
        w.low_pct = 80;
        w.max_age_secs += 7;
        assert!(engine.set_writeback(w).is_err());
        let after = engine.status();
        assert_eq!(after.mode, from, "{from:?} -> {to:?}");
        assert_eq!(after.writeback, before.writeback);
        // The old mode is the one in force: writethrough leaves nothing
        // dirty, writeback does.
        engine.write(0, &pattern(3), false).unwrap();
        let dirty = engine.status().cache_blocks_dirty;
        assert_eq!(
            dirty > 0,
            from == Mode::Writeback,
            "{from:?}: {dirty} dirty"
        );
        assert_eq!(engine.read(0, 64 * 1024).unwrap()[..], pattern(3)[..]);
        // Once the device works again the change goes through.
        cache_dev.clear_faults();
        engine.set_mode(to).unwrap();
        engine.set_writeback(w).unwrap();
        let now = engine.status();
        assert_eq!((now.mode, now.writeback), (to, w));
        engine.close().unwrap();
    }
}

/// A commit that fails after writing its journal page leaves that page on
/// the device; its records stay in memory and may be superseded. A later
/// checkpoint must start replay past the page, or the next open replays the
/// stale records over the checkpoint. Here: block 0 is written, its commit
/// fails at the last flush (the page with "block 0 in slot s" is written),
/// block 0 is then trimmed and written again (a new slot), and a clean close
/// checkpoints. Replaying the stale page would map block 0 back to slot s,
/// whose data is the first write's.
#[test]
fn a_checkpoint_after_a_failed_commit_never_replays_the_failed_commit() {
    let (cache_dev, origin, engine, _) = setup(Mode::Writeback);
    let first = pattern(1);
    let second = pattern(2);
    engine.write(0, &first[..4096], false).unwrap();
    // The commit: cache flush, journal page, then the flush that fails.
    cache_dev.fail_after_ops(2);
    assert!(engine.flush().is_err(), "the commit's last flush fails");
    cache_dev.clear_faults();
    engine.trim(0, 4096, false).unwrap();
    engine.write(0, &second[..4096], false).unwrap();
    engine.close().unwrap();
    drop(engine);
    let cache: DeviceRef = cache_dev.clone();
    let engine = Engine::open(cache, origin, &common::no_bg()).unwrap();
    assert!(
        engine.read(0, 4096).unwrap()[..] == second[..4096],
        "the failed commit's journal page was replayed over the checkpoint"
    );
    engine.close().unwrap();
}

/// `--max-dirty-age` (the writeback age) bounds what a dead single cache
/// device can leave stale: a block dirty for longer has been written back,
/// so only the blocks written within the age are stale after the loss.
#[test]
fn the_maximum_dirty_age_bounds_what_a_lost_cache_leaves_stale() {
    let (cache_dev, origin, engine, _) = setup(Mode::Writeback);
    let mut w = engine.status().writeback;
    w.max_age_secs = 1;
    engine.set_writeback(w).unwrap();
    origin
        .write_at(&vec![0x11u8; ORIGIN_BYTES as usize], 0)
        .unwrap();
    engine.write(2 * 4096, &pattern(5)[..4096], false).unwrap();
    engine.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    engine.background_tick();
    assert_eq!(
        engine.dirty_blocks(),
        0,
        "the aged block was not written back"
    );
    // Written within the age: still dirty when the device dies.
    engine.write(7 * 4096, &pattern(6)[..4096], false).unwrap();
    engine.flush().unwrap();
    cache_dev.fail_after_ops(0);
    assert_eq!(engine.give_up_cache().unwrap(), 1);
    assert_eq!(engine.status().stale_ranges, vec![(7 * 4096, 4096)]);
    assert_eq!(engine.read(2 * 4096, 4096).unwrap()[..], pattern(5)[..4096]);
    assert!(engine.read(7 * 4096, 4096).is_err());
}

/// One cache device that dies for good holding dirty data. While it fails,
/// errors reach the callers, nothing is given up, and `status` lists the
/// origin ranges its dirty blocks make stale. Given up (the operator's word
/// that it is gone), the engine fails over, fails reads that touch those
/// ranges rather than serve the origin's old bytes, serves the rest from
/// the origin, and a write covering a whole stale block makes it current.
#[test]
fn a_dead_cache_with_dirty_data_reports_stale_ranges_and_never_serves_them() {
    let (cache_dev, origin, engine, _) = setup(Mode::Writeback);
    let old = vec![0x11u8; ORIGIN_BYTES as usize];
    origin.write_at(&old, 0).unwrap();
    // Two dirty runs: blocks 2..4 and block 10.
    engine
        .write(2 * 4096, &pattern(5)[..2 * 4096], false)
        .unwrap();
    engine.write(10 * 4096, &pattern(6)[..4096], false).unwrap();
    engine.flush().unwrap();
    cache_dev.fail_after_ops(0);
    for _ in 0..100 {
        assert!(engine.read(2 * 4096, 4096).is_err());
        engine.background_tick();
    }
    assert!(
        !engine.failed_over(),
        "a failing device is not given up by itself"
    );
    let st = engine.status();
    assert_eq!(
        st.stale_ranges,
        vec![(2 * 4096, 2 * 4096), (10 * 4096, 4096)]
    );
    assert!(st.admission.contains("stale"), "{}", st.admission);
    assert_eq!(engine.give_up_cache().unwrap(), 3);
    assert!(engine.failed_over());
    engine.flush().unwrap();
    let st = engine.status();
    assert_eq!(st.stale_blocks, 3, "{st:?}");
    assert_eq!(
        st.stale_ranges,
        vec![(2 * 4096, 2 * 4096), (10 * 4096, 4096)]
    );
    assert!(st.admission.contains("stale"), "{}", st.admission);
    // Stale ranges fail; the rest is the origin's.
    assert!(engine.read(2 * 4096, 512).is_err());
    assert!(
        engine.read(0, 64 * 1024).is_err(),
        "a read spanning a stale block"
    );
    assert_eq!(engine.read(4 * 4096, 4096).unwrap()[..], old[..4096]);
    assert_eq!(engine.read(11 * 4096, 8192).unwrap()[..], old[..8192]);
    // Writes go to the origin; a whole-block write makes block 10 current.
    engine.write(10 * 4096, &pattern(7)[..4096], true).unwrap();
    assert_eq!(
        engine.read(10 * 4096, 4096).unwrap()[..],
        pattern(7)[..4096]
    );
    // A part-block write leaves block 2 stale.
    engine.write(2 * 4096, &pattern(8)[..512], true).unwrap();
    assert!(engine.read(2 * 4096, 4096).is_err());
    assert_eq!(engine.status().stale_ranges, vec![(2 * 4096, 2 * 4096)]);
}
