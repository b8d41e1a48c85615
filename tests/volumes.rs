//! One cache, several origins (issue 33): each origin is a volume with a
//! name, its blocks keyed (volume, block) in the one table. What a volume
//! holds stays its own, through the cache, writeback and a restart; the
//! superblock records the volumes (format 3) and an open holds the origins
//! it is given against them. Crash images with two and three origins:
//! tests/reliability_power_loss.rs.

mod common;

use common::rig::Rig;

use std::sync::Arc;

use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::async_engine::AsyncEngine;
use tiercache::engine::recovery::check;
use tiercache::engine::{CreateOptions, Engine, EngineError, Mode};
use tiercache::volume::Volume;

const BS: u64 = 4096;

/// The error of an open or create that must be refused.
fn refused(r: Result<Arc<Engine>, EngineError>) -> String {
    r.err().expect("refused").to_string()
}

fn block(v: u8) -> Vec<u8> {
    vec![v; BS as usize]
}

#[test]
fn each_volume_keeps_its_own_blocks_through_the_cache_writeback_and_a_restart() {
    let rig = Rig::new(64, &[1 << 20, 3 << 20]);
    let engine = rig.create(&["db", "logs"], Mode::Writeback).unwrap();
    let vols = engine.volumes();
    assert_eq!(vols.len(), 2);
    assert_eq!((vols[0].0.as_str(), vols[0].2), ("db", 1 << 20));
    assert_eq!((vols[1].0.as_str(), vols[1].2), ("logs", 3 << 20));
    let (a, b) = (vols[0].1, vols[1].1);
    // The same block number in both volumes, and the last block of each.
    engine.write(a + 5 * BS, &block(0xA5), false).unwrap();
    engine.write(b + 5 * BS, &block(0xB5), false).unwrap();
    engine
        .write(a + (1 << 20) - BS, &block(0xAE), false)
        .unwrap();
    engine
        .write(b + (3 << 20) - BS, &block(0xBE), false)
        .unwrap();
    engine.flush().unwrap();
    assert_eq!(engine.dirty_blocks(), 4);
    // Nothing reached an origin yet: writeback mode.
    assert_eq!(rig.origin_bytes(0, 5 * BS, 4), vec![0x10; 4]);
    assert_eq!(rig.origin_bytes(1, 5 * BS, 4), vec![0x11; 4]);
    assert_eq!(engine.read(a + 5 * BS, BS).unwrap().to_vec(), block(0xA5));
    assert_eq!(engine.read(b + 5 * BS, BS).unwrap().to_vec(), block(0xB5));
    // A read miss of a block only the other volume has cached.
    assert_eq!(engine.read(b + 6 * BS, BS).unwrap().to_vec(), block(0x11));
    // Each volume counts its own reads (list's per-volume hit%).
    let st = engine.status();
    let reads = |v: usize| (st.volumes[v].read_hits, st.volumes[v].read_misses);
    assert_eq!((reads(0), reads(1)), ((1, 0), (1, 1)));

    // A power loss after the flush: both volumes' blocks come back.
    engine.abandon();
    drop(engine);
    let engine = rig.open().unwrap();
    assert_eq!(engine.dirty_blocks(), 4);
    assert_eq!(engine.read(a + 5 * BS, BS).unwrap().to_vec(), block(0xA5));
    assert_eq!(engine.read(b + 5 * BS, BS).unwrap().to_vec(), block(0xB5));

    // Writeback sends each block to its own origin, at its own offset.
    engine.write_back_all(&mut |_, _| {}).unwrap();
    assert_eq!(engine.dirty_blocks(), 0);
    assert_eq!(rig.origin_bytes(0, 5 * BS, BS as usize), block(0xA5));
    assert_eq!(rig.origin_bytes(1, 5 * BS, BS as usize), block(0xB5));
    assert_eq!(
        rig.origin_bytes(0, (1 << 20) - BS, BS as usize),
        block(0xAE)
    );
    assert_eq!(
        rig.origin_bytes(1, (3 << 20) - BS, BS as usize),
        block(0xBE)
    );
    assert_eq!(rig.origin_bytes(0, 6 * BS, BS as usize), block(0x10));
    engine.close().unwrap();
    let report = check(&(rig.cache.clone() as DeviceRef), None);
    assert!(report.ok, "{:?}", report.findings);
    assert_eq!(report.format_version, Some(3));
}

#[test]
fn a_request_never_crosses_into_another_volume() {
    let rig = Rig::new(32, &[1 << 20, 1 << 20]);
    let engine = rig.create(&["vol0", "vol1"], Mode::Writeback).unwrap();
    let b = engine.volumes()[1].1;
    let past = engine.write((1 << 20) - BS, &block(1).repeat(2), false);
    assert!(matches!(past, Err(EngineError::NoSpace(_))), "{past:?}");
    let past = engine.read(b + (1 << 20), 512).unwrap_err().to_string();
    assert!(past.contains("beyond volume vol1"), "{past}");
    let none = engine.read(2 * b, 512).unwrap_err().to_string();
    assert!(none.contains("no volume 2"), "{none}");
    // Through the Volume each frontend serves: offsets are the volume's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let second = AsyncEngine::volume(engine.clone(), 1).unwrap();
    assert!(AsyncEngine::volume(engine.clone(), 2).is_none());
    assert_eq!(second.size_bytes(), 1 << 20);
    rt.block_on(async {
        let mut data = tiercache::device::AlignedBuf::zeroed(BS as usize);
        data.fill(0x77);
        second.write(0, data, true).await.unwrap();
        assert_eq!(
            second.read(0, BS as u32).await.unwrap().to_vec(),
            block(0x77)
        );
        assert!(second.read(1 << 20, 512).await.is_err());
    });
    assert_eq!(engine.read(b, BS).unwrap().to_vec(), block(0x77));
    assert_eq!(engine.read(0, BS).unwrap().to_vec(), block(0x10));
}

