//! Shared helpers of the tests that drive the `tiercache` binary: a state
//! directory with a registered cache over two files, the daemon started and
//! stopped by signal, the CLI, and fio. Included with `#[path]` by
//! `serve.rs` and the `reliability_*` tests.
#![allow(dead_code)]

use std::io::Read;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tiercache");

/// Runs the CLI with `state` as its state directory and returns its output,
/// whatever the exit status (RUST_LOG removed, so stderr is only what the
/// command itself says).
pub fn cli_in(state: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("TIERCACHE_STATE_DIR", state)
        .env_remove("RUST_LOG")
        .output()
        .expect("run tiercache")
}

/// `cli_in`, asserting success; returns stdout.
pub fn cli_ok_in(state: &Path, args: &[&str]) -> String {
    let out = cli_in(state, args);
    assert!(
        out.status.success(),
        "tiercache {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A temporary directory holding `origin.img`, `cache.img` and the state
/// directory of a cache registered as `tc0`.
pub struct Setup {
    pub dir: tempfile::TempDir,
}

impl Setup {
    /// A 64 MiB origin cached on 16 MiB, default settings.
    pub fn new(mode: &str) -> Setup {
        Setup::with_sizes(64 << 20, 16 << 20, &["--mode", mode])
    }

    /// Sparse origin and cache files of the given sizes; `create_args` are
    /// added to `tiercache create` (mode, block size, watermarks).
    pub fn with_sizes(origin_bytes: u64, cache_bytes: u64, create_args: &[&str]) -> Setup {
        Setup::with_origins(1, origin_bytes, cache_bytes, create_args)
    }

    /// `with_sizes` for a cache of `origins` origins of `origin_bytes`
    /// each (`origin.img`, then `origin1.img`, ...: volumes `vol0`, `vol1`, ...).
    pub fn with_origins(
        origins: usize,
        origin_bytes: u64,
        cache_bytes: u64,
        create_args: &[&str],
    ) -> Setup {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let s = Setup { dir };
        let names: Vec<String> = (0..origins)
            .map(|v| match v {
                0 => "origin.img".to_string(),
                v => format!("origin{v}.img"),
            })
            .collect();
        let files = names.iter().map(|n| (n.as_str(), origin_bytes));
        for (name, bytes) in files.chain([("cache.img", cache_bytes)]) {
            std::fs::File::create(s.path(name))
                .unwrap()
                .set_len(bytes)
                .unwrap();
        }
        let paths: Vec<String> = (names.iter().chain([&"cache.img".to_string()]))
            .map(|n| s.path(n).to_str().unwrap().to_string())
            .collect();
        let mut args = vec!["create"];
        for origin in &paths[..origins] {
            args.extend(["--origin", origin]);
        }
        args.extend(["--cache", &paths[origins]]);
        args.extend_from_slice(create_args);
        s.cli(&args);
        s
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    pub fn state(&self) -> PathBuf {
        self.path("state")
    }
    pub fn nbd_socket(&self) -> PathBuf {
        self.state().join("tc0.nbd")
    }
    pub fn uri(&self) -> String {
        self.export_uri("")
    }
    /// The URI of the NBD export named `export` (a volume's name; the empty
    /// name is the first volume).
    pub fn export_uri(&self, export: &str) -> String {
        format!(
            "nbd+unix:///{export}?socket={}",
            self.nbd_socket().display()
        )
    }

    /// Runs the CLI and returns its output, whatever the exit status.
    pub fn cli_output(&self, args: &[&str]) -> Output {
        cli_in(&self.state(), args)
    }

    /// Runs the CLI, asserts success, returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        cli_ok_in(&self.state(), args)
    }

    /// `status --json` of the running daemon.
    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.cli(&["status", "--json"])).unwrap()
    }

    pub fn serve(&self) -> KillOnDrop {
        self.serve_with(&[])
    }

    /// Starts `tiercache serve` and waits until both sockets accept.
    pub fn serve_with(&self, args: &[&str]) -> KillOnDrop {
        let child = Command::new(BIN)
            .arg("serve")
            .args(args)
            .env("TIERCACHE_STATE_DIR", self.state())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = KillOnDrop(child);
        wait_for_socket(&self.nbd_socket());
        wait_for_socket(&self.state().join("tc0.sock"));
        child
    }
}

/// A child process that is killed and reaped if still running when
/// dropped, so a failing test leaves no daemon (or frozen fio) behind.
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn wait_for_socket(p: &Path) {
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(p).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server did not listen on {}",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fails with a clear message if a system tool is missing.
pub fn need(tool: &str, package: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{tool} is missing: install the Debian package {package} (scripts/test.sh does)"
    );
}

pub fn sigterm(child: &mut Child) {
    stop_with(child, libc::SIGTERM);
}

/// Sends `sig` and waits for a clean exit.
pub fn stop_with(child: &mut Child, sig: i32) {
    signal(child.id(), sig);
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "serve exited with {st}");
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "serve did not stop on signal {sig}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a signal to a process this test started.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child we started; no memory is involved.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Parses fio's `--output-format=json` stdout (the nbd engine prints a
/// line before the JSON).
pub fn fio_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in fio output: {text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio JSON: {e}: {text}"))
}

/// fio over an NBD volume: `args` after the common ones; its JSON, or the
/// whole output (or the failed job) if it failed.
pub fn fio_nbd(uri: &str, name: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new("fio")
        .arg(format!("--name={name}"))
        .args(["--ioengine=nbd", "--output-format=json"])
        .arg(format!("--uri={uri}"))
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json = fio_json(&out.stdout);
    for job in json["jobs"].as_array().unwrap() {
        if job["error"] != 0 {
            return Err(format!("fio job error: {job}"));
        }
    }
    Ok(json)
}

/// `nbdcopy FROM TO`, which must succeed.
pub fn nbdcopy(from: impl AsRef<std::ffi::OsStr>, to: impl AsRef<std::ffi::OsStr>) {
    let out = Command::new("nbdcopy").arg(from).arg(to).output().unwrap();
    assert!(
        out.status.success(),
        "nbdcopy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compares two files chunk by chunk; the first differing byte offset.
pub fn first_difference(a: &Path, b: &Path) -> Option<u64> {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    assert_eq!(
        fa.metadata().unwrap().len(),
        fb.metadata().unwrap().len(),
        "{} and {} differ in size",
        a.display(),
        b.display()
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return None;
        }
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            let k = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y);
            return Some(at + k.unwrap() as u64);
        }
        at += n as u64;
    }
}

/// Polls `status --json` of the cache served from `state` until its
/// origin's health passes `done`; fails after `limit`, naming `what`.
pub fn wait_origin_health(
    state: &Path,
    what: &str,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let status = cli_ok_in(state, &["status", "--json"]);
        let s: serde_json::Value = serde_json::from_str(&status).unwrap();
        let h = s["origin_health"].clone();
        if done(&h) {
            return h;
        }
        assert!(t.elapsed() < limit, "waiting for {what}: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback TCP port free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something listens on `addr` (at most 20 s).
pub fn wait_for_tcp(addr: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nothing listens on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
