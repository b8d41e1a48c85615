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
//!   `--handshake-timeout`; connections beyond `--max-connections` are
//!   closed at once.
//!
//! The volume is a RAM origin with a RAM cache, written once in full before
//! the baseline is taken, so the daemon's RSS moves only with what it
//! buffers for clients.

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
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("tc0.nbd");
        let child = Command::new(BIN)
            .args(["serve", "--name", "tc0", "--origin"])
            .arg(format!("ram:{}M", VOLUME_BYTES / MIB))
            .args(["--ram-cache", "32M", "--io-threads", "4"])
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
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
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
        "--max-connections",
        "8",
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
    // Seven idle plaintext handshakes and one that stops inside TLS
    // negotiation (STARTTLS acknowledged, then silence).
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
    // The cap is reached: more connections are closed without a greeting.
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