/// A frontend hands the engine whatever offset its client sent; an offset
/// past volume 1's address space must not wrap into volume 2 (or 0).
#[test]
fn a_client_offset_never_reaches_another_volume() {
    let rig = Rig::new(32, &[1 << 20, 1 << 20, 1 << 20]);
    let engine = rig.create(&["a", "b", "c"], Mode::Writeback).unwrap();
    let middle = AsyncEngine::volume(engine.clone(), 1).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let space = 1u64 << 52; // one volume's address space
    rt.block_on(async {
        for offset in [
            space,
            space + BS,
            u64::MAX - 511,
            u64::MAX - (2 * space) + 1,
        ] {
            let mut data = tiercache::device::AlignedBuf::zeroed(BS as usize);
            data.fill(0xEE);
            assert!(middle.write(offset, data, true).await.is_err(), "{offset}");
            assert!(middle.read(offset, 512).await.is_err(), "{offset}");
            assert!(middle.trim(offset, 512, false).await.is_err(), "{offset}");
            assert!(middle.write_zeroes(offset, 512, false).await.is_err());
        }
    });
    for (name, base, bytes) in engine.volumes() {
        let all = engine.read(base, bytes).unwrap().to_vec();
        assert!(
            all.iter().all(|&x| x != 0xEE && x != 0),
            "volume {name} was written"
        );
    }
}

#[test]
fn one_origin_named_vol0_keeps_format_2_and_more_write_format_3() {
    let rig = Rig::new(32, &[1 << 20]);
    rig.create(&["vol0"], Mode::Writeback)
        .unwrap()
        .close()
        .unwrap();
    let sb = rig.superblock();
    assert_eq!(
        sb.version.get(),
        2,
        "a release from before volumes reads it"
    );
    assert_eq!(sb.volumes.count.get(), 0);

    let rig = Rig::new(32, &[1 << 20]);
    rig.create(&["db"], Mode::Writeback)
        .unwrap()
        .close()
        .unwrap();
    let sb = rig.superblock();
    assert_eq!(sb.version.get(), 3);
    assert_eq!(sb.volume_list()[0].name, "db");
    assert_eq!(rig.open().unwrap().volumes()[0].0, "db");

    let rig = Rig::new(32, &[1 << 20, 2 << 20]);
    rig.create(&["vol0", "vol1"], Mode::Writeback)
        .unwrap()
        .close()
        .unwrap();
    let sb = rig.superblock();
    assert_eq!(sb.version.get(), 3);
    let list = sb.volume_list();
    assert_eq!(list.len(), 2);
    assert_eq!(
        (list[1].bytes, list[1].identity),
        (2 << 20, rig.origins[1].identity())
    );
}

#[test]
fn an_open_refuses_missing_swapped_or_shrunk_origins_and_writes_nothing() {
    let rig = Rig::new(32, &[1 << 20, 2 << 20, 1 << 20]);
    let engine = rig.create(&["a", "b", "c"], Mode::Writeback).unwrap();
    engine.write(0, &block(1), false).unwrap();
    engine.flush().unwrap();
    engine.abandon();
    drop(engine);
    let before = rig.cache.snapshot_current();
    let refs = rig.origin_refs();
    let e = refused(Engine::open_volumes(
        rig.cache.clone(),
        refs[..2].to_vec(),
        &common::no_bg(),
    ));
    assert!(e.contains("holds 3 volumes (a, b, c) but 2 origins"), "{e}");
    // Volumes a and c have the same size: swapped, only identity tells.
    let swapped = vec![refs[2].clone(), refs[1].clone(), refs[0].clone()];
    let e = refused(Engine::open_volumes(
        rig.cache.clone(),
        swapped,
        &common::no_bg(),
    ));
    assert!(e.contains("(volume a) is not the device"), "{e}");
    let small: DeviceRef = Arc::new(FaultDevice::new("o1", 1 << 20, 3));
    let shrunk = vec![refs[0].clone(), small, refs[2].clone()];
    let e = refused(Engine::open_volumes(
        rig.cache.clone(),
        shrunk,
        &common::no_bg(),
    ));
    assert!(
        e.contains("(volume b) has 1048576 bytes, fewer than"),
        "{e}"
    );
    assert!(
        rig.cache.snapshot_current() == before,
        "a refused open wrote"
    );
    assert_eq!(rig.open().unwrap().dirty_blocks(), 1);
}

#[test]
fn create_refuses_one_origin_twice_and_bad_names() {
    let rig = Rig::new(32, &[1 << 20, 1 << 20]);
    let twice = vec![
        ("a".to_string(), rig.origins[0].clone() as DeviceRef),
        ("b".to_string(), rig.origins[0].clone() as DeviceRef),
    ];
    let e = refused(Engine::create_volumes(
        rig.cache.clone(),
        twice,
        &Default::default(),
        &common::no_bg(),
    ));
    assert!(e.contains("given twice"), "{e}");
    for (names, says) in [
        (["a", "a"], "two volumes are named"),
        (["a", "b/c"], "may hold only"),
        (["", "b"], "1 to 32 characters"),
    ] {
        let e = refused(rig.create(&names, Mode::Writeback));
        assert!(e.contains(says), "{names:?}: {e}");
    }
    // Nothing was formatted: the device holds no cache.
    assert!(rig.cache.snapshot_current().iter().all(|&b| b == 0));
}

