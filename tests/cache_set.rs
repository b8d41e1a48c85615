//! Several cache devices as one (device/set/): dirty data and metadata on
//! two copies, clean data on every member's capacity, a member lost while
//! serving, a replacement rebuilt online, a stale member never read, a set
//! that lost a member coming back by itself after a kill, and a member
//! that returns garbage failed past 10 checksum errors.

mod common;
#[path = "common/servers.rs"]
mod servers;

use std::sync::Arc;

use common::{fault_dev, no_bg, seed, stamped, SectorModel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::fault::FaultDevice;
use tiercache::device::set::health::CHECKSUM_WINDOW;
use tiercache::device::set::{CacheSet, MemberState};
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, WritebackSettings};

const BS: u32 = 4096;
const ORIGIN_BYTES: u64 = 8 << 20;
const MEMBER_BYTES: u64 = 4 << 20;

struct Rig {
    members: Vec<Arc<FaultDevice>>,
    origin: Arc<FaultDevice>,
}

impl Rig {
    fn new(n: usize, seed: u64) -> Rig {
        let members = (0..n)
            .map(|i| fault_dev(&format!("member{i}"), MEMBER_BYTES, seed + i as u64).0)
            .collect();
        let (origin, _) = fault_dev("origin", ORIGIN_BYTES, seed + 100);
        origin
            .write_at(&common::initial_origin(ORIGIN_BYTES), 0)
            .unwrap();
        origin.flush().unwrap();
        Rig { members, origin }
    }

    fn refs(&self) -> Vec<DeviceRef> {
        self.members
            .iter()
            .map(|m| m.clone() as DeviceRef)
            .collect()
    }

    fn create(&self, mode: Mode) -> Arc<Engine> {
        let bytes: Vec<u64> = self.members.iter().map(|m| m.size_bytes()).collect();
        let g = Layout::set_geometry(&bytes, BS, 50).unwrap();
        let set: DeviceRef = Arc::new(CacheSet::format(self.refs(), g, 0x5e7).unwrap());
        let opts = CreateOptions {
            mode,
            block_bytes: BS,
            writeback: WritebackSettings {
                high_pct: 90,
                low_pct: 80,
                max_age_secs: 3600,
                idle_secs: 0,
            },
            ..Default::default()
        };
        Engine::create_with(set, self.origin.clone(), &opts, &no_bg()).unwrap()
    }

    fn open(&self, devs: Vec<DeviceRef>, allow_missing: bool) -> Result<Arc<Engine>, String> {
        let set = CacheSet::open(devs, allow_missing).map_err(|e| e.to_string())?;
        Engine::open(Arc::new(set), self.origin.clone(), &no_bg()).map_err(|e| e.to_string())
    }
}

fn set_of(engine: &Engine) -> &CacheSet {
    (engine.cache_device().members().expect("a set").as_any())
        .downcast_ref::<CacheSet>()
        .expect("a cache set")
}

/// Random stamped writes of 1..16 sectors, and reads checked against the
/// model, `ops` of them.
fn workload(engine: &Engine, model: &mut SectorModel, rng: &mut ChaCha8Rng, ops: usize) {
    let sectors = ORIGIN_BYTES / 512;
    for _ in 0..ops {
        let n = rng.gen_range(1..=16u64);
        let first = rng.gen_range(0..sectors - n);
        if rng.gen_bool(0.5) {
            let v = model.issue_write(first, n);
            engine
                .write(first * 512, &stamped(first, n, v), false)
                .unwrap();
            model.fua_done(v);
        } else {
            let data = engine.read(first * 512, n * 512).unwrap();
            for k in 0..n as usize {
                model
                    .check_sector(first + k as u64, &data[k * 512..(k + 1) * 512])
                    .unwrap();
            }
        }
    }
}

fn verify_all(engine: &Engine, model: &SectorModel) {
    let v = common::read_volume(engine).unwrap();
    model.verify(&v).unwrap();
}

#[test]
fn clean_data_uses_every_member_and_dirty_data_is_mirrored() {
    let rig = Rig::new(2, seed());
    let engine = rig.create(Mode::Writeback);
    let set = set_of(&engine);
    let single = Layout::compute(MEMBER_BYTES, BS).unwrap().slot_count;
    let status = engine.status();
    assert!(
        status.cache_blocks_total > single * 14 / 10,
        "two members hold {} blocks, one alone {single}",
        status.cache_blocks_total
    );
    // Read the whole origin: every block is promoted, clean.
    common::read_volume(&engine).unwrap();
    let used = engine.status().cache_blocks_used;
    assert!(
        used > single,
        "{used} clean blocks cached, one device holds {single}"
    );
    // Dirty data: on both members (mirrored slots), nowhere else.
    let writes_before: Vec<u64> = rig.members.iter().map(|m| m.writes()).collect();
    engine.write(0, &stamped(0, 8, 1), true).unwrap();
    for (i, m) in rig.members.iter().enumerate() {
        assert!(m.writes() > writes_before[i], "member {i} got no copy");
    }
    assert_eq!(set.members().len(), 2);
    engine.close().unwrap();
}

