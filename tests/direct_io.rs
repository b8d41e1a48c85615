//! Requests whose cache device I/O the front end makes itself
//! (`Volume::start_read`, `start_write`, src/engine/io/direct.rs): the
//! ublk queue reads hits and writes what the cache takes at once on its
//! own io_uring, straight to and from the request's buffer. Here the test
//! makes those requests with pread and pwrite on the descriptor the engine
//! names, over real files, and checks what the queue relies on: the data
//! lies (or goes) where the engine says, the blocks stay locked until the
//! request is finished (a write or read of them waits), a write is
//! recorded only once finished, a failed or abandoned request is finished
//! by the engine and counted once, and what the cache cannot serve at once
//! never comes back as a direct request. A read of blocks the cache holds
//! none of comes back as a direct read of the origin file
//! (src/engine/io/direct_origin.rs): the same rules, and its promotion is
//! stored after it is finished. The ublk path itself runs in the guest
//! (scripts/guest-test.sh: ublk_fio_verify_writeback, ublk_ext4_*).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiercache::device::file::FileDevice;
use tiercache::device::ram::RamDevice;
use tiercache::device::{AlignedBuf, DeviceRef};
use tiercache::engine::async_engine::AsyncEngine;
use tiercache::engine::{CreateOptions, Engine, Mode};
use tiercache::volume::{Dest, Direct, DirectRead, DirectWrite, ReadStart, Start, Volume};

const BS: u64 = 4096;
const ORIGIN_BYTE: u8 = 0x11;

struct Files {
    _dir: tempfile::TempDir,
    engine: Arc<Engine>,
    vol: AsyncEngine,
    rt: tokio::runtime::Runtime,
}

/// A write started on its own thread, to see whether a lock holds it.
struct WriteBehind {
    thread: std::thread::JoinHandle<()>,
    wrote: Arc<AtomicBool>,
}

impl WriteBehind {
    /// The write has returned.
    fn done(&self) -> bool {
        self.wrote.load(Ordering::SeqCst)
    }

    fn join(self) {
        self.thread.join().unwrap();
    }
}

/// Writes `data` at `at` through the engine on a thread of its own.
fn write_behind(f: &Files, at: u64, data: Vec<u8>) -> WriteBehind {
    let (e, wrote) = (f.engine.clone(), Arc::new(AtomicBool::new(false)));
    let done = wrote.clone();
    let thread = std::thread::spawn(move || {
        e.write(at, &data, false).unwrap();
        done.store(true, Ordering::SeqCst);
    });
    WriteBehind { thread, wrote }
}

/// A writeback cache of 64 blocks on a file, over a 1 MiB origin file of
/// `ORIGIN_BYTE`s; `ram_cache` puts the cache in memory instead (in
/// writethrough: a volatile cache takes no dirty data).
fn files(ram_cache: bool) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let origin_path = dir.path().join("origin");
    std::fs::write(&origin_path, vec![ORIGIN_BYTE; 1 << 20]).unwrap();
    let cache_path = dir.path().join("cache");
    let cache_bytes = common::cache_bytes_for(64, BS as u32);
    let cache: DeviceRef = if ram_cache {
        Arc::new(RamDevice::new("cache", cache_bytes))
    } else {
        std::fs::File::create(&cache_path)
            .unwrap()
            .set_len(cache_bytes)
            .unwrap();
        Arc::new(FileDevice::open(cache_path.to_str().unwrap()).unwrap())
    };
    let origin = Arc::new(FileDevice::open(origin_path.to_str().unwrap()).unwrap());
    let opts = CreateOptions {
        mode: if ram_cache {
            Mode::Writethrough
        } else {
            Mode::Writeback
        },
        ..Default::default()
    };
    let engine = Engine::create(cache, origin, &opts).unwrap();
    let vol = AsyncEngine::new(engine.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    Files {
        _dir: dir,
        engine,
        vol,
        rt,
    }
}

fn block(v: u8) -> Vec<u8> {
    vec![v; BS as usize]
}

