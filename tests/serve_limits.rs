//! Bounded resources under abusive clients, measured on the `tiercache
//! serve` daemon's RSS (/proc/PID/status VmRSS) against the configured
//! caps:
//! - clients sending 64 MiB writes at depth 1,000 are slowed by back
//!   pressure (the daemon stops reading their sockets), not killed, and the
//!   daemon grows by less than `--total-buffer`;
//! - clients that never read their replies hold at most `--conn-buffer`
//!   each, do not hold up other clients, and are closed after
//!   `--stall-timeout`;
//! - handshakes that go idle (plaintext or inside TLS) are closed after
//!   `--handshake-timeout`; connections beyond `--max-handshakes` are
//!   closed at once;
//! - 16 pipelined 1 GiB NBD_CMD_CACHE requests from libnbd (a 1 GiB cache
//!   file): the daemon's peak RSS grows by less than `--total-buffer` plus
//!   a small margin, and every request completes;
//! - 64 TCP connections that never start a handshake: a client of the
//!   Unix socket is served at once, a 65th TCP client is refused at once
//!   (not left hanging) and served once the idle ones reach the handshake
//!   timeout;
//! - clients that trickle a big write's payload a byte at a time: another
//!   client's 4 KiB reads complete within a second all along, and the
//!   tricklers are cut off at `--transfer-timeout`;
//! - NBD_CMD_BLOCK_STATUS over 4 GiB of a cache with thousands of extents:
//!   a bounded answer (at most 1,024 extents), quickly.
//!
//! The volume is a RAM origin with a RAM cache (the CACHE test: files),
//! written once in full before the baseline is taken where it matters, so
//! the daemon's RSS moves only with what it buffers for clients.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/nbd.rs"]
mod nbdc;
#[path = "common/tls.rs"]
mod tls;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::{wait_for_socket, KillOnDrop, BIN};
use nbdc::RawClient;
use tiercache::nbd::proto;

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 160 * MIB;

struct Daemon {
    child: KillOnDrop,
    _dir: tempfile::TempDir,
    sock: PathBuf,
}

impl Daemon {
    /// `serve` over a RAM origin and RAM cache (writethrough), with `args`.
    fn start(args: &[&str]) -> Daemon {
        Daemon::start_on(&format!("ram:{}M", VOLUME_BYTES / MIB), "32M", args)
    }

    /// `serve` over `origin` and a RAM cache of `cache` bytes, with `args`.
    fn start_on(origin: &str, cache: &str, args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("tc0.nbd");
        let child = Command::new(BIN)
            .args(["serve", "--name", "tc0", "--origin", origin])
            .args(["--ram-cache", cache, "--io-threads", "4"])
            .args(args)
            .env("TIERCACHE_STATE_DIR", dir.path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = KillOnDrop(child);
        wait_for_socket(&sock);
        Daemon {
            child,
            _dir: dir,
            sock,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    /// Fails the test if the daemon has exited.
    fn assert_running(&mut self) {
        let st = self.child.try_wait().unwrap();
        assert!(st.is_none(), "the daemon exited: {st:?}");
    }

    fn client(&self) -> RawClient {
        let mut c = RawClient::connect(&self.sock);
        c.handshake(false);
        c
    }

    /// Writes the whole volume once, so the RAM devices are resident
    /// before the baseline.
    fn fill(&self) {
        let mut c = self.client();
        let chunk = vec![0x5au8; MIB as usize];
        for i in 0..VOLUME_BYTES / MIB {
            assert_eq!(c.write(i, i * MIB, &chunk), 0);
        }
    }
}

/// The process's resident set (None once it has exited).
fn try_rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// A size field of /proc/PID/status, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    Some(kb * 1024)
}

fn rss_bytes(pid: u32) -> u64 {
    try_rss_bytes(pid).expect("VmRSS in /proc/PID/status of the running daemon")
}

/// Samples a process's RSS every 10 ms until dropped; keeps the peak.
struct RssSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Some(rss) = try_rss_bytes(pid) else {
                    return;
                };
                p.fetch_max(rss, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        RssSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.peak.load(Ordering::Relaxed)
    }
}

/// The daemon's RSS once it has settled (it trims malloc every 5 s).
fn settled_rss(pid: u32) -> u64 {
    std::thread::sleep(Duration::from_secs(6));
    rss_bytes(pid)
}

fn report(what: &str, baseline: u64, peak: u64, cap: u64) {
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "{what}: RSS baseline {} MiB, peak {} MiB, growth {} MiB, cap {} MiB",
        baseline / MIB,
        peak / MIB,
        growth / MIB,
        cap / MIB
    );
    assert!(
        growth <= cap,
        "{what}: the daemon grew by {growth} bytes, more than the {cap}-byte cap"
    );
}