/// A member fails while serving (every I/O errors): nothing acknowledged
/// is lost, reads stay correct, clean blocks it held come from the origin,
/// and after a restart without it the set opens degraded with the data.
#[test]
fn losing_either_member_loses_nothing() {
    for lost in 0..2 {
        let s = seed() + lost as u64;
        let rig = Rig::new(2, s);
        let engine = rig.create(Mode::Writeback);
        let mut model = SectorModel::new(ORIGIN_BYTES / 512);
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        workload(&engine, &mut model, &mut rng, 400);
        engine.flush().unwrap();
        model.flush_done();
        rig.members[lost].fail_after_ops(0);
        workload(&engine, &mut model, &mut rng, 400);
        verify_all(&engine, &model);
        engine.flush().unwrap();
        model.flush_done();
        engine.background_tick();
        let st = &set_of(&engine).members()[lost];
        assert_eq!(st.state, MemberState::Failed, "seed {s}: member {lost}");
        assert!(set_of(&engine).degraded());
        engine.close().unwrap();
        drop(engine);
        // Restart without the lost member: the survivor's label names it
        // failed, so no --degraded is needed.
        let survivor: DeviceRef = rig.members[1 - lost].clone();
        let engine = rig.open(vec![survivor], false).unwrap();
        assert!(set_of(&engine).degraded());
        verify_all(&engine, &model);
        workload(&engine, &mut model, &mut rng, 200);
        verify_all(&engine, &model);
        engine.close().unwrap();
    }
}

/// A member that failed and comes back (its device readable again) is
/// never read: the other member's label names it stale.
#[test]
fn a_member_that_failed_is_not_trusted_when_it_returns() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    workload(&engine, &mut model, &mut rng, 200);
    rig.members[1].fail_after_ops(0);
    workload(&engine, &mut model, &mut rng, 400);
    engine.flush().unwrap();
    model.flush_done();
    engine.close().unwrap();
    drop(engine);
    rig.members[1].clear_faults();
    let engine = rig.open(rig.refs(), false).unwrap();
    assert_eq!(set_of(&engine).members()[1].state, MemberState::Failed);
    verify_all(&engine, &model);
    // Member 0 lost now too would lose everything: the stale member must
    // not be taken for a copy.
    engine.close().unwrap();
}

/// `replace` rebuilds a failed member onto a new device while writes go on;
/// then the other original member can be lost.
#[test]
fn a_replacement_is_rebuilt_online_and_then_carries_the_set() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    workload(&engine, &mut model, &mut rng, 300);
    rig.members[0].fail_after_ops(0);
    workload(&engine, &mut model, &mut rng, 100);
    let (fresh, fresh_ref) = fault_dev("member0-new", MEMBER_BYTES, s + 7);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut model, mut rng) = std::thread::scope(|sc| {
        let e = engine.clone();
        let stop = &stop;
        let writer = sc.spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                workload(&e, &mut model, &mut rng, 20);
            }
            (model, rng)
        });
        let mut calls = 0;
        set_of(&engine)
            .replace(0, fresh_ref, |_, _| calls += 1)
            .unwrap();
        assert!(calls > 0);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap()
    });
    engine.background_tick();
    assert!(!set_of(&engine).degraded());
    assert_eq!(set_of(&engine).members()[0].state, MemberState::Healthy);
    workload(&engine, &mut model, &mut rng, 100);
    engine.flush().unwrap();
    model.flush_done();
    // Now lose the original member 1: the rebuilt copy carries everything.
    rig.members[1].fail_after_ops(0);
    verify_all(&engine, &model);
    workload(&engine, &mut model, &mut rng, 200);
    verify_all(&engine, &model);
    engine.flush().unwrap();
    model.flush_done();
    engine.close().unwrap();
    drop(engine);
    let engine = rig.open(vec![fresh.clone() as DeviceRef], true).unwrap();
    verify_all(&engine, &model);
    engine.close().unwrap();
}

/// A member missing at open that nothing says failed may hold the only
/// current copy: opening without it takes the operator's word.
#[test]
fn a_missing_healthy_member_needs_degraded() {
    let rig = Rig::new(2, seed());
    let engine = rig.create(Mode::Writeback);
    engine.write(0, &stamped(0, 8, 1), true).unwrap();
    engine.close().unwrap();
    drop(engine);
    let one: DeviceRef = rig.members[0].clone();
    let refused = rig.open(vec![one.clone()], false).err().unwrap();
    assert!(refused.contains("--degraded"), "{refused}");
    let engine = rig.open(vec![one], true).unwrap();
    assert!(set_of(&engine).degraded());
    assert_eq!(&engine.read(0, 4096).unwrap()[..], &stamped(0, 8, 1)[..]);
    engine.close().unwrap();
}

#[test]
fn members_of_another_set_or_given_twice_are_refused() {
    let a = Rig::new(2, seed());
    let b = Rig::new(2, seed() + 10);
    drop(a.create(Mode::Writeback));
    let bytes = vec![MEMBER_BYTES; 2];
    let g = Layout::set_geometry(&bytes, BS, 50).unwrap();
    CacheSet::format(b.refs(), g, 0xbbb).unwrap();
    let mixed = vec![a.members[0].clone() as DeviceRef, b.members[1].clone()];
    let e = CacheSet::open(mixed, false).err().unwrap().to_string();
    assert!(e.contains("another cache set"), "{e}");
    let twice = vec![a.members[0].clone() as DeviceRef, a.members[0].clone()];
    let e = CacheSet::open(twice, false).err().unwrap().to_string();
    assert!(e.contains("given twice"), "{e}");
    let plain: DeviceRef = fault_dev("plain", MEMBER_BYTES, 1).1;
    let e = CacheSet::open(vec![plain], false)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a cache-set member"), "{e}");
    let _ = OpenOptions::default();
}

