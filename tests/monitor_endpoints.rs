//! The monitoring endpoints and commands against the real binary:
//! `serve --metrics/--http` under a storm of scrapes while fio runs (no I/O
//! error, bounded memory, every scrape answered, the server's bounds
//! holding), `warm` (offline and through the daemon, admission forced),
//! `top --count`, and a cache set member returning garbage: failed, and
//! shown in `status` (text and JSON) and the metrics.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/web.rs"]
mod web;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use daemon::{fio_json, need, sigterm, Setup};
use web::{free_port, get, wait_http};

fn vm_rss_bytes(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

/// A metric's value for the sample whose name and labels start with `prefix`.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_scrape_storm_during_fio_answers_everything_without_io_errors() {
    need("fio", "fio");
    let s = Setup::with_sizes(64 << 20, 16 << 20, &["--mode", "writeback"]);
    let metrics = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let mut serve = s.serve_with(&["--metrics", &metrics, "--http", &http]);
    wait_http(&metrics, "/metrics");
    wait_http(&http, "/api/snapshot");

    let fio = Command::new("fio")
        .args([
            "--name=storm",
            "--ioengine=nbd",
            "--rw=randrw",
            "--bs=4k",
            "--size=32M",
            "--iodepth=8",
            "--runtime=8",
            "--time_based",
            "--output-format=json",
        ])
        .arg(format!("--uri={}", s.uri()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let rss_before = vm_rss_bytes(serve.id());

    // 100 scrapers at once, three rounds of both endpoints each.
    let t = Instant::now();
    let scrapers: Vec<_> = (0..100)
        .map(|i| {
            let (m, h) = (metrics.clone(), http.clone());
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let (code, body) = if i % 2 == 0 {
                        get(&m, "/metrics").unwrap()
                    } else {
                        get(&h, "/api/snapshot").unwrap()
                    };
                    assert_eq!(code, 200, "{body:.200}");
                    assert!(
                        body.contains("tiercache_read_hits_total") || body.contains("\"heat\"")
                    );
                }
            })
        })
        .collect();
    for t in scrapers {
        t.join().expect("a scraper failed");
    }
    let storm = t.elapsed();
    let rss_after = vm_rss_bytes(serve.id());
    eprintln!(
        "300 scrapes by 100 clients in {:.2} s; daemon VmRSS {} -> {} MiB",
        storm.as_secs_f64(),
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(
        rss_after < rss_before + (64 << 20),
        "RSS grew by {} MiB in the storm",
        (rss_after - rss_before) >> 20
    );

    // Bounds: an oversized request head is refused; 40 clients that send
    // nothing hold at most 32 connections until the read timeout, and a
    // scrape behind them is still answered.
    let mut big = TcpStream::connect(&metrics).unwrap();
    let _ = big.write_all(format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000)).as_bytes());
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.80}");
    let idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&metrics).unwrap())
        .collect();
    let t = Instant::now();
    let (code, _) = get(&metrics, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    drop(idle);
    let (code, _) = get(&metrics, "/api/snapshot").unwrap();
    assert_eq!(code, 404, "the metrics listener serves only /metrics");

    let out = fio.wait_with_output().unwrap();
    assert!(out.status.success(), "fio failed");
    let j = fio_json(&out.stdout);
    assert_eq!(j["jobs"][0]["error"], 0, "fio saw an I/O error");
    assert!(j["jobs"][0]["read"]["io_bytes"].as_u64().unwrap() > 0);

    // The metrics count what fio did.
    let (_, text) = get(&metrics, "/metrics").unwrap();
    for name in [
        "tiercache_read_requests_total{cache=\"tc0\"}",
        "tiercache_request_duration_seconds_count{cache=\"tc0\",op=\"read\",result=\"cache\"}",
        "tiercache_device_duration_seconds_count{cache=\"tc0\",device=\"cache\",op=\"write\"}",
        "tiercache_mrc_hit_ratio{cache=\"tc0\",size_ratio=\"1\"}",
    ] {
        let v = metric(&text, name).unwrap_or_else(|| panic!("no {name}"));
        assert!(v > 0.0, "{name} = {v}");
    }
    assert!(text.ends_with("# EOF\n"));
    sigterm(&mut serve);
}

