//! Issue 5, scenario 2: `kill -9` of `tiercache serve` under load, over and
//! over, restarting each time; after every restart nothing that was flushed
//! is missing and `tiercache check` finds the metadata intact.
//!
//! Two loads run together against one daemon (4 KiB blocks, a cache an
//! eighth of the data written, watermarks 10%/2% and 1 s age, so writeback
//! and eviction run all the time):
//!
//! - fio (4 jobs, iodepth 8, a flush every 32 writes) with crc32c verify
//!   headers and `verify_state_save`. After the restart fio re-reads every
//!   write its saved state lists (`--verify_only --verify_state_load`).
//!   That state assumes completed writes are durable, which holds at a kill
//!   only for flushed writes: in writeback cycles fio is frozen (SIGSTOP)
//!   and two global NBD flushes are issued 200 ms apart before the kill; in
//!   writethrough cycles fio is killed mid-flight (a writethrough write
//!   completes once the origin file has it). fio's state also lists the
//!   writes that failed when the daemon died; those were never
//!   acknowledged, so a verify failure is allowed only at an offset missing
//!   from fio's completion log (`--write_lat_log --log_offset`).
//! - Our own writers (4 threads, one NBD connection each) that keep writing
//!   through the kill: 1 KiB writes interleaved with the other threads'
//!   sectors inside the same cache blocks (read-modify-write), and writes of
//!   512 B..32 KiB at any sector. Each sector has one owner, every sector
//!   holds `common::sector_content(sector, version)`, versions only grow.
//!   The log keeps, per sector, the highest version sent and the durable
//!   floor: the highest version acknowledged before a flush that completed
//!   (or simply acknowledged, in writethrough). After a restart each sector
//!   must hold a version between its floor and the highest sent, whole and
//!   at the right place. While running, a thread re-reads its own recent
//!   writes: they must read exactly as last acknowledged.
//!
//! With two origins (`create --origin A --origin B`: volumes `vol0` and
//! `vol1`, each its own NBD export, the empty name `vol0`'s), fio loads
//! `vol0` as above and every own writer has a connection to each export
//! and writes both (a volume drawn per write), flushing each export it
//! wrote to; the log keeps each volume's sectors apart, and volume 1's are
//! stamped apart (`stamp`), so data on the wrong origin is caught. After
//! each restart both exports are read back whole, and `check` must name
//! both volumes. Every fourth cycle from the second, `vol1` alone is in
//! writethrough (one cache, two modes).
//!
//! CI runs 6 cycles (8 with two origins); `TIERCACHE_LONG=1` runs 200
//! (100). Rerun a seed with `TIERCACHE_SEED=N` (timing still varies).
//!
//! Needs real processes: what is under test is a daemon killed by a signal
//! while NBD clients write, and the next daemon taking over. Timing decides
//! where the kill lands, so a seed does not replay a failure exactly. Its
//! seeded twin is tests/engine_crash_log.rs (a deterministic simulation of
//! the same kill, the crash log copied at a device event a seed picks).

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use daemon::{fio_json, need, signal, Setup};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::nbd::NbdDevice;
use tiercache::device::BlockDevice;

const MIB: u64 = 1 << 20;
const ORIGIN_BYTES: u64 = 64 * MIB;
const CACHE_BYTES: u64 = 8 * MIB;

/// fio: jobs of FIO_JOB_BYTES each, one after the other from offset 0.
const FIO_JOBS: u64 = 4;
const FIO_JOB_BYTES: u64 = 8 * MIB;
/// Completion-log entries fio allocates up front per job: more than a job's
/// writes (FIO_JOB_BYTES / 4 KiB) and flushes (one per 32 writes).
const FIO_LOG_ENTRIES: u64 = 2 * FIO_JOB_BYTES / 4096;

/// Own writers: WRITERS threads.
const WRITERS: usize = 4;
/// Interleaved region: 1 KiB units, unit u owned by thread u % WRITERS.
const SMALL_FIRST_SECTOR: u64 = FIO_JOBS * FIO_JOB_BYTES / 512;
const SMALL_SECTORS: u64 = 8 * MIB / 512;
const UNIT_SECTORS: u64 = 2;
/// Zoned region: one zone per thread, writes of 1..=64 sectors anywhere in it.
const BIG_FIRST_SECTOR: u64 = SMALL_FIRST_SECTOR + SMALL_SECTORS;
const ZONE_SECTORS: u64 = 4 * MIB / 512;
const LOG_FIRST_SECTOR: u64 = SMALL_FIRST_SECTOR;
const LOG_SECTORS: u64 = SMALL_SECTORS + WRITERS as u64 * ZONE_SECTORS;
/// Writes between two flushes of one writer.
const WRITES_PER_FLUSH: u64 = 16;

