//! Origin reads and writes started without blocking a thread
//! (engine/io/submitted.rs): over an origin that completes requests on its
//! own thread (`device::Submit`, as librbd does for `rbd://`), a read of
//! blocks the cache does not hold goes there from the caller's task, and
//! its blocks stay locked until the origin completes it and what it keeps
//! is stored; so does a write around the cache that needs nothing done
//! first. Here the origin is a RAM image with a volatile write cache
//! (`FaultDevice`) whose submitted requests a thread of its own completes,
//! past a gate the test may close.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tiercache::device::fault::FaultDevice;
use tiercache::device::{AlignedBuf, BlockDevice, DeviceResult, Done, Submit};
use tiercache::engine::async_engine::AsyncEngine;
use tiercache::engine::{CreateOptions, Engine, Mode};
use tiercache::volume::Volume;

const BS: u64 = 4096;
const SLOTS: u64 = 64;

/// A submitted request: buffer, offset, a write?, end.
type Job = (AlignedBuf, u64, bool, Done);

/// The origin: `inner`'s data; submitted requests are completed by a
/// thread of the device's own, each once the gate is open.
struct Threaded {
    inner: Arc<FaultDevice>,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Reads and writes submitted.
    submitted: AtomicU64,
    submitted_writes: AtomicU64,
    open: Arc<(Mutex<bool>, Condvar)>,
    /// Reads that reached the worker and wait at the gate.
    at_gate: Arc<AtomicU64>,
}

impl Threaded {
    fn new(inner: Arc<FaultDevice>) -> Arc<Threaded> {
        let (tx, rx) = mpsc::channel::<Job>();
        let open = Arc::new((Mutex::new(true), Condvar::new()));
        let at_gate = Arc::new(AtomicU64::new(0));
        let (dev, gate, waiting) = (inner.clone(), open.clone(), at_gate.clone());
        std::thread::spawn(move || {
            for (mut buf, offset, write, done) in rx {
                waiting.fetch_add(1, Ordering::SeqCst);
                let mut is_open = gate.0.lock();
                while !*is_open {
                    gate.1.wait(&mut is_open);
                }
                drop(is_open);
                waiting.fetch_sub(1, Ordering::SeqCst);
                let r = match write {
                    false => dev.read_at(&mut buf, offset),
                    true => dev.write_at(&buf, offset),
                };
                done(buf, r);
            }
        });
        Arc::new(Threaded {
            inner,
            jobs: Mutex::new(tx),
            submitted: AtomicU64::new(0),
            submitted_writes: AtomicU64::new(0),
            open,
            at_gate,
        })
    }

    fn set_gate(&self, open: bool) {
        *self.open.0.lock() = open;
        self.open.1.notify_all();
    }

    /// Waits (at most 10 s) until a request waits at the gate.
    fn wait_at_gate(&self) {
        for _ in 0..1000 {
            if self.at_gate.load(Ordering::SeqCst) > 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no submitted request reached the gate");
    }
}

impl BlockDevice for Threaded {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DeviceResult<()> {
        self.inner.flush()
    }
    fn loss_epoch(&self) -> u64 {
        self.inner.loss_epoch()
    }
    fn name(&self) -> &str {
        "threaded origin"
    }
    fn submitter(&self) -> Option<&dyn Submit> {
        Some(self)
    }
}

impl Submit for Threaded {
    fn submit_read(&self, buf: AlignedBuf, offset: u64, done: Done) {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        self.jobs.lock().send((buf, offset, false, done)).unwrap();
    }
    fn submit_write(&self, buf: AlignedBuf, offset: u64, done: Done) {
        self.submitted_writes.fetch_add(1, Ordering::SeqCst);
        self.jobs.lock().send((buf, offset, true, done)).unwrap();
    }
}

/// Origin block `b` holds bytes `b as u8 ^ 0x5a`.
fn origin_block(b: u64) -> Vec<u8> {
    vec![b as u8 ^ 0x5a; BS as usize]
}

struct Rig {
    origin: Arc<Threaded>,
    faults: Arc<FaultDevice>,
    cache: Arc<FaultDevice>,
    engine: Arc<Engine>,
    rt: tokio::runtime::Runtime,
}

fn rig(mode: Mode) -> Rig {
    let image: Vec<u8> = (0..256).flat_map(origin_block).collect();
    let faults = Arc::new(FaultDevice::from_image("origin", image, 2));
    let origin = Threaded::new(faults.clone());
    let cache = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(SLOTS, BS as u32),
        1,
    ));
    let opts = CreateOptions {
        mode,
        ..Default::default()
    };
    let engine = Engine::create(cache.clone(), origin.clone(), &opts).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    Rig {
        origin,
        faults,
        cache,
        engine,
        rt,
    }
}

