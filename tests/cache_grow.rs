//! A cache device that grew (issue 33): `Engine::grow_cache`, what
//! `tiercache resize --cache` runs, takes the new space while requests
//! run. The data region keeps its place and grows; the two checkpoint
//! areas move past it (format 4, docs/format.md "A cache that grew"). A
//! crash at any write of it opens at one size or the other with every
//! flushed write; a killed process loses no acknowledged write made in the
//! new slots; a device that shrank is refused and nothing changes. The
//! daemon's side: tests/serve_volumes.rs.

mod common;

use common::rig::Rig;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::format::FORMAT_VERSION_GROWN;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::recovery::check;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, Placement, WritebackOrder};

const BS: u64 = 4096;
const ORIGIN_BYTES: u64 = 4 << 20;

/// Block `b`'s data at version `v`.
fn data(b: u64, v: u64) -> Vec<u8> {
    common::stamped(b * 8, 8, v)
}

/// A cache of `slots` blocks over a 4 MiB origin.
fn rig(slots: u64) -> Rig {
    let origin = FaultDevice::from_image("origin", common::initial_origin(ORIGIN_BYTES), 2);
    Rig::over(slots, vec![origin])
}

/// A new cache of one volume (named as `Engine::create` names it).
fn create(rig: &Rig, opts: &CreateOptions) -> Arc<Engine> {
    rig.create_with(&["vol0"], opts).unwrap()
}

/// The cache device grows to hold about `slots` blocks.
fn grow(rig: &Rig, slots: u64) {
    rig.cache.grow(common::cache_bytes_for(slots, BS as u32));
}

fn writeback() -> CreateOptions {
    CreateOptions {
        mode: Mode::Writeback,
        ..Default::default()
    }
}

/// Writes blocks `range` at version `v`, none flushed.
fn write_blocks(engine: &Engine, range: std::ops::Range<u64>, v: u64) {
    for b in range {
        engine.write(b * BS, &data(b, v), false).unwrap();
    }
}

/// Every block of `range` reads back at version `v`.
fn assert_blocks(engine: &Engine, range: std::ops::Range<u64>, v: u64, what: &str) {
    for b in range {
        let back = engine.read(b * BS, BS).unwrap();
        assert!(back[..] == data(b, v)[..], "{what}: block {b}");
    }
}

/// A cache of 64 blocks, 40 of them dirty, grows to about 256 while a
/// thread keeps writing; afterwards 200 dirty blocks fit (the new slots are
/// used), every write reads back, and the grown layout (format 4) opens
/// again with the same blocks. A second growth, from a grown layout, works
/// too, and `check` finds nothing wrong.
#[test]
fn a_cache_device_that_grew_is_taken_online_beside_a_writer() {
    let rig = rig(64);
    let engine = create(&rig, &writeback());
    write_blocks(&engine, 0..40, 1);
    let before = engine.status().cache_blocks_total;
    grow(&rig, 256);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n < 50 {
                let b = 600 + n % 20;
                engine.write(b * BS, &data(b, 2 + n / 20), false).unwrap();
                n += 1;
            }
            n
        });
        let (was, now) = engine.grow_cache().unwrap();
        stop.store(true, Ordering::Relaxed);
        let n = writer.join().unwrap();
        assert_eq!(was, before);
        assert!(now > 240, "grew to {now} blocks");
        // The writer's last version of each of its blocks.
        for b in 600..620u64 {
            let last = (b - 600..n).step_by(20).last().unwrap();
            assert_blocks(&engine, b..b + 1, 2 + last / 20, "the writer's");
        }
    });
    write_blocks(&engine, 40..200, 1);
    let st = engine.status();
    assert!(st.cache_blocks_total > 240);
    assert!(
        st.cache_blocks_dirty >= 200,
        "{} dirty",
        st.cache_blocks_dirty
    );
    assert_blocks(&engine, 0..200, 1, "after the grow");
    engine.close().unwrap();
    drop(engine);
    assert_eq!(rig.superblock().version.get(), FORMAT_VERSION_GROWN);
    let report = check(&(rig.cache.clone() as DeviceRef), None);
    assert!(report.ok, "{:?}", report.findings);
    assert_eq!(report.format_version, Some(FORMAT_VERSION_GROWN));
    assert_eq!(report.cache_blocks_total, st.cache_blocks_total);
    let engine = rig.open().unwrap();
    assert_eq!(engine.status().cache_blocks_total, st.cache_blocks_total);
    assert_blocks(&engine, 0..200, 1, "reopened");
    // Grown again, from the grown layout.
    grow(&rig, 1024);
    let (was, now) = engine.grow_cache().unwrap();
    assert_eq!(was, st.cache_blocks_total);
    assert!(now > 1000, "grew to {now}");
    write_blocks(&engine, 200..900, 3);
    engine.close().unwrap();
    drop(engine);
    let engine = rig.open().unwrap();
    assert_blocks(&engine, 0..200, 1, "grown twice");
    assert_blocks(&engine, 200..900, 3, "grown twice");
    // Unchanged: nothing to take.
    assert_eq!(engine.grow_cache().unwrap(), (now, now));
}