/// Makes a direct read's device reads (as the ublk queue does, with
/// pread), into a buffer of `len` bytes.
fn read_pieces(d: &DirectRead, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len);
    for p in &d.pieces {
        let dst = &mut buf[p.buf.clone()];
        // SAFETY: `dst` is a live, writable slice of the length given.
        let n = unsafe {
            libc::pread(
                d.fd,
                dst.as_mut_ptr().cast(),
                dst.len(),
                p.at as libc::off_t,
            )
        };
        assert_eq!(n, dst.len() as isize, "pread of {p:?}");
    }
    buf
}

/// Makes a direct write's device writes (pwrite) from `data`.
fn write_pieces(d: &DirectWrite, data: &[u8]) {
    let src = AlignedBuf::from_slice(data);
    for p in &d.pieces {
        let from = &src[p.buf.clone()];
        // SAFETY: `from` is a live slice of the length given.
        let n =
            unsafe { libc::pwrite(d.fd, from.as_ptr().cast(), from.len(), p.at as libc::off_t) };
        assert_eq!(n, from.len() as isize, "pwrite of {p:?}");
    }
}

fn direct<T, B>(start: Start<T, B>) -> Direct<T> {
    match start {
        Start::Direct(d) => d,
        Start::Later(_) | Start::Blocking(_) => {
            panic!("expected a direct request, got one the engine goes on with")
        }
        Start::Default => panic!("expected a direct request, got none"),
    }
}

/// A read the engine goes on with on a thread that may block (as a ublk
/// queue runs it: into a buffer lent until the reply), run on a thread of
/// its own; its data or error comes through the channel, once the buffer
/// was given back.
fn go_on(start: ReadStart, len: usize) -> std::sync::mpsc::Receiver<Result<Vec<u8>, String>> {
    let Start::Blocking(read) = start else {
        panic!("a read that is not all hits must go on in the engine, on a blocking thread");
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = AlignedBuf::zeroed(len);
        let given_back = Arc::new(AtomicBool::new(false));
        let (g, (reply_tx, reply_rx)) = (given_back.clone(), std::sync::mpsc::channel());
        // SAFETY: `buf` outlives the Dest, and is not touched until the
        // reply (which comes after the Dest is given back and dropped).
        let dest = unsafe {
            Dest::new(buf.as_mut_ptr(), len, move || {
                g.store(true, Ordering::SeqCst)
            })
        };
        read(
            dest,
            Box::new(move |dest, r| {
                drop(dest);
                let _ = reply_tx.send(r);
            }),
        );
        let r = reply_rx.recv().expect("the read replies");
        assert!(given_back.load(Ordering::SeqCst));
        let _ = tx.send(r.map(|()| buf.to_vec()).map_err(|e| e.to_string()));
    });
    rx
}

fn read_hits(e: &Engine) -> u64 {
    e.status().stats.read_hits
}

fn write_requests(e: &Engine) -> u64 {
    e.status().stats.write_requests
}

fn read(f: &Files, at: u64, len: u64) -> Vec<u8> {
    f.engine.read(at, len).unwrap().to_vec()
}

#[test]
fn a_hit_is_read_where_the_engine_says_and_counted_once() {
    let f = files(false);
    let _rt = f.rt.enter();
    f.engine.write(3 * BS, &block(3), false).unwrap();
    f.engine.write(4 * BS, &block(4), false).unwrap();
    f.engine.write(9 * BS, &block(9), false).unwrap();
    let before = read_hits(&f.engine);
    // Blocks 3 and 4, and 9: whatever slots they got, each piece says
    // where, and the request's buffer gets them in order.
    let d = direct(f.vol.start_read(3 * BS, 2 * BS as u32));
    let got = read_pieces(&d, 2 * BS as usize);
    assert!(d.finish(true, &[]).is_none());
    assert_eq!(got.to_vec(), [block(3), block(4)].concat());
    // Part of a block: 1 KiB from inside block 9.
    let d = direct(f.vol.start_read(9 * BS + 1024, 1024));
    assert_eq!(d.pieces.len(), 1);
    let got = read_pieces(&d, 1024);
    assert!(d.finish(true, &[]).is_none());
    assert_eq!(got.to_vec(), vec![9u8; 1024]);
    assert_eq!(read_hits(&f.engine), before + 3);
}