/// Each volume has its mode: writeback on one origin, writethrough on the
/// other. Switching one volume out of writeback writes back its dirty
/// blocks only; the modes are on disk (format 3's records) and come back
/// at open; `set_mode` gives every volume the one mode again.
#[test]
fn each_volume_has_its_own_mode_kept_across_a_restart() {
    let rig = Rig::new(64, &[1 << 20, 1 << 20]);
    let engine = rig.create(&["db", "logs"], Mode::Writeback).unwrap();
    let (a, b) = (engine.volumes()[0].1, engine.volumes()[1].1);
    engine.write(a, &block(0xA1), false).unwrap();
    engine.write(b, &block(0xB1), false).unwrap();
    assert_eq!(engine.dirty_blocks(), 2);
    // logs leaves writeback: its block is written back, db's stays dirty.
    engine.set_volume_mode(1, Mode::Writethrough).unwrap();
    assert_eq!(engine.dirty_blocks(), 1);
    assert_eq!(rig.origin_bytes(1, 0, BS as usize), block(0xB1));
    assert_eq!(rig.origin_bytes(0, 0, 4), vec![0x10; 4]);
    // Now a write to logs reaches its origin at once; one to db does not.
    engine.write(b + BS, &block(0xB2), false).unwrap();
    engine.write(a + BS, &block(0xA2), false).unwrap();
    assert_eq!(rig.origin_bytes(1, BS, BS as usize), block(0xB2));
    assert_eq!(rig.origin_bytes(0, BS, 4), vec![0x10; 4]);
    assert_eq!(engine.dirty_blocks(), 2);
    let st = engine.status();
    let modes: Vec<Mode> = st.volumes.iter().map(|v| v.mode).collect();
    assert_eq!(modes, vec![Mode::Writeback, Mode::Writethrough]);
    assert_eq!(st.mode, Mode::Writeback, "the cache's (volume 0's) mode");
    assert_eq!(st.volumes[0].cache_blocks_dirty, 2);
    assert_eq!(st.volumes[1].cache_blocks_dirty, 0);
    assert!(engine.set_volume_mode(2, Mode::Writethrough).is_err());

    // On disk: a power loss after a flush keeps both modes and db's
    // dirty blocks.
    engine.flush().unwrap();
    engine.abandon();
    drop(engine);
    let sb = rig.superblock();
    let recorded: Vec<Option<Mode>> = sb.volume_list().iter().map(|v| v.mode).collect();
    assert_eq!(recorded, vec![None, Some(Mode::Writethrough)]);
    let engine = rig.open().unwrap();
    let modes: Vec<Mode> = engine.status().volumes.iter().map(|v| v.mode).collect();
    assert_eq!(modes, vec![Mode::Writeback, Mode::Writethrough]);
    assert_eq!(engine.dirty_blocks(), 2);
    engine.write(b + 2 * BS, &block(0xB3), false).unwrap();
    assert_eq!(rig.origin_bytes(1, 2 * BS, BS as usize), block(0xB3));

    // One mode for all again: db's dirty blocks go back first, and no
    // volume keeps a mode of its own.
    engine.set_mode(Mode::Writearound).unwrap();
    assert_eq!(engine.dirty_blocks(), 0);
    assert_eq!(rig.origin_bytes(0, BS, BS as usize), block(0xA2));
    engine.close().unwrap();
    let recorded: Vec<Option<Mode>> = rig
        .superblock()
        .volume_list()
        .iter()
        .map(|v| v.mode)
        .collect();
    assert_eq!(recorded, vec![None, None]);
    let engine = rig.open().unwrap();
    let modes: Vec<Mode> = engine.status().volumes.iter().map(|v| v.mode).collect();
    assert_eq!(modes, vec![Mode::Writearound, Mode::Writearound]);
    engine.close().unwrap();
    let report = check(&(rig.cache.clone() as DeviceRef), None);
    assert!(report.ok, "{:?}", report.findings);
}

/// A volume's clients see their own origin's trouble, not another's: once
/// the second origin failed a flush after a writethrough write (it may
/// have lost it), FLUSH on that volume fails until the write is written
/// again, and FLUSH on the first volume succeeds (the first try may fail
/// with the cache's commit; the one after does not).
#[test]
fn a_flush_fails_only_for_the_volume_whose_origin_lost_writes() {
    let rig = Rig::new(64, &[1 << 20, 1 << 20]);
    let engine = rig.create(&["db", "logs"], Mode::Writethrough).unwrap();
    let (a, b) = (engine.volumes()[0].1, engine.volumes()[1].1);
    engine.flush().unwrap();
    // logs' origin takes the next write, then fails everything.
    rig.origins[1].fail_after_ops(1);
    engine.write(b, &block(0xB1), false).unwrap();
    engine.write(a, &block(0xA1), false).unwrap();
    let first = engine.flush_volume(0);
    let second = engine.flush_volume(0);
    assert!(second.is_ok(), "db's flush: {first:?} then {second:?}");
    let logs = engine.flush_volume(1).unwrap_err();
    assert!(matches!(logs, EngineError::OriginWritesLost(_)), "{logs}");
    assert!(
        engine.flush().is_err(),
        "the whole cache's flush covers logs"
    );
    // Through the frontends' volumes, the same.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = AsyncEngine::volume(engine.clone(), 0).unwrap();
        let logs = AsyncEngine::volume(engine.clone(), 1).unwrap();
        db.flush().await.unwrap();
        assert!(logs.flush().await.is_err());
    });
    assert!(engine.flush_volume(2).is_err());
}

/// Where two origins' writes meet: a write waits (up to 5 s, once) for a
/// write to the other origin to be under way at the same time.
#[derive(Default)]
struct Hall {
    state: std::sync::Mutex<HallState>,
    cv: std::sync::Condvar,
}

#[derive(Default)]
struct HallState {
    in_write: [u32; 2],
    met: bool,
    gave_up: bool,
}

