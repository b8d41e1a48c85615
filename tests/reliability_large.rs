//! Issue 5, scenario 9: large offsets. Every 512-byte sector written holds
//! `common::sector_content(sector, version)`, so it names its own offset.
//! Written near the end of the origin (including its partial last block,
//! which is never cached), across the 2^32-byte, 2^40-byte and 2 TiB
//! (2^41-byte: origin block 2^29 at 4 KiB) boundaries, and spread over the
//! whole range; rewritten in part (read-modify-write far out); verified
//! through the cache, after a clean reopen, after a crash (journal replay),
//! and on the origin itself after detach. A cache of 64 blocks keeps
//! eviction and writeback busy at those block numbers.
//!
//! - In-process on a sparse 2 TiB + 64 MiB + 1536 B origin file (4 KiB and
//!   64 KiB cache blocks), and on a sparse in-memory origin of 64 TiB, whose
//!   4 KiB block numbers pass 2^32 (no u32 may hold a block number).
//! - Over NBD: `tiercache serve` on the 2 TiB file, written with our client,
//!   read back with libnbd (Debian's python3-libnbd), after a restart and,
//!   after `detach`, from the origin file.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::fault::FaultDevice;
use tiercache::device::file::FileDevice;
use tiercache::device::nbd::NbdDevice;
use tiercache::device::{BlockDevice, DeviceRef, DeviceResult};
use tiercache::engine::recovery;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, WritebackSettings};

const TIB: u64 = 1 << 40;
const MIB: u64 = 1 << 20;
/// 2 TiB + 64 MiB and a partial last cache block of three sectors.
const FILE_ORIGIN_BYTES: u64 = 2 * TIB + 64 * MIB + 1536;
/// Origin of the in-memory case: 2^34 blocks of 4 KiB.
const SPARSE_ORIGIN_BYTES: u64 = 64 * TIB;

/// A sparse in-memory device: only written sectors take memory; the rest
/// reads as zeroes.
struct SparseDevice {
    size_bytes: u64,
    sectors: Mutex<HashMap<u64, Box<[u8; 512]>>>,
}

impl BlockDevice for SparseDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        tiercache::device::check_range(self, offset, buf.len() as u64)?;
        let m = self.sectors.lock();
        for (k, out) in buf.chunks_mut(512).enumerate() {
            match m.get(&(offset / 512 + k as u64)) {
                Some(s) => out.copy_from_slice(&s[..]),
                None => out.fill(0),
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        tiercache::device::check_range(self, offset, buf.len() as u64)?;
        let mut m = self.sectors.lock();
        for (k, s) in buf.chunks(512).enumerate() {
            m.insert(offset / 512 + k as u64, Box::new(s.try_into().unwrap()));
        }
        Ok(())
    }
    fn flush(&self) -> DeviceResult<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        let mut m = self.sectors.lock();
        for s in offset / 512..(offset + len) / 512 {
            m.remove(&s);
        }
        Ok(())
    }
    fn name(&self) -> &str {
        "sparse"
    }
}

/// The expected content: version per written sector (absent = zeroes).
#[derive(Default)]
struct Expected {
    versions: BTreeMap<u64, u64>,
}

impl Expected {
    fn data(&mut self, offset: u64, len: u64, version: u64) -> Vec<u8> {
        let mut data = vec![0u8; len as usize];
        for (k, s) in data.chunks_mut(512).enumerate() {
            let sector = offset / 512 + k as u64;
            s.copy_from_slice(&common::sector_content(sector, version));
            self.versions.insert(sector, version);
        }
        data
    }

    /// Checks `got`, read at `offset`; returns the sectors checked.
    fn check(&self, offset: u64, got: &[u8], ctx: &str) -> u64 {
        for (k, s) in got.chunks(512).enumerate() {
            let sector = offset / 512 + k as u64;
            match self.versions.get(&sector) {
                Some(&v) => assert!(
                    s == common::sector_content(sector, v),
                    "{ctx}: sector {sector} (byte {}) does not hold version {v}: found {:?}",
                    sector * 512,
                    common::decode_sector(s)
                ),
                None => assert!(
                    s.iter().all(|&b| b == 0),
                    "{ctx}: sector {sector} (byte {}) was never written but holds {:?}",
                    sector * 512,
                    common::decode_sector(s)
                ),
            }
        }
        got.len() as u64 / 512
    }
}

