//! Origin outages (issue 23) against real parts: the origin is nbdkit's
//! file plugin on a Unix socket (its data outlives the server: the file
//! keeps it), a writeback cache is served in front of it by the
//! `tiercache` binary, and fio verify writes through the cache (with a
//! flush every 64 writes). The origin server is killed mid-run and kept
//! down for a few seconds: fio sees no error (writes and flushes go to the
//! cache), a read the cache cannot serve fails at once, `status`,
//! `status --json` and the metrics say the origin is unreachable and since
//! when, the daemon's log is not flooded. The server
//! is started again on the same socket: the origin is reconnected, fio's
//! verify passes, `tiercache flush` writes everything back, and the origin
//! file then holds what the volume holds.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/web.rs"]
mod web;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use daemon::{cli_ok_in, fio_json, need, sigterm, wait_for_socket, KillOnDrop, BIN};
use serde_json::Value;
use tiercache::device::nbd::NbdDevice;
use tiercache::device::{open_device, BlockDevice};
use tiercache::engine::{CreateOptions, Engine, OpenOptions, WritebackSettings};

const ORIGIN_BYTES: u64 = 64 << 20;
/// The cache is large enough that fio's data stays below the writeback
/// watermark: nothing is written back before the outage, so the cache's
/// flushes need nothing from the origin while it is down.
const CACHE_BYTES: u64 = 128 << 20;
/// How long the origin stays down.
const OUTAGE: Duration = Duration::from_secs(3);

/// `nbdkit -U SOCK -f file FILE`, in the foreground.
fn start_origin(sock: &Path, file: &Path) -> KillOnDrop {
    start_origin_with(sock, file, &[], &[])
}

/// Kills the origin server as a crash would (SIGKILL).
fn kill(mut server: KillOnDrop) {
    server.kill().unwrap();
    server.wait().unwrap();
}

fn unix_now_s() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

struct Volume {
    dir: tempfile::TempDir,
}

impl Volume {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn state(&self) -> PathBuf {
        self.path("state")
    }
    fn cli(&self, args: &[&str]) -> String {
        cli_ok_in(&self.state(), args)
    }
    fn status(&self) -> Value {
        serde_json::from_str(&self.cli(&["status", "--json"])).unwrap()
    }
    fn health(&self) -> Value {
        self.status()["origin_health"].clone()
    }
    /// Polls `status --json` until the origin's health passes `done`.
    fn wait_health(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        daemon::wait_origin_health(&self.state(), what, Duration::from_secs(20), done)
    }
    fn uri(&self) -> String {
        format!(
            "nbd+unix:///?socket={}",
            self.state().join("tc0.nbd").display()
        )
    }
}

/// `serve` with its log (warnings and up) kept in `serve.log`.
fn serve(v: &Volume, metrics: &str) -> KillOnDrop {
    let child = serve_args(v, &["--metrics", metrics]);
    web::wait_http(metrics, "/metrics");
    child
}