/// Power lost at each write of a grow (and after its last): the cache
/// opens with the slots of before or of after, never in between, with
/// every flushed write; the new slots then take writes, and the grow run
/// again finishes.
#[test]
fn a_power_loss_at_every_write_of_a_cache_grow_opens_at_one_size_or_the_other() {
    let base = rig(64);
    let engine = create(&base, &writeback());
    write_blocks(&engine, 0..30, 1);
    engine.flush().unwrap();
    let before = engine.status().cache_blocks_total;
    engine.close().unwrap();
    drop(engine);
    grow(&base, 256);
    for n in 1.. {
        let switch = CrashSwitch::new();
        let rig = base.under(&switch, |_| 2);
        let engine = rig.open().unwrap();
        write_blocks(&engine, 30..40, 2);
        engine.flush().unwrap();
        switch.arm_after_writes(n);
        let grown = engine.grow_cache();
        let finished = !switch.is_tripped();
        assert!(grown.is_ok() || !finished, "{grown:?}");
        engine.abandon();
        drop(engine);
        let lost = rig.power_lost(3, |_| 4);
        let engine = lost.open().unwrap();
        let total = engine.status().cache_blocks_total;
        let after = grown.as_ref().map_or(0, |g| g.1);
        assert!(
            total == before || total > 240,
            "crash after {n} writes: {total} blocks"
        );
        assert!(
            !finished || total == after,
            "{total} blocks after a whole grow"
        );
        assert_blocks(&engine, 0..30, 1, &format!("crash after {n} writes"));
        assert_blocks(&engine, 30..40, 2, &format!("crash after {n} writes"));
        if total == before {
            engine.grow_cache().unwrap();
        }
        write_blocks(&engine, 40..200, 3);
        engine.flush().unwrap();
        assert_blocks(&engine, 40..200, 3, &format!("crash after {n} writes"));
        assert!(engine.status().cache_blocks_dirty >= 200);
        if finished {
            assert!(n > 3, "a grow writes a checkpoint and the superblock twice");
            eprintln!(
                "cache grow: power lost at each of its {} writes, and after",
                n - 1
            );
            return;
        }
    }
}

/// A process killed after a grow, with acknowledged writes in the new
/// slots that no commit covered yet, loses none of them: the crash log
/// (which a grow keeps, its slot count following) brings them back.
#[test]
fn a_killed_process_after_a_grow_loses_no_acknowledged_write_in_the_new_slots() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let rig = rig(64);
    create(&rig, &writeback()).close().unwrap();
    let opts = logged(&log);
    let engine = rig.open_with(&opts).unwrap();
    write_blocks(&engine, 0..60, 1);
    grow(&rig, 256);
    engine.grow_cache().unwrap();
    // Past the old 64 slots: these take new ones; no flush, no commit.
    write_blocks(&engine, 60..180, 2);
    engine.abandon();
    drop(engine);
    let killed = rig.killed(5, |_| 6);
    let engine = killed.open_with(&opts).unwrap();
    assert!(engine.status().stats.crash_log_records_recovered >= 120);
    assert_blocks(&engine, 0..60, 1, "killed after the grow");
    assert_blocks(&engine, 60..180, 2, "killed after the grow");
}

