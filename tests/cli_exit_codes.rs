//! Exit codes a script can rely on (`tiercache --help`, src/cli/exit.rs):
//! each class of failure ends a command with its own code, whether the
//! command did the work itself or asked the daemon that serves the cache.
//! tests/cli.rs, claims.rs and security_daemon.rs check the codes of their
//! own refusals; this file holds the ones no other test mounts.

#[path = "common/daemon.rs"]
mod daemon;

use std::process::{Command, Output};

use daemon::Setup;

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn err(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit `want` and an error line holding `what`.
fn exits(out: &Output, want: i32, what: &str) {
    let e = err(out);
    assert_eq!(code(out), Some(want), "expected exit {want}: {e}");
    assert!(e.contains(what), "expected '{what}' in: {e}");
}

#[test]
fn help_lists_every_exit_code() {
    let out = Command::new(daemon::BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for (n, word) in [
        (0, "success"),
        (1, "failed"),
        (2, "usage"),
        (3, "not found"),
        (4, "busy"),
        (5, "damaged"),
        (6, "degraded"),
        (7, "refused for safety"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{n}  {word}"))),
            "--help lacks exit code {n} ({word}):\n{text}"
        );
    }
}

/// Another process holding the cache's lock (a command under way) makes
/// a command exit 4, whatever it is.
#[test]
fn a_cache_another_command_holds_is_busy() {
    let s = Setup::new("writeback");
    let lock = std::fs::File::open(s.state().join("tc0.lock")).unwrap();
    lock.try_lock().unwrap();
    for args in [
        vec!["status"],
        vec!["flush"],
        vec!["set-mode", "writethrough"],
    ] {
        exits(
            &s.cli_output(&args),
            4,
            "in use by another tiercache process",
        );
    }
    drop(lock);
    s.cli(&["status"]);
}

/// Not found and usage, offline: a volume name the cache lacks is 3, a
/// value that is not one is 2.
#[test]
fn unknown_names_and_bad_values_offline() {
    let s = Setup::with_origins(2, 16 << 20, 16 << 20, &["--mode", "writeback"]);
    exits(
        &s.cli_output(&["flush", "--volume", "nope"]),
        3,
        "no volume named 'nope'",
    );
    exits(
        &s.cli_output(&["status", "--name", "nope"]),
        3,
        "no cache named",
    );
    exits(
        &s.cli_output(&["warm", "--offset", "100", "--length", "4096"]),
        2,
        "multiples of 512",
    );
}

/// The daemon sends the class with its refusal: a command forwarded to it
/// exits as one that did the work itself.
#[test]
fn a_served_cache_answers_with_the_same_codes() {
    let s = Setup::with_origins(2, 16 << 20, 16 << 20, &["--mode", "writeback"]);
    let _daemon = s.serve();
    exits(
        &s.cli_output(&["flush", "--volume", "nope"]),
        3,
        "no volume named 'nope'",
    );
    // A refusal for safety over the control socket (detach under a
    // connected client) is tests/serve.rs's
    // status_shows_frontends_and_detach_waits_for_clients.
    exits(
        &s.cli_output(&["set-policy", "clock"]),
        2,
        "unknown replacement policy",
    );
    exits(
        &s.cli_output(&["resize", "--volume", "nope"]),
        3,
        "no volume named 'nope'",
    );
}
