//! The origin hangs nothing that does not need it, and never hides a lost
//! write (engine/io/origin_sync.rs, writeback/run.rs):
//!
//! - in writeback, a client's write and FLUSH complete while the origin is
//!   frozen in the middle of a writeback (the data is durable on the cache
//!   device; the commit no longer flushes the origin first);
//! - writeback marks blocks clean only after an origin flush that covers
//!   their writes, with no loss in between: an origin that restarts and
//!   loses its volatile cache before the flush gets the blocks again;
//! - a failed origin flush in writethrough fails that FLUSH and every later
//!   one until the lost range is written again (fsyncgate).
//!
//! The daemon-level tests (a SIGSTOPped nbdkit, a killed one) are in
//! tests/origin_outage.rs.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tiercache::device::fault::FaultDevice;
use tiercache::device::{BlockDevice, DeviceError, DeviceRef, DeviceResult};
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, WritebackOrder};

const ORIGIN_BYTES: u64 = 4 << 20;
const BS: u64 = 4096;

/// An origin over a fault device that can be frozen (its writes and
/// flushes wait, as a stopped server's do), restarted before its next
/// flush (losing what it had not flushed), or made to fail its next flush.
struct Origin {
    inner: Arc<FaultDevice>,
    frozen: Mutex<bool>,
    thawed: Condvar,
    /// Requests waiting while frozen.
    stuck: AtomicU32,
    restart_before_next_flush: AtomicBool,
    fail_next_flush: AtomicBool,
    flushes: AtomicU64,
}

impl Origin {
    fn new() -> Arc<Origin> {
        Arc::new(Origin {
            inner: Arc::new(FaultDevice::new("origin", ORIGIN_BYTES, 7)),
            frozen: Mutex::new(false),
            thawed: Condvar::new(),
            stuck: AtomicU32::new(0),
            restart_before_next_flush: AtomicBool::new(false),
            fail_next_flush: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
        })
    }

