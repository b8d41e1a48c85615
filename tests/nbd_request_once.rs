//! Each client request is resolved and counted once, seen through a real
//! NBD client (libnbd's Python binding, one request at a time) against the
//! in-process server over the cache engine. The server tries a request on
//! its fast path first and hands it to the blocking path when the fast path
//! cannot finish it; before issue 21 both paths resolved the request, so
//! admission's stream table, the bypass counters and the replacement policy
//! saw such a request twice. Each test fails on that code:
//!
//! - a sequential read past the cutoff: the stream table was fed twice at
//!   the same offset and the sequential counter counted each request twice;
//! - the guard: its counter counted each read miss and each write twice;
//! - a partial hit: the policy was told of the cached block twice.

mod common;
#[path = "common/nbd.rs"]
mod nbd;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use nbd::TestServer;
use tiercache::device::fault::FaultDevice;
use tiercache::device::latency::LatencyDevice;
use tiercache::device::ram::RamDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::stats::StatsSnapshot;
use tiercache::engine::{AdmissionSettings, CreateOptions, Engine, Mode};

const PYTHON: &str = "/usr/bin/python3";
const BS: u64 = 4096;

/// Runs the requests on stdin, one per line and one at a time, through
/// libnbd: `r OFFSET LEN` reads, `w OFFSET LEN` writes bytes of 0x5a.
const CLIENT: &str = r#"
import sys
import nbd

h = nbd.NBD()
h.connect_uri(sys.argv[1])
n = 0
for line in sys.stdin:
    op, off, length = line.split()
    off, length = int(off), int(length)
    if op == "r":
        h.pread(length, off)
    else:
        h.pwrite(b"\x5a" * length, off)
    n += 1
h.shutdown()
print(n)
"#;

/// Sends `requests` (as `CLIENT` reads them) to the server through libnbd.
fn run_client(server: &TestServer, requests: &[(char, u64, u64)]) {
    assert!(
        Path::new(PYTHON).is_file(),
        "{PYTHON} not found: install the Debian package python3"
    );
    let input: String = requests
        .iter()
        .map(|(op, off, len)| format!("{op} {off} {len}\n"))
        .collect();
    let mut child = Command::new(PYTHON)
        .args(["-c", CLIENT, &server.uri()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "libnbd client failed (the Debian package python3-libnbd provides it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        requests.len().to_string()
    );
}

fn engine(cache: DeviceRef, origin_bytes: u64, admission: AdmissionSettings) -> Arc<Engine> {
    let origin = Arc::new(RamDevice::new("origin", origin_bytes));
    let opts = CreateOptions {
        mode: Mode::Writeback,
        admission,
        ..Default::default()
    };
    Engine::create(cache, origin, &opts).expect("create")
}

fn stats(e: &Engine) -> StatsSnapshot {
    e.status().stats
}

#[test]
fn a_sequential_read_past_the_cutoff_is_counted_once_per_request() {
    let cache = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(4096, 4096),
        1,
    ));
    // Selective from the first cached block on; every miss promotes.
    let e = engine(
        cache,
        128 << 20,
        AdmissionSettings {
            sequential_cutoff_bytes: 4 << 20,
            promote_after: 1,
            selective_above_pct: 0,
            guard: false,
        },
    );
    let server = TestServer::start_engine(e.clone(), TestServer::test_config());
    // 64 MiB in 512 reads of 128 KiB, each where the last ended.
    let req = 128 << 10;
    let reads: Vec<_> = (0..512u64).map(|k| ('r', k * req, req)).collect();
    run_client(&server, &reads);
    let st = stats(&e);
    assert_eq!(st.read_requests, 512, "{st:?}");
    // The stream passes 4 MiB after 32 requests: the other 480 go around.
    assert_eq!(st.sequential_bypasses, 480, "{st:?}");
    let per_req = req / BS;
    assert_eq!(st.promotions, 32 * per_req, "{st:?}");
    assert_eq!(st.bypassed_ios, 480 * per_req, "{st:?}");
    assert_eq!(e.status().cache_blocks_used, 32 * per_req);
    drop(server);
    e.close().unwrap();
}

#[test]
fn the_guard_counts_each_request_once() {
    // A cache device 3 ms a request over a RAM origin: the guard engages.
    let slow: DeviceRef = Arc::new(LatencyDevice::new(
        Arc::new(FaultDevice::new(
            "cache",
            common::cache_bytes_for(4096, 4096),
            1,
        )),
        Duration::from_millis(3),
    ));
    let e = engine(
        slow,
        256 << 20,
        AdmissionSettings {
            sequential_cutoff_bytes: 0,
            ..Default::default()
        },
    );
    common::engage_guard(&e, BS, Duration::from_secs(60));
    let server = TestServer::start_engine(e.clone(), TestServer::test_config());
    let before = stats(&e);
    // 200 writes and 100 reads of blocks never written, one at a time.
    let mut requests: Vec<_> = (0..200u64)
        .map(|k| ('w', (20_000 + k * 7) * BS, BS))
        .collect();
    requests.extend((0..100u64).map(|k| ('r', (40_000 + k * 7) * BS, BS)));
    run_client(&server, &requests);
    let st = stats(&e);
    assert!(e.status().guard_engaged, "the guard stayed engaged");
    assert_eq!(st.write_requests - before.write_requests, 200);
    assert_eq!(st.read_requests - before.read_requests, 100);
    // Every request asks the guard once; while engaged it lets one in 16
    // through to keep measuring (at most 19 of 300).
    let guarded = st.guard_bypasses - before.guard_bypasses;
    assert!(
        (300 - 19..=300).contains(&guarded),
        "{guarded} guard bypasses for 300 requests"
    );
    // Each guarded request went around the cache, one block each.
    assert_eq!(st.bypassed_ios - before.bypassed_ios, guarded);
    drop(server);
    e.close().unwrap();
}

#[test]
fn a_partial_hit_tells_the_policy_once() {
    let cache = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(4096, 4096),
        1,
    ));
    let e = engine(
        cache,
        64 << 20,
        AdmissionSettings {
            sequential_cutoff_bytes: 0,
            promote_after: 1,
            guard: false,
            ..Default::default()
        },
    );
    let server = TestServer::start_engine(e.clone(), TestServer::test_config());
    let blocks: Vec<u64> = (0..50u64).map(|k| 100 + k * 10).collect();
    // A miss (promoted: nothing to tell the policy), then a read of that
    // block and the next, which is not cached: a partial hit, which the
    // fast path cannot finish and hands on.
    let mut requests: Vec<_> = blocks.iter().map(|&b| ('r', b * BS, BS)).collect();
    requests.extend(blocks.iter().map(|&b| ('r', b * BS, 2 * BS)));
    run_client(&server, &requests);
    let st = stats(&e);
    assert_eq!(st.read_requests, 100, "{st:?}");
    assert_eq!(st.policy_accesses, 50, "one per partial hit: {st:?}");
    assert_eq!(st.promotions, 100, "{st:?}");
    // Both blocks cached now: whole hits on the fast path, two each.
    let hits: Vec<_> = blocks.iter().map(|&b| ('r', b * BS, 2 * BS)).collect();
    run_client(&server, &hits);
    let st = stats(&e);
    assert_eq!(st.read_requests, 150, "{st:?}");
    assert_eq!(st.policy_accesses, 150, "{st:?}");
    drop(server);
    e.close().unwrap();
}