#[test]
fn what_is_not_all_hits_is_never_a_direct_read() {
    let f = files(false);
    let _rt = f.rt.enter();
    f.engine.write(3 * BS, &block(3), false).unwrap();
    // Block 3 cached, block 4 not: the engine reads it its own way.
    let got = go_on(f.vol.start_read(3 * BS, 2 * BS as u32), 2 * BS as usize);
    let got = got.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(got, [block(3), block(ORIGIN_BYTE)].concat());
    // Read again: both blocks are hits now (the miss was promoted).
    let d = direct(f.vol.start_read(3 * BS, 2 * BS as u32));
    assert_eq!(
        read_pieces(&d, 2 * BS as usize).to_vec(),
        [block(3), block(ORIGIN_BYTE)].concat()
    );
    assert!(d.finish(true, &[]).is_none());
    // Beyond the end: the error comes back, not a direct read.
    match f.vol.start_read(1 << 20, BS as u32) {
        ReadStart::Later(later) => assert!(f.rt.block_on(later).is_err()),
        _ => panic!("a read past the end must fail"),
    }
    // A cache device that is no file: nothing is started.
    let ram = files(true);
    ram.engine.write(3 * BS, &block(3), false).unwrap();
    assert!(matches!(
        ram.vol.start_read(3 * BS, BS as u32),
        ReadStart::Default
    ));
}

#[test]
fn a_direct_read_holds_its_blocks_until_it_is_finished() {
    let f = files(false);
    let _rt = f.rt.enter();
    f.engine.write(5 * BS, &block(5), false).unwrap();
    let d = direct(f.vol.start_read(5 * BS, BS as u32));
    // A second read of the block cannot take it: the engine goes on with
    // it, and it waits (on the blocking pool) for the first.
    let second = go_on(f.vol.start_read(5 * BS, BS as u32), BS as usize);
    // A write of the block waits too.
    let writer = write_behind(&f, 5 * BS, block(0x55));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!writer.done(), "a write went past a direct read's lock");
    assert!(
        second.try_recv().is_err(),
        "a read went past a direct read's lock"
    );
    let got = read_pieces(&d, BS as usize);
    assert!(d.finish(true, &[]).is_none());
    assert_eq!(got.to_vec(), block(5));
    writer.join();
    let second = second
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert!(second == block(5) || second == block(0x55));
    // The write landed; the block is free for direct reads again.
    let d: DirectRead = direct(f.vol.start_read(5 * BS, BS as u32));
    assert_eq!(read_pieces(&d, BS as usize).to_vec(), block(0x55));
}

#[test]
fn a_failed_or_dropped_direct_read_is_finished_by_the_engine_and_counted_once() {
    let f = files(false);
    let _rt = f.rt.enter();
    f.engine.write(7 * BS, &block(7), false).unwrap();
    let before = read_hits(&f.engine);
    let d = direct(f.vol.start_read(7 * BS, BS as u32));
    let later = d
        .finish(false, &[])
        .expect("a failed read is finished by the engine");
    assert_eq!(f.rt.block_on(later).unwrap().to_vec(), block(7));
    assert_eq!(read_hits(&f.engine), before + 1, "counted once");
    // Dropped without a word (a queue that stopped): the block is let go.
    drop(direct(f.vol.start_read(7 * BS, BS as u32)));
    f.engine.write(7 * BS, &block(0x77), false).unwrap();
    let d = direct(f.vol.start_read(7 * BS, BS as u32));
    assert_eq!(read_pieces(&d, BS as usize).to_vec(), block(0x77));
    assert!(d.finish(true, &[]).is_none());
}

