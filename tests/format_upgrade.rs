//! Caches made by an older release open with this one, and upgrade in
//! place, crash-safe. tests/fixtures/format2-eb5101c is a cache as the
//! release at eb5101c (on-disk format 2, one origin) left it after a clean
//! stop with dirty blocks, made by scripts/make-format-fixture.sh (which
//! says what it wrote). Kept in the tests: every later tiercache must open
//! it with nothing lost, and `add-origin` must take it to format 3 with a
//! power loss at any of its writes losing nothing either.

mod common;
#[path = "common/sparse.rs"]
mod sparse;

use std::path::PathBuf;
use std::sync::Arc;

use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::recovery::check;
use tiercache::engine::{Engine, EngineError, OpenOptions};

const ORIGIN_BYTES: u64 = 8 << 20;
/// Dirty blocks the fixture holds: 256 KiB of 4 KiB blocks, and one block
/// cached in part.
const DIRTY: u64 = 64 + 1;

fn fixture(name: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format2-eb5101c");
    sparse::read(&dir.join(name))
}

/// Sector `s` stamped as scripts/make-format-fixture.sh stamps it.
fn stamp(tag: &str, s: u64) -> Vec<u8> {
    let mut v = format!("{tag} sector {s} ").into_bytes();
    v.resize(512, b'.');
    v
}

/// The origin as the fixture was made over.
fn origin_image() -> Vec<u8> {
    (0..ORIGIN_BYTES / 512)
        .flat_map(|s| stamp("origin", s))
        .collect()
}

/// What the volume holds: the writes through the cache over the origin.
fn expected() -> Vec<u8> {
    (0..ORIGIN_BYTES / 512)
        .flat_map(|s| match s {
            0..512 => stamp("written", s),
            6147 => stamp("partial", s),
            _ => stamp("origin", s),
        })
        .collect()
}

fn devices(switch: Option<&CrashSwitch>) -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    let dev = |name: &str, image| {
        let d = FaultDevice::from_image(name, image, 1);
        Arc::new(match switch {
            Some(s) => d.with_crash_switch(s.clone()),
            None => d,
        })
    };
    (
        dev("cache", fixture("cache.sparse")),
        dev("origin", origin_image()),
    )
}

/// The fixture's origin was a file on the machine that made it: its
/// identity (device and inode) cannot be had here, so the opens are forced
/// past the identity check; the size is still checked.
fn opts() -> OpenOptions {
    OpenOptions {
        force: true,
        ..common::no_bg()
    }
}

fn read_volume(engine: &Engine, base: u64) -> Vec<u8> {
    (0..ORIGIN_BYTES / (1 << 20))
        .flat_map(|m| engine.read(base + m * (1 << 20), 1 << 20).unwrap().to_vec())
        .collect()
}

/// The fixture checks clean as format 2 with its dirty blocks, opens, reads
/// back every write, stays format 2 (a lone volume needs no upgrade) and
/// writes its dirty data back to the origin.
#[test]
fn a_format_2_cache_made_by_eb5101c_opens_with_its_dirty_data() {
    let (cache, origin) = devices(None);
    let cache_ref: DeviceRef = cache.clone();
    let report = check(&cache_ref, Some(ORIGIN_BYTES));
    assert!(report.ok, "{:?}", report.findings);
    assert_eq!(report.format_version, Some(2));
    assert_eq!(report.cache_blocks_dirty, DIRTY);
    assert_eq!(report.clean_shutdown, Some(true));
    let engine = Engine::open_volumes(cache.clone(), vec![origin.clone()], &opts()).unwrap();
    assert_eq!(engine.status().cache_blocks_dirty, DIRTY);
    assert!(
        read_volume(&engine, 0) == expected(),
        "the volume reads back"
    );
    engine.close().unwrap();
    drop(engine);
    assert_eq!(
        check(&cache_ref, Some(ORIGIN_BYTES)).format_version,
        Some(2)
    );
    let engine = Engine::open_volumes(cache.clone(), vec![origin.clone()], &opts()).unwrap();
    engine.write_back_all(&mut |_, _| {}).unwrap();
    assert_eq!(engine.status().cache_blocks_dirty, 0);
    let mut on_origin = vec![0u8; ORIGIN_BYTES as usize];
    origin.read_at(&mut on_origin, 0).unwrap();
    assert!(on_origin == expected(), "written back");
}

/// `add-origin`'s open (a second origin appended, `add_volumes`) takes the
/// fixture to format 3; a write to the new volume is flushed and the cache
/// closed. Power lost at each of those writes in turn: the images open as
/// one volume (the next open, told again, finishes the add) or two, the
/// first volume's data whole and still dirty, the new volume's write there
/// once its flush returned.
#[test]
fn adding_an_origin_upgrades_it_to_format_3_and_a_power_loss_at_every_write_loses_nothing() {
    let want = expected();
    for n in 1.. {
        let switch = CrashSwitch::new();
        let (cache, origin) = devices(Some(&switch));
        let extra =
            Arc::new(FaultDevice::new("extra", 1 << 20, 3).with_crash_switch(switch.clone()));
        let adding = OpenOptions {
            add_volumes: vec!["extra".into()],
            ..opts()
        };
        switch.arm_after_writes(n);
        // The add, a write to the new volume made durable, a clean close.
        let mut flushed = false;
        let mut steps = || -> Result<(), EngineError> {
            let e =
                Engine::open_volumes(cache.clone(), vec![origin.clone(), extra.clone()], &adding)?;
            let base = e.volumes()[1].1;
            e.write(base + 4096, &[0xE7; 4096], false)?;
            e.flush()?;
            flushed = true;
            e.close()
        };
        let done = steps();
        let finished = !switch.is_tripped();
        assert!(done.is_ok() || !finished, "{done:?}");
        let image = |d: &FaultDevice, name: &str| {
            Arc::new(FaultDevice::from_image(name, d.power_loss_image(), 1))
        };
        let (cache, origin, extra) = (
            image(&cache, "cache"),
            image(&origin, "origin"),
            image(&extra, "extra"),
        );
        let both = || vec![origin.clone() as DeviceRef, extra.clone() as DeviceRef];
        let engine = match Engine::open_volumes(cache.clone(), both(), &opts()) {
            Ok(e) => e,
            Err(EngineError::OriginMismatch { what }) => {
                assert!(!finished, "power lost after {n} writes: {what}");
                Engine::open_volumes(cache.clone(), both(), &adding).unwrap()
            }
            Err(e) => panic!("power lost after {n} writes: {e}"),
        };
        assert_eq!(engine.volumes().len(), 2, "power lost after {n} writes");
        assert_eq!(engine.status().volumes[0].cache_blocks_dirty, DIRTY);
        assert!(
            read_volume(&engine, 0) == want,
            "power lost after {n} writes"
        );
        if flushed {
            let base = engine.volumes()[1].1;
            let back = engine.read(base + 4096, 4096).unwrap().to_vec();
            assert_eq!(
                back, [0xE7; 4096],
                "power lost after {n} writes: a flushed write"
            );
        }
        engine.close().unwrap();
        drop(engine);
        let cache_ref: DeviceRef = cache;
        let report = check(&cache_ref, Some(ORIGIN_BYTES));
        assert!(report.ok, "{:?}", report.findings);
        assert_eq!(report.format_version, Some(3));
        if finished {
            eprintln!(
                "add-origin on the eb5101c cache: power lost at each of its {} writes, and after",
                n - 1
            );
            return;
        }
    }
}