impl Rig {
    /// A read of `block` started on the runtime with the origin's gate
    /// closed, once it waits at the gate.
    fn gated_read(
        &self,
        block: u64,
    ) -> tokio::task::JoinHandle<tiercache::volume::VolumeResult<AlignedBuf>> {
        self.origin.set_gate(false);
        let v = AsyncEngine::new(self.engine.clone());
        let read = self
            .rt
            .spawn(async move { v.read(block * BS, BS as u32).await });
        self.origin.wait_at_gate();
        read
    }

    /// Writes `data` at byte `at` through the asynchronous volume (a
    /// client's write).
    fn write(&self, at: u64, data: &[u8], fua: bool) -> tiercache::volume::VolumeResult<()> {
        let v = AsyncEngine::new(self.engine.clone());
        let data = AlignedBuf::from_slice(data);
        self.rt
            .block_on(async move { v.write(at, data, fua).await })
    }

    fn flush(&self) -> tiercache::volume::VolumeResult<()> {
        let v = AsyncEngine::new(self.engine.clone());
        self.rt.block_on(async move { v.flush().await })
    }

    fn submitted_writes(&self) -> u64 {
        self.origin.submitted_writes.load(Ordering::SeqCst)
    }

    fn read(&self, block: u64, blocks: u64) -> tiercache::volume::VolumeResult<AlignedBuf> {
        let v = AsyncEngine::new(self.engine.clone());
        self.rt
            .block_on(async move { v.read(block * BS, (blocks * BS) as u32).await })
    }
}

#[test]
fn passthrough_reads_are_submitted_and_right() {
    let r = rig(Mode::Passthrough);
    let reads_before = r.faults.reads();
    for (block, blocks) in [(0, 1), (7, 3), (100, 16), (255, 1)] {
        let got = r.read(block, blocks).unwrap();
        let want: Vec<u8> = (block..block + blocks).flat_map(origin_block).collect();
        assert!(got[..] == want[..], "blocks {block}+{blocks}");
    }
    assert_eq!(r.origin.submitted.load(Ordering::SeqCst), 4);
    // Each went to the origin once, through the submitted path only.
    assert_eq!(r.faults.reads() - reads_before, 4);
    let s = r.engine.status().stats;
    assert_eq!((s.read_requests, s.read_misses, s.origin_reads), (4, 21, 4));
    assert_eq!(s.origin_reads_submitted, 4);
    assert_eq!(s.origin_errors, 0);
}

#[test]
fn a_write_waits_for_the_submitted_read_of_its_block() {
    let r = rig(Mode::Passthrough);
    let read = r.gated_read(5);
    // A write of the read's block waits for the read's lock.
    let wrote = Arc::new(AtomicBool::new(false));
    let (engine, flag) = (r.engine.clone(), wrote.clone());
    let writer = std::thread::spawn(move || {
        engine.write(5 * BS, &[0xee; BS as usize], false).unwrap();
        flag.store(true, Ordering::SeqCst);
    });
    // A write of another block does not.
    r.engine.write(6 * BS, &[0xdd; BS as usize], false).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !wrote.load(Ordering::SeqCst),
        "the write went past a read holding its block"
    );
    r.origin.set_gate(true);
    let got = r.rt.block_on(read).unwrap().unwrap();
    assert!(
        got[..] == origin_block(5)[..],
        "the read started before the write"
    );
    writer.join().unwrap();
    assert!(wrote.load(Ordering::SeqCst));
    assert!(r.read(5, 2).unwrap()[..] == [[0xee; BS as usize], [0xdd; BS as usize]].concat()[..]);
}

#[test]
fn a_failed_submitted_read_is_an_error_and_lets_its_blocks_go() {
    let r = rig(Mode::Passthrough);
    r.faults.fail_reads_in(9 * BS, BS);
    assert!(r.read(8, 3).is_err());
    assert_eq!(r.engine.status().stats.origin_errors, 1);
    r.faults.clear_faults();
    // The blocks were unlocked: a write and a read of them go through.
    r.engine.write(9 * BS, &[0x11; BS as usize], false).unwrap();
    assert!(r.read(9, 1).unwrap()[..] == [0x11; BS as usize][..]);
}

