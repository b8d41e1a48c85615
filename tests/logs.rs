//! The daemon's log: one line format (`tiercache: LEVEL: message`), the
//! syslog priority in front of each line under journald (JOURNAL_STREAM
//! set, as systemd sets it), an audit line for every change an operator
//! asks for naming the uid and pid that asked and how it ended, and a
//! normal SIGTERM at info, not as a warning.

#[path = "common/daemon.rs"]
mod daemon;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon::{sigterm, wait_for_socket, KillOnDrop, Setup, BIN};
use tiercache::device::nbd::NbdDevice;

/// Serves `s` with stderr in `log`, JOURNAL_STREAM set if `journal`;
/// runs `changes` against it with an NBD client connected, then stops it
/// with SIGTERM. Returns the log.
fn serve_and_change(s: &Setup, journal: bool, changes: &[&[&str]]) -> String {
    let log = s.path(if journal { "journal.log" } else { "plain.log" });
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .env("TIERCACHE_STATE_DIR", s.state())
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if journal {
        cmd.env("JOURNAL_STREAM", "8:12345");
    }
    let mut server = KillOnDrop(cmd.spawn().unwrap());
    wait_for_socket(&s.nbd_socket());
    wait_for_socket(&s.state().join("tc0.sock"));
    let client = NbdDevice::connect(&s.uri(), 1).unwrap();
    for args in changes {
        let _ = s.cli_output(args);
    }
    // A request the daemon refuses (the commands check names before they
    // ask): straight on the control socket.
    let mut control = UnixStream::connect(s.state().join("tc0.sock")).unwrap();
    control
        .write_all(b"{\"op\":\"resize\",\"volume\":\"nope\"}\n")
        .unwrap();
    let mut reply = String::new();
    control.read_to_string(&mut reply).unwrap();
    assert!(reply.contains(r#""class":"not-found""#), "{reply}");
    drop(client);
    sigterm(&mut server);
    let t = Instant::now();
    while server.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(60), "serve did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn journal_lines_carry_priorities_and_changes_are_audited() {
    let s = Setup::new("writeback");
    let log = serve_and_change(
        &s,
        true,
        &[&["set-mode", "writethrough"], &["flush"], &["status"]],
    );
    for line in log.lines() {
        let ok = ["<3>", "<4>", "<6>", "<7>"].iter().any(|p| {
            line.strip_prefix(p).is_some_and(|rest| {
                ["error", "warning", "info", "debug"]
                    .iter()
                    .any(|l| rest.starts_with(&format!("tiercache: {l}: ")))
            })
        });
        assert!(ok, "not a journal line: {line:?}\nlog:\n{log}");
    }
    let me = format!("uid {} (pid ", unsafe { libc::geteuid() });
    let has = |want: &[&str]| log.lines().any(|l| want.iter().all(|w| l.contains(w)));
    assert!(
        has(&[
            "<6>",
            "audit: ",
            &me,
            r#""op":"set-mode""#,
            "writethrough",
            ": done"
        ]),
        "no audit of set-mode:\n{log}"
    );
    assert!(
        has(&["<6>", "audit: ", &me, r#"{"op":"flush"}"#, ": done"]),
        "no audit of flush:\n{log}"
    );
    assert!(
        has(&["<4>", "audit: ", r#""volume":"nope""#, "failed (not-found)"]),
        "no audit of the refused resize:\n{log}"
    );
    // A look is not a change.
    assert!(!has(&["audit: ", r#""op":"status""#]), "{log}");
    assert!(
        has(&["<6>tiercache: info: SIGTERM: shutting down"]),
        "{log}"
    );
    assert!(has(&["<6>", "shut down cleanly"]), "{log}");
    // Sizes for people.
    assert!(has(&["serving 'tc0' (64 MiB, writeback mode)"]), "{log}");
}

#[test]
fn plain_lines_outside_the_journal() {
    let s = Setup::new("writeback");
    let log = serve_and_change(&s, false, &[&["set-mode", "writearound"]]);
    for line in log.lines() {
        assert!(line.starts_with("tiercache: "), "{line:?}\nlog:\n{log}");
    }
    assert!(log.contains("tiercache: info: audit: "), "{log}");
}

/// A command's closing error line has the logger's shape, and under the
/// journal its priority (3) as well.
#[test]
fn a_failing_command_ends_with_an_error_line_of_the_same_shape() {
    let s = Setup::new("writeback");
    for (journal, start) in [
        (false, "tiercache: error: "),
        (true, "<3>tiercache: error: "),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(["status", "--name", "nope"])
            .env("TIERCACHE_STATE_DIR", s.state())
            .env_remove("JOURNAL_STREAM");
        if journal {
            cmd.env("JOURNAL_STREAM", "8:1");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(3));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with(start) && err.lines().count() == 1, "{err}");
    }
}
