//! The log placement (engine/table/segments.rs, writeback/clean.rs) as the
//! cache device sees it: random overwrites go down in order at the write
//! cursor, a full cache is emptied a segment at a time, freed segments are
//! discarded whole, and nothing a client wrote is lost or served stale on
//! the way (a discard over a slot still mapped would read back as zeroes).
//! Every stream here is deterministic: single-threaded, no background
//! thread (the test runs the background's ticks), seeded data.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::fault::FaultDevice;
use tiercache::device::latency::LatencyDevice;
use tiercache::device::recorder::{Event, EventLog};
use tiercache::device::DeviceRef;
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, Mode, Placement};

const BS: u64 = 4096;
const UNKNOWN: u8 = 255;

/// A device request's offset and length.
type Extent = (u64, u64);

struct Rig {
    engine: Arc<Engine>,
    log: EventLog,
    cache: DeviceRef,
    origin: DeviceRef,
    data_offset: u64,
    /// Per origin block: the byte it was last written with (0: never;
    /// `UNKNOWN`: trimmed, any contents).
    model: Vec<u8>,
}

fn rig(placement: Placement, slots: u64, origin_blocks: u64) -> Rig {
    rig_with(placement, slots, origin_blocks, None)
}

/// A rig whose cache device takes `delay` per request, one at a time (so
/// that concurrent writers queue, as on a real device).
fn rig_with(placement: Placement, slots: u64, origin_blocks: u64, delay: Option<Duration>) -> Rig {
    let cache_bytes = common::cache_bytes_for(slots, BS as u32);
    let log = EventLog::new();
    let mut inner: DeviceRef = Arc::new(FaultDevice::new("cache", cache_bytes, 1));
    if let Some(d) = delay {
        inner = Arc::new(LatencyDevice::new(inner, d));
    }
    let cache: DeviceRef = Arc::new(log.record(inner));
    let origin: DeviceRef = Arc::new(FaultDevice::new("origin", origin_blocks * BS, 2));
    let opts = CreateOptions {
        mode: Mode::Writeback,
        placement,
        ..Default::default()
    };
    Engine::create(cache.clone(), origin.clone(), &opts)
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(cache.clone(), origin.clone(), &common::no_bg()).unwrap();
    assert_eq!(engine.status().placement, placement);
    Rig {
        engine,
        log,
        cache,
        origin,
        data_offset: Layout::compute(cache_bytes, BS as u32).unwrap().data_offset,
        model: vec![0; origin_blocks as usize],
    }
}

impl Rig {
    fn write(&mut self, block: u64, byte: u8) {
        self.engine
            .write(block * BS, &vec![byte; BS as usize], false)
            .unwrap();
        self.model[block as usize] = byte;
    }

    fn check_all(&self, when: &str) {
        for (b, &byte) in self.model.iter().enumerate() {
            if byte == UNKNOWN {
                continue;
            }
            let got = self.engine.read(b as u64 * BS, BS).unwrap();
            assert!(
                got.iter().all(|&x| x == byte),
                "{when}: block {b} reads {:#x}.., wrote {byte:#x}",
                got[0]
            );
        }
    }

    /// The cache device's data-region writes and discards since event `from`.
    fn data_events(&self, from: usize) -> (Vec<Extent>, Vec<Extent>) {
        let (mut writes, mut discards) = (Vec::new(), Vec::new());
        for e in &self.log.events()[from..] {
            match e {
                Event::Write {
                    device: 0,
                    offset,
                    data,
                } if *offset >= self.data_offset => writes.push((*offset, data.len() as u64)),
                Event::Discard {
                    device: 0,
                    offset,
                    len,
                } if *offset >= self.data_offset => discards.push((*offset, *len)),
                _ => {}
            }
        }
        (writes, discards)
    }

    fn reopen(&mut self) {
        self.engine.close().unwrap();
        self.engine =
            Engine::open(self.cache.clone(), self.origin.clone(), &common::no_bg()).unwrap();
    }
}

/// The share of writes that start where the previous one ended.
fn sequential_share(writes: &[Extent]) -> f64 {
    let seq = writes
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + w[0].1)
        .count();
    seq as f64 / (writes.len().max(2) - 1) as f64
}

/// Writes every block of a region that fits the cache in random order,
/// then overwrites random blocks: with the log placement the overwrites go
/// down in order; in place they land wherever the blocks were.
#[test]
fn random_overwrites_go_down_in_order_and_in_place_ones_do_not() {
    let mut shares = Vec::new();
    for placement in [Placement::Log, Placement::InPlace] {
        let mut r = rig(placement, 1024, 512);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut order: Vec<u64> = (0..512).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        for &b in &order {
            r.write(b, 1);
        }
        r.engine.flush().unwrap();
        let from = r.log.len();
        for k in 0..400u32 {
            let b = rng.gen_range(0..512);
            r.write(b, 2 + (k % 200) as u8);
        }
        let (writes, _) = r.data_events(from);
        assert!(writes.len() >= 400, "{} cache writes", writes.len());
        shares.push(sequential_share(&writes));
        r.check_all("after the overwrites");
        r.engine.flush().unwrap();
        r.reopen();
        r.check_all("after a restart");
    }
    let (log, in_place) = (shares[0], shares[1]);
    assert!(
        log >= 0.9,
        "log placement: only {:.0}% in order",
        log * 100.0
    );
    assert!(
        in_place < 0.2,
        "in place: {:.0}% in order (the test no longer tells them apart)",
        in_place * 100.0
    );
}