impl Hall {
    fn enter(&self, me: usize) {
        let mut st = self.state.lock().unwrap();
        st.in_write[me] += 1;
        if st.in_write[1 - me] > 0 {
            st.met = true;
        }
        self.cv.notify_all();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !st.met && !st.gave_up {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                st.gave_up = true;
                break;
            }
            st = self.cv.wait_timeout(st, left).unwrap().0;
        }
    }

    fn leave(&self, me: usize) {
        self.state.lock().unwrap().in_write[me] -= 1;
    }

    /// True if writes to both origins were under way at once since the
    /// last call.
    fn met(&self) -> bool {
        let mut st = self.state.lock().unwrap();
        let met = st.met;
        *st = HallState::default();
        met
    }
}

/// An origin whose writes go through the hall.
struct Meeting {
    inner: Arc<FaultDevice>,
    me: usize,
    hall: Arc<Hall>,
}

impl BlockDevice for Meeting {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.hall.enter(self.me);
        let r = self.inner.write_at(buf, offset);
        self.hall.leave(self.me);
        r
    }
    fn flush(&self) -> tiercache::device::DeviceResult<()> {
        self.inner.flush()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn identity(&self) -> u64 {
        self.inner.identity()
    }
}

/// Each origin's writeback runs on a thread of its own: the two origins'
/// writes are under way at once, in `flush` (write_back_all) and in a
/// background batch past the high watermark, which takes a share of
/// every volume's dirty blocks (so one volume's writeback never waits
/// behind the other's). Written back, each origin holds its own data.
#[test]
fn each_origins_writeback_runs_beside_the_others() {
    let rig = Rig::new(64, &[1 << 20, 1 << 20]);
    let hall = Arc::new(Hall::default());
    let origins: Vec<(String, DeviceRef)> = (0..2)
        .map(|v| {
            let dev = Meeting {
                inner: rig.origins[v].clone(),
                me: v,
                hall: hall.clone(),
            };
            (format!("v{v}"), Arc::new(dev) as DeviceRef)
        })
        .collect();
    let real_clock = tiercache::engine::OpenOptions {
        no_background: true,
        ..Default::default()
    };
    let engine = Engine::create_volumes(
        rig.cache.clone(),
        origins,
        &CreateOptions::default(),
        &real_clock,
    )
    .unwrap();
    let bases: Vec<u64> = engine.volumes().iter().map(|v| v.1).collect();
    let fill = |round: u8| {
        for (v, &base) in bases.iter().enumerate() {
            for k in 0..24u64 {
                let data = block(0xA0 + 0x10 * v as u8 + round);
                engine.write(base + k * 2 * BS, &data, false).unwrap();
            }
        }
    };
    fill(0);
    engine.write_back_all(&mut |_, _| {}).unwrap();
    assert!(
        hall.met(),
        "flush wrote the origins back one after the other"
    );
    engine
        .set_writeback(tiercache::engine::WritebackSettings {
            high_pct: 10,
            low_pct: 1,
            ..Default::default()
        })
        .unwrap();
    fill(1);
    assert!(engine.writeback_step().unwrap() > 0);
    assert!(
        hall.met(),
        "a background batch took one volume's blocks only"
    );
    engine.write_back_all(&mut |_, _| {}).unwrap();
    for v in 0..2 {
        let want = block(0xA1 + 0x10 * v as u8);
        for k in 0..24u64 {
            assert_eq!(rig.origin_bytes(v, k * 2 * BS, BS as usize), want);
        }
    }
}

/// A volume grows online (`Engine::grow_volume`, what `tiercache resize`
/// runs): blocks past the old end are refused before and cached after,
/// the other volume is untouched, the size is recorded (a restart needs no
/// word that it grew) and what was written past the old end reaches the
/// origin. Measuring an origin that did not grow changes nothing.
#[test]
fn a_volume_grows_online_and_keeps_its_new_blocks_across_a_restart() {
    const MIB: u64 = 1 << 20;
    let rig = Rig::new(64, &[MIB, MIB]);
    let engine = rig.create(&["a", "b"], Mode::Writeback).unwrap();
    let b = engine.volumes()[1].1;
    assert_eq!(engine.grow_volume(1).unwrap(), (MIB, MIB));
    rig.origins[1].grow(2 * MIB);
    let past = b + MIB + 64 * 1024;
    assert!(
        engine.write(past, &block(0xB7), false).is_err(),
        "not yet taken"
    );
    assert_eq!(engine.grow_volume(1).unwrap(), (MIB, 2 * MIB));
    assert_eq!(engine.volume_size(1), 2 * MIB);
    assert_eq!(engine.volume_size(0), MIB);
    let v1 = AsyncEngine::volume(engine.clone(), 1).unwrap();
    assert_eq!(v1.size_bytes(), 2 * MIB);
    engine.write(past, &block(0xB7), false).unwrap();
    let held = engine.cache_state(past, BS);
    let both = tiercache::volume::CACHE_CACHED | tiercache::volume::CACHE_DIRTY;
    assert!(held.iter().any(|e| e.flags & both == both), "{held:?}");
    let st = engine.status();
    assert_eq!(st.volumes[1].bytes, 2 * MIB);
    assert_eq!(
        st.volumes[1].cache_blocks_dirty, 1,
        "the heat map counts it"
    );
    engine.flush().unwrap();
    engine.close().unwrap();
    drop(engine);

    let engine = rig.open().unwrap();
    assert_eq!(engine.volume_size(1), 2 * MIB);
    assert_eq!(engine.read(past, BS).unwrap().to_vec(), block(0xB7));
    engine.write_back_all(&mut |_, _| {}).unwrap();
    assert_eq!(
        rig.origin_bytes(1, MIB + 64 * 1024, BS as usize),
        block(0xB7)
    );
    assert_eq!(rig.origin_bytes(1, MIB - BS, BS as usize), block(0x11));
}