/// Garbage on one member (every mirrored block of member 0 overwritten,
/// then every one of member 1) is caught by the blocks' checksums and
/// served and repaired from the other copy; garbage in a member's own
/// (clean) blocks is caught and read from the origin.
#[test]
fn damaged_data_on_a_member_is_caught_and_repaired() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let set = set_of(&engine);
    // Repair alone: the rule that fails a member past 10 checksum errors
    // is off here (`a_member_that_returns_garbage_is_failed_and_shown`).
    set.set_checksum_limit(0, CHECKSUM_WINDOW);
    let g = set.geometry().clone();
    let bs = BS as u64;
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    // Whole, aligned blocks: their sums are known.
    for _ in 0..300 {
        let block = rng.gen_range(0..ORIGIN_BYTES / bs);
        let first = block * bs / 512;
        let v = model.issue_write(first, bs / 512);
        engine
            .write(block * bs, &stamped(first, bs / 512, v), false)
            .unwrap();
        model.fua_done(v);
    }
    let garbage = |m: &FaultDevice, from: u64, len: u64| {
        let junk: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8 ^ 0x5a).collect();
        m.write_at(&junk, from).unwrap();
    };
    let mirror_at = tiercache::device::set::LABEL_BYTES + g.meta_bytes;
    garbage(&rig.members[0], mirror_at, g.mirror_slots * bs);
    // Each block twice: reads of a mirrored block alternate between its
    // copies, so each copy is read once.
    let every_block_twice = |engine: &Engine| {
        for block in 0..ORIGIN_BYTES / bs {
            for _ in 0..2 {
                let data = engine.read(block * bs, bs).unwrap();
                for k in 0..(bs / 512) as usize {
                    let sector = block * bs / 512 + k as u64;
                    model
                        .check_sector(sector, &data[k * 512..(k + 1) * 512])
                        .unwrap();
                }
            }
        }
    };
    every_block_twice(&engine);
    let bad0 = set.members()[0].bad_blocks;
    assert!(
        bad0 > 0,
        "seed {s}: no damaged block was caught on member 0"
    );
    // Member 0's copies were repaired: now damage member 1's.
    garbage(&rig.members[1], mirror_at, g.mirror_slots * bs);
    every_block_twice(&engine);
    assert!(set.members()[1].bad_blocks > 0, "seed {s}");
    // Clean blocks in the members' own slots: one copy; the origin has it.
    engine.flush().unwrap();
    model.flush_done();
    engine.write_back_all(&mut |_, _| {}).unwrap();
    verify_all(&engine, &model);
    for (i, m) in rig.members.iter().enumerate() {
        let own_at = mirror_at + g.member_mirror_slots(i) * bs;
        garbage(m, own_at, g.stripe_slots[i] * bs);
    }
    verify_all(&engine, &model);
    assert_eq!(engine.status().stats.origin_errors, 0);
    engine.close().unwrap();
}

/// One member's whole metadata copy (superblocks, journal, checkpoints)
/// overwritten with garbage after a crash: the set reads the other's intact
/// pages, the cache opens with everything acknowledged, and the damaged
/// copy is repaired (the superblocks and journal at open, checkpoint pages
/// when read); then the repaired member alone carries the cache.
#[test]
fn damaged_metadata_on_a_member_is_read_from_the_other() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let g = set_of(&engine).geometry().clone();
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    workload(&engine, &mut model, &mut rng, 300);
    engine.flush().unwrap();
    model.flush_done();
    // No close: the next open replays the journal.
    drop(engine);
    for (victim, keep) in [(0usize, 1usize), (1, 0)] {
        let junk: Vec<u8> = (0..g.meta_bytes).map(|i| (i * 7 % 253) as u8).collect();
        rig.members[victim]
            .write_at(&junk, tiercache::device::set::LABEL_BYTES)
            .unwrap();
        let engine = rig.open(rig.refs(), false).unwrap();
        verify_all(&engine, &model);
        let st = &set_of(&engine).members()[victim];
        assert!(st.bad_blocks > 0, "seed {s}: member {victim}: {st:?}");
        // After a crash the copies may differ by a commit: the damage is
        // repaired and counted, not held against the member.
        assert_eq!(st.state, MemberState::Healthy, "seed {s}: {st:?}");
        assert_eq!(set_of(&engine).members()[keep].bad_blocks, 0);
        workload(&engine, &mut model, &mut rng, 100);
        engine.flush().unwrap();
        model.flush_done();
        drop(engine);
    }
    // Member 1's copy was damaged last: lose member 0 now and open from
    // the repaired member 1 alone (the checkpoint areas were rewritten by
    // the opens since).
    let engine = rig
        .open(vec![rig.members[1].clone() as DeviceRef], true)
        .unwrap();
    verify_all(&engine, &model);
    engine.close().unwrap();
}

