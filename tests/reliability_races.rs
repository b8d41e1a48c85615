//! Issue 5, scenario 8: same-block races never produce a stale read.
//!
//! Many threads hammer a few dozen cache blocks (a 16..24-slot cache over
//! 40 hot blocks) with writes, reads, trims, prefetches and flushes of
//! 512 B..12 KiB at any sector, while writeback runs all the time
//! (watermarks 5%/0%, 1 s age, plus threads driving writeback and
//! `write_back_all` directly). So blocks are written while being written back,
//! read while being promoted, trimmed while dirty, evicted while wanted.
//! Once against the engine in-process (every caching mode, and with the
//! mode switched under the load), once over NBD against `tiercache serve`
//! with several connections writing overlapping ranges.
//!
//! The checker (linearizability of each 512-byte sector as a register,
//! without the read-read order): every write gets a fresh version and
//! writes `common::sector_content(sector, version)`; a logical clock ticks
//! when a request is issued and when it completes. A read of sector s that
//! returns version v is stale if some write w of s completed before the
//! read was issued and v's write had completed before w was issued
//! (`ack(v) < issue(w)`). A trim makes a sector unspecified until a write
//! issued after the trim completed has completed; even then the sector may
//! only hold zeroes or one of its own versions, never another sector's data.
//! After the load the volume is checked the same way, then again after a
//! clean reopen, and after `write_back_all` the origin must equal the volume.
//!
//! CI runs a few seconds per case; `TIERCACHE_LONG=1` a minute. Timing
//! decides interleavings, so a seed does not replay a failure exactly.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::fault::FaultDevice;
use tiercache::device::nbd::NbdDevice;
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::{CreateOptions, Engine, Fast, Mode, OpenOptions, WritebackSettings};

/// Hot region: the first HOT_BLOCKS cache blocks of the volume.
const HOT_BLOCKS: u64 = 40;
/// Longest request, in sectors (crosses up to four 4 KiB blocks).
const MAX_SECTORS: u64 = 24;
/// Versions a run may hand out (the history is preallocated); the load
/// stops early if they run out.
fn max_versions() -> u64 {
    if common::long_form() {
        1 << 24
    } else {
        1 << 21
    }
}

/// The volume under test, whichever way it is reached.
trait Target: Send + Sync {
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), String>;
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, String>;
    fn trim(&self, offset: u64, len: u64) -> Result<(), String>;
    fn flush(&self) -> Result<(), String>;
    fn prefetch(&self, offset: u64, len: u64) -> Result<(), String>;
}

/// Requests at even sectors try the fast paths `serve` uses first (hits,
/// in-place rewrites and whole-block stores on the calling thread), the others go straight to the
/// full paths, so both race with everything else.
impl Target for Engine {
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        let fast = (offset / 512).is_multiple_of(2);
        if !fast {
            return Engine::write(self, offset, data, false).map_err(|e| e.to_string());
        }
        match self.try_write_cached(offset, data, false) {
            Fast::Done(r) => r,
            Fast::Pending(req) => self.write_request(req, data),
        }
        .map_err(|e| e.to_string())
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let fast = (offset / 512).is_multiple_of(2);
        let r = if fast {
            match self.try_read_hits(offset, len) {
                Fast::Done(r) => r,
                Fast::Pending(req) => self.read_request(req),
            }
        } else {
            Engine::read(self, offset, len)
        };
        r.map(|b| b.to_vec()).map_err(|e| e.to_string())
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), String> {
        Engine::trim(self, offset, len, false).map_err(|e| e.to_string())
    }
    fn flush(&self) -> Result<(), String> {
        Engine::flush(self).map_err(|e| e.to_string())
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<(), String> {
        Engine::prefetch(self, offset, len).map_err(|e| e.to_string())
    }
}

/// Several NBD connections; each request goes to the next one.
struct NbdTarget {
    conns: Vec<NbdDevice>,
    next: AtomicU64,
}

impl NbdTarget {
    fn conn(&self) -> &NbdDevice {
        &self.conns[self.next.fetch_add(1, Ordering::Relaxed) as usize % self.conns.len()]
    }
}

impl Target for NbdTarget {
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.conn()
            .write_at(data, offset)
            .map_err(|e| e.to_string())
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len as usize];
        self.conn()
            .read_at(&mut buf, offset)
            .map_err(|e| e.to_string())?;
        Ok(buf)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), String> {
        self.conn().discard(offset, len).map_err(|e| e.to_string())
    }
    fn flush(&self) -> Result<(), String> {
        self.conn().flush().map_err(|e| e.to_string())
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<(), String> {
        // NbdDevice has no NBD_CMD_CACHE; a read promotes just as well.
        self.read(offset, len).map(|_| ())
    }
}