/// Power lost at every write a grow makes: the cache opens at the old size
/// (refused without the word that the origin grew, `serve --origin-grew`
/// or `resize`, and then taken) or at the new one, its data whole either
/// way.
#[test]
fn a_power_loss_at_every_write_of_a_grow_opens_at_one_size_or_the_other() {
    const MIB: u64 = 1 << 20;
    for n in 1.. {
        let switch = CrashSwitch::new();
        let rig = Rig::new(64, &[MIB, MIB]).under(&switch, |_| 2);
        let engine = rig.create(&["a", "b"], Mode::Writeback).unwrap();
        let b = engine.volumes()[1].1;
        engine.write(b + 8 * BS, &block(0xB1), false).unwrap();
        engine.flush().unwrap();
        rig.origins[1].grow(2 * MIB);
        switch.arm_after_writes(n);
        let grown = engine.grow_volume(1);
        let finished = !switch.is_tripped();
        assert!(grown.is_ok() || !finished, "{grown:?}");
        drop(engine);
        let images = rig.power_lost(1, |v| 2 + v as u64);
        let engine = match images.open() {
            Ok(e) => e,
            Err(e) => {
                assert!(
                    matches!(e, EngineError::OriginMismatch { .. }) && !finished,
                    "crash after {n} writes: {e}"
                );
                let told = tiercache::engine::OpenOptions {
                    origin_grew: true,
                    ..common::no_bg()
                };
                Engine::open_volumes(images.cache.clone(), images.origin_refs(), &told).unwrap()
            }
        };
        assert_eq!(engine.volume_size(1), 2 * MIB, "crash after {n} writes");
        let back = engine.read(b + 8 * BS, BS).unwrap().to_vec();
        assert_eq!(back, block(0xB1), "crash after {n} writes");
        engine.write(b + MIB + BS, &block(0xB2), false).unwrap();
        if finished {
            assert!(n > 1, "a grow writes the superblock");
            eprintln!(
                "grow: power lost at each of its {} writes, and after",
                n - 1
            );
            return;
        }
    }
}

/// Writes blocks 0..n of every volume `v` with `0xA0 + 0x10 v + k` (block
/// `k`); returns the volumes' base addresses.
fn stamp_volumes(engine: &Engine, n: u64) -> Vec<u64> {
    let bases: Vec<u64> = engine.volumes().iter().map(|v| v.1).collect();
    for (v, &base) in bases.iter().enumerate() {
        for k in 0..n {
            let data = block(0xA0 + 0x10 * v as u8 + k as u8);
            engine.write(base + k * BS, &data, false).unwrap();
        }
    }
    bases
}

/// `Engine::remove_volume` (what `tiercache remove-origin` runs) takes the
/// middle of three volumes out: its dirty data reaches its origin, the
/// engine closes, and the cache opens with the two origins left, the third
/// volume now second with its cached and dirty blocks (their keys moved
/// down one place). Then the first is taken out too, leaving one volume
/// with its own name. The only volume is refused.
#[test]
fn removing_a_volume_writes_it_back_and_the_volumes_after_it_move_down() {
    const MIB: u64 = 1 << 20;
    let rig = Rig::new(64, &[MIB, MIB, MIB]);
    let engine = rig.create(&["a", "b", "c"], Mode::Writeback).unwrap();
    let bases = stamp_volumes(&engine, 4);
    engine.flush().unwrap();
    engine.remove_volume(1, &mut |_, _| {}).unwrap();
    assert!(engine.write(bases[0], &block(1), false).is_err(), "closed");
    drop(engine);
    for k in 0..4u64 {
        assert_eq!(
            rig.origin_bytes(1, k * BS, BS as usize),
            block(0xB0 + k as u8)
        );
    }
    let left = Rig {
        cache: rig.cache.clone(),
        origins: vec![rig.origins[0].clone(), rig.origins[2].clone()],
    };
    assert!(
        rig.open().is_err(),
        "the removed origin is not the cache's any more"
    );
    let engine = left.open().unwrap();
    let names: Vec<String> = engine.volumes().into_iter().map(|v| v.0).collect();
    assert_eq!(names, ["a", "c"]);
    let st = engine.status();
    assert_eq!(
        (
            st.volumes[0].cache_blocks_dirty,
            st.volumes[1].cache_blocks_dirty
        ),
        (4, 4)
    );
    let c = engine.volumes()[1].1;
    for k in 0..4u64 {
        assert_eq!(
            engine.read(c + k * BS, BS).unwrap().to_vec(),
            block(0xC0 + k as u8)
        );
    }
    assert_eq!(engine.read(c + 9 * BS, BS).unwrap().to_vec(), block(0x12));
    engine.remove_volume(0, &mut |_, _| {}).unwrap();
    drop(engine);
    assert_eq!(rig.origin_bytes(0, 3 * BS, BS as usize), block(0xA3));
    let alone = Rig {
        cache: rig.cache.clone(),
        origins: vec![rig.origins[2].clone()],
    };
    let engine = alone.open().unwrap();
    assert_eq!(engine.volumes()[0].0, "c");
    assert_eq!(engine.read(BS, BS).unwrap().to_vec(), block(0xC1));
    assert!(
        engine.remove_volume(0, &mut |_, _| {}).is_err(),
        "the only volume"
    );
    engine.write_back_all(&mut |_, _| {}).unwrap();
    assert_eq!(rig.origin_bytes(2, 2 * BS, BS as usize), block(0xC2));
    let cache: DeviceRef = rig.cache.clone();
    let report = check(&cache, Some(MIB));
    assert!(report.ok, "{:?}", report.findings);
}

/// Power lost at every write a removal makes (the removed volume's
/// writeback to its origin, the journal, the checkpoint, the superblock):
/// the images open with all three origins (nothing removed yet; the middle
/// volume's data read back whole, from the cache or its origin) or with
/// the two left (removed; the middle origin holds its data), never
/// neither, and every other volume's data is whole.
#[test]
fn a_power_loss_at_every_write_of_a_removal_leaves_the_volume_in_or_out() {
    power_loss_at_every_write_of_a_removal("remove_volume", |e| e.remove_volume(1, &mut |_, _| {}));
}