/// Threads writing and reading back their own regions (as fio verify does)
/// while a member fails: no read or write sees an error, and every block
/// reads back what was last written to it.
#[test]
fn a_member_failing_under_concurrent_writers_is_invisible() {
    for lost in 0..2usize {
        let s = seed() + lost as u64;
        let rig = Rig::new(2, s);
        let engine = rig.create(Mode::Writeback);
        engine
            .set_writeback(WritebackSettings {
                high_pct: 40,
                low_pct: 20,
                max_age_secs: 1,
                idle_secs: 0,
            })
            .unwrap();
        let threads = 4u64;
        let region = ORIGIN_BYTES / threads;
        let bs = BS as u64;
        let failed = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            for t in 0..threads {
                let engine = &engine;
                let failed = &failed;
                sc.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(s ^ ((t + 1) * 0x9e37));
                    let blocks = region / bs;
                    let mut latest = vec![0u64; blocks as usize];
                    for op in 0..3000u64 {
                        let b = rng.gen_range(0..blocks);
                        let at = t * region + b * bs;
                        let first = at / 512;
                        if rng.gen_bool(0.6) {
                            let v = op + 1;
                            engine
                                .write(at, &stamped(first, bs / 512, v), false)
                                .unwrap_or_else(|e| panic!("seed {s}: write {at}: {e}"));
                            latest[b as usize] = v;
                        } else {
                            let data = engine.read(at, bs).unwrap_or_else(|e| {
                                panic!("seed {s}: read {at}: {e} (failed: {failed:?})")
                            });
                            let want = stamped(first, bs / 512, latest[b as usize]);
                            if latest[b as usize] > 0 {
                                assert!(data[..] == want[..], "seed {s}: block at {at} is wrong");
                            }
                        }
                        if op % 500 == 0 {
                            engine.background_tick();
                        }
                    }
                });
            }
            sc.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(150));
                rig.members[lost].fail_after_ops(0);
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            });
        });
        assert!(set_of(&engine).degraded(), "seed {s}");
        engine.close().unwrap();
    }
}

/// The metrics and the dashboard's snapshot show each member: state, used
/// and dirty blocks, errors; and the dirty blocks at risk once degraded.
#[test]
fn metrics_and_the_snapshot_show_each_member() {
    let rig = Rig::new(2, seed());
    let engine = rig.create(Mode::Writeback);
    engine.write(0, &stamped(0, 64, 1), false).unwrap();
    rig.members[1].fail_after_ops(0);
    engine.write(8192, &stamped(16, 8, 2), false).unwrap();
    let monitor = tiercache::monitor::Monitor::new(&engine, "set");
    let taken = monitor.take_now().unwrap();
    let text = taken.metrics_text();
    for want in [
        "tiercache_cache_member_healthy{cache=\"set\",member=\"0\",device=\"member0\"} 1.0",
        "tiercache_cache_member_failed{cache=\"set\",member=\"1\",device=\"member1\"} 1.0",
        "tiercache_cache_member_dirty_blocks{cache=\"set\",member=\"0\",device=\"member0\"} 8.0",
        "tiercache_dirty_at_risk_blocks{cache=\"set\"} 8.0",
    ] {
        assert!(text.contains(want), "no `{want}` in the metrics:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(taken.json_text()).unwrap();
    let members = &json["status"]["cache_members"];
    assert_eq!(members[1]["state"], "failed", "{members}");
    assert!(
        members[1]["failure"]
            .as_str()
            .is_some_and(|w| !w.is_empty()),
        "{members}"
    );
    assert_eq!(members[0]["checksum_errors_recent"], 0, "{members}");
    assert_eq!(members[0]["failure"], serde_json::Value::Null, "{members}");
    assert_eq!(json["status"]["cache_set_state"], "degraded");
    engine.close().unwrap();
}

/// Members that are files: the two copies of a mirrored write go down in
/// one io_uring submission (`FileDevice::write_pair`; a helper thread
/// where io_uring is off). Concurrent writers, then every block checked,
/// both members' metadata and mirrored slots byte for byte equal, and the
/// set reopened from either member alone holds every write.
#[test]
fn file_members_get_both_copies_of_every_mirrored_write() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<String> = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("member{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(MEMBER_BYTES)
                .unwrap();
            p.to_str().unwrap().to_string()
        })
        .collect();
    let open_members = || -> Vec<DeviceRef> {
        paths
            .iter()
            .map(|p| tiercache::device::open_device(p).unwrap())
            .collect()
    };
    let (origin, _) = fault_dev("origin", ORIGIN_BYTES, 5);
    origin
        .write_at(&common::initial_origin(ORIGIN_BYTES), 0)
        .unwrap();
    let bytes = vec![MEMBER_BYTES; 2];
    // Every slot mirrored: every write is a pair.
    let g = Layout::set_geometry(&bytes, BS, 100).unwrap();
    let set: DeviceRef = Arc::new(CacheSet::format(open_members(), g, 0xf11e).unwrap());
    let opts = CreateOptions {
        mode: Mode::Writeback,
        block_bytes: BS,
        writeback: WritebackSettings {
            high_pct: 95,
            low_pct: 90,
            max_age_secs: 3600,
            idle_secs: 0,
        },
        ..Default::default()
    };
    let engine = Engine::create_with(set, origin.clone(), &opts, &no_bg()).unwrap();
    // Four writers on disjoint quarters, each with its own model slice.
    let quarter = ORIGIN_BYTES / 4;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let engine = &engine;
            s.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t);
                for i in 0..400u64 {
                    let n = rng.gen_range(1..=16u64);
                    let first = t * quarter / 512 + rng.gen_range(0..quarter / 512 - n);
                    engine
                        .write(first * 512, &stamped(first, n, 1 + i), false)
                        .unwrap();
                }
            });
        }
    });
    let before = common::read_volume(&engine).unwrap();
    let writes: Vec<u64> = set_of(&engine).members().iter().map(|m| m.writes).collect();
    assert!(writes.iter().all(|&w| w > 400), "member writes {writes:?}");
    engine.close().unwrap();
    drop(engine);
    // The copies agree: the mirrored region (every slot here) and the
    // metadata are the same bytes on both members, past their labels.
    let images: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let from = tiercache::device::set::LABEL_BYTES as usize;
    assert!(
        images[0][from..] == images[1][from..],
        "the members' copies differ"
    );
    // Either member alone (the other missing) holds every write.
    for (keep, path) in paths.iter().enumerate() {
        let member = tiercache::device::open_device(path).unwrap();
        let set = CacheSet::open(vec![member], true).unwrap();
        let engine = Engine::open(Arc::new(set), origin.clone(), &no_bg()).unwrap();
        assert_eq!(
            common::read_volume(&engine).unwrap(),
            before,
            "member {keep} alone"
        );
        engine.abandon();
    }
}