/// The history the checker needs, lock-free.
struct History {
    clock: AtomicU64,
    next_version: AtomicU64,
    /// Per version: clock at its acknowledgement (0 while in flight).
    ack_tick: Vec<AtomicU64>,
    /// Per sector: the latest issue tick among acknowledged writes.
    acked_issue_max: Vec<AtomicU64>,
    /// Per sector: the latest acknowledgement tick of a trim.
    trim_ack_max: Vec<AtomicU64>,
    /// Per sector: trims in flight.
    trims_in_flight: Vec<AtomicU64>,
    /// Stop handing out versions (the history is full).
    full: AtomicBool,
}

#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    reads: AtomicU64,
    trims: AtomicU64,
    flushes: AtomicU64,
    prefetches: AtomicU64,
    sector_checks: AtomicU64,
}

impl History {
    fn new(sectors: u64) -> History {
        let v = |n: u64| (0..n).map(|_| AtomicU64::new(0)).collect();
        History {
            clock: AtomicU64::new(1),
            next_version: AtomicU64::new(1),
            ack_tick: v(max_versions()),
            acked_issue_max: v(sectors),
            trim_ack_max: v(sectors),
            trims_in_flight: v(sectors),
            full: AtomicBool::new(false),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Writes a fresh version over `sectors` sectors at `first`.
    fn write(&self, t: &dyn Target, first: u64, n: u64) -> Result<(), String> {
        let v = self.next_version.fetch_add(1, Ordering::SeqCst);
        if v as usize >= self.ack_tick.len() {
            self.full.store(true, Ordering::SeqCst);
            return Ok(());
        }
        let mut data = vec![0u8; (n * 512) as usize];
        for k in 0..n {
            data[(k * 512) as usize..((k + 1) * 512) as usize]
                .copy_from_slice(&common::sector_content(first + k, v));
        }
        let issue = self.tick();
        t.write(first * 512, &data)?;
        let ack = self.tick();
        self.ack_tick[v as usize].store(ack, Ordering::SeqCst);
        for s in first..first + n {
            self.acked_issue_max[s as usize].fetch_max(issue, Ordering::SeqCst);
        }
        Ok(())
    }

    fn trim(&self, t: &dyn Target, first: u64, n: u64) -> Result<(), String> {
        for s in first..first + n {
            self.trims_in_flight[s as usize].fetch_add(1, Ordering::SeqCst);
        }
        let r = t.trim(first * 512, n * 512);
        let ack = self.tick();
        for s in first..first + n {
            self.trim_ack_max[s as usize].fetch_max(ack, Ordering::SeqCst);
            self.trims_in_flight[s as usize].fetch_sub(1, Ordering::SeqCst);
        }
        r
    }

    /// Reads and checks `n` sectors at `first`; returns the sectors checked.
    fn read_check(&self, t: &dyn Target, first: u64, n: u64, ctx: &str) -> Result<u64, String> {
        // Floors first, then the issue tick: a write acknowledged in
        // between is simply not counted (a weaker check, never a false one).
        let floors: Vec<u64> = (first..first + n)
            .map(|s| self.acked_issue_max[s as usize].load(Ordering::SeqCst))
            .collect();
        self.tick();
        let data = t.read(first * 512, n * 512)?;
        for (k, got) in data.chunks(512).enumerate() {
            let s = first + k as u64;
            self.check_sector(s, got, floors[k])
                .map_err(|e| format!("{ctx}: read of sectors {first}+{n}: {e}"))?;
        }
        Ok(n)
    }

    fn check_sector(&self, s: u64, got: &[u8], floor: u64) -> Result<(), String> {
        let trimmed = || {
            self.trims_in_flight[s as usize].load(Ordering::SeqCst) > 0
                || self.trim_ack_max[s as usize].load(Ordering::SeqCst) > floor
        };
        if got.iter().all(|&b| b == 0) {
            if floor == 0 || trimmed() {
                return Ok(());
            }
            return Err(format!(
                "sector {s} reads zeroes, but a write to it completed before the read"
            ));
        }
        let Some((at, v)) = common::decode_sector(got) else {
            return Err(format!("sector {s} holds garbage (torn or foreign bytes)"));
        };
        if at != s {
            return Err(format!("sector {s} holds sector {at}'s data (version {v})"));
        }
        if v >= self.next_version.load(Ordering::SeqCst) {
            return Err(format!("sector {s} holds version {v}, never written"));
        }
        let ack = self.ack_tick[v as usize].load(Ordering::SeqCst);
        if ack == 0 || ack > floor || trimmed() {
            return Ok(());
        }
        Err(format!(
            "STALE: sector {s} reads version {v} (acknowledged at tick {ack}), but a write \
             issued at tick {floor} completed before the read was issued"
        ))
    }
}

struct Load {
    sectors: u64,
    workers: usize,
    duration: Duration,
    seed: u64,
}

/// Runs the random load on `t` until `duration` passes or an error.
fn run_load(
    t: Arc<dyn Target>,
    h: Arc<History>,
    counts: Arc<Counts>,
    load: &Load,
    ctx: &str,
) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let first_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let handles: Vec<_> = (0..load.workers)
        .map(|w| {
            let (t, h, counts, stop, first_error) = (
                t.clone(),
                h.clone(),
                counts.clone(),
                stop.clone(),
                first_error.clone(),
            );
            let seed = load.seed.wrapping_add(w as u64 * 0x9E37_79B9);
            let sectors = load.sectors;
            let ctx = format!("{ctx} worker {w}");
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                while !stop.load(Ordering::Relaxed) && !h.full.load(Ordering::Relaxed) {
                    let n = rng.gen_range(1..=MAX_SECTORS);
                    let first = rng.gen_range(0..=sectors - n);
                    let r = match rng.gen_range(0..100) {
                        0..=39 => h
                            .write(&*t, first, n)
                            .map(|_| counts.writes.fetch_add(1, Ordering::Relaxed)),
                        40..=84 => h.read_check(&*t, first, n, &ctx).map(|c| {
                            counts.sector_checks.fetch_add(c, Ordering::Relaxed);
                            counts.reads.fetch_add(1, Ordering::Relaxed)
                        }),
                        85..=89 => h
                            .trim(&*t, first, n)
                            .map(|_| counts.trims.fetch_add(1, Ordering::Relaxed)),
                        90..=94 => t
                            .prefetch(first * 512, n * 512)
                            .map(|_| counts.prefetches.fetch_add(1, Ordering::Relaxed)),
                        _ => t
                            .flush()
                            .map(|_| counts.flushes.fetch_add(1, Ordering::Relaxed)),
                    };
                    if let Err(e) = r {
                        first_error.lock().unwrap().get_or_insert(e);
                        stop.store(true, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    while t0.elapsed() < load.duration && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.join().unwrap();
    }
    let e = first_error.lock().unwrap().take();
    e.map_or(Ok(()), Err)
}

/// Reads the whole hot region once, checking every sector.
fn check_all(t: &dyn Target, h: &History, sectors: u64, ctx: &str) -> Result<u64, String> {
    let mut done = 0;
    let mut s = 0;
    while s < sectors {
        let n = 256.min(sectors - s);
        done += h.read_check(t, s, n, ctx)?;
        s += n;
    }
    Ok(done)
}

fn durations() -> (Duration, Duration) {
    if common::long_form() {
        (Duration::from_secs(60), Duration::from_secs(60))
    } else {
        (Duration::from_secs(3), Duration::from_secs(3))
    }
}

fn report(what: &str, counts: &Counts, seconds: f64, seed: u64) {
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "races {what}: {:.0} s, seed {seed}: {} writes, {} reads ({} sector checks), {} trims, \
         {} prefetches, {} flushes; 0 stale",
        seconds,
        c(&counts.writes),
        c(&counts.reads),
        c(&counts.sector_checks),
        c(&counts.trims),
        c(&counts.prefetches),
        c(&counts.flushes),
    );
}

/// One in-process case: engine over fault devices, the engine's background
/// thread plus a thread driving writeback ticks, `write_back_all` and (with
/// `switch_modes`) mode changes.
fn engine_case(mode: Mode, block_bytes: u32, slots: u64, switch_modes: bool, seed: u64) {
    let volume_bytes = HOT_BLOCKS * block_bytes as u64;
    let sectors = volume_bytes / 512;
    let ctx = format!(
        "engine {mode} bs {block_bytes}{} seed {seed}",
        if switch_modes { " +mode switches" } else { "" }
    );
    let cache_dev = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(slots, block_bytes),
        seed,
    ));
    let origin_dev = Arc::new(FaultDevice::new("origin", volume_bytes, seed));
    let (cache, origin): (DeviceRef, DeviceRef) = (cache_dev.clone(), origin_dev.clone());
    let opts = CreateOptions {
        mode,
        block_bytes,
        writeback: WritebackSettings {
            high_pct: 5,
            low_pct: 0,
            max_age_secs: 1,
            idle_secs: 0,
        },
        ..Default::default()
    };
    let engine = Engine::create(cache.clone(), origin.clone(), &opts).expect("create");
    let h = Arc::new(History::new(sectors));
    let counts = Arc::new(Counts::default());
    let (duration, _) = durations();
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u64, String> {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xD1);
            let mut switches = 0;
            while !stop.load(Ordering::Relaxed) {
                match rng.gen_range(0..10) {
                    0..=6 => engine.background_tick(),
                    7..=8 => engine
                        .write_back_all(&mut |_, _| {})
                        .map_err(|e| format!("write_back_all: {e}"))?,
                    _ if switch_modes => {
                        let m = Mode::ALL[rng.gen_range(0..Mode::ALL.len())];
                        engine
                            .set_mode(m)
                            .map_err(|e| format!("set_mode {m}: {e}"))?;
                        switches += 1;
                    }
                    _ => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            Ok(switches)
        })
    };
    let t0 = Instant::now();
    let target: Arc<dyn Target> = engine.clone();
    let load = Load {
        sectors,
        workers: 6,
        duration,
        seed,
    };
    let result = run_load(target, h.clone(), counts.clone(), &load, &ctx);
    stop.store(true, Ordering::SeqCst);
    let switches = driver
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    result.unwrap_or_else(|e| panic!("{e}"));
    if switch_modes {
        engine.set_mode(mode).expect("set_mode back");
    }
    let st = engine.status().stats;
    // Quiet now: every sector as the history says, before and after a
    // clean reopen; after write_back_all the origin equals the volume.
    let quiet = |e: &Engine, what: &str| {
        let c =
            check_all(e, &h, sectors, &format!("{ctx} {what}")).unwrap_or_else(|e| panic!("{e}"));
        counts.sector_checks.fetch_add(c, Ordering::Relaxed);
    };
    quiet(&engine, "after the load");
    engine.close().expect("close");
    drop(engine);
    let engine = Engine::open(cache, origin, &OpenOptions::default()).expect("reopen");
    quiet(&engine, "after a clean reopen");
    engine
        .write_back_all(&mut |_, _| {})
        .expect("write_back_all");
    let volume = engine.read(0, volume_bytes).expect("read all");
    engine.close().expect("close");
    assert!(
        volume[..] == origin_dev.snapshot_current()[..],
        "{ctx}: origin differs from the volume after write_back_all"
    );
    assert!(
        st.blocks_written_back > 0 || !mode.holds_dirty(),
        "{ctx}: no writeback happened: {st:?}"
    );
    assert!(st.demotions > 0, "{ctx}: no eviction happened: {st:?}");
    report(
        &format!(
            "{ctx} ({} written back, {} promoted, {} evicted{})",
            st.blocks_written_back,
            st.promotions,
            st.demotions,
            if switch_modes {
                format!(", {switches} mode switches")
            } else {
                String::new()
            }
        ),
        &counts,
        t0.elapsed().as_secs_f64(),
        seed,
    );
}

#[test]
fn engine_races_writeback() {
    let seed = common::seed();
    engine_case(Mode::Writeback, 4096, 16, false, seed);
    engine_case(Mode::Writeback, 16384, 24, false, seed + 1);
}

#[test]
fn engine_races_writethrough() {
    engine_case(Mode::Writethrough, 4096, 16, false, common::seed());
}

#[test]
fn engine_races_writeonly() {
    engine_case(Mode::Writeonly, 4096, 16, false, common::seed());
}

#[test]
fn engine_races_writearound() {
    engine_case(Mode::Writearound, 4096, 16, false, common::seed());
}

#[test]
fn engine_races_with_mode_switches() {
    engine_case(Mode::Writeback, 4096, 16, true, common::seed());
}

/// Over NBD: `tiercache serve` on files, four connections, `tiercache
/// flush` from the CLI now and then.
fn nbd_case(mode: &str, seed: u64) {
    let block_bytes = 4096u32;
    let volume_bytes = HOT_BLOCKS * block_bytes as u64;
    let sectors = volume_bytes / 512;
    let setup = daemon::Setup::with_sizes(
        volume_bytes,
        common::cache_bytes_for(16, block_bytes),
        &[
            "--mode",
            mode,
            "--writeback-high",
            "5",
            "--writeback-low",
            "0",
            "--writeback-age",
            "1",
        ],
    );
    let ctx = format!("nbd {mode} seed {seed}");
    let mut server = setup.serve();
    let conns = (0..4)
        .map(|_| NbdDevice::connect(&setup.uri(), 1).unwrap())
        .collect();
    let target = Arc::new(NbdTarget {
        conns,
        next: AtomicU64::new(0),
    });
    let h = Arc::new(History::new(sectors));
    let counts = Arc::new(Counts::default());
    let (_, duration) = durations();
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let stop = stop.clone();
        let state = setup.state();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let out = std::process::Command::new(daemon::BIN)
                    .arg("flush")
                    .env("TIERCACHE_STATE_DIR", &state)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "flush: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            n
        })
    };
    let t0 = Instant::now();
    let load = Load {
        sectors,
        workers: 8,
        duration,
        seed,
    };
    let result = run_load(target.clone(), h.clone(), counts.clone(), &load, &ctx);
    stop.store(true, Ordering::SeqCst);
    let cli_flushes = flusher.join().unwrap();
    result.unwrap_or_else(|e| panic!("{e}"));
    let c = check_all(&*target, &h, sectors, &format!("{ctx} after the load"))
        .unwrap_or_else(|e| panic!("{e}"));
    counts.sector_checks.fetch_add(c, Ordering::Relaxed);
    let st = setup.status();
    drop(target);
    daemon::sigterm(&mut server);
    // Restarted: the same again, then after a flush the origin file equals
    // the volume.
    let mut server = setup.serve();
    let dev = NbdDevice::connect(&setup.uri(), 1).unwrap();
    let c = check_all(
        &NbdTarget {
            conns: vec![dev],
            next: AtomicU64::new(0),
        },
        &h,
        sectors,
        &format!("{ctx} after a restart"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    counts.sector_checks.fetch_add(c, Ordering::Relaxed);
    setup.cli(&["flush"]);
    let dev = NbdDevice::connect(&setup.uri(), 1).unwrap();
    let mut volume = vec![0u8; volume_bytes as usize];
    dev.read_at(&mut volume, 0).unwrap();
    drop(dev);
    daemon::sigterm(&mut server);
    let origin = std::fs::read(setup.path("origin.img")).unwrap();
    assert!(
        volume == origin,
        "{ctx}: origin file differs from the volume after flush"
    );
    let s = &st["stats"];
    assert!(
        s["demotions"].as_u64().unwrap() > 0,
        "{ctx}: no eviction: {st}"
    );
    report(
        &format!(
            "{ctx} ({} written back, {} promoted, {} evicted, {cli_flushes} CLI flushes)",
            s["blocks_written_back"], s["promotions"], s["demotions"]
        ),
        &counts,
        t0.elapsed().as_secs_f64(),
        seed,
    );
}

#[test]
fn nbd_races_writeback_and_writeonly() {
    let seed = common::seed();
    nbd_case("writeback", seed);
    nbd_case("writeonly", seed + 1);
}

#[test]
fn nbd_races_writethrough_and_writearound() {
    let seed = common::seed();
    nbd_case("writethrough", seed);
    nbd_case("writearound", seed + 1);
}

/// A device whose next read (or write), once armed, waits until the test
/// lets it go: as the cache, it holds a write in writeback mode inside its
/// cache write (block locked, mode already read); as the origin, a
/// writeback inside its origin write, for as long as the test needs.
struct GatedDevice {
    inner: FaultDevice,
    armed_read: AtomicBool,
    armed_write: AtomicBool,
    reached: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl GatedDevice {
    fn new(name: &str, size: u64) -> GatedDevice {
        GatedDevice {
            inner: FaultDevice::new(name, size, 1),
            armed_read: AtomicBool::new(false),
            armed_write: AtomicBool::new(false),
            reached: Mutex::new(None),
            release: Mutex::new(None),
        }
    }

    /// Arms the gate for the next read (or write): returns (fires when the
    /// request reaches the gate, opens the gate).
    fn arm(&self, write: bool) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (reached_tx, reached_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        *self.reached.lock().unwrap() = Some(reached_tx);
        *self.release.lock().unwrap() = Some(release_rx);
        if write {
            self.armed_write.store(true, Ordering::SeqCst);
        } else {
            self.armed_read.store(true, Ordering::SeqCst);
        }
        (reached_rx, release_tx)
    }

    fn pass(&self, armed: &AtomicBool) {
        if armed.swap(false, Ordering::SeqCst) {
            let reached = self.reached.lock().unwrap().take().unwrap();
            let release = self.release.lock().unwrap().take().unwrap();
            reached.send(()).unwrap();
            release.recv().unwrap();
        }
    }
}

impl BlockDevice for GatedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.pass(&self.armed_read);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> tiercache::device::DeviceResult<()> {
        self.pass(&self.armed_write);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> tiercache::device::DeviceResult<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> tiercache::device::DeviceResult<()> {
        self.inner.discard(offset, len)
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}

/// A writeback engine over a gated origin and a gated cache device.
fn gated_engine() -> (Arc<Engine>, Arc<GatedDevice>, Arc<GatedDevice>) {
    let origin = Arc::new(GatedDevice::new("origin", 1 << 20));
    let cache = Arc::new(GatedDevice::new("cache", common::cache_bytes_for(32, 4096)));
    let engine = Engine::create(
        cache.clone(),
        origin.clone(),
        &CreateOptions {
            mode: Mode::Writeback,
            ..Default::default()
        },
    )
    .expect("create");
    (engine, origin, cache)
}

/// The engine, its origin, the writer thread, and the gate's release.
type HeldWrite = (
    Arc<Engine>,
    Arc<GatedDevice>,
    std::thread::JoinHandle<Result<(), String>>,
    std::sync::mpsc::Sender<()>,
);

/// A writeback engine over gated devices, and a 512-byte write to an
/// uncached block stopped inside its cache write.
fn write_held_in_flight() -> HeldWrite {
    let (engine, origin, cache) = gated_engine();
    let (reached, release) = cache.arm(true);
    let writer = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            Target::write(&*engine, 5 * 4096, &common::sector_content(40, 7))
        })
    };
    reached
        .recv_timeout(Duration::from_secs(10))
        .expect("the write did not reach its cache write");
    (engine, origin, writer, release)
}