/// A 4 KiB write and read round trip in the last 16 MiB of the volume
/// (the abusive clients stay below); returns how long it took.
fn round_trip(c: &mut RawClient, cookie: u64) -> Duration {
    let t = Instant::now();
    let off = VOLUME_BYTES - 16 * MIB + (cookie % 1000) * 4096;
    let data = vec![cookie as u8; 4096];
    assert_eq!(c.write(cookie, off, &data), 0);
    let (e, back) = c.read(cookie, off, 4096);
    assert!(
        e == 0 && back == data,
        "round trip {cookie} read back wrong data"
    );
    t.elapsed()
}

/// Three clients send 64 MiB writes at depth 1,000 (never waiting for a
/// reply before sending on) for `secs`, while a fourth does 4 KiB round
/// trips. Returns the 64 MiB writes done, and the slowest round trip.
fn abuse_with_big_writes(d: &Daemon, secs: u64) -> (u64, Duration) {
    let payload = Arc::new(vec![0xa5u8; 64 << 20]);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut abusers = Vec::new();
    for a in 0..3u64 {
        let c = d.client();
        let mut w = c.s.try_clone().unwrap();
        let mut r = c.s.try_clone().unwrap();
        let payload = payload.clone();
        let sent = Arc::new(AtomicU64::new(0));
        let sent_w = sent.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..1000u64 {
                if Instant::now() > deadline {
                    break;
                }
                let off = ((a + i) % 2) * (64 << 20);
                let h = RawClient::request_bytes(proto::CMD_WRITE, 0, i, off, 64 << 20);
                w.write_all(&h).unwrap();
                w.write_all(&payload).unwrap();
                sent_w.fetch_add(1, Ordering::SeqCst);
            }
        });
        let reader = std::thread::spawn(move || {
            r.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut replies = 0u64;
            let mut h = [0u8; 16];
            while r.read_exact(&mut h).is_ok() {
                let errno = u32::from_be_bytes(h[4..8].try_into().unwrap());
                assert_eq!(errno, 0, "a 64 MiB write failed");
                replies += 1;
            }
            replies
        });
        abusers.push((c, writer, reader, sent));
    }
    let mut good = d.client();
    let mut slowest = Duration::ZERO;
    let mut n = 0u64;
    while Instant::now() < deadline {
        slowest = slowest.max(round_trip(&mut good, n));
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut written = 0;
    for (c, writer, reader, sent) in abusers {
        writer.join().unwrap();
        let sent = sent.load(Ordering::SeqCst);
        // Still connected: every request sent is answered, then DISC.
        let mut s = c.s;
        s.write_all(&RawClient::request_bytes(proto::CMD_DISC, 0, 0, 0, 0))
            .unwrap();
        let replies = reader.join().unwrap();
        assert_eq!(replies, sent, "the server dropped an abusive writer");
        written += sent;
    }
    (written, slowest)
}

