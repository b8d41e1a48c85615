//! Background writeback policy: it starts at the high watermark and stops
//! at the low one, writes blocks older than the maximum age, issues origin
//! writes in ascending order with adjacent blocks coalesced, paces itself
//! while clients keep the origin busy and drains everything once the
//! origin is idle; and nothing but writeback ever writes the origin (create
//! is non-intrusive).

mod common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tiercache::device::fault::FaultDevice;
use tiercache::device::ram::RamDevice;
use tiercache::device::{BlockDevice, DeviceRef, DeviceResult};
use tiercache::engine::{CreateOptions, Engine, OpenOptions, WritebackSettings};

const ORIGIN_BYTES: u64 = 4 << 20;
const BS: u64 = 4096;

/// An origin that records every write (offset, length) it receives. Its
/// writes wait at a gate while a test holds it closed (open at setup).
struct Recorder {
    inner: RamDevice,
    writes: Mutex<Vec<(u64, u64)>>,
    /// (writes waiting at the gate, gate open)
    gate: Mutex<(u32, bool)>,
    cv: parking_lot::Condvar,
    /// Time every read and write takes, as a disk's would.
    delay: Mutex<Duration>,
}

impl BlockDevice for Recorder {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        std::thread::sleep(*self.delay.lock());
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        std::thread::sleep(*self.delay.lock());
        let mut g = self.gate.lock();
        g.0 += 1;
        self.cv.notify_all();
        while !g.1 {
            self.cv.wait(&mut g);
        }
        g.0 -= 1;
        drop(g);
        self.writes.lock().push((offset, buf.len() as u64));
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DeviceResult<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        "recorder"
    }
    fn identity(&self) -> u64 {
        42
    }
}

/// A recording origin of `ORIGIN_BYTES`, its gate open, no delay.
fn recorder() -> Arc<Recorder> {
    Arc::new(Recorder {
        inner: RamDevice::new("origin", ORIGIN_BYTES),
        writes: Mutex::new(Vec::new()),
        gate: Mutex::new((0, true)),
        cv: parking_lot::Condvar::new(),
        delay: Mutex::new(Duration::ZERO),
    })
}

fn setup(w: WritebackSettings) -> (Arc<Recorder>, Arc<Engine>) {
    setup_with(w, true)
}

fn setup_with(w: WritebackSettings, no_background: bool) -> (Arc<Recorder>, Arc<Engine>) {
    setup_slots(w, no_background, 100)
}

/// With a cache of `slots` blocks.
fn setup_slots(
    w: WritebackSettings,
    no_background: bool,
    slots: u64,
) -> (Arc<Recorder>, Arc<Engine>) {
    let origin = recorder();
    let cache: DeviceRef = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(slots, BS as u32),
        1,
    ));
    let o: DeviceRef = origin.clone();
    let opts = CreateOptions {
        writeback: w,
        ..Default::default()
    };
    Engine::create(cache.clone(), o.clone(), &opts)
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(
        cache,
        o,
        &OpenOptions {
            no_background,
            ..Default::default()
        },
    )
    .unwrap();
    (origin, engine)
}

fn write_block(engine: &Engine, block: u64) {
    engine
        .write(
            block * BS,
            &vec![(block as u8).wrapping_add(1); BS as usize],
            false,
        )
        .unwrap();
}

#[test]
fn create_and_caching_never_write_the_origin() {
    let (origin, engine) = setup(common::held_writeback());
    for b in 0..50 {
        write_block(&engine, b * 3);
        engine.read(b * 7 * BS, BS).unwrap();
    }
    engine.flush().unwrap();
    engine.close().unwrap();
    assert!(
        origin.writes.lock().is_empty(),
        "the origin was written: {:?}",
        origin.writes.lock()
    );
}

