//! A read miss into the reader's buffer (`Engine::read_into`, what a ublk
//! queue's miss runs) is answered as soon as its data is read; what it
//! fetched is stored in the cache after that (engine/cache/deferred.rs),
//! still under the read's block locks. Over a cache device whose writes
//! are held at a gate: the read's data comes back while the promotion
//! waits; a request for the same blocks waits for the promotion; closing
//! waits for it, and the next open has the blocks cached. A read that
//! returns its own buffer (NBD's) stores first.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tiercache::device::fault::FaultDevice;
use tiercache::device::{AlignedBuf, BlockDevice, DeviceRef, DeviceResult};
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions};
use tiercache::volume::Dest;

const BS: u64 = 4096;
const SLOTS: u64 = 64;

/// The cache device: once `armed`, each write waits until the gate opens.
struct Gate {
    inner: Arc<FaultDevice>,
    armed: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
    /// Writes waiting at the gate now.
    waiting: Mutex<usize>,
}

impl Gate {
    fn close(&self) {
        *self.open.lock() = false;
        self.armed.store(true, Ordering::SeqCst);
    }

    fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }

    fn waiting(&self) -> usize {
        *self.waiting.lock()
    }

    /// Waits (at most 10 s) until `n` writes wait at the gate.
    fn wait_for_waiting(&self, n: usize) {
        for _ in 0..1000 {
            if self.waiting() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{n} writes never reached the gate ({} did)", self.waiting());
    }
}

impl BlockDevice for Gate {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        if self.armed.load(Ordering::SeqCst) {
            *self.waiting.lock() += 1;
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            drop(open);
            *self.waiting.lock() -= 1;
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DeviceResult<()> {
        self.inner.flush()
    }
    fn name(&self) -> &str {
        "gated cache"
    }
}

struct Rig {
    gate: Arc<Gate>,
    origin: Arc<FaultDevice>,
    engine: Arc<Engine>,
}

/// Origin block `b` holds bytes `b as u8 ^ 0x5a`.
fn origin_block(b: u64) -> Vec<u8> {
    vec![b as u8 ^ 0x5a; BS as usize]
}

fn rig() -> Rig {
    let image: Vec<u8> = (0..256).flat_map(origin_block).collect();
    let origin = Arc::new(FaultDevice::from_image("origin", image, 2));
    let cache = FaultDevice::new("cache", common::cache_bytes_for(SLOTS, BS as u32), 1);
    let gate = Arc::new(Gate {
        inner: Arc::new(cache),
        armed: AtomicBool::new(false),
        open: Mutex::new(true),
        opened: Condvar::new(),
        waiting: Mutex::new(0),
    });
    let opts = CreateOptions {
        mode: Mode::Writeback,
        ..Default::default()
    };
    let engine = Engine::create(gate.clone(), origin.clone(), &opts).unwrap();
    Rig {
        gate,
        origin,
        engine,
    }
}

fn expect_blocks(data: &[u8], first: u64) {
    for (k, got) in data.chunks(BS as usize).enumerate() {
        let b = first + k as u64;
        assert!(got == origin_block(b), "block {b} reads {:#x}..", got[0]);
    }
}

impl Rig {
    /// Reads `blocks` blocks from `first` into a buffer it lends, in a
    /// thread of its own: the data comes through the channel at the reply.
    fn read_in_background(
        &self,
        first: u64,
        blocks: u64,
    ) -> std::sync::mpsc::Receiver<Result<AlignedBuf, String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = self.engine.clone();
        std::thread::spawn(move || {
            let len = (blocks * BS) as usize;
            let mut buf = AlignedBuf::zeroed(len);
            // SAFETY: `buf`'s memory lives in the reply closure, which
            // only hands it on once the Dest is given back and dropped.
            let dest = unsafe { Dest::new(buf.as_mut_ptr(), len, || {}) };
            engine.read_into(first * BS, dest, move |dest, r| {
                drop(dest);
                let _ = tx.send(r.map(|()| buf).map_err(|e| e.to_string()));
                // This thread goes on with the promotion after this.
            });
        });
        rx
    }

    /// The answer of `rx` within 10 s; on none, opens the gate (so the
    /// runtime can stop) and fails.
    fn answer(
        &self,
        rx: &std::sync::mpsc::Receiver<Result<AlignedBuf, String>>,
        what: &str,
    ) -> AlignedBuf {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r.unwrap(),
            Err(_) => {
                self.gate.open();
                panic!("{what}: no answer in 10 s");
            }
        }
    }

    fn promotions(&self) -> u64 {
        self.engine.status().stats.promotions
    }
}

#[test]
fn a_miss_is_answered_before_its_promotion_is_stored() {
    let r = rig();
    r.gate.close();
    let first = r.read_in_background(8, 16);
    let data = r.answer(&first, "the miss's data, while its promotion waits");
    expect_blocks(&data, 8);
    r.gate.wait_for_waiting(1);
    assert_eq!(r.promotions(), 0, "the promotion is still waiting");
    // The same blocks again: the read waits for the promotion's locks.
    let again = r.read_in_background(12, 2);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        again.try_recv().is_err(),
        "a read of the blocks waits for their promotion"
    );
    let origin_reads = r.origin.reads();
    r.gate.open();
    let data = r.answer(&again, "the second read");
    expect_blocks(&data, 12);
    assert_eq!(r.promotions(), 16);
    assert_eq!(r.origin.reads(), origin_reads, "the second read was a hit");
    r.engine.close().unwrap();
}

#[test]
fn closing_waits_for_a_promotion_and_the_next_open_has_its_blocks() {
    let r = rig();
    r.gate.close();
    let first = r.read_in_background(0, 8);
    expect_blocks(
        &r.answer(&first, "the miss's data, while its promotion waits"),
        0,
    );
    r.gate.wait_for_waiting(1);
    let (done_tx, done) = std::sync::mpsc::channel();
    let engine = r.engine.clone();
    std::thread::spawn(move || done_tx.send(engine.close().map_err(|e| e.to_string())));
    std::thread::sleep(Duration::from_millis(300));
    assert!(done.try_recv().is_err(), "close waits for the promotion");
    r.gate.open();
    done.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(r.promotions(), 8);
    let cache: DeviceRef = r.gate.clone();
    let again = Engine::open(cache, r.origin.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(
        again.status().cache_blocks_used,
        8,
        "the promoted blocks are cached"
    );
    let before = r.origin.reads();
    expect_blocks(&again.read(0, 8 * BS).unwrap(), 0);
    assert_eq!(r.origin.reads(), before, "read from the cache");
    again.close().unwrap();
}

#[test]
fn a_read_that_returns_its_own_buffer_stores_first() {
    let r = rig();
    let data = r.engine.read(4 * BS, 4 * BS).unwrap();
    expect_blocks(&data, 4);
    assert_eq!(r.promotions(), 4);
    // Over NBD too (the server's reads): a client that reads, then asks
    // what is cached, sees the promotion.
    let vol = tiercache::engine::async_engine::AsyncEngine::new(r.engine.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    use tiercache::volume::Volume;
    let data = rt.block_on(vol.read(20 * BS, (4 * BS) as u32)).unwrap();
    expect_blocks(&data, 20);
    assert_eq!(r.promotions(), 8);
    r.engine.close().unwrap();
}