    fn wait_if_frozen(&self) {
        let mut f = self.frozen.lock();
        if *f {
            self.stuck.fetch_add(1, Ordering::SeqCst);
            while *f {
                self.thawed.wait(&mut f);
            }
            self.stuck.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn freeze(&self, on: bool) {
        *self.frozen.lock() = on;
        self.thawed.notify_all();
    }
}

impl BlockDevice for Origin {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.wait_if_frozen();
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        self.wait_if_frozen();
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DeviceResult<()> {
        self.wait_if_frozen();
        self.flushes.fetch_add(1, Ordering::SeqCst);
        if self.restart_before_next_flush.swap(false, Ordering::SeqCst) {
            self.inner.lose_unflushed();
        }
        if self.fail_next_flush.swap(false, Ordering::SeqCst) {
            return Err(DeviceError::Io {
                device: "origin".into(),
                what: "flush",
                source: std::io::Error::other("injected flush failure"),
            });
        }
        self.inner.flush()
    }
    fn name(&self) -> &str {
        "origin"
    }
    fn identity(&self) -> u64 {
        self.inner.identity()
    }
    fn loss_epoch(&self) -> u64 {
        self.inner.loss_epoch()
    }
}

fn engine(
    origin: &Arc<Origin>,
    mode: Mode,
    order: WritebackOrder,
    background: bool,
) -> Arc<Engine> {
    let (_, cache) = common::fault_dev("cache", common::cache_bytes_for(256, BS as u32), 3);
    let o: DeviceRef = origin.clone();
    let opts = CreateOptions {
        mode,
        writeback_order: order,
        writeback: common::eager_writeback(),
        ..Default::default()
    };
    Engine::create(cache.clone(), o.clone(), &opts)
        .unwrap()
        .close()
        .unwrap();
    let open = if background {
        OpenOptions::default()
    } else {
        common::no_bg()
    };
    Engine::open(cache, o, &open).unwrap()
}

fn block(b: u64, version: u8) -> Vec<u8> {
    vec![version.wrapping_add(b as u8); BS as usize]
}

/// Runs `f` on a thread; its result if it ends within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_client_flush_in_writeback_does_not_wait_for_a_frozen_origin() {
    for order in WritebackOrder::ALL {
        let origin = Origin::new();
        let e = engine(&origin, Mode::Writeback, order, true);
        for b in 0..200 {
            e.write(b * BS, &block(b, 1), false).unwrap();
        }
        e.flush().unwrap();
        origin.freeze(true);
        // Background writeback (eager: a second's age) is soon stuck in an
        // origin write.
        let t = Instant::now();
        while origin.stuck.load(Ordering::SeqCst) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "writeback never reached the origin"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let e2 = e.clone();
        let done = within(Duration::from_secs(5), move || {
            e2.write(300 * BS, &block(300, 2), false)?;
            e2.flush()?;
            e2.write(301 * BS, &block(301, 2), true)
        });
        let r = done
            .unwrap_or_else(|| panic!("{order:?}: a write and FLUSH hung on the frozen origin"));
        r.unwrap();
        origin.freeze(false);
        e.write_back_all(&mut |_, _| {}).unwrap();
        e.close().unwrap();
        let image = origin.inner.durable_image();
        for b in (0..200).chain(300..302) {
            let v = if b < 200 { 1 } else { 2 };
            let at = (b * BS) as usize;
            assert_eq!(
                &image[at..at + BS as usize],
                &block(b, v)[..],
                "{order:?}: block {b}"
            );
        }
    }
}

#[test]
fn writeback_writes_again_what_a_restarted_origin_lost() {
    for order in WritebackOrder::ALL {
        let origin = Origin::new();
        let e = engine(&origin, Mode::Writeback, order, false);
        for b in 0..64 {
            e.write(b * BS, &block(b, 5), false).unwrap();
        }
        e.flush().unwrap();
        // The origin takes the writes, then restarts before the flush
        // that would make them durable; the flush itself succeeds.
        origin
            .restart_before_next_flush
            .store(true, Ordering::SeqCst);
        let first = e.write_back_all(&mut |_, _| {});
        assert!(first.is_err(), "{order:?}: the loss went unnoticed");
        assert_eq!(
            e.dirty_blocks(),
            64,
            "{order:?}: blocks marked clean that the origin lost"
        );
        e.write_back_all(&mut |_, _| {}).unwrap();
        assert_eq!(e.dirty_blocks(), 0);
        e.close().unwrap();
        let image = origin.inner.durable_image();
        for b in 0..64 {
            let at = (b * BS) as usize;
            assert_eq!(
                &image[at..at + BS as usize],
                &block(b, 5)[..],
                "{order:?}: block {b}"
            );
        }
    }
}

#[test]
fn a_failed_origin_flush_fails_every_flush_until_the_range_is_written_again() {
    let origin = Origin::new();
    let e = engine(&origin, Mode::Writethrough, WritebackOrder::Address, false);
    e.write(0, &block(0, 1), false).unwrap();
    e.write(8 * BS, &block(8, 1), false).unwrap();
    origin.fail_next_flush.store(true, Ordering::SeqCst);
    assert!(e.flush().is_err(), "the failed origin flush was hidden");
    // The next origin flush would succeed: the writes it should cover may
    // be gone (fsyncgate), so the volume's flush still fails.
    let again = e.flush().unwrap_err().to_string();
    assert!(again.contains("written again"), "{again}");
    e.write(0, &block(0, 2), false).unwrap();
    assert!(e.flush().is_err(), "block 8 is not written again yet");
    e.write(8 * BS, &block(8, 2), false).unwrap();
    e.flush().unwrap();
    e.close().unwrap();
}

#[test]
fn a_writeback_commit_without_origin_writes_sends_no_origin_flush() {
    let origin = Origin::new();
    let e = engine(&origin, Mode::Writeback, WritebackOrder::Address, false);
    let before = origin.flushes.load(Ordering::SeqCst);
    for b in 0..16 {
        e.write(b * BS, &block(b, 1), true).unwrap();
        e.flush().unwrap();
    }
    assert_eq!(origin.flushes.load(Ordering::SeqCst), before);
    e.write_back_all(&mut |_, _| {}).unwrap();
    assert!(origin.flushes.load(Ordering::SeqCst) > before);
    e.close().unwrap();
}

/// With two volumes, an origin frozen in the middle of a background
/// writeback holds up its own volume's writeback and nothing else: the
/// other volume's dirty blocks, written after the freeze, are written
/// back by the background meanwhile (each origin has a lane of its own:
/// writeback/lanes.rs), and a client's writes and FLUSH to either volume
/// complete.
#[test]
fn a_frozen_origin_holds_up_only_its_own_volumes_background_writeback() {
    let frozen = Origin::new();
    let other = Arc::new(FaultDevice::new("other", ORIGIN_BYTES, 9));
    let (_, cache) = common::fault_dev("cache", common::cache_bytes_for(512, BS as u32), 3);
    let opts = CreateOptions {
        mode: Mode::Writeback,
        writeback: common::eager_writeback(),
        ..Default::default()
    };
    let named = vec![
        ("a".to_string(), other.clone() as DeviceRef),
        ("b".to_string(), frozen.clone() as DeviceRef),
    ];
    let e = Engine::create_volumes(cache, named, &opts, &OpenOptions::default()).unwrap();
    let (a, b) = (e.volumes()[0].1, e.volumes()[1].1);
    for k in 0..100 {
        e.write(b + k * BS, &block(k, 1), false).unwrap();
    }
    e.flush().unwrap();
    frozen.freeze(true);
    let t = Instant::now();
    while frozen.stuck.load(Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "writeback never reached b's origin"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Volume a's writes come after b's origin froze under a writeback.
    for k in 0..100 {
        e.write(a + k * BS, &block(k, 2), false).unwrap();
    }
    e.flush().unwrap();
    let a_dirty = |e: &Engine| e.status().volumes[0].cache_blocks_dirty;
    let t = Instant::now();
    while a_dirty(&e) > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "volume a's {} dirty blocks wait behind b's frozen origin",
            a_dirty(&e)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        e.status().volumes[1].cache_blocks_dirty > 0,
        "b's origin is frozen"
    );
    let e2 = e.clone();
    let done = within(Duration::from_secs(5), move || {
        e2.write(b + 300 * BS, &block(300, 3), false)?;
        e2.flush()
    });
    done.expect("a write and FLUSH to the frozen origin's volume hung")
        .unwrap();
    frozen.freeze(false);
    e.write_back_all(&mut |_, _| {}).unwrap();
    e.close().unwrap();
    let image = other.durable_image();
    for k in 0..100u64 {
        let at = (k * BS) as usize;
        assert_eq!(
            &image[at..at + BS as usize],
            &block(k, 2)[..],
            "a's block {k}"
        );
    }
    let image = frozen.inner.durable_image();
    for k in (0..100u64).chain([300]) {
        let v = if k < 100 { 1 } else { 3 };
        let at = (k * BS) as usize;
        assert_eq!(
            &image[at..at + BS as usize],
            &block(k, v)[..],
            "b's block {k}"
        );
    }
}