#[test]
fn a_write_the_cache_takes_goes_where_the_engine_says_and_is_recorded_when_finished() {
    let f = files(false);
    let _rt = f.rt.enter();
    let writes = write_requests(&f.engine);
    // Two whole blocks not cached: new slots.
    let data = [block(3), block(4)].concat();
    let w = direct(f.vol.start_write(3 * BS, &data, false));
    write_pieces(&w, &data);
    // Not recorded before it is finished: the blocks are not cached yet.
    assert_eq!(f.engine.dirty_blocks(), 0);
    assert!(w.finish(true, &data).is_none());
    assert_eq!(f.engine.dirty_blocks(), 2);
    assert_eq!(read(&f, 3 * BS, 2 * BS), data);
    // Part of a dirty block: written in place, one piece.
    let part = vec![0x3A; 1024];
    let w = direct(f.vol.start_write(3 * BS + 2048, &part, false));
    assert_eq!(w.pieces.len(), 1);
    write_pieces(&w, &part);
    assert!(w.finish(true, &part).is_none());
    let mut want = block(3);
    want[2048..3072].copy_from_slice(&part);
    assert_eq!(read(&f, 3 * BS, BS), want);
    // Parts of blocks not cached: new slots holding those sectors, the
    // rest of each block still the origin's; across a block boundary too.
    let part = vec![0xC4; 2048];
    let w = direct(f.vol.start_write(12 * BS + 3072, &part, false));
    write_pieces(&w, &part);
    assert!(w.finish(true, &part).is_none());
    let mut want = block(ORIGIN_BYTE).repeat(2);
    want[3072..5120].copy_from_slice(&part);
    assert_eq!(read(&f, 12 * BS, 2 * BS), want);
    assert_eq!(write_requests(&f.engine), writes + 3);
    // A flush commits it like any write.
    f.engine.flush().unwrap();
    assert_eq!(f.engine.dirty_blocks(), 4);
}

#[test]
fn what_the_cache_cannot_take_at_once_is_never_a_direct_write() {
    let f = files(false);
    let _rt = f.rt.enter();
    // A write with FUA (it commits), and one in writethrough (it goes to
    // the origin): the engine's way.
    let start = |at: u64, data: &[u8], fua: bool| match f.vol.start_write(at, data, fua) {
        Start::Later(later) => f.rt.block_on(later).unwrap(),
        _ => panic!("a write at {at} (fua {fua}) must go on in the engine"),
    };
    start(10 * BS, &block(10), true);
    assert_eq!(read(&f, 10 * BS, BS), block(10));
    f.engine.set_mode(Mode::Writethrough).unwrap();
    start(11 * BS, &block(11), false);
    assert_eq!(read(&f, 11 * BS, BS), block(11));
    // No file under the cache: nothing is started.
    let ram = files(true);
    assert!(matches!(
        ram.vol.start_write(3 * BS, &block(3), false),
        Start::Default
    ));
}