fn status_counter(s: &Setup, name: &str) -> u64 {
    s.status()["stats"][name].as_u64().unwrap()
}

/// Reads `len` bytes at `offset` through the daemon with fio.
fn fio_read(s: &Setup, offset: u64, len: u64) {
    let out = Command::new("fio")
        .args([
            "--name=read",
            "--ioengine=nbd",
            "--rw=read",
            "--bs=64k",
            &format!("--offset={offset}"),
            &format!("--size={len}"),
        ])
        .arg(format!("--uri={}", s.uri()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn warm_promotes_a_range_offline_and_through_the_daemon() {
    need("fio", "fio");
    let s = Setup::with_sizes(64 << 20, 32 << 20, &["--mode", "writethrough"]);
    // Admission that would keep every read miss out: selective from 0%
    // occupancy, promotion after 15 misses.
    s.cli(&[
        "set-admission",
        "--selective-above",
        "0",
        "--promote-after",
        "15",
    ]);
    // Offline: no daemon holds the cache.
    let out = s.cli(&["warm", "--offset", "8M", "--length", "4M"]);
    assert!(out.contains("1024 blocks"), "{out}");
    let mut serve = s.serve();
    let before = status_counter(&s, "origin_reads");
    fio_read(&s, 8 << 20, 4 << 20);
    assert_eq!(
        status_counter(&s, "origin_reads"),
        before,
        "reads of the range warmed offline went to the origin"
    );
    // A range not warmed misses, and admission keeps it out.
    fio_read(&s, 20 << 20, 1 << 20);
    assert!(status_counter(&s, "origin_reads") > before);
    assert_eq!(status_counter(&s, "promotions"), 0);

    // Through the daemon.
    let out = s.cli(&["warm", "--offset", "20M", "--length", "2M"]);
    assert!(out.contains("512 blocks"), "{out}");
    let before = status_counter(&s, "origin_reads");
    fio_read(&s, 20 << 20, 2 << 20);
    assert_eq!(status_counter(&s, "origin_reads"), before);

    let e = s.cli_output(&["warm", "--offset", "100M"]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("past the end"));
    let e = s.cli_output(&["warm", "--offset", "1000"]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("multiples of 512"));

    // top: screens one after another when stdout is not a terminal.
    let out = s.cli(&["top", "--count", "2", "--interval", "0.2"]);
    assert_eq!(out.matches("tiercache top: 'tc0'").count(), 2, "{out}");
    assert!(
        out.contains("read_hits") && out.contains("per second"),
        "{out}"
    );
    // top --json: a line of JSON per sample, rates from the second on.
    let out = s.cli(&["top", "--json", "--count", "2", "--interval", "0.2"]);
    let samples: Vec<serde_json::Value> = (out.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(samples.len(), 2, "{out}");
    assert_eq!(samples[0]["schema_version"], 1);
    assert_eq!(samples[0]["name"], "tc0");
    assert!(samples[0]["counters"]["read_hits"]["per_second"].is_null());
    assert!(
        samples[1]["counters"]["read_hits"]["total"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(samples[1]["counters"]["read_hits"]["per_second"].is_f64());
    assert!(samples[1]["interval_secs"].as_f64().unwrap() >= 0.2);
    sigterm(&mut serve);
}

/// fio through the daemon with crc32c verification; `args` say what.
fn fio_verify(s: &Setup, args: &[&str]) {
    let out = Command::new("fio")
        .args([
            "--name=verify",
            "--ioengine=nbd",
            "--bs=64k",
            "--size=4M",
            "--verify=crc32c",
            "--verify_fatal=1",
        ])
        .arg(format!("--uri={}", s.uri()))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `serve` again after a kill -9 (no `--degraded`: what systemd restarts),
/// with its log kept for the failure message.
fn restart(s: &Setup, log: &std::path::Path) -> daemon::KillOnDrop {
    let child = Command::new(daemon::BIN)
        .arg("serve")
        .env("TIERCACHE_STATE_DIR", s.state())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut child = daemon::KillOnDrop(child);
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(s.nbd_socket()).is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "the restarted daemon exited ({st}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no restart");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `status` (JSON and text) and the metrics say member 1 (`second`) was
/// failed for its checksum errors, with the counts, and the set degraded.
fn member_1_failed_and_shown(s: &Setup, metrics: &str, second: &str) {
    let st = s.status();
    let m = &st["cache_members"][1];
    assert_eq!(st["cache_set_state"], "degraded", "{st}");
    assert_eq!(m["state"], "failed", "{m}");
    assert!(m["bad_blocks"].as_u64().unwrap() >= 10, "{m}");
    assert!(m["checksum_errors_recent"].as_u64().unwrap() >= 10, "{m}");
    let why = m["failure"].as_str().unwrap_or_default();
    assert!(why.contains("checksum errors within 600 s"), "{m}");
    let text = s.cli(&["status"]);
    let row = text
        .lines()
        .find(|l| l.contains("member") && l.contains(second))
        .unwrap_or_else(|| panic!("no row for member 1: {text}"));
    for want in [
        "failed",
        "checksum errors",
        "in the last 10 min",
        "failed: ",
    ] {
        assert!(row.contains(want), "no `{want}` in: {row}");
    }
    assert!(text.contains("DEGRADED"), "{text}");
    eprintln!("status after member 1 returned garbage:\n{text}");
    let (_, m) = get(metrics, "/metrics").unwrap();
    let labels = format!("{{cache=\"tc0\",member=\"1\",device=\"{second}\"}}");
    assert_eq!(
        metric(&m, &format!("tiercache_cache_member_failed{labels}")),
        Some(1.0)
    );
    for name in ["damaged_blocks", "checksum_errors_recent"] {
        let v = metric(&m, &format!("tiercache_cache_member_{name}{labels}"));
        assert!(v.is_some_and(|v| v >= 10.0), "{name}: {v:?}");
    }
}

/// A cache set member whose whole device is overwritten with random bytes
/// (seeded) under the daemon: fio's verify reads pass (the set serves the
/// other copy), the member is failed past 10 checksum errors, and `status`
/// (text and JSON) and the metrics say so, with the counts. The daemon
/// killed with -9 then comes back by itself (member 0's label names member
/// 1 failed; member 1's label is garbage too), and fio verifies again.
#[test]
fn a_cache_set_member_returning_garbage_is_failed_and_shown() {
    need("fio", "fio");
    let extra = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let second = extra.path().join("cache2.img");
    std::fs::File::create(&second)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let second = second.to_str().unwrap();
    let s = Setup::with_sizes(
        64 << 20,
        16 << 20,
        &[
            "--mode",
            "writeback",
            "--cache",
            second,
            "--writeback-idle",
            "0",
        ],
    );
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut serve = s.serve_with(&["--metrics", &metrics]);
    wait_http(&metrics, "/metrics");
    fio_verify(&s, &["--rw=write", "--do_verify=0"]);
    // Member 1's device, label included: random bytes, written in place
    // (no truncation: the daemon's reads never see a short file).
    let mut junk = vec![0u8; 16 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in junk.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(second)
        .unwrap();
    f.write_all(&junk).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fio_verify(&s, &["--rw=read", "--verify_only"]);

    member_1_failed_and_shown(&s, &metrics, second);

    serve.kill().unwrap();
    serve.wait().unwrap();
    let mut serve = restart(&s, &extra.path().join("serve.log"));
    let st = s.status();
    let m = &st["cache_members"][1];
    assert_eq!(st["cache_set_state"], "degraded", "{st}");
    let why = m["failure"].as_str().unwrap_or_default();
    assert!(why.contains("named failed by the label of member 0"), "{m}");
    fio_verify(&s, &["--rw=read", "--verify_only"]);
    sigterm(&mut serve);
}
