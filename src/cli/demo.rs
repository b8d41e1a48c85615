//! `tiercache demo`: the README's one-command tour. Two sparse files in a
//! directory become a writeback cache, the origin slowed by a latency
//! wrapper (`device/latency.rs`) as a disk would be; random reads of a hot
//! set are timed on the origin alone and through the cache; a short
//! workload runs through the engine in this process while the dashboard
//! (`serve --http`'s page) shows it; the cache is flushed, checked,
//! reopened and detached, and the origin file alone is shown to hold the
//! data.
//!
//! The demo's cache is not registered: it is dissolved before the demo ends.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use tiercache::device::file::create_file;
use tiercache::device::latency::LatencyDevice;
use tiercache::device::{open_device, open_device_read_only, AlignedBuf, DeviceRef};
use tiercache::engine::recovery;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions, Placement};
use tiercache::monitor::{spawn_endpoints, EndpointConfig};

use super::status;
use super::units::{human_bytes, percent};

const ORIGIN_BYTES: u64 = 256 << 20;
const CACHE_BYTES: u64 = 64 << 20;
/// The written region: half the cache.
const WRITE_BYTES: u64 = 32 << 20;
/// A region never written, read to show misses turning into hits.
const COLD_OFFSET: u64 = 128 << 20;
const COLD_BYTES: u64 = 16 << 20;
const IO_BYTES: u64 = 1 << 20;
/// The hot set read at random, origin alone and through the cache: 512
/// KiB in a region never written.
const HOT_OFFSET: u64 = 192 << 20;
const HOT_BLOCKS: u64 = 128;
const HOT_READS: usize = 1000;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory for the demo's origin.img and cache.img (replaced if present).
    #[arg(long, default_value = "demo")]
    dir: PathBuf,
    /// Delay of every origin request, milliseconds (the slowed origin).
    #[arg(long, default_value_t = 3.0)]
    origin_latency_ms: f64,
    /// Where the dashboard is served while the demo runs ("off": nowhere).
    #[arg(long, default_value = "127.0.0.1:0")]
    http: String,
    /// Seconds the dashboard stays up after the workload, before the cache
    /// is closed and detached.
    #[arg(long, default_value_t = 0)]
    linger: u64,
}

pub fn run(a: &Args) -> Result<()> {
    let started = Instant::now();
    if !(0.0..=1000.0).contains(&a.origin_latency_ms) {
        bail!("--origin-latency-ms must be between 0 and 1000");
    }
    let (origin_path, cache_path) = demo_files(a)?;
    let delay = Duration::from_secs_f64(a.origin_latency_ms / 1e3);
    let slow_origin: DeviceRef = Arc::new(LatencyDevice::new(
        open_device(&origin_path).context("origin")?,
        delay,
    ));
    outln!(
        "demo: the origin answers each request after {} ms, one at a time (a disk-like origin)",
        a.origin_latency_ms
    );
    let engine = Engine::create(
        open_device(&cache_path).context("cache")?,
        slow_origin.clone(),
        &CreateOptions {
            mode: Mode::Writeback,
            // As `tiercache create` makes a cache by default.
            placement: Placement::Log,
            ..CreateOptions::default()
        },
    )
    .context("creating the demo cache")?;
    let dashboard = Dashboard::start(a, &engine)?;
    outln!();
    origin_versus_cache(&slow_origin, &engine)?;
    workload(&engine)?;
    if a.linger > 0 {
        outln!(
            "demo: the dashboard stays up {} s (Ctrl-C ends the demo)",
            a.linger
        );
        std::thread::sleep(Duration::from_secs(a.linger));
    }
    write_back_and_show(&engine)?;
    // Clean shutdown, offline check, warm reopen, detach.
    dashboard.stop();
    engine.close().context("closing the demo cache")?;
    // Both files are claimed by their open (device/claim.rs): let go of
    // them before opening them again.
    drop(engine);
    drop(slow_origin);
    check_reopen_detach(&origin_path, &cache_path)?;
    outln!();
    outln!(
        "demo finished in {:.1} s. The same with named caches:",
        started.elapsed().as_secs_f64()
    );
    outln!("  tiercache create --origin {origin_path} --cache {cache_path}");
    outln!("  tiercache status; tiercache flush; tiercache check; tiercache detach");
    Ok(())
}