#[test]
fn big_writes_at_depth_are_back_pressured_not_killed() {
    // Each 64 MiB write is charged 66 MiB: one fits a connection's 128 MiB
    // at a time, two fit the total, the third client waits.
    let total = 160 * MIB;
    let d = Daemon::start(&[
        "--max-request-size",
        "64M",
        "--conn-buffer",
        "128M",
        "--total-buffer",
        "160M",
    ]);
    d.fill();
    // A first round brings every cache page the workload touches into
    // memory, so the measured round sees only what the server buffers.
    abuse_with_big_writes(&d, 1);
    let baseline = settled_rss(d.pid());
    let rss = RssSampler::start(d.pid());
    let (written, slowest) = abuse_with_big_writes(&d, 5);
    let peak = rss.finish();
    eprintln!(
        "64 MiB writes at depth 1000 from 3 clients for 5 s: {written} written; \
         another client's 4 KiB round trip took at most {slowest:?}"
    );
    assert!(written >= 2, "the abusive clients made no progress");
    assert!(slowest < Duration::from_secs(5), "other clients starved");
    report("64 MiB writes at depth 1000", baseline, peak, total);
}

#[test]
fn slow_readers_are_bounded_and_do_not_block_others() {
    let (conn_cap, total) = (16 * MIB, 64 * MIB);
    let d = Daemon::start(&[
        "--conn-buffer",
        "16M",
        "--total-buffer",
        "64M",
        "--max-request-size",
        "1M",
        "--stall-timeout",
        "3",
    ]);
    d.fill();
    let baseline = settled_rss(d.pid());
    let rss = RssSampler::start(d.pid());
    // Three clients ask for 200 MiB each and never read a reply.
    let mut slow = Vec::new();
    for _ in 0..3 {
        let mut c = d.client();
        let mut batch = Vec::new();
        for i in 0..200u64 {
            let off = i * MIB % (VOLUME_BYTES - 16 * MIB);
            batch.extend(RawClient::request_bytes(
                proto::CMD_READ,
                0,
                i,
                off,
                MIB as u32,
            ));
        }
        c.s.write_all(&batch).unwrap();
        slow.push(c);
    }
    let started = Instant::now();
    let mut good = d.client();
    let mut slowest = Duration::ZERO;
    for n in 0..50 {
        slowest = slowest.max(round_trip(&mut good, n));
    }
    std::thread::sleep(Duration::from_secs(1));
    let peak = rss.finish();
    eprintln!("3 clients not reading 200 MiB of replies each: another client's 4 KiB round trip took at most {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "a slow reader held up another client"
    );
    eprintln!(
        "(3 slow readers may hold {} MiB at most)",
        3 * conn_cap / MIB
    );
    report("slow readers", baseline, peak, total);
    // After the stall timeout the server closes them: what is left in the
    // socket buffers drains, then EOF. (Reading earlier would be progress.)
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
    for mut c in slow {
        c.s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0usize;
        loop {
            match c.s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("slow reader not closed after the stall timeout: {e}"),
            }
        }
        assert!(
            (got as u64) < 200 * MIB,
            "the server sent all {got} bytes: it never gave up"
        );
    }
    assert!(started.elapsed() >= Duration::from_secs(3));
    // The daemon is fine afterwards.
    round_trip(&mut good, 99);
}

/// Connects and reads the greeting, then sends nothing.
fn idle(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s
}

/// Waits for the server to close `s`; returns how long it took.
fn closed_within(s: &mut impl Read, limit: Duration) -> Duration {
    let t = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return t.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return t.elapsed(),
            Err(e) => panic!("not closed within {limit:?}: {e}"),
        }
    }
}