/// Where to write: (offset, length) pairs, sector-aligned, inside the
/// volume: the end (with the partial tail), around the boundaries, and
/// `spread` random ones.
fn layout(volume_bytes: u64, block_bytes: u64, spread: usize, seed: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let tail = volume_bytes % block_bytes;
    let full_end = volume_bytes - tail;
    // The partial last block, and the last full blocks before it.
    if tail > 0 {
        v.push((full_end, tail));
        v.push((full_end - 1024, 1024 + tail));
    }
    for k in 1..=4 {
        v.push((full_end - k * block_bytes, block_bytes));
    }
    v.push((volume_bytes - 512, 512));
    // Across boundaries: straddling writes, partial blocks on both sides.
    for b in [1u64 << 31, 1 << 32, 1 << 40, 1 << 41, 1 << 44, 1 << 45] {
        if b + 2 * block_bytes < full_end {
            v.push((b - 1536, 3072));
            v.push((b - block_bytes, 2 * block_bytes));
            v.push((b + 3 * block_bytes + 512, 512));
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..spread {
        let len = rng.gen_range(1..=128u64) * 512;
        let off = rng.gen_range(0..(volume_bytes - len) / 512) * 512;
        v.push((off, len));
    }
    v
}

/// Reads every range back (with the whole blocks around it, so unwritten
/// neighbours are checked too); returns the sectors checked.
fn verify(
    read: &dyn Fn(u64, u64) -> Vec<u8>,
    exp: &Expected,
    ranges: &[(u64, u64)],
    bs: u64,
    volume_bytes: u64,
    ctx: &str,
) -> u64 {
    let mut n = 0;
    for &(off, len) in ranges {
        let start = off / bs * bs;
        let end = (off + len).div_ceil(bs) * bs;
        let end = end.min(volume_bytes);
        n += exp.check(start, &read(start, end - start), ctx);
    }
    n
}

fn nbd_read(dev: &NbdDevice, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    dev.read_at(&mut buf, off).unwrap();
    buf
}

fn engine_case(origin: DeviceRef, block_bytes: u32, spread: usize, ctx: &str) -> u64 {
    let seed = common::seed();
    let ctx = format!("{ctx} bs {block_bytes} seed {seed}");
    let bs = block_bytes as u64;
    let volume_bytes = origin.size_bytes();
    let cache: DeviceRef = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(64, block_bytes),
        seed,
    ));
    let opts = CreateOptions {
        mode: Mode::Writeback,
        block_bytes,
        writeback: WritebackSettings {
            high_pct: 20,
            low_pct: 5,
            max_age_secs: 1,
            idle_secs: 0,
        },
        ..Default::default()
    };
    let engine = Engine::create(cache.clone(), origin.clone(), &opts).expect("create");
    assert_eq!(engine.volume_bytes(), volume_bytes);
    let ranges = layout(volume_bytes, bs, spread, seed);
    let mut exp = Expected::default();
    for &(off, len) in &ranges {
        let data = exp.data(off, len, 1);
        engine.write(off, &data, false).expect("write");
    }
    let mut checked = 0;
    let read_with = |e: &Arc<Engine>| {
        let e = e.clone();
        move |off: u64, len: u64| e.read(off, len).expect("read").to_vec()
    };
    checked += verify(
        &read_with(&engine),
        &exp,
        &ranges,
        bs,
        volume_bytes,
        &format!("{ctx} written"),
    );
    // Rewrite part of every other range: partial blocks far out.
    for (i, &(off, len)) in ranges.iter().enumerate() {
        if i % 2 == 0 {
            let part = (len / 1024).max(1) * 512;
            let data = exp.data(off + len - part, part, 2);
            engine
                .write(off + len - part, &data, i % 4 == 0)
                .expect("rewrite");
        }
    }
    checked += verify(
        &read_with(&engine),
        &exp,
        &ranges,
        bs,
        volume_bytes,
        &format!("{ctx} rewritten"),
    );
    let st = engine.status();
    assert!(st.stats.demotions > 0, "{ctx}: no eviction: {st:?}");
    // A crash after a flush: journal replay brings every block number back.
    engine.flush().expect("flush");
    engine.abandon();
    drop(engine);
    let engine = Engine::open(cache.clone(), origin.clone(), &OpenOptions::default())
        .expect("reopen after crash");
    checked += verify(
        &read_with(&engine),
        &exp,
        &ranges,
        bs,
        volume_bytes,
        &format!("{ctx} after crash"),
    );
    // Clean close: the checkpoint holds the block numbers; check reads it.
    engine.close().expect("close");
    drop(engine);
    let report = recovery::check(&cache, Some(volume_bytes));
    assert!(report.ok, "{ctx}: check: {:?}", report.findings);
    let engine =
        Engine::open(cache.clone(), origin.clone(), &OpenOptions::default()).expect("reopen");
    checked += verify(
        &read_with(&engine),
        &exp,
        &ranges,
        bs,
        volume_bytes,
        &format!("{ctx} after reopen"),
    );
    engine.detach().expect("detach");
    drop(engine);
    let origin_read = |off: u64, len: u64| {
        let mut buf = tiercache::device::AlignedBuf::zeroed(len as usize);
        origin.read_at(&mut buf, off).expect("origin read");
        buf.to_vec()
    };
    checked += verify(
        &origin_read,
        &exp,
        &ranges,
        bs,
        volume_bytes,
        &format!("{ctx} origin after detach"),
    );
    eprintln!(
        "large offsets {ctx}: origin {volume_bytes} bytes (blocks up to {}), {} ranges written, \
         {checked} sectors verified, {} written back, {} evicted",
        volume_bytes / bs,
        ranges.len(),
        st.stats.blocks_written_back,
        st.stats.demotions
    );
    checked
}

