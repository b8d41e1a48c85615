//! What the cache device sees of 4 KiB random writes at queue depth 32:
//! the cache device wrapped in a recorder of its request stream, the engine
//! in writeback driven by 32 threads (one request in flight each) over an
//! origin four times the cache (`--origin-pct`). Reports, for the cache device's data
//! region, in the order the writes completed:
//!
//! - the share of writes that start where the previous write ended;
//! - the mean write size;
//! - the share of writes and discards that cover a whole 1 MiB segment,
//!   and the share of overwrites (writes to bytes written, and not
//!   discarded, before) that do: the proxy for the write amplification a
//!   flash device's own garbage collection will add.
//!
//! ```text
//! cargo run --release --example cache_stream -- [--writes N] [--cache-mib M] \
//!     [--placement log|in-place] [--origin-pct P]
//! ```
//!
//! The origin is `P`% of the cache (400 by default: the cache fills with
//! dirty data and writes wait for writeback; 50: the written region fits).
//!
//! Issue 22 asks for these before and after random writes are laid down
//! in segments; docs/benchmarks.md keeps the numbers.

#[path = "example_args.rs"]
mod example_args;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use example_args::{arg, next};
use tiercache::device::ram::RamDevice;
use tiercache::device::{BlockDevice, DeviceRef, DeviceResult};
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, OpenOptions, Placement};

const BS: u64 = 4096;
const SEGMENT_BYTES: u64 = 1 << 20;
const THREADS: u64 = 32;

#[derive(Default)]
struct Stream {
    last_end: u64,
    writes: u64,
    sequential: u64,
    bytes: u64,
    whole_segment_writes: u64,
    overwrites: u64,
    whole_segment_overwrites: u64,
    discards: u64,
    whole_segment_discards: u64,
    /// Per 4 KiB of the device: written before.
    written: Vec<bool>,
}

/// A device that counts its own request stream (data region only).
struct Recorder {
    inner: DeviceRef,
    data_from: AtomicU64,
    stream: Mutex<Stream>,
}

fn whole_segment(offset: u64, len: u64) -> bool {
    let first = offset.div_ceil(SEGMENT_BYTES) * SEGMENT_BYTES;
    first + SEGMENT_BYTES <= offset + len
}