#[test]
fn idle_handshakes_time_out_and_connections_are_capped() {
    let scratch = tempfile::tempdir().unwrap();
    let keys = tls::psk_file(&scratch.path().join("psk"), "alice", 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let keys_arg = keys.to_str().unwrap().to_string();
    let d = Daemon::start(&[
        "--max-handshakes",
        "7",
        "--handshake-timeout",
        "2",
        "--tcp",
        &addr,
        "--tls-psk",
        &keys_arg,
    ]);
    let baseline = rss_bytes(d.pid());
    let rss = RssSampler::start(d.pid());
    let t0 = Instant::now();
    // Seven idle plaintext handshakes (every handshake slot of the Unix
    // socket) and one on TCP that stops inside TLS negotiation (STARTTLS
    // acknowledged, then silence).
    let mut idle_conns: Vec<UnixStream> = (0..7).map(|_| idle(&d.sock)).collect();
    let mut tls_idle = std::net::TcpStream::connect(&addr).unwrap();
    let mut hello = [0u8; 18];
    tls_idle.read_exact(&mut hello).unwrap();
    tls_idle.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = proto::IHAVEOPT.to_be_bytes().to_vec();
    opt.extend_from_slice(&proto::OPT_STARTTLS.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    tls_idle.write_all(&opt).unwrap();
    let mut ack = [0u8; 20];
    tls_idle.read_exact(&mut ack).unwrap();
    assert_eq!(
        u32::from_be_bytes(ack[12..16].try_into().unwrap()),
        proto::REP_ACK
    );
    // The Unix socket's cap is reached: more connections are closed
    // without a greeting.
    for _ in 0..100 {
        let mut s = UnixStream::connect(&d.sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(
            s.read(&mut b).unwrap_or(0),
            0,
            "a connection beyond the cap was served"
        );
    }
    // Every idle handshake is closed at the timeout.
    tls_idle
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    closed_within(&mut tls_idle, Duration::from_secs(10));
    for s in &mut idle_conns {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        closed_within(s, Duration::from_secs(10));
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(8),
        "idle handshakes closed after {waited:?}, the timeout is 2 s"
    );
    // Slots are free again.
    let mut c = d.client();
    round_trip(&mut c, 1);
    let peak = rss.finish();
    report(
        "idle handshakes and refused connections",
        baseline,
        peak,
        8 * MIB,
    );
}

// ---------------------------------------------------------------------------
// Issue 32: CACHE of any length, handshake floods, clients that trickle,
// block status over huge ranges; each mounted by a real client against the
// daemon.
// ---------------------------------------------------------------------------

const PYTHON: &str = "/usr/bin/python3";
const GIB: u64 = 1 << 30;

/// Runs a libnbd client (Debian's Python binding) with `args`; returns its
/// stdout, trimmed.
fn libnbd(script: &str, args: &[String]) -> String {
    let probe = Command::new(PYTHON).args(["-c", "import nbd"]).output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "{PYTHON} cannot import nbd: install the Debian packages python3 and python3-libnbd \
         (scripts/test.sh does)"
    );
    let out = Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "libnbd client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs nbdinfo on `uri`: (succeeded, how long it took, stderr).
fn nbdinfo(uri: &str) -> (bool, Duration, String) {
    let t = Instant::now();
    let out = Command::new("nbdinfo")
        .arg(uri)
        .stdin(Stdio::null())
        .output()
        .expect("nbdinfo is missing: install the Debian package libnbd-bin (scripts/test.sh does)");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), t.elapsed(), err)
}

/// Resets the daemon's peak RSS (VmHWM) to its RSS now (clear_refs 5,
/// Linux 4.0), so the peak read afterwards is the workload's.
fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .expect("reset VmHWM through /proc/PID/clear_refs (Linux 4.0, the daemon's owner)");
}

/// A loopback TCP address nothing listens on yet.
fn free_tcp_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

/// Sends N CACHE requests of SIZE bytes at SIZE apart, all at once, then
/// waits for them; prints "completed failed seconds first-error".
const PIPELINED_CACHE: &str = r#"
import sys, time, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
n, size = int(sys.argv[2]), int(sys.argv[3])
t0 = time.monotonic()
cookies = [h.aio_cache(size, i * size) for i in range(n)]
pending, failed = set(cookies), []
while pending:
    if time.monotonic() - t0 > 60:
        sys.exit("%d CACHE requests still pending after 60 s" % len(pending))
    h.poll(1000)
    for c in list(pending):
        try:
            if h.aio_command_completed(c):
                pending.discard(c)
        except nbd.Error as e:
            failed.append(str(e))
            pending.discard(c)