/// The same for the middle volume removed while served
/// (`remove_volume_served`): an image that has the record marked removed
/// opens with the two origins left and takes it out.
#[test]
fn a_power_loss_at_every_write_of_a_served_removal_leaves_the_volume_in_or_out() {
    power_loss_at_every_write_of_a_removal("remove_volume_served", |e| {
        e.remove_volume_served(1, &mut |_, _| {})
    });
}

/// Three volumes, each stamped, the middle one taken out by `remove`
/// with the power lost after 1, 2, ... writes, until a removal finishes;
/// each image opens with or without it (both seen), data whole.
fn power_loss_at_every_write_of_a_removal(
    what: &str,
    remove: impl Fn(&Engine) -> Result<(), EngineError>,
) {
    const MIB: u64 = 1 << 20;
    let mut outcomes = [0u32; 2];
    for n in 1.. {
        let switch = CrashSwitch::new();
        let dev = |name: &str, bytes: u64, fill: u8| {
            let d = FaultDevice::from_image(name, vec![fill; bytes as usize], 1);
            Arc::new(d.with_crash_switch(switch.clone()))
        };
        let rig = Rig {
            cache: dev("cache", common::cache_bytes_for(64, BS as u32), 0),
            origins: (0..3)
                .map(|v| dev(&format!("o{v}"), MIB, 0x10 + v as u8))
                .collect(),
        };
        let engine = rig.create(&["a", "b", "c"], Mode::Writeback).unwrap();
        stamp_volumes(&engine, 3);
        engine.flush().unwrap();
        switch.arm_after_writes(n);
        let removed = remove(&engine);
        let finished = !switch.is_tripped();
        assert!(removed.is_ok() || !finished, "{removed:?}");
        engine.abandon();
        drop(engine);
        let after = rig.power_lost(1, |_| 1);
        let kept = reopened_after_a_removal(&after, n);
        outcomes[(kept == 2) as usize] += 1;
        if finished {
            assert_eq!(kept, 2);
            assert!(outcomes[0] > 0, "{outcomes:?}");
            eprintln!(
                "{what}: power lost at each of its {} writes ({} images still had the volume, \
                 {} had not), and after",
                n - 1,
                outcomes[0],
                outcomes[1] - 1
            );
            return;
        }
    }
}

/// Opens `after` with its three origins, else with the first and the
/// third, checking every volume's stamped blocks (and, removed, the middle
/// one's on its origin); returns how many volumes it opened with.
fn reopened_after_a_removal(after: &Rig, n: u64) -> usize {
    let two = Rig {
        cache: after.cache.clone(),
        origins: vec![after.origins[0].clone(), after.origins[2].clone()],
    };
    let (engine, kept) = match after.open() {
        Ok(e) => (e, vec![0, 1, 2]),
        Err(_) => match two.open() {
            Ok(e) => (e, vec![0, 2]),
            Err(e) => panic!("power lost after {n} writes: opens with neither: {e}"),
        },
    };
    if kept.len() == 2 {
        for k in 0..3u64 {
            let on_origin = after.origin_bytes(1, k * BS, BS as usize);
            assert_eq!(
                on_origin,
                block(0xB0 + k as u8),
                "power lost after {n} writes"
            );
        }
    }
    for (i, &v) in kept.iter().enumerate() {
        let base = engine.volumes()[i].1;
        for k in 0..3u64 {
            let back = engine.read(base + k * BS, BS).unwrap().to_vec();
            let want = block(0xA0 + 0x10 * v as u8 + k as u8);
            assert_eq!(back, want, "power lost after {n} writes");
        }
    }
    kept.len()
}

/// `add_volume` while another thread writes: the cache of one origin
/// (format 2, 4-byte entries) takes a second and a third volume online,
/// its entries widening under the writer; each new volume serves at once,
/// in its own mode, and all of it is there after a power loss.
#[test]
fn volumes_added_online_serve_at_once_beside_a_writer_and_stay_after_a_power_loss() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const MIB: u64 = 1 << 20;
    let rig = Rig::new(64, &[MIB, MIB, 2 * MIB]);
    let engine = rig.create(&["vol0"], Mode::Writeback).unwrap();
    assert_eq!(rig.superblock().version.get(), 2);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Acquire) || round < 4 {
                for k in 0..16 {
                    let stamp = (round as u8).wrapping_mul(16).wrapping_add(k as u8);
                    engine.write(k * BS, &block(stamp), false).unwrap();
                }
                round += 1;
            }
            round - 1
        })
    };
    let b = engine
        .add_volume("b", rig.origins[1].clone(), None)
        .unwrap();
    let c = engine
        .add_volume("c", rig.origins[2].clone(), Some(Mode::Writethrough))
        .unwrap();
    assert_eq!((b, c), (1, 2));
    let vols = engine.volumes();
    engine
        .write(vols[1].1 + 5 * BS, &block(0xB5), false)
        .unwrap();
    engine
        .write(vols[2].1 + 7 * BS, &block(0xC7), false)
        .unwrap();
    assert_eq!(
        rig.origin_bytes(2, 7 * BS, BS as usize),
        block(0xC7),
        "writethrough"
    );
    stop.store(true, Ordering::Release);
    let last = writer.join().unwrap();
    engine.flush().unwrap();
    let st = engine.status();
    let modes: Vec<Mode> = st.volumes.iter().map(|v| v.mode).collect();
    assert_eq!(
        modes,
        [Mode::Writeback, Mode::Writeback, Mode::Writethrough]
    );
    // Refused: a device the cache has, a name it has, more than it holds.
    let e = engine
        .add_volume("d", rig.origins[1].clone(), None)
        .unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    let spare: DeviceRef = Arc::new(FaultDevice::new("spare", MIB, 9));
    let e = engine.add_volume("b", spare, None).unwrap_err();
    assert!(e.to_string().contains("two volumes are named"), "{e}");
    assert_eq!(engine.volumes().len(), 3);

    engine.abandon();
    drop(engine);
    assert_eq!(rig.superblock().version.get(), 3);
    let engine = rig.open().unwrap();
    let vols = engine.volumes();
    let names: Vec<&str> = vols.iter().map(|v| v.0.as_str()).collect();
    assert_eq!(names, ["vol0", "b", "c"]);
    assert_eq!(engine.status().volumes[2].mode, Mode::Writethrough);
    for k in 0..16u64 {
        let stamp = (last as u8).wrapping_mul(16).wrapping_add(k as u8);
        assert_eq!(
            engine.read(k * BS, BS).unwrap().to_vec(),
            block(stamp),
            "vol0 block {k}"
        );
    }
    assert_eq!(
        engine.read(vols[1].1 + 5 * BS, BS).unwrap().to_vec(),
        block(0xB5)
    );
    assert_eq!(
        engine.read(vols[2].1 + 7 * BS, BS).unwrap().to_vec(),
        block(0xC7)
    );
    engine.close().unwrap();
    let report = check(&(rig.cache.clone() as DeviceRef), None);
    assert!(report.ok, "{:?}", report.findings);
}