#[test]
fn watermarks_start_and_stop_writeback_in_ascending_order() {
    let w = WritebackSettings {
        high_pct: 50,
        low_pct: 25,
        max_age_secs: 3600,
        idle_secs: 0,
    };
    let (origin, engine) = setup(w);
    let total = engine.status().cache_blocks_total;
    let high = total * 50 / 100;
    let low = total * 25 / 100;
    // Just below the high watermark: nothing happens.
    let blocks: Vec<u64> = (0..high - 1).map(|i| (i * 37) % 1000).collect();
    for &b in &blocks {
        write_block(&engine, b);
    }
    engine.background_tick();
    assert!(
        origin.writes.lock().is_empty(),
        "writeback below the high watermark"
    );
    // Reach it.
    for b in 1000..1008 {
        write_block(&engine, b);
    }
    let dirty_before = engine.dirty_blocks();
    assert!(dirty_before >= high);
    engine.background_tick();
    let dirty_after = engine.dirty_blocks();
    // It stops at the low watermark, or past it by the rest of the run of
    // adjacent blocks it was in (here the 8 blocks 1000..1008).
    assert!(
        dirty_after <= low && dirty_after + 8 > low,
        "writeback must stop at the low watermark ({low} of {total} blocks), not {dirty_after}"
    );
    let writes = origin.writes.lock().clone();
    let written: u64 = writes.iter().map(|&(_, l)| l / BS).sum();
    assert_eq!(written, dirty_before - dirty_after);
    assert!(
        writes.windows(2).all(|p| p[0].0 + p[0].1 <= p[1].0),
        "origin writes are not in ascending order: {writes:?}"
    );
    // Every written-back block holds the data the volume shows.
    let vol = engine.read(0, ORIGIN_BYTES).unwrap();
    for &(o, l) in &writes {
        let mut back = vec![0u8; l as usize];
        origin.inner.read_at(&mut back, o).unwrap();
        assert!(back[..] == vol[o as usize..(o + l) as usize]);
    }
}

/// A low watermark of 0 drains to no dirty block at all. (The watermarks
/// were compared in whole percents: 0% then meant under 1%, and a cache
/// of many blocks kept hundreds dirty; bench/drain-latency.sh found it.)
#[test]
fn a_low_watermark_of_zero_drains_everything() {
    let w = WritebackSettings {
        high_pct: 1,
        low_pct: 0,
        max_age_secs: 3600,
        idle_secs: 0,
    };
    // 1% of the slots is more than a batch (256 blocks): the first batch
    // leaves dirty blocks that are under 1%.
    let (origin, engine) = setup_slots(w, true, 30_000);
    let total = engine.status().cache_blocks_total;
    assert!(total / 100 > 256 && total / 100 < 512, "{total}");
    // Scattered (no runs), just past 1%.
    let n = total / 100 + 1;
    for i in 0..n {
        write_block(&engine, i * 3);
    }
    assert_eq!(engine.dirty_blocks(), n);
    for _ in 0..n {
        if engine.dirty_blocks() == 0 {
            break;
        }
        engine.background_tick();
    }
    assert_eq!(engine.dirty_blocks(), 0, "of {total} slots, {n} dirty");
    let written: u64 = origin.writes.lock().iter().map(|&(_, l)| l / BS).sum();
    assert_eq!(written, n);
}

#[test]
fn coalesces_a_run_into_one_origin_write() {
    let (origin, engine) = setup(WritebackSettings {
        high_pct: 50,
        low_pct: 0,
        max_age_secs: 3600,
        idle_secs: 0,
    });
    for b in 200..264 {
        write_block(&engine, b);
    }
    engine.write_back_all(&mut |_, _| {}).unwrap();
    let writes = origin.writes.lock().clone();
    assert_eq!(
        writes,
        vec![(200 * BS, 64 * BS)],
        "64 adjacent dirty blocks must go out as one write"
    );
}

#[test]
fn blocks_older_than_the_maximum_age_are_written_back() {
    let (origin, engine) = setup(WritebackSettings {
        high_pct: 90,
        low_pct: 10,
        max_age_secs: 1,
        idle_secs: 0,
    });
    for b in [5u64, 9, 2] {
        write_block(&engine, b);
    }
    engine.background_tick();
    assert_eq!(engine.dirty_blocks(), 3, "young blocks written back early");
    assert!(origin.writes.lock().is_empty());
    std::thread::sleep(Duration::from_millis(1100));
    engine.background_tick();
    assert_eq!(engine.dirty_blocks(), 0, "aged blocks not written back");
    let offsets: Vec<u64> = origin.writes.lock().iter().map(|&(o, _)| o / BS).collect();
    assert_eq!(
        offsets,
        vec![2, 5, 9],
        "aged blocks not written in ascending order"
    );
}

/// Runs `f` on a thread and gives up after 10 s instead of hanging.
fn within_10s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} waited for the origin write of a writeback"))
}