/// A sample's value in the metrics text: the line that starts with `name{`.
fn metric(addr: &str, name: &str) -> f64 {
    let (code, text) = web::get(addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{text:.200}");
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics"))
}

/// fio verify writing 16 MiB through the cache at 3 MiB/s (so the writing
/// lasts over 5 s, the outage inside it), flushing every 64 writes, then
/// reading everything back.
fn start_fio(uri: &str) -> Child {
    Command::new("fio")
        .args([
            "--name=outage",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--size=16M",
            "--iodepth=8",
            "--rate=,3m",
            "--fsync=64",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--output-format=json",
        ])
        .arg(format!("--uri={uri}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Lines of the daemon's log that mention `what`.
fn log_lines(v: &Volume, what: &str) -> Vec<String> {
    std::fs::read_to_string(v.path("serve.log"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

#[test]
fn an_origin_outage_under_fio_verify_loses_nothing() {
    need("fio", "fio");
    need("nbdkit", "nbdkit");
    let v = Volume {
        dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    };
    let (origin_file, origin_sock) = (v.path("origin.img"), v.path("origin.sock"));
    std::fs::File::create(&origin_file)
        .unwrap()
        .set_len(ORIGIN_BYTES)
        .unwrap();
    std::fs::File::create(v.path("cache.img"))
        .unwrap()
        .set_len(CACHE_BYTES)
        .unwrap();
    let origin = start_origin(&origin_sock, &origin_file);
    let origin_uri = format!("nbd+unix:///?socket={}", origin_sock.display());
    let cache = v.path("cache.img");
    v.cli(&[
        "create",
        "--origin",
        &origin_uri,
        "--cache",
        cache.to_str().unwrap(),
        "--mode",
        "writeback",
    ]);
    let metrics = format!("127.0.0.1:{}", web::free_port());
    let mut daemon = serve(&v, &metrics);
    let h = v.health();
    assert_eq!(h["reachable"], true, "{h}");
    assert_eq!(metric(&metrics, "tiercache_origin_reachable"), 1.0);

    let mut fio = start_fio(&v.uri());
    // Stop the origin once fio's writes are flowing.
    let t = Instant::now();
    while v.status()["stats"]["write_requests"].as_u64().unwrap_or(0) < 200 {
        assert!(fio.try_wait().unwrap().is_none(), "fio ended early");
        assert!(t.elapsed() < Duration::from_secs(30), "fio wrote nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed_at_s = unix_now_s();
    let killed = Instant::now();
    kill(origin);
    assert!(fio.try_wait().unwrap().is_none(), "the outage is mid-run");

    // Unreachable, since the kill, in every view.
    let h = v.wait_health("the outage", |h| h["reachable"] == false);
    let since = h["unreachable_since_unix_s"].as_u64().expect("since when");
    assert!(since >= killed_at_s && since <= unix_now_s(), "{h}");
    assert!(h["unreachable_s"].as_f64().is_some_and(|s| s >= 0.0), "{h}");
    let why = h["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("connection lost"), "{h}");
    let text = v.cli(&["status"]);
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("connection"))
        .unwrap_or_else(|| panic!("no connection row in:\n{text}"));
    assert!(
        row.contains("UNREACHABLE since ")
            && row.contains(" UTC (")
            && row.contains("last error: connection lost"),
        "{row}"
    );
    eprintln!("status during the outage:\n{text}");
    assert_eq!(metric(&metrics, "tiercache_origin_reachable"), 0.0);
    assert!(metric(&metrics, "tiercache_origin_unreachable_seconds") >= 0.0);

    // A read the cache cannot serve fails at once, and says why.
    let client = NbdDevice::connect(&v.uri(), 1).unwrap();
    let t = Instant::now();
    let err = client.read_at(&mut [0u8; 4096], 48 << 20).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(err.to_string().contains("EIO"), "{err}");
    drop(client);

    // Down for a while, then back on the same socket with the same file.
    std::thread::sleep(OUTAGE.saturating_sub(killed.elapsed()));
    let h = v.health();
    assert_eq!(h["reachable"], false, "{h}");
    assert!(
        h["reconnect_attempts"].as_u64().unwrap() >= 3,
        "backoff attempts: {h}"
    );
    let origin = start_origin(&origin_sock, &origin_file);
    let h = v.wait_health("the reconnect", |h| h["reachable"] == true);
    assert!(h["reconnects"].as_u64().unwrap() >= 1, "{h}");
    assert_eq!(h["unreachable_since_unix_s"], Value::Null, "{h}");
    assert_eq!(metric(&metrics, "tiercache_origin_reachable"), 1.0);
    assert!(metric(&metrics, "tiercache_origin_reconnects_total") >= 1.0);

    // fio saw no error: writes and flushes went to the cache meanwhile.
    let out = fio.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let json = fio_json(&out.stdout);
    for job in json["jobs"].as_array().unwrap() {
        assert_eq!(job["error"], 0, "fio job error: {job}");
        assert_eq!(job["write"]["io_bytes"], 16 << 20, "{job}");
    }
    let s = v.status();
    assert!(s["cache_blocks_dirty"].as_u64().unwrap() > 0, "{s}");
    // Nothing but that read tried the origin while it was down.
    assert_eq!(s["stats"]["origin_errors"], 1, "{s}");
    assert_eq!(s["stats"]["origin_writes"], 0, "{s}");

    // Everything written back, and the origin file holds the volume.
    v.cli(&["flush"]);
    let s = v.status();
    assert_eq!(s["cache_blocks_dirty"], 0, "{s}");
    let volume = NbdDevice::connect(&v.uri(), 1).unwrap();
    let mut through_cache = vec![0u8; ORIGIN_BYTES as usize];
    volume.read_at(&mut through_cache, 0).unwrap();
    drop(volume);
    let on_origin = std::fs::read(&origin_file).unwrap();
    assert!(
        on_origin[..16 << 20].iter().any(|&b| b != 0),
        "fio's data reached the origin file"
    );
    if let Some(at) = (0..on_origin.len()).find(|&i| on_origin[i] != through_cache[i]) {
        panic!("the origin file differs from the volume at byte {at}");
    }

    // The outage was logged, not every failing round of it.
    eprintln!(
        "serve.log:\n{}",
        std::fs::read_to_string(v.path("serve.log")).unwrap()
    );
    assert_eq!(log_lines(&v, "requests fail until it is back").len(), 1);
    assert_eq!(log_lines(&v, "reachable again").len(), 1);
    let repeated = log_lines(&v, "background");
    assert!(repeated.len() <= 2, "background warnings: {repeated:#?}");
    sigterm(&mut daemon);
    kill(origin);
}

/// The engine over an NBD origin that goes away, one background round at a
/// time: while the origin is unreachable the rounds leave its dirty blocks
/// alone (no origin request, no error), a client flush still commits (no
/// write reached the origin since its last flush), and `flush`'s
/// write-back fails at once saying why; the first round after the
/// reconnect writes the blocks back.
#[test]
fn background_writeback_waits_for_an_unreachable_origin() {
    need("nbdkit", "nbdkit");
    const BS: u64 = 4096;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (origin_file, sock) = (
        dir.path().join("origin.img"),
        dir.path().join("origin.sock"),
    );
    let cache_file = dir.path().join("cache.img");
    std::fs::File::create(&origin_file)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    std::fs::File::create(&cache_file)
        .unwrap()
        .set_len(tiercache::engine::format::Layout::device_bytes_for(
            BS as u32, 64,
        ))
        .unwrap();
    let server = start_origin(&sock, &origin_file);
    let origin = open_device(&format!("nbd+unix:///?socket={}", sock.display())).unwrap();
    let opts = CreateOptions {
        // Any dirty block is past the high watermark: due at every round.
        writeback: WritebackSettings {
            high_pct: 1,
            low_pct: 0,
            max_age_secs: 3600,
            idle_secs: 0,
        },
        ..CreateOptions::default()
    };
    let no_thread = OpenOptions {
        no_background: true,
        ..OpenOptions::default()
    };
    let cache = open_device(cache_file.to_str().unwrap()).unwrap();
    let engine = Engine::create_with(cache, origin.clone(), &opts, &no_thread).unwrap();
    let blocks: Vec<u64> = (0..8).map(|i| i * 3).collect();
    for &b in &blocks {
        engine
            .write(b * BS, &[b as u8 + 1; BS as usize], false)
            .unwrap();
    }
    kill(server);
    let t = Instant::now();
    while origin.health().unwrap().reachable {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the loss went unseen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    for _ in 0..20 {
        engine.background_tick();
    }
    let s = engine.status();
    assert_eq!(s.cache_blocks_dirty, blocks.len() as u64);
    assert_eq!((s.stats.origin_writes, s.stats.origin_errors), (0, 0));
    engine.flush().unwrap();
    let t = Instant::now();
    let err = engine
        .write_back_all(&mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(err.contains("unreachable"), "{err}");
    assert_eq!(engine.dirty_blocks(), blocks.len() as u64);

    let server = start_origin(&sock, &origin_file);
    let t = Instant::now();
    while !origin.health().unwrap().reachable {
        assert!(t.elapsed() < Duration::from_secs(20), "no reconnect");
        std::thread::sleep(Duration::from_millis(10));
    }
    engine.background_tick();
    assert_eq!(
        engine.dirty_blocks(),
        0,
        "written back once the origin is back"
    );
    engine.flush().unwrap();
    engine.close().unwrap();
    let on_origin = std::fs::read(&origin_file).unwrap();
    for &b in &blocks {
        let at = (b * BS) as usize;
        assert!(
            on_origin[at..at + BS as usize]
                .iter()
                .all(|&x| x == b as u8 + 1),
            "block {b} on the origin"
        );
    }
    drop(engine);
    drop(origin);
    kill(server);
}

// ---------------------------------------------------------------------------
// A frozen origin (issue 32): nbdkit stopped with SIGSTOP, as a hung NFS
// server, a partition without a reset or a wedged OSD look. Its socket
// stays open and takes connections; nothing answers.
// ---------------------------------------------------------------------------

/// `nbdkit -U SOCK -f [FILTER ARGS] file FILE [PARAMS]`.
fn start_origin_with(sock: &Path, file: &Path, filters: &[&str], params: &[&str]) -> KillOnDrop {
    // A killed server leaves its socket file, which nbdkit will not replace.
    let _ = std::fs::remove_file(sock);
    let child = Command::new("nbdkit")
        .arg("-U")
        .arg(sock)
        // One thread per connection: nbdkit 1.32 aborts (connections.c:
        // "raw_send_socket: Assertion `sock >= 0' failed") when a reply is
        // sent on one thread after another closed the socket on EPIPE,
        // which our client's timeout (it shuts a stopped server's
        // connection down with a WRITE and a FLUSH pending) set up about
        // 1 run in 10.
        .args(["-f", "--exit-with-parent", "--threads=1"])
        .args(filters)
        .arg("file")
        .arg(file)
        .args(params)
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit: install the Debian package nbdkit");
    let child = KillOnDrop(child);
    wait_for_socket(sock);
    child
}

/// A volume over an nbdkit origin (`filters`, `params`), created with
/// `create_args`, served with `serve_args`.
fn frozen_setup(
    filters: &[&str],
    params: &[&str],
    create_args: &[&str],
) -> (Volume, KillOnDrop, PathBuf) {
    need("fio", "fio");
    need("nbdkit", "nbdkit");
    let v = Volume {
        dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    };
    let origin_file = v.path("origin.img");
    std::fs::File::create(&origin_file)
        .unwrap()
        .set_len(ORIGIN_BYTES)
        .unwrap();
    std::fs::File::create(v.path("cache.img"))
        .unwrap()
        .set_len(CACHE_BYTES)
        .unwrap();
    let sock = v.path("origin.sock");
    let origin = start_origin_with(&sock, &origin_file, filters, params);
    let origin_uri = format!("nbd+unix:///?socket={}", sock.display());
    let cache = v.path("cache.img");
    let mut args = vec![
        "create",
        "--origin",
        &origin_uri,
        "--cache",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(create_args);
    v.cli(&args);
    (v, origin, origin_file)
}

/// `serve` with extra flags, its log in `serve.log`.
fn serve_args(v: &Volume, args: &[&str]) -> KillOnDrop {
    let log = std::fs::File::create(v.path("serve.log")).unwrap();
    let child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .env("TIERCACHE_STATE_DIR", v.state())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let child = KillOnDrop(child);
    wait_for_socket(&v.state().join("tc0.nbd"));
    wait_for_socket(&v.state().join("tc0.sock"));
    child
}

/// fio over the volume: `args` after the common ones.
fn fio(uri: &str, name: &str, args: &[&str]) -> Result<Value, String> {
    daemon::fio_nbd(uri, name, args)
}

/// Polls the stats until `name` reaches `at_least`.
fn wait_stat(v: &Volume, name: &str, at_least: u64) {
    let t = Instant::now();
    while v.status()["stats"][name].as_u64().unwrap_or(0) < at_least {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{name} stayed below {at_least}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The whole volume through a real client (nbdcopy) against the origin
/// file, once everything is written back.
fn assert_origin_equals_volume(v: &Volume, origin_file: &Path) {
    need("nbdcopy", "libnbd-bin");
    v.cli(&["flush"]);
    let s = v.status();
    assert_eq!(s["cache_blocks_dirty"], 0, "{s}");
    let copy = v.path("volume.img");
    daemon::nbdcopy(v.uri(), &copy);
    if let Some(at) = daemon::first_difference(&copy, origin_file) {
        panic!("the origin file differs from the volume at byte {at}");
    }
}

/// Writeback: with the origin stopped in the middle of a writeback, a
/// client's writes and flushes complete at the cache's speed (fio verify,
/// a flush every 16 writes; no flush takes even a second, where the
/// origin's requests time out after 4 s), status says the origin stopped
/// answering; once it runs again everything reaches it.
#[test]
fn a_stopped_origin_hangs_no_flush_in_writeback() {
    let (v, mut origin, origin_file) = frozen_setup(
        &["--filter=delay"],
        &["delay-write=10ms"],
        &["--mode", "writeback", "--writeback-age", "1"],
    );
    let mut daemon = serve_args(&v, &["--origin-timeout", "4"]);
    // 512 scattered dirty blocks, written back at ~100 a second.
    fio(
        &v.uri(),
        "fill",
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--io_size=2M",
            "--iodepth=16",
        ],
    )
    .unwrap();
    wait_stat(&v, "origin_writes", 20);
    daemon::signal(origin.id(), libc::SIGSTOP);
    let t = Instant::now();
    let json = fio(
        &v.uri(),
        "during",
        &[
            "--rw=randwrite",
            "--offset=32M",
            "--bs=4k",
            "--size=16M",
            "--io_size=4M",
            "--iodepth=8",
            "--fsync=16",
            "--verify=crc32c",
            "--verify_fatal=1",
        ],
    )
    .unwrap_or_else(|e| panic!("fio failed while the origin was stopped: {e}"));
    let took = t.elapsed();
    let job = &json["jobs"][0];
    let sync_max_ms = job["sync"]["lat_ns"]["max"].as_u64().unwrap_or(0) / 1_000_000;
    eprintln!("during the stop: fio took {took:?}, slowest flush {sync_max_ms} ms");
    assert!(
        job["sync"]["total_ios"].as_u64().unwrap_or(0) >= 60,
        "{job}"
    );
    assert!(
        sync_max_ms < 1000,
        "a flush waited {sync_max_ms} ms for the stopped origin"
    );
    // The writeback's request timed out: the origin is unreachable.
    let h = v.wait_health("the stop", |h| h["reachable"] == false);
    let why = h["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("stopped answering") || why.contains("handshake"),
        "{h}"
    );
    let dirty = v.status()["cache_blocks_dirty"].as_u64().unwrap();
    assert!(dirty > 0, "writeback was under way");

    daemon::signal(origin.id(), libc::SIGCONT);
    v.wait_health("the origin back", |h| h["reachable"] == true);
    assert_origin_equals_volume(&v, &origin_file);
    sigterm(&mut daemon);
    origin.kill().unwrap();
}

/// Writethrough: every write needs the origin, so with it stopped a write
/// fails, after the origin timeout (2 s here), not never; once it runs
/// again, writes and flushes work and the origin holds the volume.
#[test]
fn a_stopped_origin_fails_writethrough_writes_in_bounded_time() {
    let (v, mut origin, origin_file) = frozen_setup(&[], &[], &["--mode", "writethrough"]);
    let mut daemon = serve_args(&v, &["--origin-timeout", "2"]);
    fio(
        &v.uri(),
        "before",
        &["--rw=randwrite", "--bs=4k", "--size=4M", "--fsync=8"],
    )
    .unwrap();
    daemon::signal(origin.id(), libc::SIGSTOP);
    let t = Instant::now();
    let err = fio(
        &v.uri(),
        "during",
        &[
            "--rw=write",
            "--offset=8M",
            "--bs=4k",
            "--size=64k",
            "--fsync=1",
        ],
    )
    .expect_err("a writethrough write succeeded with the origin stopped");
    let took = t.elapsed();
    eprintln!("fio failed after {took:?}: {:.300}", err);
    assert!(took < Duration::from_secs(20), "bounded: {took:?}");
    let h = v.wait_health("the stop", |h| h["reachable"] == false);
    assert!(h["last_error"].is_string(), "{h}");
    daemon::signal(origin.id(), libc::SIGCONT);
    v.wait_health("the origin back", |h| h["reachable"] == true);
    fio(
        &v.uri(),
        "after",
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=4M",
            "--fsync=8",
            "--verify=crc32c",
            "--verify_fatal=1",
        ],
    )
    .unwrap();
    // The region the failed job wrote is written again before the flush
    // in assert_origin_equals_volume: a flush after a lost write fails
    // until it is.
    fio(
        &v.uri(),
        "rewrite",
        &[
            "--rw=write",
            "--offset=8M",
            "--bs=4k",
            "--size=64k",
            "--fsync=1",
        ],
    )
    .unwrap();
    assert_origin_equals_volume(&v, &origin_file);
    sigterm(&mut daemon);
    origin.kill().unwrap();
}

/// An origin with a volatile write cache (nbdkit's cache filter in
/// writeback) is killed in the middle of a writeback and started again:
/// the writes it had taken but not flushed are gone. The blocks whose
/// writeback they were stay dirty and go again: after `tiercache flush`
/// the origin file holds the volume.
#[test]
fn an_origin_that_loses_its_cache_mid_writeback_gets_the_blocks_again() {
    let filters = ["--filter=delay", "--filter=cache"];
    let params = [
        "cache=writeback",
        "cache-min-block-size=4096",
        "delay-write=5ms",
    ];
    let (v, origin, origin_file) = frozen_setup(
        &filters,
        &params,
        &["--mode", "writeback", "--writeback-age", "1"],
    );
    let mut daemon = serve_args(&v, &["--origin-timeout", "4"]);
    fio(
        &v.uri(),
        "fill",
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--io_size=8M",
            "--iodepth=16",
        ],
    )
    .unwrap();
    wait_stat(&v, "origin_writes", 100);
    kill(origin);
    v.wait_health("the loss", |h| h["reachable"] == false);
    let sock = v.path("origin.sock");
    let origin = start_origin_with(&sock, &origin_file, &filters, &params);
    v.wait_health("the origin back", |h| h["reachable"] == true);
    assert_origin_equals_volume(&v, &origin_file);
    let s = v.status();
    assert!(
        s["stats"]["origin_flush_losses"].as_u64().unwrap() >= 1,
        "{s}"
    );
    sigterm(&mut daemon);
    kill(origin);
}
