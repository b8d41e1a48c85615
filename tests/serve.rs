//! `tiercache serve` end to end, through the real engine, with real clients:
//! fio verify in every cache mode; status/set-mode over the control socket;
//! SIGTERM shuts down clean; kill -9 under a write load loses nothing that
//! was flushed.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use std::process::Command;
use std::time::{Duration, Instant};

use daemon::{need, sigterm, stop_with, Setup, BIN};

use tiercache::device::nbd::NbdDevice;
use tiercache::device::BlockDevice;

#[test]
fn fio_verify_in_every_mode() {
    need("fio", "fio");
    for mode in [
        "writeback",
        "writethrough",
        "writearound",
        "writeonly",
        "passthrough",
    ] {
        let s = Setup::new(mode);
        let mut server = s.serve();
        let out = Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri()),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=32",
                "--numjobs=3",
                "--size=6M",
                "--offset_increment=8M",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--output-format=json",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "fio failed in {mode}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json_start = stdout.find('{').expect("fio JSON");
        let v: serde_json::Value = serde_json::from_str(&stdout[json_start..]).expect("fio JSON");
        for job in v["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "fio job error in {mode}");
        }
        let status = s.cli(&["status", "--json"]);
        let st: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(st["mode"], mode);
        assert!(
            st["stats"]["write_requests"].as_u64().unwrap() > 0,
            "status is not the live daemon's"
        );
        sigterm(&mut server);
        let check = s.cli(&["check"]);
        assert!(check.contains("shut down cleanly: yes"), "{check}");
    }
}

#[test]
fn set_mode_and_flush_over_control_socket() {
    let s = Setup::new("writeback");
    let mut server = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    dev.write_at(&data, 4 << 20).unwrap();
    let out = s.cli(&["set-mode", "writethrough"]);
    assert!(out.contains("writethrough"), "{out}");
    let st: serde_json::Value = serde_json::from_str(&s.cli(&["status", "--json"])).unwrap();
    assert_eq!(st["cache_blocks_dirty"], 0);
    drop(dev);
    sigterm(&mut server);
    // The origin alone holds the data.
    let origin = std::fs::read(s.path("origin.img")).unwrap();
    assert!(origin[4 << 20..5 << 20] == data[..]);
}