/// New origin and cache files in the demo's directory: (origin, cache).
fn demo_files(a: &Args) -> Result<(String, String)> {
    fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let origin_path = fresh_file(&a.dir.join("origin.img"), ORIGIN_BYTES)?;
    let cache_path = fresh_file(&a.dir.join("cache.img"), CACHE_BYTES)?;
    outln!(
        "demo: origin {origin_path} ({}), cache {cache_path} ({}), writeback mode",
        human_bytes(ORIGIN_BYTES),
        human_bytes(CACHE_BYTES)
    );
    Ok((origin_path, cache_path))
}

/// The dashboard, on a runtime of its own while the workload runs on the
/// demo's thread.
struct Dashboard {
    rt: tokio::runtime::Runtime,
    stop_tx: tokio::sync::watch::Sender<bool>,
    endpoints: Option<tiercache::monitor::Endpoints>,
}

impl Dashboard {
    fn start(a: &Args, engine: &Arc<Engine>) -> Result<Dashboard> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("starting the runtime")?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let endpoints = if a.http == "off" {
            None
        } else {
            let cfg = EndpointConfig {
                name: "demo".into(),
                metrics: None,
                http: Some(a.http.clone()),
            };
            let e = rt
                .block_on(spawn_endpoints(engine, &cfg, stop_rx))
                .context("starting the dashboard")?;
            if let Some(addr) = e.http_addr {
                outln!(
                    "demo: dashboard on http://{addr}/ while the demo runs (--linger SECS keeps it up)"
                );
            }
            Some(e)
        };
        Ok(Dashboard {
            rt,
            stop_tx,
            endpoints,
        })
    }

    fn stop(self) {
        let _ = self.stop_tx.send(true);
        drop(self.endpoints);
        self.rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// Writes a pattern and flushes, reads it twice, then reads a range never
/// written twice (the origin's zeroes, then the cache's copy of them).
fn workload(engine: &Arc<Engine>) -> Result<()> {
    let t = Instant::now();
    for off in (0..WRITE_BYTES).step_by(IO_BYTES as usize) {
        let mut buf = AlignedBuf::zeroed(IO_BYTES as usize);
        fill_pattern(&mut buf, off);
        engine.write(off, &buf, false)?;
    }
    engine.flush()?;
    let secs = t.elapsed().as_secs_f64();
    outln!(
        "{:<32} {:>7.1} ms  {:>7.0} MiB/s",
        format!("write  {} pattern + flush", human_bytes(WRITE_BYTES)),
        secs * 1e3,
        mib_per_sec(WRITE_BYTES, secs)
    );
    for pass in 1..=2 {
        let what = format!("read   written, pass {pass}");
        read_pass(engine, &what, 0, WRITE_BYTES, true)?;
    }
    for pass in 1..=2 {
        let what = format!("read   never written, pass {pass}");
        read_pass(engine, &what, COLD_OFFSET, COLD_BYTES, false)?;
    }
    Ok(())
}

/// Writes every dirty block back, then prints the status table.
fn write_back_and_show(engine: &Arc<Engine>) -> Result<()> {
    let dirty = engine.dirty_blocks();
    let t = Instant::now();
    engine.write_back_all(&mut |_, _| {})?;
    outln!(
        "flush  {dirty} dirty blocks written back to the origin in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    outln!();
    out!("{}", status::table("demo", &engine.status()));
    outln!();
    Ok(())
}

/// The closed cache checked offline, reopened warm and detached; then the
/// origin file alone must hold the pattern.
fn check_reopen_detach(origin_path: &str, cache_path: &str) -> Result<()> {
    let report = recovery::check(
        &open_device_read_only(cache_path).context("cache")?,
        Some(ORIGIN_BYTES),
    );
    if !report.ok {
        bail!(
            "check of the demo cache found damage: {}",
            report.findings.join("; ")
        );
    }
    outln!(
        "check  metadata ok: {} of {} blocks cached, {} dirty, shut down cleanly: {}",
        report.cache_blocks_used,
        report.cache_blocks_total,
        report.cache_blocks_dirty,
        report.clean_shutdown == Some(true)
    );
    let engine = Engine::open(
        open_device(cache_path).context("cache")?,
        open_device(origin_path).context("origin")?,
        &OpenOptions {
            no_background: true,
            ..OpenOptions::default()
        },
    )
    .context("reopening the demo cache")?;
    let warm = engine.status().cache_blocks_used;
    engine.detach().context("detaching the demo cache")?;
    drop(engine);
    outln!("detach reopened warm with {warm} blocks cached, then dissolved the cache");
    verify_origin(origin_path)?;
    outln!(
        "verify the origin file alone holds the {} pattern and zeroes elsewhere",
        human_bytes(WRITE_BYTES)
    );
    Ok(())
}

/// The point of a cache: the same random reads of a hot set, timed on the
/// slowed origin alone and through the cache.
fn origin_versus_cache(origin: &DeviceRef, engine: &Arc<Engine>) -> Result<()> {
    let bs = u64::from(engine.block_bytes());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    let offsets: Vec<u64> = (0..HOT_READS)
        .map(|_| HOT_OFFSET + rng.gen_range(0..HOT_BLOCKS) * bs)
        .collect();
    let mut buf = AlignedBuf::zeroed(bs as usize);
    let t = Instant::now();
    for &off in &offsets {
        origin
            .read_at(&mut buf, off)
            .context("reading the origin")?;
    }
    let alone = t.elapsed().as_secs_f64();
    let before = engine.status().stats;
    let t = Instant::now();
    for &off in &offsets {
        engine.read(off, bs)?;
    }
    let cached = t.elapsed().as_secs_f64();
    let after = engine.status().stats;
    let line = |what: &str, secs: f64| {
        outln!(
            "{what:<32} {:>7.1} ms  {:>7.0} IOPS  {:>6.3} ms a read",
            secs * 1e3,
            HOT_READS as f64 / secs.max(1e-9),
            secs * 1e3 / HOT_READS as f64
        )
    };
    outln!(
        "{HOT_READS} random {} reads of a {} hot set:",
        human_bytes(bs),
        human_bytes(HOT_BLOCKS * bs)
    );
    line("  origin alone", alone);
    line("  through the cache", cached);
    outln!(
        "  the cache is {:.1}x faster: {} misses filled it, then {} hits\n",
        alone / cached.max(1e-9),
        after.read_misses - before.read_misses,
        after.read_hits - before.read_hits
    );
    Ok(())
}

/// Replaces whatever regular file is at `path` by a new sparse file.
fn fresh_file(path: &Path, size_bytes: u64) -> Result<String> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => {
            fs::remove_file(path).with_context(|| format!("removing old {}", path.display()))?
        }
        Ok(_) => bail!(
            "{} exists and is not a regular file; not touching it",
            path.display()
        ),
        Err(_) => {}
    }
    create_file(path, size_bytes)?;
    let abs = std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    Ok(abs.display().to_string())
}