/// Power lost at every write an online add makes: the cache opens with
/// the new volume (all three origins given) or without it (the first two),
/// the others' flushed data whole either way.
#[test]
fn a_power_loss_at_every_write_of_an_online_add_leaves_the_volume_in_or_out() {
    const MIB: u64 = 1 << 20;
    for n in 1.. {
        let switch = CrashSwitch::new();
        let rig = Rig::new(64, &[MIB, MIB, MIB]).under(&switch, |v| 2 + v as u64);
        let engine = rig.create(&["a", "b"], Mode::Writeback).unwrap();
        let bases = stamp_volumes(&engine, 4);
        engine.flush().unwrap();
        switch.arm_after_writes(n);
        let added = engine.add_volume("c", rig.origins[2].clone(), None);
        let finished = !switch.is_tripped();
        assert!(added.is_ok() || !finished, "{added:?}");
        drop(engine);
        let images = rig.power_lost(1, |v| 2 + v as u64);
        let engine = match images.open() {
            Ok(e) => e,
            Err(e) => {
                assert!(!finished, "crash after {n} writes: {e}");
                let two: Vec<DeviceRef> = images.origin_refs().into_iter().take(2).collect();
                Engine::open_volumes(images.cache.clone(), two, &common::no_bg())
                    .unwrap_or_else(|e| panic!("crash after {n} writes, without c: {e}"))
            }
        };
        for (v, &base) in bases.iter().enumerate() {
            for k in 0..4 {
                let want = block(0xA0 + 0x10 * v as u8 + k as u8);
                let got = engine.read(base + k * BS, BS).unwrap().to_vec();
                assert_eq!(got, want, "crash after {n} writes: volume {v} block {k}");
            }
        }
        if engine.volumes().len() == 3 {
            engine
                .write(engine.volumes()[2].1, &block(0xC0), false)
                .unwrap();
        }
        if finished {
            assert!(n > 1, "an add writes the superblock");
            eprintln!(
                "online add: power lost at each of its {} writes, and after",
                n - 1
            );
            return;
        }
    }
}

/// `Engine::remove_volume_served` (`tiercache remove-origin` of a served
/// cache) takes the first of three volumes out while a thread keeps writing
/// to the third: the writer never sees an error, the removed volume's
/// requests are refused by name, its origin holds every write (the blocks
/// dirty in the cache were written back) and is let go. `status` and
/// `check` show two volumes (check notes the removal). The next open,
/// given the two origins left, takes the record out and moves the others
/// down one place, keys and all, and their data reads back; so does the
/// open after it.
#[test]
fn a_volume_removed_while_served_leaves_the_others_serving() {
    const MIB: u64 = 1 << 20;
    let rig = Rig::new(64, &[MIB, MIB, MIB]);
    let engine = rig.create(&["a", "b", "c"], Mode::Writeback).unwrap();
    let bases = stamp_volumes(&engine, 4);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let writes = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 20 {
                let k = 8 + n % 8;
                engine
                    .write(bases[2] + k * BS, &block(0xC8 + (n % 8) as u8), false)
                    .unwrap();
                n += 1;
            }
            n
        });
        engine.remove_volume_served(0, &mut |_, _| {}).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap()
    });
    assert!(writes >= 20);
    assert!(rig.origins[0].was_let_go(), "the origin is let go");
    let on_origin = FaultDevice::from_image("o0", rig.origins[0].durable_image(), 9);
    for k in 0..4u64 {
        let mut buf = vec![0u8; BS as usize];
        on_origin.read_at(&mut buf, k * BS).unwrap();
        assert_eq!(
            buf,
            block(0xA0 + k as u8),
            "volume a's block {k} on its origin"
        );
    }
    let e = engine.read(bases[0], BS).unwrap_err().to_string();
    assert!(e.contains("volume a was removed"), "{e}");
    let e = engine.remove_volume_served(1, &mut |_, _| {});
    assert!(e.is_ok(), "b can go too: {e:?}");
    let e = engine
        .remove_volume_served(2, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("only one"), "{e}");
    let st = engine.status();
    let names: Vec<&str> = st.volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["c"]);
    assert!(engine.volume_index("a").is_err());
    engine.flush().unwrap();
    engine.close().unwrap();
    drop(engine);
    let report = check(&(rig.cache.clone() as DeviceRef), None);
    assert!(report.ok, "{:?}", report.findings);
    assert!(report
        .findings
        .iter()
        .any(|f| f.contains("volume a was removed")));
    assert_eq!(report.volumes.len(), 1);
    let left = Rig {
        cache: rig.cache.clone(),
        origins: vec![rig.origins[2].clone()],
    };
    for open in 0..2 {
        let engine = left.open().unwrap_or_else(|e| panic!("open {open}: {e}"));
        let vols = engine.volumes();
        assert_eq!(vols.len(), 1);
        let base = vols[0].1;
        for k in 0..4u64 {
            let back = engine.read(base + k * BS, BS).unwrap().to_vec();
            assert_eq!(back, block(0xC0 + k as u8), "open {open}: c's block {k}");
        }
        let last = (writes - 8..writes).map(|n| (8 + n % 8, 0xC8 + (n % 8) as u8));
        for (k, v) in last {
            let back = engine.read(base + k * BS, BS).unwrap().to_vec();
            assert_eq!(back, block(v), "open {open}: the writer's block {k}");
        }
        engine.close().unwrap();
    }
}

