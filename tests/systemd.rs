//! The systemd unit (`contrib/systemd/tiercache@.service`) passes
//! `systemd-analyze verify`, and `serve` speaks the readiness protocol it
//! declares (`Type=notify`): READY=1 once its sockets listen, STOPPING=1 on
//! SIGTERM, then a clean exit with the cache marked clean.

#[path = "common/daemon.rs"]
mod daemon;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon::{sigterm, KillOnDrop, Setup, BIN};

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/contrib/systemd/tiercache@.service"
);

#[test]
fn unit_passes_systemd_analyze_verify() {
    let text = std::fs::read_to_string(UNIT).unwrap();
    for line in [
        "Type=notify",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
        // Registered, or found by its recorded name; else skipped.
        "ExecCondition=/usr/local/bin/tiercache import --boot %i",
        "ExecStart=/usr/local/bin/tiercache serve --name %i $TIERCACHE_SERVE_ARGS",
    ] {
        assert!(text.lines().any(|l| l == line), "the unit lacks {line}");
    }
    let analyze = Command::new("sh")
        .args(["-c", "command -v systemd-analyze"])
        .output()
        .unwrap();
    if !analyze.status.success() {
        eprintln!(
            "SKIPPED: systemd-analyze is missing (Debian package systemd; scripts/test.sh installs it)"
        );
        return;
    }
    // verify checks that ExecStart's binary exists: point it at this build.
    let dir = tempfile::tempdir().unwrap();
    let instance = dir.path().join("tiercache@tc0.service");
    std::fs::write(&instance, text.replace("/usr/local/bin/tiercache", BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&instance)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    assert!(!err.contains("tiercache@"), "systemd-analyze verify: {err}");
}

#[test]
fn serve_notifies_ready_and_stopping() {
    let s = Setup::new("writeback");
    let notify_path = s.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut server = KillOnDrop(
        Command::new(BIN)
            .args(["serve", "--name", "tc0"])
            .env("TIERCACHE_STATE_DIR", s.state())
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("no READY=1 within 30 s");
    assert_eq!(&buf[..n], b"READY=1");
    // Ready means listening: both sockets accept at once.
    std::os::unix::net::UnixStream::connect(s.nbd_socket()).expect("NBD socket after READY");
    std::os::unix::net::UnixStream::connect(s.state().join("tc0.sock"))
        .expect("control socket after READY");
    sigterm(&mut server);
    let n = notify.recv(&mut buf).expect("no STOPPING=1 after SIGTERM");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let check = s.cli(&["check"]);
    assert!(check.contains("shut down cleanly: yes"), "{check}");
}