/// What the log knows about each sector of the own writers' regions, on
/// every volume (volume `v`'s at `v * LOG_SECTORS`).
struct SectorLog {
    /// Highest version ever sent (it may have landed even if not acknowledged).
    sent: Vec<AtomicU64>,
    /// Highest version that must survive a kill.
    floor: Vec<AtomicU64>,
    /// The version the sector reads now (tracked by its only writer).
    current: Vec<AtomicU64>,
    /// Version source: grows across cycles, so a sector's versions only grow.
    next_version: AtomicU64,
}

impl SectorLog {
    fn new(volumes: usize) -> SectorLog {
        let v = || {
            (0..volumes as u64 * LOG_SECTORS)
                .map(|_| AtomicU64::new(0))
                .collect()
        };
        SectorLog {
            sent: v(),
            floor: v(),
            current: v(),
            next_version: AtomicU64::new(1),
        }
    }
    /// Volume `volume`'s `sector`.
    fn idx(volume: usize, sector: u64) -> usize {
        volume * LOG_SECTORS as usize + (sector - LOG_FIRST_SECTOR) as usize
    }
}

/// What volume `vol`'s `sector` is stamped as (`common::sector_content`):
/// volume 0's as itself, so that data on the wrong volume reads as
/// another sector's.
fn stamp(vol: usize, sector: u64) -> u64 {
    (vol as u64) << 40 | sector
}

/// Counts for the report.
#[derive(Default)]
struct Counts {
    writes_acked: AtomicU64,
    flushes: AtomicU64,
    live_reads_checked: AtomicU64,
}

/// The owner's writes: a random 1 KiB unit of its own, or a run in its zone.
fn pick_range(rng: &mut ChaCha8Rng, thread: usize) -> (u64, u64) {
    if rng.gen_bool(0.6) {
        let units = SMALL_SECTORS / UNIT_SECTORS / WRITERS as u64;
        let u = rng.gen_range(0..units) * WRITERS as u64 + thread as u64;
        (SMALL_FIRST_SECTOR + u * UNIT_SECTORS, UNIT_SECTORS)
    } else {
        let n = rng.gen_range(1..=64u64);
        let zone = BIG_FIRST_SECTOR + thread as u64 * ZONE_SECTORS;
        (zone + rng.gen_range(0..=ZONE_SECTORS - n), n)
    }
}

struct WriterCtl {
    /// Set by the test: writers pause between requests.
    hold: AtomicBool,
    /// Writers paused (or finished).
    held: AtomicUsize,
    errors: Mutex<Vec<String>>,
}

/// One writer thread: a connection to each volume, and what it sent.
struct Writer {
    devs: Vec<NbdDevice>,
    rng: ChaCha8Rng,
    thread: usize,
    /// Per volume: an acknowledged write is on the origin (writethrough).
    writethrough: Vec<bool>,
    log: Arc<SectorLog>,
    counts: Arc<Counts>,
    ctl: Arc<WriterCtl>,
    /// Per volume: the writes acknowledged since its last flush.
    since_flush: Vec<Vec<(u64, u64, u64)>>,
    /// (volume, first sector, sectors) of the last writes.
    recent: Vec<(usize, u64, u64)>,
}