/// A write over blocks the cache holds in part and blocks it holds none of
/// (random writes smaller than a block cross block boundaries) is placed
/// segment by segment: parts of blocks in place over their writable
/// slots, whole blocks and parts of blocks not cached into new slots.
#[test]
fn a_write_over_cached_and_uncached_blocks_is_a_direct_write_placed_by_segment() {
    let f = files(false);
    let _rt = f.rt.enter();
    let writes = write_requests(&f.engine);
    // Block 20's last 1 KiB cached, dirty.
    f.engine
        .write(20 * BS + 3072, &[0x20; 1024], false)
        .unwrap();
    // Its last 2 KiB (half dirty, half empty) and block 21's first 1 KiB
    // (not cached): one piece if the new slot follows block 20's.
    let data = vec![0xA1; 3072];
    let w = direct(f.vol.start_write(20 * BS + 2048, &data, false));
    assert!(w.pieces.len() <= 2, "{:?}", w.pieces);
    write_pieces(&w, &data);
    assert_eq!(
        f.engine.dirty_blocks(),
        1,
        "recorded before it was finished"
    );
    assert!(w.finish(true, &data).is_none());
    assert_eq!(f.engine.dirty_blocks(), 2);
    // (A read of block 21 now would fill its other sectors, clean.)
    let mut want = block(ORIGIN_BYTE);
    want[2048..].fill(0xA1);
    assert_eq!(read(&f, 20 * BS, BS), want);
    // A part of cached block 21, two whole blocks, a part of block 24.
    let data = vec![0xA2; 3 * BS as usize];
    let w = direct(f.vol.start_write(21 * BS + 2048, &data, false));
    write_pieces(&w, &data);
    assert!(w.finish(true, &data).is_none());
    assert_eq!(f.engine.dirty_blocks(), 5);
    let mut want = block(ORIGIN_BYTE).repeat(4);
    want[..1024].fill(0xA1);
    want[2048..2048 + data.len()].copy_from_slice(&data);
    assert_eq!(read(&f, 21 * BS, 4 * BS), want);
    assert_eq!(write_requests(&f.engine), writes + 3);

    // Dropped, or failed: its new slots given back, nothing recorded.
    f.engine.write(26 * BS, &[0x26; 1024], false).unwrap();
    let (used, dirty) = (f.engine.status().cache_blocks_used, f.engine.dirty_blocks());
    let data = vec![0xA3; 2048];
    let w = direct(f.vol.start_write(26 * BS + 3072, &data, false));
    write_pieces(&w, &data);
    drop(w);
    assert_eq!(f.engine.status().cache_blocks_used, used);
    assert_eq!(f.engine.dirty_blocks(), dirty);
    let w = direct(f.vol.start_write(26 * BS + 3072, &data, false));
    let later = w.finish(false, &data).expect("finished by the engine");
    f.rt.block_on(later).unwrap();
    let mut want = block(ORIGIN_BYTE).repeat(2);
    want[..1024].fill(0x26);
    want[3072..5120].copy_from_slice(&data);
    assert_eq!(read(&f, 26 * BS, 2 * BS), want);

    // A part of a block whose slot holds clean data there (promoted by a
    // read) is no direct write: the engine copies the block to a new slot.
    assert_eq!(read(&f, 30 * BS, BS), block(ORIGIN_BYTE));
    let data = vec![0xA4; 2048];
    match f.vol.start_write(30 * BS + 3072, &data, false) {
        Start::Later(later) => f.rt.block_on(later).unwrap(),
        _ => panic!("a write over clean cached sectors must go on in the engine"),
    }
    let mut want = block(ORIGIN_BYTE).repeat(2);
    want[3072..5120].copy_from_slice(&data);
    assert_eq!(read(&f, 30 * BS, 2 * BS), want);
}

/// The same rule on the fast path NBD requests take first
/// (`Engine::try_write_cached`, on the calling thread): a write over a
/// block cached in part and one not cached is done at once; one over
/// clean cached sectors is handed on.
#[test]
fn the_calling_threads_fast_path_takes_a_write_over_cached_and_uncached_blocks() {
    use tiercache::engine::Fast;
    let f = files(false);
    f.engine
        .write(20 * BS + 3072, &[0x20; 1024], false)
        .unwrap();
    let data = vec![0xB1; 3072];
    assert!(matches!(
        f.engine.try_write_cached(20 * BS + 2048, &data, false),
        Fast::Done(Ok(()))
    ));
    assert_eq!(f.engine.dirty_blocks(), 2);
    let mut want = block(ORIGIN_BYTE).repeat(2);
    want[2048..5120].copy_from_slice(&data);
    assert_eq!(read(&f, 20 * BS, 2 * BS), want);
    // Block 21's other sectors are clean now (the read filled them).
    match f.engine.try_write_cached(21 * BS + 2048, &data, false) {
        Fast::Pending(req) => f.engine.write_request(req, &data).unwrap(),
        Fast::Done(r) => panic!("a write over clean cached sectors was done at once: {r:?}"),
    }
    want.extend(block(ORIGIN_BYTE));
    want[BS as usize + 2048..BS as usize + 5120].copy_from_slice(&data);
    assert_eq!(read(&f, 20 * BS, 3 * BS), want);
}