/// Regression: a write that read the mode (writeback) before a switch to
/// passthrough, and dirtied its block after the switch's `write_back_all` had
/// looked, left a dirty block behind in passthrough, whose reads go to the
/// origin: the acknowledged write read back stale.
#[test]
fn switch_to_passthrough_during_a_write_serves_no_stale_data() {
    let (engine, _origin, writer, release) = write_held_in_flight();
    engine.set_mode(Mode::Passthrough).expect("set_mode");
    release.send(()).unwrap();
    writer.join().unwrap().expect("write");
    let got = engine.read(5 * 4096, 512).expect("read");
    assert!(
        got[..] == common::sector_content(40, 7)[..],
        "passthrough read returned stale data after an acknowledged write"
    );
    assert_eq!(engine.dirty_blocks(), 0, "dirty data left in passthrough");
    engine.close().expect("close");
}

/// Regression, same race with detach: the late write's block was dirty in
/// a cache that detach had already dissolved, so the acknowledged write
/// never reached the origin.
#[test]
fn detach_during_a_write_loses_nothing() {
    let (engine, origin, writer, release) = write_held_in_flight();
    engine.detach().expect("detach");
    release.send(()).unwrap();
    writer.join().unwrap().expect("write");
    let mut got = vec![0u8; 512];
    origin.inner.read_at(&mut got, 5 * 4096).unwrap();
    assert!(
        got[..] == common::sector_content(40, 7)[..],
        "an acknowledged write is missing from the origin after detach"
    );
}

/// Regression: set-mode and detach switch to passthrough first and write
/// the dirty blocks back after; a read in between went to the origin for a
/// block whose only current copy was still dirty in the cache.
#[test]
fn read_during_a_switch_to_passthrough_is_not_stale() {
    let (engine, origin, _cache) = gated_engine();
    // Two dirty blocks far apart: written back one after the other.
    Target::write(&*engine, 4096, &[1u8; 4096]).unwrap();
    Target::write(&*engine, 10 * 4096, &[2u8; 4096]).unwrap();
    let (reached, release) = origin.arm(true);
    let switch = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.set_mode(Mode::Passthrough))
    };
    // The switch is writing block 1 back; block 10 is still dirty.
    reached
        .recv_timeout(Duration::from_secs(10))
        .expect("the switch did not start writing back");
    let got = engine.read(10 * 4096, 4096).expect("read");
    release.send(()).unwrap();
    switch.join().unwrap().expect("set_mode");
    assert!(
        got.iter().all(|&b| b == 2),
        "a read during the switch to passthrough returned the origin's stale block"
    );
    engine.close().expect("close");
}