impl Writer {
    fn pause_while_held(&self) {
        if self.ctl.hold.load(Ordering::SeqCst) {
            self.ctl.held.fetch_add(1, Ordering::SeqCst);
            while self.ctl.hold.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.ctl.held.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Re-reads one of its recent writes: it must read as last
    /// acknowledged. False once the daemon is gone.
    fn live_read(&mut self) -> bool {
        let (vol, first, n) = self.recent[self.rng.gen_range(0..self.recent.len())];
        let mut buf = vec![0u8; (n * 512) as usize];
        if self.devs[vol].read_at(&mut buf, first * 512).is_err() {
            return false;
        }
        for (k, got) in buf.chunks(512).enumerate() {
            let s = first + k as u64;
            let want = self.log.current[SectorLog::idx(vol, s)].load(Ordering::SeqCst);
            if got != common::sector_content(stamp(vol, s), want) {
                self.ctl.errors.lock().unwrap().push(format!(
                    "live read: volume {vol}'s sector {s} does not hold its last acknowledged version {want} (found {:?})",
                    common::decode_sector(got)
                ));
            }
        }
        self.counts
            .live_reads_checked
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// One stamped write, to a volume drawn (none drawn for one, so a seed
    /// of one origin draws as before volumes). False once the daemon is gone.
    fn write(&mut self) -> bool {
        let vol = match self.devs.len() {
            1 => 0,
            n => self.rng.gen_range(0..n),
        };
        let (first, n) = pick_range(&mut self.rng, self.thread);
        let log = &self.log;
        let v = log.next_version.fetch_add(1, Ordering::SeqCst);
        let mut data = vec![0u8; (n * 512) as usize];
        for k in 0..n {
            let s = first + k;
            data[(k * 512) as usize..((k + 1) * 512) as usize]
                .copy_from_slice(&common::sector_content(stamp(vol, s), v));
            log.sent[SectorLog::idx(vol, s)].fetch_max(v, Ordering::SeqCst);
        }
        if self.devs[vol].write_at(&data, first * 512).is_err() {
            return false;
        }
        for s in first..first + n {
            let i = SectorLog::idx(vol, s);
            log.current[i].store(v, Ordering::SeqCst);
            if self.writethrough[vol] {
                log.floor[i].fetch_max(v, Ordering::SeqCst);
            }
        }
        self.counts.writes_acked.fetch_add(1, Ordering::Relaxed);
        self.since_flush[vol].push((first, n, v));
        self.recent.push((vol, first, n));
        if self.recent.len() > 16 {
            self.recent.remove(0);
        }
        true
    }

    /// Every WRITES_PER_FLUSH writes, flushes each volume written since:
    /// NBD proto.md, a FLUSH covers every write replied to before it was
    /// sent, on its export. False once the daemon is gone.
    fn flush_now_and_then(&mut self) -> bool {
        if (self.since_flush.iter().map(Vec::len).sum::<usize>() as u64) < WRITES_PER_FLUSH {
            return true;
        }
        for (vol, dev) in self.devs.iter().enumerate() {
            if self.since_flush[vol].is_empty() {
                continue;
            }
            let covered = std::mem::take(&mut self.since_flush[vol]);
            if dev.flush().is_err() {
                return false;
            }
            for (first, n, v) in covered {
                for s in first..first + n {
                    self.log.floor[SectorLog::idx(vol, s)].fetch_max(v, Ordering::SeqCst);
                }
            }
            self.counts.flushes.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// One writer thread: writes, flushes, re-reads its own recent writes,
/// on every volume (`uris`, by volume), until the connections die with
/// the daemon.
fn writer(
    uris: Vec<String>,
    thread: usize,
    seed: u64,
    writethrough: Vec<bool>,
    log: Arc<SectorLog>,
    counts: Arc<Counts>,
    ctl: Arc<WriterCtl>,
) {
    let devs: Result<Vec<NbdDevice>, _> = uris.iter().map(|u| NbdDevice::connect(u, 1)).collect();
    let Ok(devs) = devs else {
        ctl.held.fetch_add(1, Ordering::SeqCst);
        return;
    };
    let volumes = devs.len();
    let mut w = Writer {
        devs,
        rng: ChaCha8Rng::seed_from_u64(seed),
        thread,
        writethrough,
        log,
        counts,
        ctl,
        since_flush: vec![Vec::new(); volumes],
        recent: Vec::new(),
    };
    loop {
        w.pause_while_held();
        let alive = if !w.recent.is_empty() && w.rng.gen_ratio(1, 8) {
            w.live_read()
        } else {
            w.write() && w.flush_now_and_then()
        };
        if !alive {
            break;
        }
    }
    w.ctl.held.fetch_add(1, Ordering::SeqCst);
}

/// Reads every sector of volume `vol`'s part of the log after a restart
/// and checks it against the floor and the highest version sent. Sets
/// `current` to what is there. Returns how many sectors had a floor
/// (flushed data that had to survive).
fn verify_log(dev: &NbdDevice, log: &SectorLog, cycle: u64, vol: usize) -> u64 {
    let chunk_sectors = MIB / 512;
    let mut verified = 0;
    let mut sector = LOG_FIRST_SECTOR;
    while sector < LOG_FIRST_SECTOR + LOG_SECTORS {
        let n = chunk_sectors.min(LOG_FIRST_SECTOR + LOG_SECTORS - sector);
        let mut buf = vec![0u8; (n * 512) as usize];
        dev.read_at(&mut buf, sector * 512)
            .unwrap_or_else(|e| panic!("cycle {cycle}: volume {vol}: read after restart: {e}"));
        for (k, got) in buf.chunks(512).enumerate() {
            let s = sector + k as u64;
            let i = SectorLog::idx(vol, s);
            let floor = log.floor[i].load(Ordering::SeqCst);
            let sent = log.sent[i].load(Ordering::SeqCst);
            let version = if got.iter().all(|&b| b == 0) {
                0
            } else {
                match common::decode_sector(got) {
                    Some((at, v)) if at == stamp(vol, s) => v,
                    Some((at, v)) => panic!(
                        "cycle {cycle}: volume {vol}'s sector {s} holds sector {at}'s data (version {v})"
                    ),
                    None => panic!(
                        "cycle {cycle}: volume {vol}'s sector {s} holds garbage (torn or foreign)"
                    ),
                }
            };
            assert!(
                version >= floor,
                "cycle {cycle}: volume {vol}'s sector {s} reads version {version}, older than its flushed version {floor}: a flushed write was lost"
            );
            assert!(
                version <= sent,
                "cycle {cycle}: volume {vol}'s sector {s} reads version {version}, never sent (highest sent {sent})"
            );
            if floor > 0 {
                verified += 1;
            }
            log.current[i].store(version, Ordering::SeqCst);
        }
        sector += n;
    }
    verified
}

fn fio_args(uri: &str, seed: u64) -> Vec<String> {
    vec![
        "--thread".into(),
        "--name=kill".into(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        format!("--size={FIO_JOB_BYTES}"),
        format!("--offset_increment={FIO_JOB_BYTES}"),
        format!("--numjobs={FIO_JOBS}"),
        "--iodepth=8".into(),
        "--fsync=32".into(),
        format!("--randseed={seed}"),
        "--verify=crc32c".into(),
        "--verify_fatal=1".into(),
        "--output-format=json".into(),
    ]
}

fn fio_state_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with("verify.state"))
        .collect()
}

/// Offsets named by the lines of fio's stderr that contain `marker`
/// followed by a number.
fn offsets_after(text: &str, marker: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let at = l.find(marker)? + marker.len();
            let digits: String = l[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Offsets of the writes fio saw acknowledged: its completion latency logs
/// (`--write_lat_log=lat --log_offset=1`: time, latency, direction, size,
/// offset per completed I/O; failed I/Os are not logged).
fn fio_acked_writes(dir: &Path) -> std::collections::HashSet<u64> {
    let mut acked = std::collections::HashSet::new();
    for job in 1..=FIO_JOBS {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("lat_clat.{job}.log"))) else {
            continue;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() >= 5 && f[2] == "1" {
                acked.insert(f[4].parse().unwrap());
            }
        }
    }
    acked
}

/// Re-reads everything the last fio run wrote, as its saved state lists
/// it. fio's state counts a write that failed when the daemon died as
/// completed; such a write was never acknowledged, so a verify failure is
/// allowed exactly where fio logged no completion. Returns (blocks
/// verified, unacknowledged writes found missing).
fn verify_fio(dir: &Path, uri: &str, fio_seed: u64, cycle: u64) -> (u64, u64) {
    let acked = fio_acked_writes(dir);
    let mut args = fio_args(uri, fio_seed);
    args.push("--verify_only".into());
    args.push("--verify_fatal=0".into());
    if !fio_state_files(dir).is_empty() {
        args.push("--verify_state_load=1".into());
    }
    let (out_path, err_path) = (dir.join("verify.out"), dir.join("verify.err"));
    let mut child = daemon::KillOnDrop(
        Command::new("fio")
            .args(&args)
            .current_dir(dir)
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "cycle {cycle}: fio verify did not finish in 300 s:\n{}",
            proc_state(child.id())
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let stdout = std::fs::read(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    let bad = offsets_after(&stderr, "requested block: offset=");
    for off in &bad {
        assert!(
            !acked.contains(off),
            "cycle {cycle}: fio verify of the previous cycle's writes failed at offset {off}, \
             a write fio saw completed: {stderr}"
        );
    }
    let v = fio_json(&stdout);
    let mut read = 0;
    for j in v["jobs"].as_array().unwrap() {
        // 84 (EILSEQ) is fio's verify failure, judged above.
        let e = j["error"].as_u64().unwrap();
        assert!(
            e == 0 || (e == 84 && !bad.is_empty()),
            "cycle {cycle}: fio verify job error {e}: {stderr}"
        );
        read += j["read"]["total_ios"].as_u64().unwrap();
    }
    (read - bad.len() as u64, bad.len() as u64)
}

/// What a process and its threads are doing, from /proc (for a hang).
fn proc_state(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("pid {pid} is gone");
    };
    for t in tasks.flatten() {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string();
        out.push_str(&format!(
            "  thread {} {}: state {state}, wchan {}\n",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan")
        ));
    }
    out
}

/// Waits for fio to exit after the daemon died. After 10 s it is sent
/// SIGCONT again (in case the first one was lost); after `secs` it is
/// reported (its threads, its stderr) and killed. Returns whether the
/// second SIGCONT was needed.
fn wait_fio(fio: &mut Child, dir: &Path, cycle: u64, secs: u64) -> bool {
    let t = Instant::now();
    let mut nudged = false;
    loop {
        if fio.try_wait().unwrap().is_some() {
            return nudged;
        }
        if !nudged && t.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "kill-9: cycle {cycle}: fio still running 10 s after the kill:\n{}",
                proc_state(fio.id())
            );
            signal(fio.id(), libc::SIGCONT);
            nudged = true;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            let state = proc_state(fio.id());
            let err = std::fs::read_to_string(dir.join("load.err")).unwrap_or_default();
            let _ = fio.kill();
            panic!(
                "cycle {cycle}: fio did not exit within {secs} s of the daemon's death:\n{state}\nits stderr:\n{err}"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Each volume's mode in `cycle`: writeback, every fourth cycle
/// writethrough; with several volumes, volume 1 alone in writethrough in
/// another cycle of four (one cache, two modes).
fn modes_of(cycle: u64, volumes: usize) -> Vec<&'static str> {
    let mode = |v| match (cycle % 4, v) {
        (3, _) | (1, 1) => "writethrough",
        _ => "writeback",
    };
    (0..volumes).map(mode).collect()
}

/// Counts over the cycles, for the report.
#[derive(Default)]
struct Totals {
    verified_sectors: u64,
    fio_blocks: u64,
    fio_failed_missing: u64,
    fio_nudged: u64,
    writethrough_cycles: u64,
    mixed_cycles: u64,
}

/// One run's state across its cycles: a cache of `uris.len()` origins, fio
/// on the first volume, the own writers on every volume.
struct Run {
    setup: Setup,
    /// Each volume's NBD export (the first by the empty name, the others
    /// by their volume names).
    uris: Vec<String>,
    fio_dir: PathBuf,
    log: Arc<SectorLog>,
    counts: Arc<Counts>,
    rng: ChaCha8Rng,
    seed: u64,
    modes: Vec<&'static str>,
    last_fio_seed: Option<u64>,
    totals: Totals,
}

impl Run {
    fn new(seed: u64, volumes: usize) -> Run {
        let create = [
            "--mode",
            "writeback",
            "--writeback-high",
            "10",
            "--writeback-low",
            "2",
            "--writeback-age",
            "1",
        ];
        let setup = Setup::with_origins(volumes, ORIGIN_BYTES, CACHE_BYTES, &create);
        let fio_dir = setup.path("fio");
        std::fs::create_dir(&fio_dir).unwrap();
        let uris = (0..volumes)
            .map(|v| match v {
                0 => setup.uri(),
                v => setup.export_uri(&format!("vol{v}")),
            })
            .collect();
        Run {
            setup,
            uris,
            fio_dir,
            log: Arc::new(SectorLog::new(volumes)),
            counts: Arc::new(Counts::default()),
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            modes: vec!["writeback"; volumes],
            last_fio_seed: None,
            totals: Totals::default(),
        }
    }

    /// After a restart: every volume's own writes, and fio's.
    fn verify(&mut self, cycle: u64) {
        for (v, uri) in self.uris.iter().enumerate() {
            let dev = NbdDevice::connect(uri, 1).unwrap();
            self.totals.verified_sectors += verify_log(&dev, &self.log, cycle, v);
        }
        if let Some(fio_seed) = self.last_fio_seed {
            let (ok, missing) = verify_fio(&self.fio_dir, &self.uris[0], fio_seed, cycle);
            self.totals.fio_blocks += ok;
            self.totals.fio_failed_missing += missing;
        }
    }

    /// Switches the volumes to `cycle`'s modes; returns, per volume,
    /// whether it is in writethrough.
    fn set_modes(&mut self, cycle: u64) -> Vec<bool> {
        let want = modes_of(cycle, self.uris.len());
        for (v, &mode) in want.iter().enumerate() {
            if mode == self.modes[v] {
                continue;
            }
            match self.uris.len() {
                1 => self.setup.cli(&["set-mode", mode]),
                _ => (self.setup).cli(&["set-mode", mode, "--volume", &format!("vol{v}")]),
            };
        }
        self.modes = want;
        let writethrough: Vec<bool> = self.modes.iter().map(|&m| m == "writethrough").collect();
        match writethrough.iter().filter(|&&w| w).count() {
            0 => {}
            n if n == writethrough.len() => self.totals.writethrough_cycles += 1,
            _ => self.totals.mixed_cycles += 1,
        }
        writethrough
    }

    /// Starts fio on the first volume with a seed of the run's.
    fn start_fio(&mut self) -> (daemon::KillOnDrop, u64) {
        for e in std::fs::read_dir(&self.fio_dir).unwrap().flatten() {
            std::fs::remove_file(e.path()).unwrap();
        }
        let fio_seed = self.rng.gen_range(1..u32::MAX as u64);
        let fio = daemon::KillOnDrop(
            Command::new("fio")
                .args(fio_args(&self.uris[0], fio_seed))
                .arg("--do_verify=0")
                .arg("--verify_state_save=1")
                .arg("--write_lat_log=lat")
                .arg("--log_offset=1")
                // Room for every completion of a job in the log's first
                // chunk. A full chunk makes fio drain its queue before
                // growing the log (io_u_quiesce), and that drain loops
                // forever once the NBD connection is dead: fio's nbd
                // engine returns an error from every poll of a dead handle
                // and the loop only ends when no I/O is in flight (fio
                // 3.33, engines/nbd.c and io_u.c). That was the "fio did
                // not exit within 60 s" failure.
                .arg(format!("--log_entries={FIO_LOG_ENTRIES}"))
                .current_dir(&self.fio_dir)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(self.fio_dir.join("load.err")).unwrap())
                .spawn()
                .unwrap(),
        );
        (fio, fio_seed)
    }

    fn start_writers(
        &mut self,
        writethrough: &[bool],
        ctl: &Arc<WriterCtl>,
    ) -> Vec<JoinHandle<()>> {
        (0..WRITERS)
            .map(|t| {
                let (uris, log, counts, ctl) = (
                    self.uris.clone(),
                    self.log.clone(),
                    self.counts.clone(),
                    ctl.clone(),
                );
                let (s, writethrough) = (self.rng.gen(), writethrough.to_vec());
                std::thread::spawn(move || writer(uris, t, s, writethrough, log, counts, ctl))
            })
            .collect()
    }

    /// Makes fio's completed writes durable: freezes it, lets its requests
    /// in flight finish, flushes for every connection.
    fn freeze_and_flush(&mut self, fio: &daemon::KillOnDrop, ctl: &WriterCtl) {
        signal(fio.id(), libc::SIGSTOP);
        ctl.hold.store(true, Ordering::SeqCst);
        let t = Instant::now();
        while ctl.held.load(Ordering::SeqCst) < WRITERS {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "writers do not pause"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let flusher = NbdDevice::connect(&self.uris[0], 1).unwrap();
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(200));
            flusher.flush().unwrap();
        }
        drop(flusher);
        ctl.hold.store(false, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.rng.gen_range(0..300)));
    }

    /// Loads every volume, then kills the daemon (`kill -9`) under the load.
    fn load_and_kill(&mut self, mut server: daemon::KillOnDrop, cycle: u64, writethrough: &[bool]) {
        let (mut fio, fio_seed) = self.start_fio();
        let ctl = Arc::new(WriterCtl {
            hold: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            errors: Mutex::new(Vec::new()),
        });
        let writers = self.start_writers(writethrough, &ctl);
        std::thread::sleep(Duration::from_millis(self.rng.gen_range(300..900)));
        // fio writes the first volume: in writethrough it is killed
        // mid-flight (a completed write is on the origin).
        if !writethrough[0] {
            self.freeze_and_flush(&fio, &ctl);
        }
        server.kill().unwrap();
        server.wait().unwrap();
        signal(fio.id(), libc::SIGCONT);
        self.totals.fio_nudged += wait_fio(&mut fio, &self.fio_dir, cycle, 60) as u64;
        for w in writers {
            w.join().unwrap();
        }
        let errors = ctl.errors.lock().unwrap();
        assert!(
            errors.is_empty(),
            "cycle {cycle} (seed {}): {} stale live reads, first: {}",
            self.seed,
            errors.len(),
            errors[0]
        );
        self.last_fio_seed = Some(fio_seed);
    }

    /// Offline check of the metadata the kill left behind.
    fn check_after_kill(&self, cycle: u64) {
        let out = self.setup.cli_output(&["check"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cycle {cycle}: check after kill -9: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("shut down cleanly: no"), "{text}");
        for v in 1..self.uris.len() {
            assert!(text.contains(&format!("volume vol{v}")), "{text}");
        }
    }

    fn report(&self, cycles: u64, started: Instant) {
        let t = &self.totals;
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        eprintln!(
            "kill-9, {} volume(s): {cycles} cycles ({} writethrough, {} mixed) in {:.0} s, seed {}: \
             {} flushed sectors verified (summed over restarts and volumes), \
             {} fio blocks verified ({} unacknowledged fio writes absent, as allowed), \
             {} own writes acknowledged, {} own flushes, {} live reads checked; \
             fio needed a second SIGCONT {} times",
            self.uris.len(),
            t.writethrough_cycles,
            t.mixed_cycles,
            started.elapsed().as_secs_f64(),
            self.seed,
            t.verified_sectors,
            t.fio_blocks,
            t.fio_failed_missing,
            count(&self.counts.writes_acked),
            count(&self.counts.flushes),
            count(&self.counts.live_reads_checked),
            t.fio_nudged,
        );
    }
}

/// `cycles` kills of a daemon serving a cache of `volumes` origins.
fn run(cycles: u64, seed: u64, volumes: usize) {
    need("fio", "fio");
    let mut r = Run::new(seed, volumes);
    let started = Instant::now();
    for cycle in 0..=cycles {
        let mut server = r.setup.serve();
        r.verify(cycle);
        if cycle == cycles {
            // The last restart only verifies; then a clean shutdown.
            daemon::sigterm(&mut server);
            let check = r.setup.cli(&["check"]);
            assert!(check.contains("shut down cleanly: yes"), "{check}");
            break;
        }
        let writethrough = r.set_modes(cycle);
        r.load_and_kill(server, cycle, &writethrough);
        if (cycle + 1) % 25 == 0 {
            eprintln!(
                "kill-9: {} cycles done in {:.0} s, {} flushed sectors verified so far",
                cycle + 1,
                started.elapsed().as_secs_f64(),
                r.totals.verified_sectors
            );
        }
        r.check_after_kill(cycle);
    }
    r.report(cycles, started);
}

#[test]
fn kill_9_under_fio_and_logged_writers() {
    let cycles = if common::long_form() { 200 } else { 6 };
    run(cycles, common::seed(), 1);
}

/// A cache of two origins, each an NBD export (`vol0` by the empty name,
/// `vol1` by its own): the own writers write both, and every flushed write
/// of both is there after each kill; the volumes sometimes in two modes.
#[test]
fn kill_9_with_two_origins() {
    let cycles = if common::long_form() { 100 } else { 8 };
    run(cycles, common::seed(), 2);
}