/// kill -9 under a write load with periodic flushes, then restart: every
/// write flushed before the kill reads back (or a later write of it).
#[test]
fn kill_9_loses_nothing_flushed() {
    let s = Setup::new("writeback");
    for cycle in 0..5u64 {
        let mut server = s.serve();
        let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
        // Verify what previous cycles flushed.
        if cycle > 0 {
            for sector in 0..(8u64 << 20) / 512 {
                let mut buf = vec![0u8; 512];
                dev.read_at(&mut buf, sector * 512).unwrap();
                let (sec, version) = common::decode_sector(&buf)
                    .unwrap_or_else(|| panic!("cycle {cycle}: sector {sector} never written"));
                assert_eq!(sec, sector);
                assert!(version >= cycle * 1000, "cycle {cycle}: sector {sector} has version {version}: a flushed write was lost");
            }
        }
        // Write every sector of the first 8 MiB with this cycle's version, flush.
        let version = (cycle + 1) * 1000;
        for chunk in 0..(8u64 << 20) / 65536 {
            let mut data = vec![0u8; 65536];
            for k in 0..128u64 {
                let sector = chunk * 128 + k;
                data[(k * 512) as usize..((k + 1) * 512) as usize]
                    .copy_from_slice(&common::sector_content(sector, version));
            }
            dev.write_at(&data, chunk * 65536).unwrap();
        }
        dev.flush().unwrap();
        // Unflushed writes in flight when the server dies.
        let writer = {
            let uri = s.uri();
            std::thread::spawn(move || {
                let Ok(d) = NbdDevice::connect(&uri, 1) else {
                    return;
                };
                for i in 0..10_000u64 {
                    let sector = (i * 7919) % ((8 << 20) / 512);
                    if d.write_at(
                        &common::sector_content(sector, version + 1 + i % 500),
                        sector * 512,
                    )
                    .is_err()
                    {
                        return;
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        server.kill().unwrap();
        server.wait().unwrap();
        let _ = writer.join();
        drop(dev);
    }
}

/// Sectors `first..first + n`, each stamped with its sector and `version`.
fn stamped(first: u64, n: u64, version: u64) -> Vec<u8> {
    (first..first + n)
        .flat_map(|s| common::sector_content(s, version))
        .collect()
}

/// Sub-block writes at QD1 until the connection dies; per sector, the
/// version of the last write acknowledged and of the one in flight.
fn write_until_killed(
    uri: &str,
    mut latest: Vec<(u64, u64)>,
    first_version: u64,
) -> Vec<(u64, u64)> {
    let sectors = latest.len() as u64;
    let Ok(dev) = NbdDevice::connect(uri, 1) else {
        return latest;
    };
    let mut x = first_version | 1;
    for version in first_version.. {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = 1 + x % 8;
        let first = (x >> 8) % (sectors - n);
        for s in first..first + n {
            latest[s as usize].1 = version;
        }
        if dev
            .write_at(&stamped(first, n, version), first * 512)
            .is_err()
        {
            return latest;
        }
        for s in first..first + n {
            latest[s as usize].0 = version;
        }
    }
    unreachable!()
}

/// Every sector holds its last acknowledged version or the one in flight.
fn check_acknowledged(volume: &[u8], latest: &[(u64, u64)], when: &str) {
    let mut lost = 0;
    for (sector, &(acked, in_flight)) in latest.iter().enumerate() {
        let data = &volume[sector * 512..(sector + 1) * 512];
        let version = match common::decode_sector(data) {
            Some((s, v)) if s == sector as u64 => v,
            // Never written: the origin's zeroes.
            _ if acked == 0 && data.iter().all(|&b| b == 0) => 0,
            _ => panic!("{when}: sector {sector} holds data never written to it"),
        };
        if version != acked && version != in_flight {
            lost += 1;
        }
    }
    assert_eq!(
        lost, 0,
        "{when}: {lost} sectors lost their last acknowledged (unflushed) write"
    );
}

/// kill -9 right after unflushed writes were acknowledged: the next daemon,
/// or an offline command, finds every one of them (the crash log); none of
/// them was flushed or committed when the daemon died.
#[test]
fn kill_9_keeps_acknowledged_unflushed_writes() {
    let s = Setup::new("writeback");
    let sectors = (4u64 << 20) / 512;
    let kill_under_writes = |before: Vec<(u64, u64)>, first_version: u64| {
        let mut server = s.serve();
        let writer = {
            let uri = s.uri();
            std::thread::spawn(move || write_until_killed(&uri, before, first_version))
        };
        // Well under the background's one-second commit.
        std::thread::sleep(Duration::from_millis(400));
        server.kill().unwrap();
        server.wait().unwrap();
        writer.join().unwrap()
    };
    let latest = kill_under_writes(vec![(0, 0); sectors as usize], 1);
    let acked = latest.iter().filter(|l| l.0 > 0).count();
    assert!(acked > 500, "only {acked} sectors written before the kill");
    // check (read-only) says what the log holds; a new daemon applies it.
    let report = s.cli(&["check"]);
    assert!(
        report.contains("records the last daemon acknowledged but did not journal"),
        "{report}"
    );
    // Given only the device, check finds the log by the cache named in it.
    let cache = s.path("cache.img");
    let report = s.cli(&["check", "--cache", cache.to_str().unwrap()]);
    assert!(
        report.contains("records the last daemon acknowledged but did not journal"),
        "{report}"
    );
    let _server = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    let mut volume = vec![0u8; (sectors * 512) as usize];
    dev.read_at(&mut volume, 0).unwrap();
    check_acknowledged(&volume, &latest, "after restart");
    let status = s.status();
    assert!(
        status["stats"]["crash_log_records_recovered"]
            .as_u64()
            .unwrap()
            > 0
    );
    let log = status["crash_log"]["path"]
        .as_str()
        .expect("status names the crash log");
    assert!(std::path::Path::new(log).exists(), "{log}");
    drop(dev);
    drop(_server);
    // Killed again; this time an offline detach writes everything back.
    let now: Vec<(u64, u64)> = volume
        .chunks(512)
        .map(|d| common::decode_sector(d).map_or((0, 0), |(_, v)| (v, v)))
        .collect();
    let latest = kill_under_writes(now, 1 << 40);
    s.cli(&["detach"]);
    let origin = std::fs::read(s.path("origin.img")).unwrap();
    check_acknowledged(&origin[..volume.len()], &latest, "after an offline detach");
}

fn nbdinfo_json(uri: &str) -> serde_json::Value {
    need("nbdinfo", "libnbd-bin");
    let out = Command::new("nbdinfo")
        .arg("--json")
        .arg(uri)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nbdinfo {uri}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `--tcp` listens on loopback too; `--read-only` refuses writes; SIGINT
/// shuts down as cleanly as SIGTERM.
#[test]
fn tcp_read_only_and_sigint() {
    let s = Setup::new("writeback");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = s.serve_with(&["--tcp", &addr, "--read-only"]);
    let tcp_uri = format!("nbd://{addr}/");
    let v = nbdinfo_json(&tcp_uri);
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 64u64 << 20, "{v:#}");
    assert_eq!(e["is_read_only"], true, "{v:#}");
    assert_eq!(e["can_multi_conn"], true, "{v:#}");
    let dev = NbdDevice::connect(&tcp_uri, 1).unwrap();
    assert!(
        dev.write_at(&[0u8; 512], 0).is_err(),
        "read-only export accepted a write"
    );
    let mut buf = vec![1u8; 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    drop(dev);
    stop_with(&mut server, libc::SIGINT);
    let check = s.cli(&["check"]);
    assert!(check.contains("shut down cleanly: yes"), "{check}");
}

/// flush and detach sent to a running daemon: flush writes every dirty
/// block back; detach leaves the origin alone with the data and ends the
/// daemon.
#[test]
fn flush_and_detach_over_control_socket() {
    let s = Setup::new("writeback");
    let mut server = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    let data: Vec<u8> = (0..2 << 20).map(|i| (i % 253) as u8).collect();
    dev.write_at(&data, 8 << 20).unwrap();
    dev.flush().unwrap();
    let st: serde_json::Value = serde_json::from_str(&s.cli(&["status", "--json"])).unwrap();
    assert!(
        st["cache_blocks_dirty"].as_u64().unwrap() > 0,
        "nothing dirty to flush: {st}"
    );
    let out = s.cli(&["flush"]);
    assert!(out.contains("0 dirty"), "{out}");
    drop(dev);
    let out = s.cli(&["detach"]);
    assert!(out.contains("stands alone"), "{out}");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = server.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "daemon still running after detach"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "daemon exited with {status} after detach");
    let origin = std::fs::read(s.path("origin.img")).unwrap();
    assert!(
        origin[8 << 20..10 << 20] == data[..],
        "origin lacks the data after detach"
    );
    // The cache device holds no cache any more.
    let out = Command::new(BIN)
        .args(["check", "--cache", s.path("cache.img").to_str().unwrap()])
        .env("TIERCACHE_STATE_DIR", s.state())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "check still finds a cache after detach"
    );
}

/// On a terminal, `flush` of a served cache shows a progress bar that
/// counts the dirty blocks (progress travels over the control socket).
#[test]
fn flush_shows_progress_on_a_terminal() {
    need("script", "bsdutils");
    let s = Setup::new("writeback");
    let mut server = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    for i in 0..1024u64 {
        dev.write_at(&[i as u8; 4096], (i * 7919 % 16384) * 4096)
            .unwrap();
    }
    dev.flush().unwrap();
    drop(dev);
    let st: serde_json::Value = serde_json::from_str(&s.cli(&["status", "--json"])).unwrap();
    let dirty = st["cache_blocks_dirty"].as_u64().unwrap();
    assert!(dirty > 0);
    let out = Command::new("script")
        .args(["-qec", &format!("{BIN} flush"), "/dev/null"])
        .env("TIERCACHE_STATE_DIR", s.state())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("writing back [") && text.contains(&format!("/{dirty} blocks")),
        "no progress bar over {dirty} blocks: {text}"
    );
    assert!(text.contains("0 dirty"), "{text}");
    sigterm(&mut server);
}

/// `status` names the front ends of the daemon; `detach` is refused while
/// an NBD client is connected, and `--force` detaches anyway.
#[test]
fn status_shows_frontends_and_detach_waits_for_clients() {
    let s = Setup::new("writeback");
    let mut server = s.serve();
    let st = s.status();
    let socket = s.nbd_socket().display().to_string();
    assert_eq!(st["frontends"]["nbd_socket"], socket.as_str(), "{st}");
    assert_eq!(st["frontends"]["nbd_clients"], 0, "{st}");
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    dev.write_at(&[7u8; 4096], 0).unwrap();
    dev.flush().unwrap();
    assert_eq!(s.status()["frontends"]["nbd_clients"], 1);
    let text = s.cli(&["status"]);
    assert!(
        text.contains(&format!("served          NBD on {socket}"))
            && text.contains("NBD clients connected: 1"),
        "{text}"
    );
    let out = s.cli_output(&["detach"]);
    let err = String::from_utf8_lossy(&out.stderr);
    // 7: refused for safety, the class the daemon sends with its refusal.
    assert_eq!(out.status.code(), Some(7), "detach under a client: {err}");
    assert!(
        err.contains("refusing to detach cache 'tc0': 1 NBD client is connected")
            && err.contains("--force"),
        "{err}"
    );
    assert!(server.try_wait().unwrap().is_none(), "the daemon stopped");
    // Still served, nothing detached: the client goes on.
    dev.write_at(&[8u8; 4096], 4096).unwrap();
    dev.flush().unwrap();
    let out = s.cli(&["detach", "--force"]);
    assert!(out.contains("stands alone"), "{out}");
    let t = Instant::now();
    while server.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "daemon still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let origin = std::fs::read(s.path("origin.img")).unwrap();
    assert!(origin[..4096] == [7u8; 4096] && origin[4096..8192] == [8u8; 4096]);
}

/// A cache device that dies holding dirty data, under the daemon: it is an
/// nbdkit export whose error filter fails every request once a trigger
/// file exists. Reads of the dirty blocks fail (never the origin's old
/// bytes), status lists the stale origin range once the device is past the
/// error limit, and `give-up-cache --lose-dirty-data` serves on from the
/// origin: the stale range still fails, the rest reads, and a whole-block
/// write makes a stale block current again.
#[test]
fn a_dead_cache_is_given_up_and_its_stale_ranges_are_never_served() {
    need("nbdkit", "nbdkit");
    let s = Setup {
        dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    };
    let (origin, cache) = (s.path("origin.img"), s.path("cache.img"));
    std::fs::File::create(&origin)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let (sock, trigger) = (s.path("cache.sock"), s.path("cache-dies"));
    let mut nbdkit = daemon::KillOnDrop(
        Command::new("nbdkit")
            .args([
                "-f",
                "--exit-with-parent",
                "-U",
                sock.to_str().unwrap(),
                "--filter=error",
            ])
            .arg("file")
            .arg(&cache)
            .args([
                "error-rate=100%",
                &format!("error-file={}", trigger.display()),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let cache_uri = format!("nbd+unix:///?socket={}", sock.display());
    s.cli(&[
        "create",
        "--origin",
        origin.to_str().unwrap(),
        "--cache",
        &cache_uri,
    ]);
    let mut server = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    let data: Vec<u8> = (0..32768u32).map(|i| (i % 253) as u8 | 1).collect();
    dev.write_at(&data, 0).unwrap();
    dev.flush().unwrap();
    std::fs::write(&trigger, b"").unwrap();
    let mut buf = vec![0u8; 4096];
    for _ in 0..80 {
        assert!(
            dev.read_at(&mut buf, 0).is_err(),
            "a dirty block read from a dead cache"
        );
    }
    let st = s.status();
    assert_eq!(st["stale_ranges"], serde_json::json!([[0, 32768]]), "{st}");
    let refused = s.cli_output(&["give-up-cache"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--lose-dirty-data"));
    let out = s.cli(&["give-up-cache", "--lose-dirty-data"]);
    assert!(out.contains("0+32768"), "{out}");
    assert!(
        dev.read_at(&mut buf, 4096).is_err(),
        "a stale block was served"
    );
    let mut other = vec![1u8; 4096];
    dev.read_at(&mut other, 1 << 20).unwrap();
    assert!(
        other.iter().all(|&b| b == 0),
        "the origin's bytes elsewhere"
    );
    dev.write_at(&data[..4096], 4096).unwrap();
    dev.read_at(&mut buf, 4096).unwrap();
    assert_eq!(buf[..], data[..4096]);
    assert!(dev.read_at(&mut buf, 0).is_err(), "block 0 is still stale");
    drop(dev);
    sigterm(&mut server);
    let _ = nbdkit.kill();
}

/// An origin file grown while no daemon ran: `serve` refuses it, naming
/// `--origin-grew` (a grown loop device or NBD export looks like another
/// device of another size); `serve --origin-grew` serves the new size with
/// the data written before; the next `serve` needs no word.
#[test]
fn serve_takes_a_grown_origin_only_when_told() {
    let s = Setup::with_sizes(4 << 20, 8 << 20, &["--mode", "writeback"]);
    let mut d = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    dev.write_at(&[0x5c; 4096], 8192).unwrap();
    dev.flush().unwrap();
    drop(dev);
    sigterm(&mut d);
    std::fs::OpenOptions::new()
        .write(true)
        .open(s.path("origin.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let out = s.cli_output(&["serve"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--origin-grew"),
        "{err}"
    );
    assert!(!s.nbd_socket().exists(), "a refused serve left its socket");

    for args in [&["--origin-grew"][..], &[]] {
        let mut d = s.serve_with(args);
        let v = nbdinfo_json(&s.uri());
        assert_eq!(v["exports"][0]["export-size"], 8 << 20, "{args:?}: {v}");
        let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
        let mut buf = vec![0u8; 4096];
        dev.read_at(&mut buf, 8192).unwrap();
        assert!(buf.iter().all(|&b| b == 0x5c), "{args:?}: data lost");
        drop(dev);
        sigterm(&mut d);
    }
}