impl BlockDevice for Recorder {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        self.inner.write_at(buf, offset)?;
        if offset >= self.data_from.load(Ordering::Relaxed) {
            let len = buf.len() as u64;
            let mut s = self.stream.lock().unwrap();
            s.writes += 1;
            s.bytes += len;
            if offset == s.last_end {
                s.sequential += 1;
            }
            s.last_end = offset + len;
            let whole = whole_segment(offset, len);
            s.whole_segment_writes += whole as u64;
            let pages = (offset / BS) as usize..((offset + len).div_ceil(BS)) as usize;
            if s.written[pages.clone()].iter().any(|&w| w) {
                s.overwrites += 1;
                s.whole_segment_overwrites += whole as u64;
            }
            s.written[pages].iter_mut().for_each(|w| *w = true);
        }
        Ok(())
    }
    fn flush(&self) -> DeviceResult<()> {
        self.inner.flush()
    }
    fn discard_helps(&self) -> bool {
        self.inner.discard_helps()
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        self.inner.discard(offset, len)?;
        if offset >= self.data_from.load(Ordering::Relaxed) {
            let mut s = self.stream.lock().unwrap();
            s.discards += 1;
            s.whole_segment_discards += whole_segment(offset, len) as u64;
            if std::env::var("TC_DBG").is_ok() {
                eprintln!("discard {offset} {len}");
            }
            // Discarded pages are not overwritten by the next write there:
            // the flash device erased them.
            let pages = offset.div_ceil(BS) as usize..((offset + len) / BS) as usize;
            s.written[pages].iter_mut().for_each(|w| *w = false);
        }
        Ok(())
    }
    fn name(&self) -> &str {
        "cache"
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let writes = arg(&args, "--writes", 200_000)?;
    let cache_mib = arg(&args, "--cache-mib", 64)?;
    // The origin's size, in percent of the cache's data slots.
    let origin_pct = arg(&args, "--origin-pct", 400)?.max(1);
    let cache_bytes = cache_mib << 20;
    let placement = match args.iter().position(|a| a == "--placement") {
        None => Placement::Log,
        Some(i) => args
            .get(i + 1)
            .and_then(|v| Placement::parse(v))
            .ok_or_else(|| anyhow::anyhow!("--placement needs log or in-place"))?,
    };
    let layout = Layout::compute(cache_bytes, BS as u32).map_err(anyhow::Error::msg)?;
    // `--cache-file PATH`: a file of the cache's size, opened as tiercache
    // opens cache files (O_DIRECT), instead of RAM.
    let ram: DeviceRef = match args.iter().position(|a| a == "--cache-file") {
        None => Arc::new(RamDevice::new("cache", cache_bytes)),
        Some(i) => {
            let path = args
                .get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("--cache-file needs a path"))?;
            let f = std::fs::File::create(path)?;
            // Written through, as bench/run writes its cache files.
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..cache_bytes >> 20 {
                std::io::Write::write_all(&mut &f, &chunk)?;
            }
            f.sync_all()?;
            Arc::new(tiercache::device::file::FileDevice::open(path)?)
        }
    };
    let recorder = Arc::new(Recorder {
        inner: ram,
        data_from: AtomicU64::new(u64::MAX),
        stream: Mutex::new(Stream {
            written: vec![false; (cache_bytes / BS) as usize],
            ..Default::default()
        }),
    });
    let cache: DeviceRef = recorder.clone();
    let origin_bytes = origin_pct * layout.slot_count / 100 * BS;
    let origin: DeviceRef = Arc::new(RamDevice::new("origin", origin_bytes));
    let opts = CreateOptions {
        allow_data_loss: true,
        placement,
        ..Default::default()
    };
    let engine = Engine::create_with(cache, origin, &opts, &OpenOptions::default())?;
    recorder
        .data_from
        .store(layout.data_offset, Ordering::Relaxed);
    let blocks = origin_bytes / BS;
    let per_thread = writes / THREADS;
    let t0 = std::time::Instant::now();
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let engine = &engine;
            sc.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                let buf = vec![t as u8; BS as usize];
                for _ in 0..per_thread {
                    let block = next(&mut x) % blocks;
                    engine.write(block * BS, &buf, false).expect("write");
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    let status = engine.status();
    let st = status.stats;
    engine.close()?;
    let s = recorder.stream.lock().unwrap();
    println!(
        "{} placement: {} client writes of 4 KiB at random over {} MiB, {THREADS} at a time, cache {} MiB ({} slots); {:.1} s",
        placement.name(),
        per_thread * THREADS,
        origin_bytes >> 20,
        cache_mib,
        layout.slot_count,
        secs
    );
    println!(
        "cache device data writes: {}  sequential (start where the previous ended): {:.1}%  mean size: {:.1} KiB",
        s.writes,
        pct(s.sequential, s.writes),
        s.bytes as f64 / s.writes.max(1) as f64 / 1024.0
    );
    println!(
        "whole 1 MiB segments: {:.2}% of writes, {:.2}% of overwrites ({} overwrites, {:.1}% of writes), {:.2}% of discards ({} discards)",
        pct(s.whole_segment_writes, s.writes),
        pct(s.whole_segment_overwrites, s.overwrites),
        s.overwrites,
        pct(s.overwrites, s.writes),
        pct(s.whole_segment_discards, s.discards),
        s.discards
    );
    println!(
        "engine: {} segments cleaned, {} blocks moved, {} segments discarded, {} slots outside the cursor, {} blocks written back",
        st.segments_cleaned,
        st.blocks_moved,
        st.segments_discarded,
        status.scattered_slots,
        st.blocks_written_back
    );
    Ok(())
}