#[test]
fn a_direct_write_holds_its_blocks_and_a_failed_or_dropped_one_leaves_no_trace() {
    let f = files(false);
    let _rt = f.rt.enter();
    let w = direct(f.vol.start_write(6 * BS, &block(6), false));
    // A read of the block waits for the write's end.
    let reader = {
        let e = f.engine.clone();
        std::thread::spawn(move || e.read(6 * BS, BS).unwrap().to_vec())
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !reader.is_finished(),
        "a read went past a direct write's lock"
    );
    write_pieces(&w, &block(6));
    assert!(w.finish(true, &block(6)).is_none());
    assert_eq!(reader.join().unwrap(), block(6));

    // Dropped (a queue that stopped): nothing recorded, its slots back.
    let used = f.engine.status().cache_blocks_used;
    let w = direct(f.vol.start_write(7 * BS, &block(7), false));
    write_pieces(&w, &block(7));
    drop(w);
    assert_eq!(f.engine.status().cache_blocks_used, used);
    assert_eq!(f.engine.dirty_blocks(), 1);
    assert_eq!(read(&f, 7 * BS, BS), block(ORIGIN_BYTE));

    // Failed: the engine writes it its own way, counted once.
    let writes = write_requests(&f.engine);
    let w = direct(f.vol.start_write(8 * BS, &block(8), false));
    let later = w.finish(false, &block(8)).expect("finished by the engine");
    f.rt.block_on(later).unwrap();
    assert_eq!(read(&f, 8 * BS, BS), block(8));
    assert_eq!(write_requests(&f.engine), writes + 1);
}

/// Random direct writes (whole blocks, parts, in place and into new
/// slots), a flush, more writes, then a crash (the engine abandoned, as a
/// killed daemon leaves it) and a fresh open of the same files: every
/// sector written before the flush reads as it was then; one written after
/// reads as then or as one of the writes since, never anything else.
/// Replays with TIERCACHE_SEED.
#[test]
fn flushed_direct_writes_survive_a_crash() {
    use rand::{Rng, SeedableRng};
    let seed = common::seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let f = files(false);
    let _rt = f.rt.enter();
    let sectors = (1 << 20) / 512;
    // Per sector: the value it must hold, and after the flush the values
    // it may hold.
    let mut model = vec![ORIGIN_BYTE; sectors];
    let mut since: Vec<Vec<u8>> = vec![Vec::new(); sectors];
    let mut flushed = false;
    for op in 0..200u32 {
        if op == 120 {
            f.engine.flush().unwrap();
            flushed = true;
        }
        // 40 blocks, so the 64-slot cache takes every write.
        let first = rng.gen_range(0..40 * 8);
        let n = rng.gen_range(1..=16usize).min(40 * 8 - first);
        let v = (op % 200 + 20) as u8;
        let data = vec![v; n * 512];
        match f.vol.start_write(first as u64 * 512, &data, false) {
            Start::Direct(w) => {
                write_pieces(&w, &data);
                assert!(w.finish(true, &data).is_none());
            }
            Start::Later(later) => f.rt.block_on(later).unwrap(),
            Start::Default => panic!("a file cache gives no default"),
        }
        for s in first..first + n {
            match flushed {
                false => model[s] = v,
                true => since[s].push(v),
            }
        }
    }
    f.engine.abandon();
    let Files {
        engine,
        vol,
        _dir: dir,
        ..
    } = f;
    drop((vol, engine));
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let cache = Arc::new(FileDevice::open(&path("cache")).unwrap());
    let origin = Arc::new(FileDevice::open(&path("origin")).unwrap());
    let engine = Engine::open(cache, origin, &Default::default()).unwrap();
    let got = engine.read(0, 1 << 20).unwrap();
    for (s, sector) in got.chunks(512).enumerate() {
        let ok = sector.iter().all(|&b| b == sector[0])
            && (sector[0] == model[s] || since[s].contains(&sector[0]));
        assert!(
            ok,
            "seed {seed}: sector {s} reads {:#x}.., must be {:#x} or one of {:?}",
            sector[0], model[s], since[s]
        );
    }
}