h.shutdown()
print(n - len(failed), len(failed), "%.2f" % (time.monotonic() - t0), failed[:1])
"#;

#[test]
fn pipelined_gigabyte_cache_requests_stay_within_the_buffers() {
    // Before, each CACHE read its whole range into one buffer, charged
    // nothing: two of 1 GiB took the daemon to 4.2 GB.
    let total = 32 * MIB;
    // A cache file of 1 GiB, so the prefetches go through their ranges (in
    // pieces) until admission keeps the rest out, and the daemon's RSS does
    // not hold the cache's contents.
    let setup = daemon::Setup::with_sizes(16 * GIB, GIB, &["--mode", "writethrough"]);
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["serve", "--total-buffer", "32M", "--conn-buffer", "32M"])
            .args(["--max-request-size", "1M", "--io-threads", "4"])
            .env("TIERCACHE_STATE_DIR", setup.state())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&setup.nbd_socket());
    let pid = child.id();
    reset_peak_rss(pid);
    let baseline = rss_bytes(pid);
    let out = libnbd(
        PIPELINED_CACHE,
        &[setup.uri(), "16".into(), GIB.to_string()],
    );
    let peak = status_bytes(pid, "VmHWM:").expect("VmHWM of the running daemon");
    let cached = setup.status()["cache_blocks_used"].as_u64().unwrap();
    eprintln!(
        "16 pipelined 1 GiB CACHE requests (completed, failed, seconds): {out}; \
         {cached} blocks of 4 KiB cached"
    );
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields[..2], ["16", "0"], "not every CACHE succeeded: {out}");
    assert!(
        cached >= GIB / 4096 / 2,
        "the prefetches cached {cached} blocks"
    );
    assert!(child.try_wait().unwrap().is_none(), "the daemon exited");
    // The margin: the metadata of the blocks cached, threads, allocator.
    report(
        "16 pipelined 1 GiB CACHE requests (VmHWM)",
        baseline,
        peak,
        total + 32 * MIB,
    );
    let mut c = RawClient::connect(&setup.nbd_socket());
    c.handshake(false);
    round_trip(&mut c, 1);
}

/// A plaintext TCP client through NBD_OPT_GO (no structured replies).
fn tcp_client(addr: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut go = proto::IHAVEOPT.to_be_bytes().to_vec();
    go.extend_from_slice(&proto::OPT_GO.to_be_bytes());
    go.extend_from_slice(&6u32.to_be_bytes());
    go.extend_from_slice(&[0u8; 6]);
    s.write_all(&go).unwrap();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let reply = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut data).unwrap();
        match reply {
            proto::REP_ACK => return s,
            proto::REP_INFO => {}
            other => panic!("NBD_OPT_GO over TCP: reply {other:#x}"),
        }
    }
}

/// A 4 KiB read on a client without structured replies: the data.
fn read_4k(s: &mut std::net::TcpStream, cookie: u64) -> Vec<u8> {
    let req = RawClient::request_bytes(proto::CMD_READ, 0, cookie, cookie % 1000 * 4096, 4096);
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0);
    let mut data = vec![0u8; 4096];
    s.read_exact(&mut data).unwrap();
    data
}