/// 16 threads write random blocks of their own at once, with the log
/// placement over a cache device that takes 100 us a request: writes that
/// queue behind another in their lane go down together, adjacent ones as
/// one device write (engine/io/gather.rs), so device writes are fewer and
/// larger than client writes; every block reads back as its thread last
/// wrote it, before and after a restart.
#[test]
fn concurrent_writes_are_gathered_into_larger_device_writes() {
    let mut r = rig_with(Placement::Log, 2048, 1024, Some(Duration::from_micros(100)));
    let from = r.log.len();
    let engine = r.engine.clone();
    let models: Vec<Vec<(u64, u8)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16u64)
            .map(|t| {
                let engine = engine.clone();
                s.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(100 + t);
                    let mut last = Vec::new();
                    for k in 0..150u32 {
                        // Blocks t, t + 16, t + 32, ...: disjoint per thread.
                        let block = rng.gen_range(0..64u64) * 16 + t;
                        let byte = 1 + ((k + t as u32) % 250) as u8;
                        engine
                            .write(block * BS, &vec![byte; BS as usize], false)
                            .unwrap();
                        last.push((block, byte));
                    }
                    last
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (block, byte) in models.into_iter().flatten() {
        r.model[block as usize] = byte;
    }
    let stats = r.engine.status().stats;
    let (writes, _) = r.data_events(from);
    let bytes: u64 = writes.iter().map(|w| w.1).sum();
    eprintln!(
        "{} client writes, {} device writes, {} bytes, {} gathered",
        16 * 150,
        writes.len(),
        bytes,
        stats.gathered_writes
    );
    assert!(stats.gathered_writes > 0, "{stats:?}");
    assert!(
        (writes.len() as u64) < 16 * 150 && bytes / writes.len() as u64 > BS,
        "{} device writes for {} client writes, {} bytes: not gathered",
        writes.len(),
        16 * 150,
        bytes
    );
    r.check_all("after the concurrent writes");
    r.engine.flush().unwrap();
    r.reopen();
    r.check_all("after a restart");
}

/// Random writes over an origin four times the cache, with reads, trims
/// and flushes, the background's ticks run by the test: segments are
/// emptied and discarded whole, on segment boundaries, and every block
/// reads back as last written, before and after a restart.
#[test]
fn a_full_cache_is_emptied_a_segment_at_a_time_and_discarded_whole() {
    let slots = 512u64;
    let origin_blocks = 4 * slots;
    let mut r = rig(Placement::Log, slots, origin_blocks);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let from = r.log.len();
    for k in 0..12_000u32 {
        let b = rng.gen_range(0..origin_blocks);
        match rng.gen_range(0..10) {
            0..=6 => r.write(b, 1 + (k % 250) as u8),
            7 | 8 => {
                let got = r.engine.read(b * BS, BS).unwrap();
                let want = r.model[b as usize];
                assert!(
                    want == UNKNOWN || got.iter().all(|&x| x == want),
                    "op {k}: block {b}"
                );
            }
            _ => {
                r.engine.trim(b * BS, BS, false).unwrap();
                r.model[b as usize] = UNKNOWN;
            }
        }
        if k % 16 == 0 {
            r.engine.background_tick();
        }
        if k % 500 == 0 {
            r.engine.flush().unwrap();
        }
    }
    let st = r.engine.status();
    let (writes, discards) = r.data_events(from);
    eprintln!(
        "{} cache writes, {:.0}% in order; {} segments emptied, {} blocks moved, {} discarded",
        writes.len(),
        sequential_share(&writes) * 100.0,
        st.stats.segments_cleaned,
        st.stats.blocks_moved,
        st.stats.segments_discarded
    );
    assert!(st.stats.segments_discarded >= 10, "{:?}", st.stats);
    assert_eq!(discards.len() as u64, st.stats.segments_discarded);
    // 512 slots: segments of 32 slots (16 per pool), 128 KiB each.
    let seg_bytes = 32 * BS;
    let data_end = r.data_offset + slots * BS;
    for &(offset, len) in &discards {
        let whole = offset % seg_bytes == 0 && len == seg_bytes;
        let edge = (offset == r.data_offset || offset + len == data_end) && len < seg_bytes;
        assert!(whole || edge, "discard {offset}+{len} is not one segment");
    }
    r.check_all("after the workload");
    r.engine.flush().unwrap();
    r.reopen();
    r.check_all("after a restart");
}