/// Writeback releases a block's lock while it writes the origin: a read and
/// a rewrite of that block complete while the origin write is held, and the
/// rewrite keeps the block dirty, so the origin ends up with the new data.
#[test]
fn a_block_in_writeback_is_read_and_rewritten_without_waiting_for_the_origin() {
    let (origin, engine) = setup(CreateOptions::default().writeback);
    origin.gate.lock().1 = false;
    let old = vec![0xAAu8; BS as usize];
    let new = vec![0xBBu8; BS as usize];
    engine.write(5 * BS, &old, false).unwrap();

    let e = engine.clone();
    let flusher = std::thread::spawn(move || e.write_back_all(&mut |_, _| {}));
    // Wait for the writeback's origin write to reach the gate.
    {
        let mut g = origin.gate.lock();
        while g.0 == 0 {
            let timed_out = origin
                .cv
                .wait_for(&mut g, Duration::from_secs(10))
                .timed_out();
            assert!(!timed_out, "the writeback never reached the origin");
        }
    }
    let e = engine.clone();
    let read = within_10s("a read", move || e.read(5 * BS, BS).unwrap());
    assert!(read[..] == old[..], "the read of a block in writeback");
    let e = engine.clone();
    let data = new.clone();
    within_10s("a rewrite", move || e.write(5 * BS, &data, false).unwrap());

    {
        let mut g = origin.gate.lock();
        g.1 = true;
        origin.cv.notify_all();
    }
    flusher.join().unwrap().unwrap();
    assert_eq!(engine.dirty_blocks(), 0);
    let mut on_origin = vec![0u8; BS as usize];
    origin.inner.read_at(&mut on_origin, 5 * BS).unwrap();
    assert!(
        on_origin == new,
        "the rewrite during writeback was lost: the block was marked clean with the old data"
    );
    assert!(engine.read(5 * BS, BS).unwrap()[..] == new[..]);
    engine.close().unwrap();
}

/// Keeps the origin busy with read misses (of blocks never cached) until
/// the returned flag is set.
fn busy_reader(
    engine: &Arc<Engine>,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<u64>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (e, s) = (engine.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        let mut n = 0u64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            // Blocks 900.. are never written: every read is a miss; the
            // cache is full of dirty blocks, so nothing is promoted either.
            e.read((900 + n % 100) * BS, 512).unwrap();
            n += 1;
        }
        n
    });
    (stop, t)
}

#[test]
fn writeback_paces_itself_while_clients_keep_the_origin_busy() {
    let (origin, engine) = setup(WritebackSettings {
        high_pct: 50,
        low_pct: 40,
        max_age_secs: 3600,
        idle_secs: 0,
    });
    let total = engine.status().cache_blocks_total;
    let dirty = total * 60 / 100;
    for k in 0..dirty {
        write_block(&engine, k * 3);
    }
    *origin.delay.lock() = Duration::from_millis(2);
    let (stop, reader) = busy_reader(&engine);
    std::thread::sleep(Duration::from_millis(20));
    engine.background_tick();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    let st = engine.status();
    assert_eq!(
        st.cache_blocks_dirty,
        total * 40 / 100,
        "down to the low watermark (no adjacent blocks to finish)"
    );
    let runs = origin.writes.lock().len() as u64;
    assert!(
        st.stats.writeback_pauses >= runs - 1,
        "{} pauses for {runs} writebacks while the origin was busy",
        st.stats.writeback_pauses
    );
    assert!(reads > 0);
    // With the origin left alone, the same writeback needs no pause.
    for k in 0..dirty {
        write_block(&engine, k * 3 + 1);
    }
    std::thread::sleep(Duration::from_millis(150));
    let pauses = engine.status().stats.writeback_pauses;
    engine.background_tick();
    assert_eq!(engine.status().stats.writeback_pauses, pauses);
    // (Blocks k * 3 and k * 3 + 1 are adjacent now: a run may finish
    // past the watermark.)
    assert!(engine.dirty_blocks() <= total * 40 / 100);
}

#[test]
fn a_batch_never_ends_inside_a_run_of_dirty_blocks() {
    let (origin, engine) = setup(WritebackSettings {
        high_pct: 50,
        low_pct: 10,
        max_age_secs: 3600,
        idle_secs: 0,
    });
    let total = engine.status().cache_blocks_total;
    // Scattered blocks, then one run of 30 adjacent blocks at the end of
    // the block order: the watermark asks for fewer blocks than reach into
    // the run's end, and the run still goes out as one write.
    let scattered = total * 50 / 100 - 30;
    for k in 0..scattered {
        write_block(&engine, k * 3);
    }
    for b in 900..930 {
        write_block(&engine, b);
    }
    engine.background_tick();
    let writes = origin.writes.lock().clone();
    assert!(
        writes.contains(&(900 * BS, 30 * BS)),
        "the run was split: {writes:?}"
    );
}