fn logged(log: &Path) -> OpenOptions {
    OpenOptions {
        crash_log: Some(log.to_path_buf()),
        ..common::no_bg()
    }
}

/// Each placement, writeback order and policy grows: the log placement's
/// segments take the new slots (those completing its last segment and
/// whole new ones), and flush order writes its closed groups back first
/// (a checkpoint keeps none), as close does.
#[test]
fn every_placement_order_and_policy_grows() {
    let cases = [
        (Placement::Log, WritebackOrder::Address, PolicyKind::S3Fifo),
        (Placement::InPlace, WritebackOrder::Flush, PolicyKind::Lru),
        (Placement::Log, WritebackOrder::Flush, PolicyKind::Fifo),
    ];
    for (placement, order, policy) in cases {
        let what = format!("{placement:?} {order:?} {policy:?}");
        let rig = rig(100);
        let engine = create(
            &rig,
            &CreateOptions {
                placement,
                writeback_order: order,
                policy,
                ..writeback()
            },
        );
        write_blocks(&engine, 0..50, 1);
        engine.flush().unwrap();
        write_blocks(&engine, 0..20, 2);
        grow(&rig, 700);
        let (was, now) = engine
            .grow_cache()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(now > was + 500, "{what}: {was} -> {now}");
        write_blocks(&engine, 50..600, 3);
        assert_blocks(&engine, 0..20, 2, &what);
        assert_blocks(&engine, 20..50, 1, &what);
        assert_blocks(&engine, 50..600, 3, &what);
        engine.flush().unwrap();
        assert!(engine.status().cache_blocks_used >= 550, "{what}");
        engine.close().unwrap();
        drop(engine);
        let engine = rig.open().unwrap();
        assert_blocks(&engine, 50..600, 3, &what);
        engine.close().unwrap();
    }
}

/// Flush order with closed groups waiting for the origin: the grow writes
/// them back first (a checkpoint cannot keep them), in their order.
#[test]
fn flush_order_writes_its_closed_groups_back_before_it_grows() {
    let rig = rig(64);
    let engine = create(
        &rig,
        &CreateOptions {
            writeback_order: WritebackOrder::Flush,
            ..writeback()
        },
    );
    write_blocks(&engine, 0..10, 1);
    engine.flush().unwrap(); // closes the group; nothing written back
    write_blocks(&engine, 5..15, 2);
    engine.flush().unwrap();
    assert!(engine.status().cache_blocks_dirty >= 15);
    grow(&rig, 256);
    let (_, now) = engine.grow_cache().unwrap();
    assert!(now > 240);
    // The groups reached the origin before the grow's checkpoint.
    for b in 0..15 {
        let mut on_origin = vec![0u8; BS as usize];
        rig.origins[0].read_at(&mut on_origin, b * BS).unwrap();
        assert!(
            on_origin == data(b, if b < 5 { 1 } else { 2 }),
            "block {b} on the origin"
        );
    }
    assert_blocks(&engine, 0..5, 1, "flush order");
    assert_blocks(&engine, 5..15, 2, "flush order");
}