fn sparse_file(dir: &std::path::Path) -> String {
    let path = dir.join("origin.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(FILE_ORIGIN_BYTES)
        .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn large_offsets_on_a_2_tib_file() {
    let spread = if common::long_form() { 2000 } else { 200 };
    for bs in [4096u32, 65536] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let path = sparse_file(dir.path());
        let origin: DeviceRef = Arc::new(FileDevice::open(&path).unwrap());
        engine_case(origin, bs, spread, "2 TiB file");
    }
}

#[test]
fn block_numbers_beyond_u32() {
    let spread = if common::long_form() { 2000 } else { 200 };
    let origin: DeviceRef = Arc::new(SparseDevice {
        size_bytes: SPARSE_ORIGIN_BYTES,
        sectors: Mutex::new(HashMap::new()),
    });
    engine_case(origin, 4096, spread, "64 TiB sparse");
}

/// Reads ranges with libnbd from Debian's python3 (the pyenv python3 has
/// no `nbd` module): an independent client for the far offsets.
fn libnbd_read(uri: &str, ranges: &[(u64, u64)]) -> Vec<Vec<u8>> {
    daemon::need("/usr/bin/python3", "python3-libnbd");
    let script = "import nbd, sys\n\
        h = nbd.NBD()\n\
        h.connect_uri(sys.argv[1])\n\
        for a in sys.argv[2:]:\n\
        \x20   off, n = map(int, a.split(':'))\n\
        \x20   sys.stdout.buffer.write(h.pread(n, off))\n\
        h.shutdown()\n";
    let mut cmd = std::process::Command::new("/usr/bin/python3");
    cmd.arg("-c").arg(script).arg(uri);
    for (off, len) in ranges {
        cmd.arg(format!("{off}:{len}"));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "libnbd read failed (is python3-libnbd installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut at = 0;
    ranges
        .iter()
        .map(|&(_, len)| {
            let v = out.stdout[at..at + len as usize].to_vec();
            at += len as usize;
            v
        })
        .collect()
}

#[test]
fn large_offsets_over_nbd() {
    let spread = if common::long_form() { 1000 } else { 100 };
    let seed = common::seed();
    let bs = 4096u64;
    let setup = daemon::Setup::with_sizes(
        FILE_ORIGIN_BYTES,
        common::cache_bytes_for(64, 4096),
        &[
            "--mode",
            "writeback",
            "--writeback-high",
            "20",
            "--writeback-low",
            "5",
            "--writeback-age",
            "1",
            // Every read miss promoted, so the tiny cache keeps evicting.
            "--promote-after",
            "1",
        ],
    );
    let ctx = format!("nbd 2 TiB seed {seed}");
    let mut server = setup.serve();
    let dev = NbdDevice::connect(&setup.uri(), 2).unwrap();
    assert_eq!(dev.size_bytes(), FILE_ORIGIN_BYTES);
    let ranges = layout(FILE_ORIGIN_BYTES, bs, spread, seed);
    let mut exp = Expected::default();
    for &(off, len) in &ranges {
        let data = exp.data(off, len, 1);
        dev.write_at(&data, off).unwrap();
    }
    dev.flush().unwrap();
    let mut checked = verify(
        &|off, len| nbd_read(&dev, off, len),
        &exp,
        &ranges,
        bs,
        FILE_ORIGIN_BYTES,
        &format!("{ctx} written"),
    );
    let mut libnbd_checked = 0;
    for (&(off, _), got) in ranges.iter().zip(libnbd_read(&setup.uri(), &ranges)) {
        libnbd_checked += exp.check(off, &got, &format!("{ctx} libnbd"));
    }
    drop(dev);
    daemon::sigterm(&mut server);
    let check = setup.cli(&["check"]);
    assert!(
        check.contains("check of cache 'tc0'") && check.contains(": ok"),
        "{check}"
    );
    let mut server = setup.serve();
    let dev = NbdDevice::connect(&setup.uri(), 1).unwrap();
    checked += verify(
        &|off, len| nbd_read(&dev, off, len),
        &exp,
        &ranges,
        bs,
        FILE_ORIGIN_BYTES,
        &format!("{ctx} after restart"),
    );
    let st = setup.status();
    assert!(
        st["stats"]["demotions"].as_u64().unwrap() > 0,
        "{ctx}: no eviction: {st}"
    );
    drop(dev);
    let out = setup.cli(&["detach"]);
    assert!(out.contains("stands alone"), "{out}");
    let t = std::time::Instant::now();
    while server.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed().as_secs() < 60,
            "daemon still running after detach"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let file = std::fs::File::open(setup.path("origin.img")).unwrap();
    let file_read = |off: u64, len: u64| {
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, off).unwrap();
        buf
    };
    checked += verify(
        &file_read,
        &exp,
        &ranges,
        bs,
        FILE_ORIGIN_BYTES,
        &format!("{ctx} origin file after detach"),
    );
    eprintln!(
        "large offsets {ctx}: {} ranges written over NBD, {checked} sectors verified with our \
         client and the origin file, {libnbd_checked} with libnbd; status after restart: {} \
         promoted, {} evicted",
        ranges.len(),
        st["stats"]["promotions"],
        st["stats"]["demotions"]
    );
}