#[test]
fn an_idle_origin_is_drained_and_a_client_stops_the_drain() {
    let (origin, engine) = setup(WritebackSettings {
        high_pct: 100,
        low_pct: 0,
        max_age_secs: 3600,
        idle_secs: 1,
    });
    for k in 0..60 {
        write_block(&engine, k * 3);
    }
    // A client request to the origin now: not idle yet.
    engine.read(950 * BS, 512).unwrap();
    engine.background_tick();
    assert_eq!(
        engine.dirty_blocks(),
        60,
        "drained before the origin was idle"
    );
    std::thread::sleep(Duration::from_millis(1100));
    engine.background_tick();
    assert_eq!(engine.dirty_blocks(), 0, "an idle origin is drained");
    assert!(engine.status().stats.idle_drains >= 1);
    // Again, with a slow origin, and a client arriving during the drain.
    for k in 0..60 {
        write_block(&engine, k * 3 + 1);
    }
    *origin.delay.lock() = Duration::from_millis(10);
    std::thread::sleep(Duration::from_millis(1100));
    let e = engine.clone();
    let drain = std::thread::spawn(move || e.background_tick());
    std::thread::sleep(Duration::from_millis(60));
    engine.read(960 * BS, 512).unwrap();
    drain.join().unwrap();
    let left = engine.dirty_blocks();
    assert!(
        left >= 30,
        "the drain went on after a client came back ({left} of 60 dirty blocks left)"
    );
}

#[test]
fn writes_to_a_cache_full_of_dirty_blocks_wait_for_writeback_instead_of_going_around() {
    let (origin, engine) = setup_with(common::held_writeback(), false);
    let total = engine.status().cache_blocks_total;
    // The origin holds its writes until a client write has waited: the
    // background writeback the full cache starts cannot free a slot first.
    origin.gate.lock().1 = false;
    // Every slot dirty, in one run of adjacent blocks.
    for b in 0..total {
        write_block(&engine, b);
    }
    assert_eq!(engine.dirty_blocks(), total);
    // New writes elsewhere: each finds no slot; writeback of the run frees
    // slots with a few origin requests, and the writes land in the cache.
    let e = engine.clone();
    let writer = std::thread::spawn(move || {
        for b in 0..20 {
            write_block(&e, 500 + b * 2);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.status().stats.slot_waits == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    {
        let mut g = origin.gate.lock();
        g.1 = true;
        origin.cv.notify_all();
    }
    writer.join().unwrap();
    let st = engine.status();
    assert!(st.stats.slot_waits >= 1, "no write waited");
    assert_eq!(st.stats.bypassed_ios, 0, "writes went around the cache");
    let writes = origin.writes.lock().len();
    assert!(writes <= 10, "{writes} origin writes to free the slots");
    for b in 0..20 {
        assert!(
            engine.read((500 + b * 2) * BS, BS).unwrap()[0]
                == ((500 + b * 2) as u8).wrapping_add(1)
        );
    }
    engine.close().unwrap();
}

/// A cache device with a queue of its own: each read takes 2 ms, reads
/// run at once (`reads_in_parallel`), and the most under way at one time
/// is recorded.
struct Queued {
    inner: FaultDevice,
    under_way: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl BlockDevice for Queued {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.under_way.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        self.under_way.fetch_sub(1, SeqCst);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DeviceResult<()> {
        self.inner.flush()
    }
    fn reads_in_parallel(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "queued cache"
    }
}

/// Blocks written in a shuffled order sit in scattered slots; writeback
/// reads an address run's slots several at a time from a device that
/// takes reads at once (`read_run`), and what reaches the origin is each
/// block's data, in runs.
#[test]
fn a_run_of_scattered_slots_is_read_several_at_a_time_and_written_back_right() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let origin = recorder();
    let cache = Arc::new(Queued {
        inner: FaultDevice::new("cache", common::cache_bytes_for(400, BS as u32), 1),
        under_way: Default::default(),
        most: Default::default(),
    });
    let opts = CreateOptions {
        writeback: common::held_writeback(),
        ..Default::default()
    };
    let engine = Engine::create(cache.clone(), origin.clone(), &opts).unwrap();
    let mut blocks: Vec<u64> = (0..300).collect();
    blocks.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(common::seed()));
    for &b in &blocks {
        write_block(&engine, b);
    }
    cache.most.store(0, std::sync::atomic::Ordering::SeqCst);
    engine.write_back_all(&mut |_, _| {}).unwrap();
    assert_eq!(engine.dirty_blocks(), 0);
    assert!(
        cache.most.load(std::sync::atomic::Ordering::SeqCst) > 1,
        "writeback read a run's scattered slots one at a time"
    );
    let mut got = vec![0u8; (300 * BS) as usize];
    origin.inner.read_at(&mut got, 0).unwrap();
    for (b, data) in got.chunks(BS as usize).enumerate() {
        assert!(
            data.iter().all(|&x| x == (b as u8).wrapping_add(1)),
            "block {b} on the origin"
        );
    }
    // Adjacent blocks went out together, whatever their slots.
    assert!(
        origin.writes.lock().len() < 30,
        "{:?}",
        origin.writes.lock().len()
    );
    engine.close().unwrap();
}