/// A cache device that shrank (a file truncated, a partition cut) is
/// refused by name, and the cache keeps serving every block it had below
/// the cut (a truncated file's tail is gone with it: the blocks here sit
/// lower); given its size back and resized again, it grows as usual. A device that grew by less than a
/// block past the moved checkpoint areas is refused with the size it needs.
/// A cache device whose size is read by two callers at a time: each
/// `refresh_size` waits (2 s at most) until as many have arrived as the
/// round expects, so two grows both read the old size before either
/// takes the commit lock.
struct Meeting {
    inner: Arc<FaultDevice>,
    arrived: std::sync::atomic::AtomicU64,
    expected: std::sync::atomic::AtomicU64,
}

impl BlockDevice for Meeting {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> tiercache::device::DeviceResult<()> {
        self.inner.flush()
    }
    fn refresh_size(&self) -> tiercache::device::DeviceResult<u64> {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.arrived.load(Ordering::Acquire) < self.expected.load(Ordering::Acquire)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.inner.refresh_size()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}

/// Two `resize --cache` at once (two control connections): both read the
/// superblock's size and the device's before either grows the cache
/// (`Meeting`), one grows it, and the other finds the size taken when it
/// gets the commit lock. Before, the second failed with "too few for one
/// more block" for a cache that had just grown; now both succeed and agree
/// on the size.
#[test]
fn two_grows_at_once_both_succeed_and_agree() {
    let bytes = common::cache_bytes_for(64, BS as u32);
    let inner = Arc::new(FaultDevice::new("cache", bytes, 1));
    let meeting = Arc::new(Meeting {
        inner: inner.clone(),
        arrived: Default::default(),
        expected: Default::default(),
    });
    let origin: DeviceRef = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(ORIGIN_BYTES),
        2,
    ));
    let engine =
        Engine::create_with(meeting.clone(), origin, &writeback(), &common::no_bg()).unwrap();
    write_blocks(&engine, 0..40, 1);
    for round in 1..=5u64 {
        inner.grow(common::cache_bytes_for(64 + round * 32, BS as u32));
        let before = engine.status().cache_blocks_total;
        let arrived = meeting.arrived.load(Ordering::Acquire);
        meeting.expected.store(arrived + 2, Ordering::Release);
        let results: Vec<_> = std::thread::scope(|s| {
            let calls: Vec<_> = (0..2).map(|_| s.spawn(|| engine.grow_cache())).collect();
            calls.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let total = engine.status().cache_blocks_total;
        assert!(total > before, "round {round}: {before} -> {total} blocks");
        for r in &results {
            let (_, now) = r.as_ref().unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(*now, total, "round {round}: {results:?}");
        }
    }
    assert_blocks(&engine, 0..40, 1, "after the grows");
    engine.close().unwrap();
}

#[test]
fn a_shrunk_cache_device_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.img");
    let bytes = common::cache_bytes_for(64, BS as u32);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    let open = || tiercache::device::open_device(path.to_str().unwrap()).unwrap();
    let origin: DeviceRef = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(ORIGIN_BYTES),
        2,
    ));
    let engine =
        Engine::create_with(open(), origin.clone(), &writeback(), &common::no_bg()).unwrap();
    write_blocks(&engine, 0..40, 1);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(bytes - 64 * 1024).unwrap();
    let e = engine.grow_cache().unwrap_err().to_string();
    assert!(e.contains("shrank") && e.contains("never shrinks"), "{e}");
    file.set_len(bytes).unwrap();
    let same = engine.status().cache_blocks_total;
    assert_eq!(engine.grow_cache().unwrap(), (same, same));
    assert_blocks(&engine, 0..40, 1, "after the refusal");
    file.set_len(bytes + BS).unwrap();
    let e = engine.grow_cache().unwrap_err().to_string();
    assert!(e.contains("too few for one more block"), "{e}");
    file.set_len(bytes + (2 << 20)).unwrap();
    let (was, now) = engine.grow_cache().unwrap();
    assert!(now > was + 400, "{was} -> {now}");
    engine.close().unwrap();
    drop(engine);
    let engine = Engine::open(open(), origin, &common::no_bg()).unwrap();
    assert_blocks(&engine, 0..40, 1, "reopened");
}
