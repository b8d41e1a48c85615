//! How the volumes of one cache share it (issue 33, policy/share.rs): a
//! guaranteed minimum keeps a volume's blocks through another volume's
//! scan, a maximum makes a volume's new blocks replace its own, and the
//! curve split gives the cache to the volume whose miss-ratio curve says
//! it pays. Each is measured against the same workload without it (one
//! LRU ranking of every block: every test here runs LRU, whose behaviour
//! on these loops is plain), and the settings survive a restart.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tiercache::device::ram::RamDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::clock::{Clock, SimClock};
use tiercache::engine::format::Layout;
use tiercache::engine::policy::share::{Share, ShareChange, Sharing};
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::recovery::check;
use tiercache::engine::{AdmissionSettings, CreateOptions, Engine, Mode, OpenOptions};

const BS: u64 = 4096;
/// Cache slots of every rig here.
const SLOTS: u64 = 4096;

struct Rig {
    cache: DeviceRef,
    origins: Vec<DeviceRef>,
    clock: SimClock,
}

impl Rig {
    /// Two RAM origins of `blocks` blocks each behind a RAM cache of
    /// `SLOTS`, created in writethrough with LRU and every miss admitted.
    fn new(blocks: [u64; 2]) -> (Rig, Arc<Engine>) {
        let rig = Rig {
            cache: Arc::new(RamDevice::new(
                "cache",
                Layout::device_bytes_for(BS as u32, SLOTS),
            )),
            origins: blocks
                .iter()
                .enumerate()
                .map(|(v, &n)| Arc::new(RamDevice::new(&format!("o{v}"), n * BS)) as DeviceRef)
                .collect(),
            clock: SimClock::new(),
        };
        let opts = CreateOptions {
            mode: Mode::Writethrough,
            policy: PolicyKind::Lru,
            admission: AdmissionSettings {
                sequential_cutoff_bytes: 0,
                promote_after: 1,
                guard: false,
                ..Default::default()
            },
            allow_data_loss: true,
            ..Default::default()
        };
        let named = vec![
            ("a".to_string(), rig.origins[0].clone()),
            ("b".to_string(), rig.origins[1].clone()),
        ];
        let engine = Engine::create_volumes(rig.cache.clone(), named, &opts, &rig.open_opts())
            .expect("create");
        (rig, engine)
    }

    fn open_opts(&self) -> OpenOptions {
        OpenOptions {
            no_background: true,
            allow_data_loss: true,
            clock: Clock::sim(self.clock.clone()),
            ..Default::default()
        }
    }

    fn reopen(&self) -> Arc<Engine> {
        Engine::open_volumes(self.cache.clone(), self.origins.clone(), &self.open_opts())
            .expect("reopen")
    }
}

/// Reads block `b` of volume `v`.
fn read(engine: &Engine, v: usize, b: u64) {
    let base = engine.volumes()[v].1;
    engine.read(base + b * BS, BS).expect("read");
}

/// Volume `v`'s cached blocks.
fn held(engine: &Engine, v: usize) -> u64 {
    engine.status().volumes[v].cache_blocks_used
}

fn read_hits(engine: &Engine) -> u64 {
    engine.status().stats.read_hits
}

/// Volume a reads its `set` blocks once; volume b then reads `scan`
/// blocks once each; returns a's hits when it reads its set again.
fn set_then_scan(engine: &Engine, set: u64, scan: u64) -> u64 {
    (0..set).for_each(|b| read(engine, 0, b));
    (0..scan).for_each(|b| read(engine, 1, b));
    let before = read_hits(engine);
    (0..set).for_each(|b| read(engine, 0, b));
    read_hits(engine) - before
}

#[test]
fn a_guaranteed_minimum_keeps_a_volumes_blocks_through_another_volumes_scan() {
    let quarter = SLOTS / 4;
    // Without a share, b's scan of four caches' worth evicts all of a.
    let (_, engine) = Rig::new([SLOTS, 4 * SLOTS]);
    assert_eq!(set_then_scan(&engine, quarter, 4 * SLOTS), 0);

    let (rig, engine) = Rig::new([SLOTS, 4 * SLOTS]);
    let share = Share {
        min_permille: 250,
        max_permille: 0,
    };
    engine.set_share(0, share).unwrap();
    assert_eq!(set_then_scan(&engine, quarter, 4 * SLOTS), quarter);
    assert_eq!(held(&engine, 0), quarter);
    assert_eq!(engine.status().volumes[0].share_floor_blocks, quarter);
    // The share is the superblock's: it holds after a restart.
    engine.close().unwrap();
    let engine = rig.reopen();
    assert_eq!(engine.status().volumes[0].share, share);
    engine.close().unwrap();
    let report = check(&rig.cache, None);
    assert!(report.ok, "{:?}", report.findings);
}