#[test]
fn a_tcp_handshake_flood_holds_no_slot_a_served_client_needs() {
    let addr = free_tcp_addr();
    let timeout = Duration::from_secs(3);
    let d = Daemon::start(&[
        "--tcp",
        &addr,
        "--max-handshakes",
        "64",
        "--max-connections",
        "2",
        "--handshake-timeout",
        "3",
    ]);
    // A TCP client in transmission before the flood: one of 2 TCP slots.
    let mut served = tcp_client(&addr);
    // 64 connections that never start a handshake: each read its
    // greeting, so each holds one of the 64 TCP handshake slots.
    let flood_start = Instant::now();
    let mut idle: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.read_exact(&mut [0u8; 18]).unwrap();
            s
        })
        .collect();
    // The served client goes on; the Unix socket has slots of its own.
    read_4k(&mut served, 1);
    let (ok, took, err) = nbdinfo(&d.uri());
    assert!(
        ok,
        "nbdinfo on the Unix socket failed during the flood: {err}"
    );
    assert!(
        took < Duration::from_secs(2),
        "nbdinfo on the Unix socket took {took:?}"
    );
    // A 65th TCP client is refused at once, not left hanging...
    let tcp_uri = format!("nbd://{addr}/");
    let (ok, took, _) = nbdinfo(&tcp_uri);
    assert!(
        !ok,
        "a TCP client was served with every handshake slot held"
    );
    assert!(took < Duration::from_secs(2), "refusing took {took:?}");
    // ...and served once the idle handshakes reach the handshake timeout
    // (it takes the second TCP transmission slot).
    let served_after = loop {
        let (ok, _, err) = nbdinfo(&tcp_uri);
        if ok {
            break flood_start.elapsed();
        }
        assert!(
            flood_start.elapsed() < timeout + Duration::from_secs(5),
            "the 65th TCP client was still refused {:?} after the flood: {err}",
            flood_start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "64 idle TCP handshakes: the Unix socket served at once; a 65th TCP client \
         served {served_after:?} after the flood began (handshake timeout {timeout:?})"
    );
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        closed_within(s, Duration::from_secs(10));
    }
    read_4k(&mut served, 2);
}