/// Reads a region through the cache, verifies it, prints time and hits.
fn read_pass(engine: &Arc<Engine>, what: &str, start: u64, len: u64, written: bool) -> Result<()> {
    let before = engine.status().stats;
    let t = Instant::now();
    let mut expected = AlignedBuf::zeroed(IO_BYTES as usize);
    for off in (start..start + len).step_by(IO_BYTES as usize) {
        let got = engine.read(off, IO_BYTES)?;
        if written {
            fill_pattern(&mut expected, off);
        }
        if got[..] != expected[..] {
            bail!("read back at offset {off} does not match what was written");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let after = engine.status().stats;
    let hits = after.read_hits - before.read_hits;
    let misses = after.read_misses - before.read_misses;
    outln!(
        "{what:<32} {:>7.1} ms  {:>7.0} MiB/s  hits {hits} misses {misses} ({} hit), verified",
        secs * 1e3,
        mib_per_sec(len, secs),
        percent(hits, hits + misses)
    );
    Ok(())
}

fn mib_per_sec(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// A pattern that names its own position: a misplaced block never matches.
fn fill_pattern(buf: &mut [u8], volume_offset: u64) {
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        let pos = volume_offset + i as u64 * 8;
        word.copy_from_slice(&(pos.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).to_le_bytes());
    }
}

/// Reads the origin file directly, without the cache.
fn verify_origin(path: &str) -> Result<()> {
    let file = fs::File::open(path).with_context(|| format!("opening {path}"))?;
    let mut got = vec![0u8; IO_BYTES as usize];
    let mut expected = vec![0u8; IO_BYTES as usize];
    let regions = [(0, WRITE_BYTES, true), (COLD_OFFSET, COLD_BYTES, false)];
    for (start, len, written) in regions {
        for off in (start..start + len).step_by(IO_BYTES as usize) {
            file.read_exact_at(&mut got, off)
                .with_context(|| format!("reading {path}"))?;
            if written {
                fill_pattern(&mut expected, off);
            } else {
                expected.fill(0);
            }
            if got != expected {
                bail!("the origin file differs from the written data at offset {off}");
            }
        }
    }
    Ok(())
}
