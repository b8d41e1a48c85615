//! `tiercache serve` with TLS, end to end through the binary: the network
//! safety checks of the flags, nbdinfo and nbdcopy over `nbds://` against
//! a registered cache, and (ignored by default) the cost of TLS on 4 KiB
//! cache hits, measured against plaintext in one run:
//!
//!     cargo test --release --test serve_tls -- --ignored --nocapture tls_overhead

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/tls.rs"]
mod tls;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon::{free_port, wait_for_socket, wait_for_tcp, KillOnDrop, Setup, BIN};
use tls::{psk_file, require_tool, Pki};

/// Plaintext TCP beyond loopback is refused before anything is opened;
/// the message names the ways out.
#[test]
fn plaintext_beyond_loopback_is_refused() {
    let s = Setup::new("writeback");
    let port = free_port().to_string();
    for addr in [format!("0.0.0.0:{port}"), format!("[::]:{port}")] {
        let t = Instant::now();
        let out = s.cli_output(&["serve", "--tcp", &addr]);
        assert!(
            !out.status.success(),
            "serve --tcp {addr} started without TLS"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        for want in [
            "without TLS",
            "--tls-certificates",
            "--tls-psk",
            "--insecure",
        ] {
            assert!(err.contains(want), "{addr}: '{err}' lacks '{want}'");
        }
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    // Nothing was left behind: the cache serves normally afterwards.
    let mut server = s.serve();
    daemon::sigterm(&mut server);
}

#[test]
fn nbds_clients_against_the_daemon() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("nbdcopy", "libnbd-bin");
    let s = Setup::new("writeback");
    let pki = Pki::new(s.dir.path(), "ca");
    let addr = format!("127.0.0.1:{}", free_port());
    let certs = pki.server_dir();
    let mut server = s.serve_with(&[
        "--tcp",
        &addr,
        "--tls-certificates",
        certs.to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    wait_for_tcp(&addr);
    let uri = format!(
        "nbds://{addr}/?tls-certificates={}",
        pki.client_dir().display()
    );
    let img = s.path("data.img");
    let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    let ok = |c: &mut Command| {
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let info = ok(Command::new("nbdinfo").arg(&uri));
    assert!(String::from_utf8_lossy(&info.stdout).contains("with TLS"));
    ok(Command::new("nbdcopy").arg(&img).arg(&uri));
    let back = s.path("back.img");
    ok(Command::new("nbdcopy").arg(s.uri()).arg(&back));
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
    // Plaintext on the TCP listener is refused; the Unix socket stays local.
    let out = Command::new("nbdinfo")
        .arg(format!("nbd://{addr}/"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    daemon::sigterm(&mut server);
}

// ---------------------------------------------------------------------------
// The cost of TLS on 4 KiB cache hits (ignored: a measurement, not a test).

/// fio's nbd engine, 4 KiB random reads at depth 32 for `secs`; IOPS.
fn fio_iops(uri: &str, home: &Path, secs: u64) -> f64 {
    let out = Command::new("fio")
        .args([
            "--name=hits",
            "--ioengine=nbd",
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
            "--size=32M",
            "--time_based",
            "--output-format=json",
        ])
        .arg(format!("--runtime={secs}"))
        .arg(format!("--uri={uri}"))
        // libnbd reads its default certificates from $HOME/.pki/libnbd:
        // fio's URI cannot name local files.
        .env("HOME", home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = daemon::fio_json(&out.stdout);
    v["jobs"][0]["read"]["iops"].as_f64().unwrap()
}

/// nbdcopy of the whole volume in 4 KiB requests, 32 in flight, to null:;
/// IOPS.
fn nbdcopy_iops(uri: &str, bytes: u64) -> f64 {
    let t = Instant::now();
    let out = Command::new("nbdcopy")
        .args([
            "--no-extents",
            "--request-size=4096",
            "--requests=32",
            "--connections=1",
        ])
        .arg(uri)
        .arg("null:")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nbdcopy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (bytes / 4096) as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[test]
#[ignore]
fn tls_overhead() {
    require_tool("fio", "fio");
    require_tool("nbdcopy", "libnbd-bin");
    let rounds: usize = std::env::var("TLS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let secs = 5;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let keys = psk_file(&dir.path().join("psk"), "alice", 1);
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".pki")).unwrap();
    std::os::unix::fs::symlink(pki.client_dir(), home.join(".pki/libnbd")).unwrap();
    let volume = 64u64 << 20;
    // One daemon per credential kind, TLS optional, so plaintext and TLS
    // clients meet the same cache; the RAM cache is larger than the volume.
    let start = |creds: [&str; 2]| {
        let port = free_port();
        let state = dir.path().join(format!("state-{port}"));
        let child = Command::new(BIN)
            .args([
                "serve",
                "--name",
                "tc0",
                "--origin",
                "ram:64M",
                "--ram-cache",
                "96M",
            ])
            .args(["--tcp", &format!("127.0.0.1:{port}"), "--tls", "on"])
            .args(creds)
            .env("TIERCACHE_STATE_DIR", &state)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = KillOnDrop(child);
        wait_for_socket(&state.join("tc0.nbd"));
        let addr = format!("127.0.0.1:{port}");
        // Every block cached: one full read.
        nbdcopy_iops(&format!("nbd://{addr}/"), volume);
        (child, addr)
    };
    let certs = format!("{}", pki.server_dir().display());
    let psk = format!("{}", keys.display());
    let (_x509, x_addr) = start(["--tls-certificates", &certs]);
    let (_psk, p_addr) = start(["--tls-psk", &psk]);
    let plain_uri = format!("nbd://{x_addr}/");
    let x509_uri = format!("nbds://{x_addr}/");
    let psk_uri = format!("nbds://alice@{p_addr}/?tls-psk-file={psk}");
    let psk_plain_uri = format!("nbd://{p_addr}/");

    let (mut fio_plain, mut fio_tls) = (Vec::new(), Vec::new());
    let (mut copy_plain, mut copy_x509, mut copy_psk, mut copy_psk_plain) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so drift in the machine's load
        // does not favour one side.
        let (p, t) = if round % 2 == 0 {
            let p = fio_iops(&plain_uri, &home, secs);
            (p, fio_iops(&x509_uri, &home, secs))
        } else {
            let t = fio_iops(&x509_uri, &home, secs);
            (fio_iops(&plain_uri, &home, secs), t)
        };
        eprintln!("round {round}: fio 4K randread QD32: plain {p:.0} IOPS, TLS (X.509) {t:.0} IOPS, ratio {:.3}", t / p);
        fio_plain.push(p);
        fio_tls.push(t);
        copy_plain.push(nbdcopy_iops(&plain_uri, volume));
        copy_x509.push(nbdcopy_iops(&x509_uri, volume));
        copy_psk_plain.push(nbdcopy_iops(&psk_plain_uri, volume));
        copy_psk.push(nbdcopy_iops(&psk_uri, volume));
    }
    let (p, t) = (median(fio_plain), median(fio_tls));
    eprintln!("fio 4K random read hits, QD32, median of {rounds} x {secs} s:");
    eprintln!(
        "  plaintext TCP {p:.0} IOPS, TLS 1.3 X.509 (rustls) {t:.0} IOPS: TLS/plain = {:.3}",
        t / p
    );
    let (cp, cx) = (median(copy_plain), median(copy_x509));
    let (cpp, cps) = (median(copy_psk_plain), median(copy_psk));
    eprintln!("nbdcopy 4K sequential read hits, 32 requests, median of {rounds}:");
    eprintln!(
        "  X.509 daemon: plaintext {cp:.0} IOPS, TLS {cx:.0} IOPS: TLS/plain = {:.3}",
        cx / cp
    );
    eprintln!(
        "  PSK daemon:   plaintext {cpp:.0} IOPS, TLS {cps:.0} IOPS: TLS/plain = {:.3}",
        cps / cpp
    );
}