#[test]
fn trickled_write_payloads_are_cut_off_and_do_not_hold_up_reads() {
    // 8 writes of 4 MiB, each charged 4.125 MiB, need more than the 32 MiB
    // total: trickled a byte at a time they held it all (the stall timer
    // restarts on each byte) and reads queued behind them.
    let transfer = Duration::from_secs(2);
    let mut d = Daemon::start(&[
        "--max-request-size",
        "4M",
        "--conn-buffer",
        "8M",
        "--total-buffer",
        "32M",
        "--transfer-timeout",
        "2",
    ]);
    let started = Instant::now();
    let tricklers: Vec<_> = (0..8u64)
        .map(|i| {
            let c = d.client();
            std::thread::spawn(move || trickle(c, i * 4 * MIB, 4 * MIB as u32))
        })
        .collect();
    let mut good = d.client();
    let (mut slowest, mut n) = (Duration::ZERO, 0u64);
    while !tricklers.iter().all(|t| t.is_finished()) {
        let t = Instant::now();
        let (e, _) = good.read(n, VOLUME_BYTES - 16 * MIB + n % 1000 * 4096, 4096);
        assert_eq!(e, 0);
        slowest = slowest.max(t.elapsed());
        n += 1;
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "tricklers not cut off"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let lived: Vec<Duration> = tricklers.into_iter().map(|t| t.join().unwrap()).collect();
    eprintln!(
        "8 trickled 4 MiB writes: cut off after {lived:?}; {n} reads meanwhile, the slowest \
         {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "a 4 KiB read took {slowest:?} beside the tricklers"
    );
    for l in &lived {
        // Cut by the deadline (2 s from the first payload byte read; some
        // waited for their share first), long before the 60 s stall timeout.
        assert!(
            *l >= transfer - Duration::from_millis(100),
            "cut off after {l:?}"
        );
        assert!(*l < Duration::from_secs(20), "cut off only after {l:?}");
    }
    d.assert_running();
    round_trip(&mut good, 1);
}

/// Sends a WRITE header for `len` bytes, then its payload a byte per
/// 100 ms until the server closes the connection; returns how long that
/// took.
fn trickle(mut c: RawClient, offset: u64, len: u32) -> Duration {
    c.s.write_all(&RawClient::request_bytes(
        proto::CMD_WRITE,
        0,
        1,
        offset,
        len,
    ))
    .unwrap();
    let t = Instant::now();
    c.s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 64];
    loop {
        if c.s.write_all(&[0x77]).is_err() {
            return t.elapsed();
        }
        match c.s.read(&mut buf) {
            Ok(0) => return t.elapsed(),
            Ok(_) => panic!("a reply to a write whose payload is not all sent"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return t.elapsed(),
        }
        assert!(t.elapsed() < Duration::from_secs(40), "never cut off");
    }
}

/// One BLOCK_STATUS of COUNT bytes from 0 with both contexts; prints the
/// tiercache:cache extents (count, bytes covered), the base:allocation
/// extent count, the seconds it took, then the first 8 cache extents.
const BLOCK_STATUS: &str = r#"
import sys, time, nbd
h = nbd.NBD()
h.add_meta_context("tiercache:cache")
h.add_meta_context("base:allocation")
h.connect_uri(sys.argv[1])
got = {}
def extent(ctx, offset, entries, err):
    got[ctx] = list(entries)
    return 0
t0 = time.monotonic()
h.block_status(int(sys.argv[2]), 0, extent)
took = time.monotonic() - t0
c, b = got["tiercache:cache"], got["base:allocation"]
print(len(c) // 2, sum(c[0::2]), len(b) // 2, "%.3f" % took, *c[:16])
h.shutdown()
"#;

#[test]
fn block_status_of_a_huge_range_is_bounded() {
    let d = Daemon::start_on(
        "ram:4G",
        "64M",
        &[
            "--mode",
            "writeback",
            "--allow-data-loss",
            "--block-size",
            "64K",
        ],
    );
    // Every other sector of 48 blocks of 64 KiB: 6,144 extents, one per
    // sector (dirty, then not cached).
    let mut c = d.client();
    let sector = [0x3cu8; 512];
    let mut batch = Vec::new();
    let writes = 48 * 64;
    for i in 0..writes {
        let off = i * 1024;
        batch.extend(RawClient::request_bytes(proto::CMD_WRITE, 0, i, off, 512));
        batch.extend_from_slice(&sector);
    }
    // Sent from another thread while this one reads the replies, so
    // neither side's socket buffer fills up.
    let mut w = c.s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&batch).unwrap());
    for _ in 0..writes {
        assert_eq!(c.read_simple_reply().1, 0);
    }
    sender.join().unwrap();
    let count = 4 * GIB - 64 * 1024;
    let out = libnbd(BLOCK_STATUS, &[d.uri(), count.to_string()]);
    eprintln!("BLOCK_STATUS of {count} bytes over 6,144 extents (cache extents, bytes, allocation extents, seconds, first ones): {out}");
    let fields: Vec<&str> = out.split_whitespace().collect();
    let f: Vec<u64> = fields.iter().map(|v| v.parse().unwrap_or(0)).collect();
    let (extents, covered, alloc) = (f[0], f[1], f[2]);
    assert!(
        (1000..=1024).contains(&extents),
        "{extents} extents in one reply (at most 1,024, and there were plenty)"
    );
    assert!(
        covered < count && covered >= extents * 512,
        "{covered} bytes covered"
    );
    assert_eq!(alloc, 1, "base:allocation: all allocated data, one extent");
    let seconds: f64 = fields[3].parse().unwrap();
    assert!(seconds < 1.0, "block status took {seconds} s");
    // Alternating sectors: dirty and cached (3), not cached (0).
    assert_eq!(
        f[4..],
        [512, 3, 512, 0, 512, 3, 512, 0, 512, 3, 512, 0, 512, 3, 512, 0]
    );
}