#[test]
fn a_maximum_makes_a_volumes_new_blocks_replace_its_own() {
    let half = SLOTS / 2;
    let (_, engine) = Rig::new([SLOTS, 4 * SLOTS]);
    // Without one, b's scan takes the whole cache.
    assert_eq!(set_then_scan(&engine, half, 4 * SLOTS), 0);
    assert_eq!(held(&engine, 1), SLOTS - half);

    let (_, engine) = Rig::new([SLOTS, 4 * SLOTS]);
    engine
        .change_share(&ShareChange {
            volume: Some("b".into()),
            max_permille: Some(250),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(set_then_scan(&engine, half, 4 * SLOTS), half);
    assert_eq!(held(&engine, 1), SLOTS / 4);
}

/// Rounds of volume a reading block `i % a_set` once and volume b reading
/// `3 * i .. 3 * i + 3` modulo `b_set`; returns the read hits.
fn loops(engine: &Engine, rounds: u64, a_set: u64, b_set: u64) -> u64 {
    let before = read_hits(engine);
    for i in 0..rounds {
        read(engine, 0, i % a_set);
        (0..3).for_each(|k| read(engine, 1, (3 * i + k) % b_set));
    }
    read_hits(engine) - before
}

#[test]
fn the_curve_split_gives_the_cache_to_the_volume_whose_curve_pays() {
    // a loops over half a cache, b over four caches, three b reads to one
    // of a: in one LRU ranking a's blocks are 2 caches' worth of reads old
    // when they come back, so nothing hits. a's own curve says half the
    // cache gives it every hit; b's says no share of this cache helps it.
    let (a_set, b_set) = (SLOTS / 2, 4 * SLOTS);
    let (rig, engine) = Rig::new([SLOTS, 4 * SLOTS]);
    assert!(loops(&engine, 4 * a_set, a_set, b_set) < a_set / 20);
    engine.set_sharing(Sharing::Curve).unwrap();
    let floor = engine.status().volumes[0].share_floor_blocks;
    assert!(
        (a_set..=a_set + SLOTS / 8).contains(&floor),
        "a's floor {floor} blocks"
    );
    // One loop to take its share, then a hits nearly every time (b never).
    loops(&engine, a_set, a_set, b_set);
    let hits = loops(&engine, a_set, a_set, b_set);
    assert!(hits > a_set * 95 / 100, "{hits} hits of {a_set}");
    // The background splits again every 10 s of its clock.
    rig.clock.advance(Duration::from_secs(11));
    engine.background_tick();
    assert_eq!(engine.status().sharing, Sharing::Curve);
    // Back to one ranking: the floors go.
    engine.set_sharing(Sharing::Global).unwrap();
    assert_eq!(engine.status().volumes[0].share_floor_blocks, 0);
    engine.close().unwrap();
}

#[test]
fn shares_are_refused_where_they_cannot_hold() {
    let (_, engine) = Rig::new([SLOTS, SLOTS]);
    let share = |min, max| Share {
        min_permille: min,
        max_permille: max,
    };
    let e = engine
        .set_share(0, share(600, 500))
        .unwrap_err()
        .to_string();
    assert!(e.contains("above the maximum"), "{e}");
    engine.set_share(0, share(600, 0)).unwrap();
    let e = engine.set_share(1, share(500, 0)).unwrap_err().to_string();
    assert!(e.contains("guaranteed 60% of the cache"), "{e}");
    let e = engine
        .change_share(&ShareChange {
            min_permille: Some(100),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("--volume"), "{e}");
    // Nothing refused was recorded.
    assert_eq!(engine.status().volumes[1].share, Share::default());

    // A cache of one origin shares with nobody.
    let cache: DeviceRef = Arc::new(RamDevice::new(
        "cache",
        Layout::device_bytes_for(BS as u32, 64),
    ));
    let origin: DeviceRef = Arc::new(RamDevice::new("origin", 64 * BS));
    let opts = CreateOptions {
        allow_data_loss: true,
        ..Default::default()
    };
    let one = Engine::create_with(cache, origin, &opts, &common::no_bg()).unwrap();
    assert!(one.set_sharing(Sharing::Curve).is_err());
    assert!(one.set_share(0, share(100, 0)).is_err());
}