/// Polls `cond` for up to 10 s.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_miss_of_blocks_nothing_holds_is_read_from_the_origin_where_the_engine_says() {
    let f = files(false);
    let _rt = f.rt.enter();
    let before = f.engine.status().stats;
    // Blocks 20 and 21, cached by nobody: the origin's bytes at the
    // request's own offset, into the request's buffer.
    let d = direct(f.vol.start_read(20 * BS, 2 * BS as u32));
    assert_eq!(d.pieces.len(), 1);
    assert_eq!(
        (d.pieces[0].at, d.pieces[0].buf.clone()),
        (20 * BS, 0..2 * BS as usize)
    );
    let got = read_pieces(&d, 2 * BS as usize);
    assert_eq!(got.to_vec(), vec![ORIGIN_BYTE; 2 * BS as usize]);
    assert!(d.finish(true, &got).is_none(), "done once read");
    // Writeback promotes them, on the blocking pool after the reply.
    eventually("the promotion stored", || {
        f.engine.status().stats.promotions == before.promotions + 2
    });
    let after = f.engine.status().stats;
    assert_eq!(after.read_misses, before.read_misses + 2);
    assert_eq!(
        (after.read_requests, after.origin_reads),
        (before.read_requests + 1, before.origin_reads + 1)
    );
    // Now hits, read from the cache device.
    let d = direct(f.vol.start_read(20 * BS, 2 * BS as u32));
    assert_ne!(d.pieces[0].at, 20 * BS, "a cache slot, not the origin");
    assert_eq!(
        read_pieces(&d, 2 * BS as usize).to_vec(),
        vec![ORIGIN_BYTE; 2 * BS as usize]
    );
    assert!(d.finish(true, &[]).is_none());
    // Passthrough keeps nothing: counted as bypassed, nothing stored.
    f.engine.set_mode(Mode::Passthrough).unwrap();
    let before = f.engine.status().stats;
    let d = direct(f.vol.start_read(30 * BS + 512, 1024));
    assert_eq!(d.pieces[0].at, 30 * BS + 512);
    let got = read_pieces(&d, 1024);
    assert!(d.finish(true, &got).is_none());
    let after = f.engine.status().stats;
    assert_eq!(after.bypassed_ios, before.bypassed_ios + 1);
    assert_eq!(after.promotions, before.promotions);
    // Block 30 was not kept: the cache holds blocks 20 and 21 only.
    assert_eq!(f.engine.status().cache_blocks_used, 2);
}

#[test]
fn a_direct_origin_read_holds_its_blocks_until_its_promotion_is_stored() {
    let f = files(false);
    let _rt = f.rt.enter();
    let d = direct(f.vol.start_read(40 * BS, BS as u32));
    let writer = write_behind(&f, 40 * BS, block(0x40));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!writer.done(), "a write went past the read's lock");
    let got = read_pieces(&d, BS as usize);
    assert!(d.finish(true, &got).is_none());
    assert_eq!(got.to_vec(), block(ORIGIN_BYTE));
    writer.join();
    // The write came after the promotion: it is what the block holds.
    assert_eq!(read(&f, 40 * BS, BS), block(0x40));
}

#[test]
fn a_failed_or_dropped_direct_origin_read_is_finished_by_the_engine_and_counted_once() {
    let f = files(false);
    let _rt = f.rt.enter();
    let before = f.engine.status().stats;
    let d = direct(f.vol.start_read(50 * BS, BS as u32));
    let later = d
        .finish(false, &[])
        .expect("a failed read is finished by the engine");
    assert_eq!(f.rt.block_on(later).unwrap().to_vec(), block(ORIGIN_BYTE));
    let after = f.engine.status().stats;
    assert_eq!(
        after.read_requests,
        before.read_requests + 1,
        "counted once"
    );
    assert_eq!(after.origin_reads, before.origin_reads + 1, "counted once");
    // A short read is a failed one.
    let d = direct(f.vol.start_read(51 * BS, 2 * BS as u32));
    let later = d
        .finish(true, &block(0))
        .expect("short: finished by the engine");
    assert_eq!(
        f.rt.block_on(later).unwrap().to_vec(),
        vec![ORIGIN_BYTE; 2 * BS as usize]
    );
    // Dropped without a word (a queue that stopped): the block is let go,
    // nothing counted.
    let before = f.engine.status().stats;
    drop(direct(f.vol.start_read(60 * BS, BS as u32)));
    f.engine.write(60 * BS, &block(0x60), false).unwrap();
    assert_eq!(read(&f, 60 * BS, BS), block(0x60));
    let after = f.engine.status().stats;
    assert_eq!(after.read_misses, before.read_misses);
    // The engine closes: nothing was left holding the origin.
    f.engine.close().unwrap();
}