/// A member that disappears while serving: its NBD server (nbdkit) is
/// killed, so its connections drop and every request to it fails at once.
/// Nothing acknowledged is lost, reads stay correct, the set names the
/// member failed, and the survivor alone reopens with every write.
#[test]
fn a_member_that_disappears_while_serving_loses_nothing() {
    let s = seed();
    let mut servers: Vec<servers::Server> = (0..2)
        .map(|_| servers::nbdkit_unix(&["memory", &MEMBER_BYTES.to_string()]))
        .collect();
    let members: Vec<DeviceRef> = servers
        .iter()
        .map(|srv| tiercache::device::open_device(&srv.uri).unwrap())
        .collect();
    let rig = Rig::new(0, s);
    let bytes = vec![MEMBER_BYTES; 2];
    let g = Layout::set_geometry(&bytes, BS, 50).unwrap();
    let set: DeviceRef = Arc::new(CacheSet::format(members.clone(), g, 0xd15a).unwrap());
    let opts = CreateOptions {
        mode: Mode::Writeback,
        block_bytes: BS,
        writeback: WritebackSettings {
            high_pct: 90,
            low_pct: 80,
            max_age_secs: 3600,
            idle_secs: 0,
        },
        ..Default::default()
    };
    let engine = Engine::create_with(set, rig.origin.clone(), &opts, &no_bg()).unwrap();
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    workload(&engine, &mut model, &mut rng, 300);
    engine.flush().unwrap();
    model.flush_done();
    // Member 1's server goes away.
    servers[1].kill();
    workload(&engine, &mut model, &mut rng, 300);
    verify_all(&engine, &model);
    engine.flush().unwrap();
    model.flush_done();
    let st = &set_of(&engine).members()[1];
    assert_eq!(st.state, MemberState::Failed, "seed {s}: {st:?}");
    assert!(st.errors > 0, "seed {s}: {st:?}");
    assert_eq!(set_of(&engine).state_name(), "degraded");
    engine.close().unwrap();
    drop(engine);
    // The survivor alone: its label names member 1 failed.
    let survivor = tiercache::device::open_device(&servers[0].uri).unwrap();
    let engine = rig.open(vec![survivor], false).unwrap();
    verify_all(&engine, &model);
    engine.close().unwrap();
}

/// A member device that fails every request once told to: dm-error loaded
/// under a live member, as in the guest test.
struct Switchable {
    inner: DeviceRef,
    failing: std::sync::atomic::AtomicBool,
}

impl Switchable {
    fn new(inner: DeviceRef, failing: bool) -> Arc<Switchable> {
        Arc::new(Switchable {
            inner,
            failing: std::sync::atomic::AtomicBool::new(failing),
        })
    }
    fn fail(&self) {
        self.failing
            .store(true, std::sync::atomic::Ordering::Release);
    }
    fn check(&self, what: &'static str) -> tiercache::device::DeviceResult<()> {
        if !self.failing.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        Err(tiercache::device::DeviceError::Io {
            device: self.inner.name().to_string(),
            what,
            source: std::io::Error::from_raw_os_error(5),
        })
    }
}

impl BlockDevice for Switchable {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.check("read")?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.check("write")?;
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> tiercache::device::DeviceResult<()> {
        self.check("flush")?;
        self.inner.flush()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn identity(&self) -> u64 {
        self.inner.identity()
    }
}

/// How a member that failed while serving is found at the next open.
#[derive(Clone, Copy, Debug)]
enum Gone {
    /// Its device node is gone (ENOENT).
    Removed,
    /// Opening it fails, as a block device under dm-error does ("first
    /// read failed: Input/output error").
    OpenFails,
    /// It opens, but every read fails: its label cannot be read.
    ReadFails,
}

/// A cache set on member files, opened by path as the daemon opens it
/// (`open_paths`), with the crash log a killed daemon leaves behind.
struct FileSet {
    dir: tempfile::TempDir,
    paths: Vec<String>,
    origin: Arc<FaultDevice>,
}

/// An engine opened on a `FileSet`, and its members as opened (by path
/// index; `None` for one left out).
type Served = (Arc<Engine>, Vec<Option<Arc<Switchable>>>);

impl FileSet {
    fn new(seed: u64) -> FileSet {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mut fs = FileSet {
            dir,
            paths: Vec::new(),
            origin: Rig::new(0, seed).origin,
        };
        fs.paths = (0..2).map(|i| fs.file(&format!("member{i}.img"))).collect();
        fs
    }

    /// A new sparse member-sized file.
    fn file(&self, name: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_len(MEMBER_BYTES)
            .unwrap();
        p.to_str().unwrap().to_string()
    }

    fn options(&self) -> OpenOptions {
        OpenOptions {
            crash_log: Some(self.dir.path().join("tc0.crashlog")),
            ..no_bg()
        }
    }

