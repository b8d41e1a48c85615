//! NBD servers started by a test (nbdkit, qemu-nbd): a child process
//! killed on drop, and readiness probes. A missing tool fails the test
//! with the Debian package to install.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A server child process, killed (by PID) on drop.
pub struct Server {
    pub child: Child,
    pub uri: String,
    /// Where its socket lives, removed with it.
    pub dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

pub fn spawn(program: &str, package: &str, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}): install the Debian package '{package}'")
        })
}

/// Waits for `ready`, failing early if the server exits.
pub fn wait_ready(child: &mut Child, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{what} exited during startup: {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not start in time");
        thread::sleep(Duration::from_millis(10));
    }
}

/// The socket file appears at bind(), before listen(): probe with a connect.
pub fn listening(sock: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(sock).is_ok()
}

pub fn unix_uri(sock: &Path, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", sock.display())
}

/// `nbdkit -U SOCK --exit-with-parent [extra...]` in foreground.
pub fn nbdkit_unix(extra: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbdkit.sock");
    let mut args = vec!["-f", "--exit-with-parent", "-U", sock.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut child = spawn("nbdkit", "nbdkit", &args);
    wait_ready(&mut child, "nbdkit", || listening(&sock));
    Server {
        child,
        uri: unix_uri(&sock, ""),
        dir: Some(dir),
    }
}