#[test]
fn promoting_reads_of_whole_blocks_are_submitted_and_stored() {
    let r = rig(Mode::Writeback);
    assert!(r.read(3, 2).unwrap()[..] == [origin_block(3), origin_block(4)].concat()[..]);
    assert_eq!(r.origin.submitted.load(Ordering::SeqCst), 1);
    let s = r.engine.status().stats;
    assert_eq!((s.promotions, s.origin_reads_submitted), (2, 1));
    // Stored before the read ended: read again, they are hits.
    let reads = r.faults.reads();
    assert!(r.read(3, 2).unwrap()[..] == [origin_block(3), origin_block(4)].concat()[..]);
    assert_eq!(r.faults.reads(), reads);
    assert_eq!(r.engine.status().stats.read_hits, 2);
    // A read that promotes part of a block takes the blocking path.
    let v = AsyncEngine::new(r.engine.clone());
    let got = (r.rt)
        .block_on(async move { v.read(10 * BS + 512, 1024).await })
        .unwrap();
    assert!(got[..] == origin_block(10)[512..1536]);
    assert_eq!(r.origin.submitted.load(Ordering::SeqCst), 1);
}

#[test]
fn a_write_after_a_promoting_read_is_not_undone_by_its_promotion() {
    let r = rig(Mode::Writeback);
    let read = r.gated_read(5);
    let engine = r.engine.clone();
    let writer = std::thread::spawn(move || {
        engine.write(5 * BS, &[0xee; BS as usize], false).unwrap();
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!writer.is_finished(), "the write went past the read");
    r.origin.set_gate(true);
    assert!(r.rt.block_on(read).unwrap().unwrap()[..] == origin_block(5)[..]);
    writer.join().unwrap();
    // The promotion was stored before the write: the write's data stands,
    // in the cache and, once written back, on the origin.
    assert!(r.read(5, 1).unwrap()[..] == [0xee; BS as usize][..]);
    r.engine.write_back_all(&mut |_, _| {}).unwrap();
    let mut on_origin = vec![0; BS as usize];
    r.faults.read_at(&mut on_origin, 5 * BS).unwrap();
    assert_eq!(on_origin, vec![0xee; BS as usize]);
}

#[test]
fn a_read_nobody_awaits_still_ends_and_lets_its_blocks_go() {
    let r = rig(Mode::Writeback);
    let read = r.gated_read(7);
    read.abort();
    let _ = r.rt.block_on(read);
    r.origin.set_gate(true);
    // The read ended where its reply was dropped: the block is free.
    let (tx, rx) = mpsc::channel();
    let engine = r.engine.clone();
    std::thread::spawn(move || {
        let _ = tx.send(engine.write(7 * BS, &[0x33; BS as usize], false));
    });
    let wrote = rx.recv_timeout(Duration::from_secs(10));
    assert!(matches!(wrote, Ok(Ok(()))), "the block stayed locked");
    // Nobody wanted the data: it was not stored where the completion
    // dropped it (on the origin's thread), only counted as bypassed.
    let s = r.engine.status().stats;
    assert_eq!((s.promotions, s.bypassed_ios), (0, 1));
    assert!(r.read(7, 1).unwrap()[..] == [0x33; BS as usize][..]);
}

#[test]
fn a_promotion_the_cache_cannot_store_still_returns_the_data() {
    let r = rig(Mode::Writeback);
    r.cache.fail_writes_in(0, r.cache.size_bytes());
    assert!(r.read(40, 2).unwrap()[..] == [origin_block(40), origin_block(41)].concat()[..]);
    assert_eq!(r.origin.submitted.load(Ordering::SeqCst), 1);
    assert_eq!(r.engine.status().stats.promotions, 0);
    r.cache.clear_faults();
    assert!(r.read(40, 2).unwrap()[..] == [origin_block(40), origin_block(41)].concat()[..]);
}

#[test]
fn reads_of_cached_blocks_take_the_blocking_path() {
    // Writeonly does not promote: submitted, unless a block is dirty in
    // the cache (its only current copy).
    let r = rig(Mode::Writeonly);
    r.engine
        .write(20 * BS, &[0x77; BS as usize], false)
        .unwrap();
    let got = r.read(19, 3).unwrap();
    assert!(got[..] == [origin_block(19), vec![0x77; BS as usize], origin_block(21)].concat()[..]);
    assert_eq!(r.origin.submitted.load(Ordering::SeqCst), 0);
    assert!(r.read(30, 2).unwrap()[..] == [origin_block(30), origin_block(31)].concat()[..]);
    assert_eq!(r.origin.submitted.load(Ordering::SeqCst), 1);
}

#[test]
fn passthrough_writes_are_submitted_and_a_flush_makes_them_durable() {
    let r = rig(Mode::Passthrough);
    // Whole blocks, several, and a sector inside a block.
    r.write(10 * BS, &[0xa1; BS as usize], false).unwrap();
    r.write(12 * BS, &[0xa2; 3 * BS as usize], false).unwrap();
    r.write(20 * BS + 1024, &[0xa3; 512], false).unwrap();
    assert_eq!(r.submitted_writes(), 3);
    let s = r.engine.status().stats;
    assert_eq!(
        (s.write_requests, s.origin_writes, s.origin_writes_submitted),
        (3, 3, 3)
    );
    let mut want = r.faults.snapshot_current();
    want[10 * BS as usize..11 * BS as usize].fill(0xa1);
    want[12 * BS as usize..15 * BS as usize].fill(0xa2);
    want[(20 * BS + 1024) as usize..(20 * BS + 1536) as usize].fill(0xa3);
    assert!(r.faults.snapshot_current() == want);
    // Acknowledged, still in the origin's volatile cache: the flush makes
    // them durable (each was noted for the next origin flush).
    assert_eq!(r.faults.unflushed_writes(), 3);
    r.flush().unwrap();
    assert_eq!(r.faults.unflushed_writes(), 0);
    assert!(
        r.faults.durable_image() == want,
        "a flushed write is not durable"
    );
    assert!(r.read(12, 3).unwrap()[..] == [0xa2; 3 * BS as usize][..]);
}

#[test]
fn a_flush_after_the_origin_lost_a_submitted_write_fails() {
    let r = rig(Mode::Passthrough);
    r.write(30 * BS, &[0xb1; BS as usize], false).unwrap();
    assert_eq!(r.submitted_writes(), 1);
    // The origin's server restarts before the flush: the acknowledged
    // write is gone, and the flush must say so, not succeed.
    assert_eq!(r.faults.lose_unflushed(), 1);
    assert!(
        r.flush().is_err(),
        "a flush covered a write the origin lost"
    );
}

#[test]
fn a_read_of_a_block_waits_for_its_submitted_write() {
    let r = rig(Mode::Passthrough);
    r.origin.set_gate(false);
    let v = AsyncEngine::new(r.engine.clone());
    let data = AlignedBuf::from_slice(&[0xc1; BS as usize]);
    let write =
        r.rt.spawn(async move { v.write(5 * BS, data, false).await });
    r.origin.wait_at_gate();
    // A read of the block, on another thread, waits for the write's lock.
    let (tx, rx) = mpsc::channel();
    let engine = r.engine.clone();
    std::thread::spawn(move || {
        let _ = tx.send(engine.read(5 * BS, BS));
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a read went past a write holding its block"
    );
    r.origin.set_gate(true);
    r.rt.block_on(write).unwrap().unwrap();
    let got = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert!(
        got[..] == [0xc1; BS as usize][..],
        "the read missed the write"
    );
}

#[test]
fn a_failed_submitted_write_is_an_error_and_lets_its_blocks_go() {
    let r = rig(Mode::Passthrough);
    r.faults.fail_writes_in(40 * BS, BS);
    assert!(r.write(40 * BS, &[0xd1; BS as usize], false).is_err());
    assert_eq!(r.submitted_writes(), 1);
    assert_eq!(r.engine.status().stats.origin_errors, 1);
    r.faults.clear_faults();
    r.write(40 * BS, &[0xd2; BS as usize], false).unwrap();
    assert!(r.read(40, 1).unwrap()[..] == [0xd2; BS as usize][..]);
}

#[test]
fn writes_that_must_wait_or_commit_take_the_blocking_path() {
    let r = rig(Mode::Writearound);
    // FUA needs a commit: blocking path, durable on return.
    r.write(50 * BS, &[0xe1; BS as usize], true).unwrap();
    assert_eq!(r.submitted_writes(), 0);
    assert_eq!(r.faults.unflushed_writes(), 0);
    // A block the cache holds (writearound promotes reads): its copy is
    // dropped durably first, on the blocking path; reads see the write.
    assert!(r.read(51, 1).unwrap()[..] == origin_block(51)[..]);
    assert_eq!(r.engine.status().stats.promotions, 1);
    r.write(51 * BS, &[0xe2; BS as usize], false).unwrap();
    assert_eq!(r.submitted_writes(), 0);
    assert!(r.read(51, 1).unwrap()[..] == [0xe2; BS as usize][..]);
    // Writeback takes writes into the cache: never submitted.
    let wb = rig(Mode::Writeback);
    wb.write(52 * BS, &[0xe3; BS as usize], false).unwrap();
    assert_eq!(wb.submitted_writes(), 0);
    // An uncached block in writearound is.
    r.write(53 * BS, &[0xe4; BS as usize], false).unwrap();
    assert_eq!(r.submitted_writes(), 1);
}