/// Bad metadata: a superblock that marks a volume removed while the table
/// still holds a dirty block of it (no tiercache writes that: a removal
/// writes every block back first) is refused at open, by slot and volume,
/// and nothing is written.
#[test]
fn a_removed_volume_that_still_holds_dirty_data_is_refused_at_open() {
    const MIB: u64 = 1 << 20;
    let rig = Rig::new(64, &[MIB, MIB]);
    let engine = rig.create(&["a", "b"], Mode::Writeback).unwrap();
    stamp_volumes(&engine, 2);
    engine.close().unwrap();
    drop(engine);
    let mut sb = rig.superblock();
    sb.set_volume_removed(1);
    sb.seal();
    for copy in 0..2u64 {
        rig.cache.write_at(&sb.to_page(), copy * 4096).unwrap();
    }
    rig.cache.flush().unwrap();
    let before = rig.cache.snapshot_current();
    let one = Rig {
        cache: rig.cache.clone(),
        origins: vec![rig.origins[0].clone()],
    };
    let e = refused(one.open());
    assert!(e.contains("dirty block of volume 1"), "{e}");
    assert!(rig.cache.snapshot_current() == before, "nothing written");
}

/// Two removals while served at once (two control connections): never
/// both of the same volume, never every volume. Of two at once in a cache
/// of two volumes, at most one is done and the other volume serves on;
/// of two of one volume, one is done and the other refused.
#[test]
fn removals_at_once_never_take_a_volume_twice_or_every_volume() {
    const MIB: u64 = 1 << 20;
    for round in 0..40 {
        for (first, second) in [(0, 1), (1, 1)] {
            let rig = Rig::new(64, &[MIB, MIB]);
            let engine = rig.create(&["a", "b"], Mode::Writeback).unwrap();
            stamp_volumes(&engine, 2);
            let go = std::sync::Barrier::new(2);
            let done: Vec<bool> = std::thread::scope(|s| {
                let remove = |v: usize| {
                    let (engine, go) = (&engine, &go);
                    s.spawn(move || {
                        go.wait();
                        engine.remove_volume_served(v, &mut |_, _| {}).is_ok()
                    })
                };
                let (x, y) = (remove(first), remove(second));
                vec![x.join().unwrap(), y.join().unwrap()]
            });
            let removed = done.iter().filter(|&&d| d).count();
            let what = format!("round {round}, removals of {first} and {second}: {done:?}");
            assert!(removed <= 1, "{what}");
            if first == second {
                assert_eq!(removed, 1, "{what}");
            }
            let left = engine.status().volumes.len();
            assert_eq!(left, 2 - removed, "{what}");
            let live = engine
                .volumes()
                .into_iter()
                .find(|v| engine.volume_index(&v.0).is_ok());
            let (_, base, _) = live.expect("a volume serves on");
            engine.write(base, &block(0x5A), false).unwrap();
            engine.close().unwrap();
        }
    }
}

/// A process killed after a removal while served, with acknowledged
/// writes to the volumes after the removed one that no commit covered:
/// the next open applies the crash log under the old keys first, then
/// takes the record out and moves those volumes down, so the writes are
/// there, each on its own volume.
#[test]
fn a_killed_process_after_a_served_removal_loses_no_acknowledged_write() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let opts = tiercache::engine::OpenOptions {
        crash_log: Some(dir.path().join("log")),
        ..common::no_bg()
    };
    let rig = Rig::new(64, &[MIB, MIB, MIB]);
    rig.create(&["a", "b", "c"], Mode::Writeback)
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open_volumes(rig.cache.clone(), rig.origin_refs(), &opts).unwrap();
    let bases = stamp_volumes(&engine, 3);
    engine.remove_volume_served(0, &mut |_, _| {}).unwrap();
    // After the removal's commit: only the crash log holds these.
    for k in 4..8u64 {
        engine
            .write(bases[1] + k * BS, &block(0xD0 + k as u8), false)
            .unwrap();
        engine
            .write(bases[2] + k * BS, &block(0xE0 + k as u8), false)
            .unwrap();
    }
    engine.abandon();
    drop(engine);
    let mut killed = rig.killed(4, |v| 4 + v as u64);
    killed.origins.remove(0);
    let engine = killed.open_with(&opts).unwrap();
    assert!(engine.status().stats.crash_log_records_recovered >= 8);
    let names: Vec<String> = engine.volumes().into_iter().map(|v| v.0).collect();
    assert_eq!(names, ["b", "c"]);
    for (i, (first, later)) in [(0xB0u8, 0xD0u8), (0xC0, 0xE0)].into_iter().enumerate() {
        let base = engine.volumes()[i].1;
        for k in 0..3u64 {
            let back = engine.read(base + k * BS, BS).unwrap().to_vec();
            assert_eq!(back, block(first + k as u8), "volume {i} block {k}");
        }
        for k in 4..8u64 {
            let back = engine.read(base + k * BS, BS).unwrap().to_vec();
            assert_eq!(
                back,
                block(later + k as u8),
                "volume {i} block {k}, from the log"
            );
        }
    }
}