    /// Formats the set and creates a writeback cache on it, closed.
    fn create(&self) {
        let devs: Vec<DeviceRef> = self
            .paths
            .iter()
            .map(|p| tiercache::device::open_device(p).unwrap())
            .collect();
        let g = Layout::set_geometry(&[MEMBER_BYTES; 2], BS, 50).unwrap();
        let set: DeviceRef = Arc::new(CacheSet::format(devs, g, 0xf11e5).unwrap());
        let opts = CreateOptions {
            mode: Mode::Writeback,
            block_bytes: BS,
            ..Default::default()
        };
        let engine = Engine::create_with(set, self.origin.clone(), &opts, &no_bg()).unwrap();
        engine.close().unwrap();
    }

    /// Opens the set from its paths as `serve` does (`--degraded` is
    /// `allow_missing`), member `gone.0` found as `gone.1` says.
    fn open(&self, gone: Option<(usize, Gone)>, allow_missing: bool) -> Result<Served, String> {
        let opened = parking_lot::Mutex::new(vec![None; self.paths.len()]);
        let open = |p: &str| -> tiercache::device::DeviceResult<DeviceRef> {
            let i = self.paths.iter().position(|q| q == p).unwrap();
            let failing = match gone {
                Some((g, Gone::OpenFails)) if g == i => {
                    return Err(tiercache::device::DeviceError::Open {
                        spec: p.to_string(),
                        reason: "first read failed: Input/output error (os error 5)".into(),
                    })
                }
                Some((g, Gone::ReadFails)) => g == i,
                _ => false,
            };
            let d = Switchable::new(tiercache::device::open_device(p)?, failing);
            opened.lock()[i] = Some(d.clone());
            Ok(d as DeviceRef)
        };
        let set = tiercache::device::set::open_paths(&self.paths, allow_missing, open)
            .map_err(|e| e.to_string())?;
        let engine = Engine::open(Arc::new(set), self.origin.clone(), &self.options())
            .map_err(|e| e.to_string())?;
        Ok((engine, opened.into_inner()))
    }
}

/// Kills of the process, each followed by a restart with no operator.
const KILLS: usize = 4;

/// One case of `a_set_that_lost_a_member_comes_back_by_itself`.
fn comes_back(s: u64, lost: usize, how: Gone) {
    let mut fs = FileSet::new(s);
    fs.create();
    let (mut engine, mut members) = fs.open(None, false).unwrap();
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    workload(&engine, &mut model, &mut rng, 200);
    members[lost].as_ref().unwrap().fail();
    workload(&engine, &mut model, &mut rng, 200);
    assert_eq!(set_of(&engine).members()[lost].state, MemberState::Failed);
    if let Gone::Removed = how {
        std::fs::remove_file(&fs.paths[lost]).unwrap();
    }
    for kill in 0..KILLS {
        // kill -9: nothing committed, the crash log left for the next open.
        engine.abandon();
        drop((engine, members));
        let what = format!("seed {s}, member {lost} {how:?}, restart {kill}");
        (engine, members) = fs
            .open(Some((lost, how)), false)
            .unwrap_or_else(|e| panic!("{what}: the set did not come back by itself: {e}"));
        let st = &set_of(&engine).members()[lost];
        assert_eq!(st.state, MemberState::Failed, "{what}: {st:?}");
        assert!(
            st.failure
                .as_deref()
                .is_some_and(|w| w.contains("named failed by the label")),
            "{what}: {st:?}"
        );
        assert_eq!(
            engine.status().cache_set_state.as_deref(),
            Some("degraded"),
            "{what}"
        );
        verify_all(&engine, &model);
        workload(&engine, &mut model, &mut rng, 100);
    }
    // `replace-cache` online onto a new file, then one more kill: the set
    // comes back whole.
    let spare = fs.file("spare.img");
    let dev = tiercache::device::open_device(&spare).unwrap();
    engine
        .replace_cache_member(lost, dev, &mut |_, _| {})
        .unwrap();
    assert_eq!(set_of(&engine).state_name(), "whole", "seed {s}");
    workload(&engine, &mut model, &mut rng, 100);
    engine.abandon();
    drop((engine, members));
    fs.paths[lost] = spare;
    let (engine, _members) = fs.open(None, false).unwrap();
    assert_eq!(set_of(&engine).state_name(), "whole", "seed {s}");
    verify_all(&engine, &model);
    engine.close().unwrap();
}

/// A member fails while serving (every request errors, as under
/// dm-error); then the process is killed (`abandon`, the crash log left)
/// and restarted KILLS times with no operator: each restart opens the set
/// from its paths as `serve` does, finds the lost member gone (removed,
/// failing its open, or failing every read), reads the survivor's label,
/// which names it failed, and opens degraded by itself. Nothing
/// acknowledged is lost; `replace-cache` online makes the set whole, and
/// one more kill brings it back whole.
#[test]
fn a_set_that_lost_a_member_comes_back_by_itself() {
    let s = seed();
    for (k, (lost, how)) in [
        (1, Gone::OpenFails),
        (0, Gone::Removed),
        (1, Gone::ReadFails),
    ]
    .into_iter()
    .enumerate()
    {
        comes_back(s + k as u64, lost, how);
    }
}

/// A member missing at open that no label names failed (it went while
/// the set was not serving) may hold the only current copies: the open
/// is refused, naming the member, why it was left out and the two ways on;
/// `--degraded` is that word, after which its loss is in the labels.
#[test]
fn a_missing_member_no_label_names_failed_is_refused_with_the_way_on() {
    let fs = FileSet::new(seed());
    fs.create();
    let (engine, members) = fs.open(None, false).unwrap();
    engine.write(0, &stamped(0, 8, 1), true).unwrap();
    engine.close().unwrap();
    drop((engine, members));
    std::fs::remove_file(&fs.paths[1]).unwrap();
    let e = fs.open(None, false).err().unwrap();
    for want in [
        fs.paths[1].as_str(),
        "No such file",
        "cannot be proven current",
        "tiercache serve --degraded",
        "tiercache replace-cache",
    ] {
        assert!(e.contains(want), "no `{want}` in: {e}");
    }
    // Garbage in its place: no label either.
    let junk: Vec<u8> = (0..MEMBER_BYTES).map(|i| (i * 37 % 251) as u8).collect();
    std::fs::write(&fs.paths[1], junk).unwrap();
    let e = fs.open(None, false).err().unwrap();
    for want in ["not a cache-set member", "--degraded"] {
        assert!(e.contains(want), "no `{want}` in: {e}");
    }
    let (engine, members) = fs.open(None, true).unwrap();
    assert!(set_of(&engine).degraded());
    assert_eq!(&engine.read(0, 4096).unwrap()[..], &stamped(0, 8, 1)[..]);
    engine.close().unwrap();
    drop((engine, members));
    // Member 0's label now names member 1 failed: no word needed.
    let (engine, _members) = fs.open(None, false).unwrap();
    assert!(set_of(&engine).degraded());
    engine.close().unwrap();
}

/// Fills member `victim`'s whole device (its label included) with seeded
/// random bytes, under the running engine.
fn garbage_over(rig: &Rig, victim: usize, seed: u64) {
    let mut junk = vec![0u8; MEMBER_BYTES as usize];
    ChaCha8Rng::seed_from_u64(seed ^ 0xbad).fill(&mut junk[..]);
    rig.members[victim].write_at(&junk, 0).unwrap();
}

/// Reads every block twice (the copies of a mirrored block are read in
/// turn) and checks it against the model.
fn read_every_block_twice(engine: &Engine, model: &SectorModel, what: &str) {
    let bs = BS as u64;
    for block in 0..ORIGIN_BYTES / bs {
        for _ in 0..2 {
            let data = engine
                .read(block * bs, bs)
                .unwrap_or_else(|e| panic!("{what}: block {block}: {e}"));
            for k in 0..(bs / 512) as usize {
                let sector = block * bs / 512 + k as u64;
                model
                    .check_sector(sector, &data[k * 512..(k + 1) * 512])
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }
}

/// The value of the metric sample `name{labels}` in `text`.
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{name_and_labels}` in the metrics:\n{text}"))
}

/// A member whose whole device is overwritten with random bytes under a
/// running engine: every read still returns what was written (from the
/// other copy), and past 10 checksum errors the member is failed: status
/// says degraded and why, the counts are in the member's status and the
/// metrics. A restart (its label is garbage too) opens degraded by itself.
#[test]
fn a_member_that_returns_garbage_is_failed_and_shown() {
    for victim in 0..2usize {
        let s = seed() + victim as u64;
        let rig = Rig::new(2, s);
        let engine = rig.create(Mode::Writeback);
        let bs = BS as u64;
        let mut model = SectorModel::new(ORIGIN_BYTES / 512);
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        // Whole blocks: the set knows their sums.
        for _ in 0..200 {
            let block = rng.gen_range(0..ORIGIN_BYTES / bs);
            let first = block * bs / 512;
            let v = model.issue_write(first, bs / 512);
            engine
                .write(block * bs, &stamped(first, bs / 512, v), false)
                .unwrap();
            model.fua_done(v);
        }
        garbage_over(&rig, victim, s);
        let what = format!("seed {s}, member {victim} garbage");
        read_every_block_twice(&engine, &model, &what);
        let set = set_of(&engine);
        let st = &set.members()[victim];
        assert_eq!(st.state, MemberState::Failed, "{what}: {st:?}");
        assert!(st.bad_blocks >= 10, "{what}: {st:?}");
        assert!(st.checksum_errors_recent >= 10, "{what}: {st:?}");
        let why = st.failure.clone().unwrap_or_default();
        assert!(
            why.contains("checksum errors within 600 s"),
            "{what}: {st:?}"
        );
        assert_eq!(set.members()[1 - victim].bad_blocks, 0, "{what}");
        assert_eq!(engine.status().cache_set_state.as_deref(), Some("degraded"));
        let text = tiercache::monitor::Monitor::new(&engine, "set")
            .take_now()
            .unwrap()
            .metrics_text()
            .to_string();
        let labels = format!("{{cache=\"set\",member=\"{victim}\",device=\"member{victim}\"}}");
        for name in [
            "cache_member_failed",
            "cache_member_damaged_blocks",
            "cache_member_checksum_errors_recent",
        ] {
            let v = sample(&text, &format!("tiercache_{name}{labels}"));
            assert!(v >= 1.0, "{what}: {name} = {v}");
        }
        workload(&engine, &mut model, &mut rng, 200);
        verify_all(&engine, &model);
        engine.flush().unwrap();
        model.flush_done();
        engine.close().unwrap();
        drop(engine);
        let engine = rig.open(rig.refs(), false).unwrap();
        assert!(set_of(&engine).degraded(), "{what}");
        verify_all(&engine, &model);
        engine.close().unwrap();
    }
}

/// The last copy is never failed for its checksum errors: with member 1
/// lost, garbage in member 0's copies of clean blocks is caught, counted
/// and read from the origin instead, and member 0 keeps serving.
#[test]
fn the_last_copy_is_kept_despite_its_checksum_errors() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let g = set_of(&engine).geometry().clone();
    let bs = BS as u64;
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let mut written = std::collections::BTreeSet::new();
    for _ in 0..100 {
        let block = rng.gen_range(0..ORIGIN_BYTES / bs);
        let first = block * bs / 512;
        let v = model.issue_write(first, bs / 512);
        engine
            .write(block * bs, &stamped(first, bs / 512, v), false)
            .unwrap();
        model.fua_done(v);
        written.insert(block);
    }
    engine.flush().unwrap();
    model.flush_done();
    // Written back: the blocks are clean, still in their mirrored slots.
    engine.write_back_all(&mut |_, _| {}).unwrap();
    // Each written block twice (its two copies in turn): no other block is
    // read, so none of them is evicted.
    let read_written = |what: &str| {
        for &block in &written {
            for _ in 0..2 {
                let data = engine
                    .read(block * bs, bs)
                    .unwrap_or_else(|e| panic!("seed {s}: {what}: block {block}: {e}"));
                for k in 0..(bs / 512) as usize {
                    let sector = block * bs / 512 + k as u64;
                    model
                        .check_sector(sector, &data[k * 512..(k + 1) * 512])
                        .unwrap_or_else(|e| panic!("seed {s}: {what}: {e}"));
                }
            }
        }
    };
    rig.members[1].fail_after_ops(0);
    read_written("member 1 failing");
    assert_eq!(set_of(&engine).members()[1].state, MemberState::Failed);
    let junk: Vec<u8> = (0..g.mirror_slots * bs)
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    let mirror_at = tiercache::device::set::LABEL_BYTES + g.meta_bytes;
    rig.members[0].write_at(&junk, mirror_at).unwrap();
    read_written("member 0 garbage");
    let st = &set_of(&engine).members()[0];
    assert_eq!(st.state, MemberState::Healthy, "seed {s}: {st:?}");
    assert!(st.bad_blocks >= 10, "seed {s}: {st:?}");
    assert!(st.checksum_errors_recent >= 10, "seed {s}: {st:?}");
    engine.close().unwrap();
}

/// After a clean shutdown the members' metadata copies are equal: a copy
/// that fails its checks at the next open is damage, not a crash, and a
/// member with a whole metadata copy of garbage is failed at that open;
/// the set serves on from the other. (After a crash the same damage is
/// repaired but not held against the member:
/// `damaged_metadata_on_a_member_is_read_from_the_other`.)
#[test]
fn metadata_damage_after_a_clean_shutdown_fails_the_member() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let g = set_of(&engine).geometry().clone();
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    // Flushes often: journal pages on both members.
    for _ in 0..30 {
        workload(&engine, &mut model, &mut rng, 10);
        engine.flush().unwrap();
        model.flush_done();
    }
    engine.close().unwrap();
    drop(engine);
    let junk: Vec<u8> = (0..g.meta_bytes).map(|i| (i * 7 % 253) as u8).collect();
    rig.members[1]
        .write_at(&junk, tiercache::device::set::LABEL_BYTES)
        .unwrap();
    let engine = rig.open(rig.refs(), false).unwrap();
    let st = &set_of(&engine).members()[1];
    assert_eq!(st.state, MemberState::Failed, "seed {s}: {st:?}");
    assert!(st.bad_blocks >= 10, "seed {s}: {st:?}");
    assert!(set_of(&engine).degraded());
    verify_all(&engine, &model);
    engine.close().unwrap();
}

/// A member replaced while readable (`replace-cache` of a healthy
/// member) and then given to the set again, as when the daemon died after
/// the rebuild but before the registry named the new device: its label
/// still says it is member 1, with the set's own id, and the newest label
/// names no member failed. It is a former member (the place's serial moved
/// on at the replacement) and is never read: the open is refused as for
/// a missing member, naming it; with `--degraded` the set serves member
/// 0's copies, not its stale ones.
#[test]
fn a_replaced_member_given_back_is_never_read() {
    let s = seed();
    let rig = Rig::new(2, s);
    let engine = rig.create(Mode::Writeback);
    let mut model = SectorModel::new(ORIGIN_BYTES / 512);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    workload(&engine, &mut model, &mut rng, 300);
    let (_fresh, fresh_ref) = fault_dev("member1-new", MEMBER_BYTES, s + 7);
    set_of(&engine).replace(1, fresh_ref, |_, _| {}).unwrap();
    assert!(!set_of(&engine).degraded());
    // Newer versions of what the replaced member holds.
    workload(&engine, &mut model, &mut rng, 600);
    engine.flush().unwrap();
    model.flush_done();
    engine.close().unwrap();
    drop(engine);
    let e = rig.open(rig.refs(), false).err().unwrap();
    for want in ["member1", "a former member 1", "--degraded"] {
        assert!(e.contains(want), "seed {s}: no `{want}` in: {e}");
    }
    let engine = rig.open(rig.refs(), true).unwrap();
    assert_eq!(
        set_of(&engine).members()[1].state,
        MemberState::Failed,
        "seed {s}"
    );
    verify_all(&engine, &model);
    read_every_block_twice(&engine, &model, &format!("seed {s}"));
    engine.close().unwrap();
}
