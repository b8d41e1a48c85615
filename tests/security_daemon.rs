//! A root daemon no local user can turn: each attack of issue 32 mounted
//! for real against the `tiercache` binary (docs/security.md names the
//! threats and points here).
//!
//! - crash log: a planted world-writable directory of another uid, a log
//!   that is a symlink to a canary file, a tmpfs too small for the log,
//!   and a tmpfs that another tenant fills while the log's pages are
//!   trimmed (a punched page faulted back by a store would be SIGBUS);
//! - sockets: 0600 under a umask of 0, another uid refused by the mode;
//! - control socket: another uid refused by its credentials even when the
//!   mode lets it connect, idle connections evicted or timed out;
//! - TLS: beyond loopback, X.509 needs client certificates unless
//!   `--tls-verify-peer=off`; a certificate revoked by ca-crl.pem is
//!   refused;
//! - registry: concurrent writers lose nothing; a failover after a
//!   `replace-cache` keeps the replacement.
//!
//! Acting as another user takes root and `setpriv` (util-linux); the
//! tmpfs tests take `mount`. The tests fail with a message saying so
//! when they are missing.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/tls.rs"]
mod tls;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use daemon::{free_port, need, sigterm, wait_for_socket, wait_for_tcp, KillOnDrop, Setup, BIN};
use tiercache::daemon::{registry, Entry, Registry};
use tls::{openssl, require_tool, Pki};

/// The other user of these tests: `nobody`.
const OTHER_UID: u32 = 65534;

fn need_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests act as another user and mount tmpfs: run them as root"
    );
    need("setpriv", "util-linux");
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `tiercache serve` of `s`'s cache with extra environment, its stderr
/// kept in `<dir>/serve-N.log` (returned) for the lines it logs.
fn serve_cmd(s: &Setup, args: &[&str], env: &[(&str, &Path)]) -> (Command, PathBuf) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = s.path(&format!("serve-{n}.log"));
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args(args)
        .env("TIERCACHE_STATE_DIR", s.state())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd, log)
}

/// Starts the daemon and waits for both sockets.
fn serve(s: &Setup, args: &[&str], env: &[(&str, &Path)]) -> (KillOnDrop, PathBuf) {
    let (mut cmd, log) = serve_cmd(s, args, env);
    let child = KillOnDrop(cmd.spawn().unwrap());
    wait_for_socket(&s.nbd_socket());
    wait_for_socket(&s.state().join("tc0.sock"));
    (child, log)
}

/// Runs `cmd` to its end, which must come within 30 s (a daemon that
/// starts when it should refuse would run on).
fn run_to_end(mut cmd: Command) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = KillOnDrop(child.unwrap());
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{cmd:?} did not end: it should have refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Output {
        status: child.try_wait().unwrap().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut out.stdout)
        .unwrap();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut out.stderr)
        .unwrap();
    out
}

/// `serve` that must refuse to start: a clean exit with status 1 (never
/// a signal such as SIGBUS); returns what it said.
/// `code`: the exit code of the refusal's class (`tiercache --help`).
fn serve_refused(s: &Setup, env: &[(&str, &Path)], code: i32) -> String {
    let (mut cmd, _) = serve_cmd(s, &[], env);
    cmd.env_remove("RUST_LOG");
    let out = run_to_end(cmd);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.signal(),
        None,
        "serve was killed by a signal: {err}"
    );
    assert_eq!(out.status.code(), Some(code), "serve did not refuse: {err}");
    err
}

/// The crash log's file name in a shared directory (as the daemon names it).
fn log_name(s: &Setup) -> String {
    Registry::new(s.state()).crash_log_file_name("tc0")
}

fn file_bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// The finding: a directory made beforehand by another uid, mode 0777,
/// holding a symlink where the log goes. The daemon refuses it, naming
/// the directory, its owner and mode, and the fix; nothing is written
/// into it or through it.
#[test]
fn a_planted_crash_log_directory_is_refused() {
    need_root();
    let s = Setup::new("writeback");
    let planted = s.path("planted");
    std::fs::create_dir(&planted).unwrap();
    let canary = s.path("canary");
    std::fs::write(&canary, b"root:$6$secret:19000:0:99999:7:::\n").unwrap();
    let before = file_bytes(&canary);
    std::os::unix::fs::symlink(&canary, planted.join(log_name(&s))).unwrap();
    chown(&planted, OTHER_UID);
    chmod(&planted, 0o777);
    let err = serve_refused(&s, &[("TIERCACHE_CRASH_LOG_DIR", &planted)], 7);
    for want in [
        "crash log directory",
        planted.to_str().unwrap(),
        "uid 65534",
        "mode 0777",
        "rm -r",
    ] {
        assert!(err.contains(want), "'{err}' lacks '{want}'");
    }
    assert_eq!(file_bytes(&canary), before, "the canary changed");
    let names: Vec<_> = std::fs::read_dir(&planted)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "something was made in the planted directory"
    );
    assert_eq!(
        std::fs::read_link(planted.join(log_name(&s))).unwrap(),
        canary
    );
    // Nothing else was touched: with a directory of its own it serves.
    let own = s.path("own");
    let (mut server, _) = serve(&s, &[], &[("TIERCACHE_CRASH_LOG_DIR", &own)]);
    assert_eq!(std::fs::metadata(&own).unwrap().mode() & 0o777, 0o700);
    sigterm(&mut server);
}

/// A log that is a symlink to a canary, in a directory that passes the
/// checks: refused, and the canary stays byte for byte.
#[test]
fn a_symlinked_crash_log_is_refused_and_its_target_untouched() {
    need_root();
    let s = Setup::new("writeback");
    let dir = s.path("logs");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o700);
    let canary = s.path("canary");
    std::fs::write(&canary, vec![0x5a; 10_000]).unwrap();
    let before = file_bytes(&canary);
    std::os::unix::fs::symlink(&canary, dir.join(log_name(&s))).unwrap();
    let err = serve_refused(&s, &[("TIERCACHE_CRASH_LOG_DIR", &dir)], 7);
    assert!(
        err.contains("symbolic link") && err.contains(&log_name(&s)),
        "{err}"
    );
    assert_eq!(file_bytes(&canary), before, "the canary changed");
    assert_eq!(std::fs::metadata(&canary).unwrap().len(), 10_000);
}

/// A state directory others may write (made under an older tiercache
/// with a umask of 0, say) could hold a planted registry entry naming
/// any device: serve and the commands refuse it before reading it.
#[test]
fn a_state_directory_others_may_write_is_refused() {
    let s = Setup::new("writeback");
    chmod(&s.state().join("caches"), 0o777);
    let err = serve_refused(&s, &[], 7);
    assert!(
        err.contains("state directory") && err.contains("mode 0777") && err.contains("chmod go-w"),
        "{err}"
    );
    let out = s.cli_output(&["status"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mode 0777"));
    chmod(&s.state().join("caches"), 0o755);
    s.cli(&["status"]);
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        need_root();
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount -t tmpfs failed (these tests need root and mount): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A crash-log directory on a tmpfs too small for the log (4 MiB): serve
/// fails at start with a clear error, by exit status, never SIGBUS.
#[test]
fn a_full_tmpfs_fails_the_start_not_a_later_store() {
    let s = Setup::new("writeback");
    let shm = Tmpfs::mount("1m");
    let err = serve_refused(&s, &[("TIERCACHE_CRASH_LOG_DIR", shm.path())], 1);
    assert!(
        err.contains("cannot allocate") && err.contains("No space left on device"),
        "{err}"
    );
}

/// Appends `n` bytes' worth of 4 KiB pages to `filler` until the file
/// system says no: another tenant taking whatever the log lets go.
fn fill(filler: &mut std::fs::File) {
    let page = [0xffu8; 4096];
    while filler.write_all(&page).is_ok() {}
}

/// The child of `trimming_on_a_full_tmpfs_never_faults`: laps of a small
/// log on a tmpfs that a filler takes every free page of after each trim.
/// Runs only when that test starts it (with the mount point).
#[test]
#[ignore]
fn crash_log_laps_on_a_full_tmpfs_child() {
    use tiercache::engine::crash_log::{CrashLog, Identity, Point};
    use tiercache::engine::format::Record;
    let Some(dir) = std::env::var_os("TIERCACHE_TEST_FULL_TMPFS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let records_per_page = 256;
    let (mut log, _) = CrashLog::open(&dir.join("log"), 4 * records_per_page).unwrap();
    let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
    fill(&mut filler);
    let point = |seq| Point {
        checkpoint_generation: 1,
        journal_seq: seq,
    };
    let identity = Identity {
        boot_id: [1, 2],
        cache: [3, 4, 5, 4096],
    };
    log.reset(&identity, point(1));
    fill(&mut filler);
    // Ten laps of the ring, a commit and a trim each page and a half.
    for round in 0..30u64 {
        for i in 0..records_per_page * 3 / 2 {
            let r = Record::Unmap { slot: i as u32 };
            assert!(log.append(&r), "round {round}: the ring is never full");
        }
        log.begin_commit(point(round + 2), log.len() as usize);
        log.commit_done(point(round + 2));
        log.trim();
        fill(&mut filler);
    }
}

/// The log's pages are trimmed as commits make them durable; with hole
/// punching, another tenant that fills the tmpfs meanwhile takes the
/// freed pages and the next store into one dies of SIGBUS. The child
/// runs ten laps of the ring under exactly that and must exit cleanly.
#[test]
fn trimming_on_a_full_tmpfs_never_faults() {
    // The log (one header page and four record pages) and nothing more.
    let shm = Tmpfs::mount("20k");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_log_laps_on_a_full_tmpfs_child",
            "--ignored",
            "--nocapture",
        ])
        .env("TIERCACHE_TEST_FULL_TMPFS", shm.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "the log's writer was killed by signal {:?} (7 is SIGBUS): {text}",
        out.status.signal()
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child did not run: {text}");
    let filler = std::fs::metadata(shm.path().join("filler")).unwrap();
    assert_eq!(filler.len(), 0, "the log left no room, yet the filler grew");
}

/// Makes the test's directory and the state directory traversable by the
/// other user, as /var/lib/tiercache is (0755).
fn open_to_others(s: &Setup) {
    chmod(s.dir.path(), 0o755);
    chmod(&s.state(), 0o755);
}

/// `tiercache ARGS` as the other user.
fn as_other(s: &Setup, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={OTHER_UID}"),
            &format!("--regid={OTHER_UID}"),
            "--clear-groups",
            BIN,
        ])
        .args(args)
        .env("TIERCACHE_STATE_DIR", s.state())
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Under a umask of 0 both sockets are 0600: another user can connect to
/// neither (nbdinfo and the CLI as uid 65534 get EACCES), root can.
#[test]
fn sockets_are_private_under_umask_0() {
    need_root();
    require_tool("nbdinfo", "libnbd-bin");
    let s = Setup::new("writeback");
    let (mut cmd, _) = serve_cmd(&s, &[], &[]);
    // SAFETY: umask(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut server = KillOnDrop(cmd.spawn().unwrap());
    let (nbd, ctl) = (s.nbd_socket(), s.state().join("tc0.sock"));
    wait_for_socket(&nbd);
    wait_for_socket(&ctl);
    for sock in [&nbd, &ctl] {
        let mode = std::fs::symlink_metadata(sock).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", sock.display());
    }
    open_to_others(&s);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["nbdinfo", "--size", &s.uri()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "another user reached the volume");
    assert!(err.contains("Permission denied"), "{err}");
    let out = as_other(&s, &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Permission denied"),
        "{err}"
    );
    let size = Command::new("nbdinfo").args(["--size", &s.uri()]).output();
    assert!(size.unwrap().status.success(), "root could not connect");
    sigterm(&mut server);
}

/// Even where the mode lets another user connect (a socket made under an
/// older tiercache with a umask of 0, a chmod), its credentials are
/// refused: the request does nothing, the daemon logs the refusal.
#[test]
fn another_uid_is_refused_by_the_control_socket() {
    need_root();
    let s = Setup::new("writeback");
    let (mut server, log) = serve(&s, &[], &[]);
    open_to_others(&s);
    chmod(&s.state().join("tc0.sock"), 0o666);
    for args in [
        &["set-mode", "writethrough"][..],
        &["give-up-cache", "--lose-dirty-data"],
        &["status"],
    ] {
        let out = as_other(&s, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} as another user succeeded");
        assert!(
            err.contains("permission denied: uid 65534 may not use this control socket"),
            "{args:?}: {err}"
        );
    }
    let st = s.status();
    assert_eq!(st["mode"], "writeback", "{st}");
    assert_eq!(st["admitting"], true, "the cache was given up: {st}");
    let logged = std::fs::read_to_string(&log).unwrap();
    let refusals = logged
        .lines()
        .filter(|l| l.contains("refused a connection from uid 65534"))
        .count();
    // At least one a command (each connects twice: to see whether a
    // daemon serves the cache, then with its request).
    assert!(refusals >= 3, "{logged}");
    sigterm(&mut server);
}

/// Many idle connections (more than the daemon keeps) do not keep the
/// owner's `status` out, and an idle or slow connection is closed after
/// the request timeout (5 s).
#[test]
fn idle_control_connections_neither_block_status_nor_stay() {
    let s = Setup::new("writeback");
    let (mut server, log) = serve(&s, &[], &[]);
    let ctl = s.state().join("tc0.sock");
    let idle: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(&ctl).unwrap())
        .collect();
    let mut slow = UnixStream::connect(&ctl).unwrap();
    slow.write_all(b"{\"op\":").unwrap();
    let t = Instant::now();
    for _ in 0..5 {
        s.status();
    }
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "status waited {:?} behind idle connections",
        t.elapsed()
    );
    // The last one opened is among those still open: closed by the
    // timeout, not sooner.
    let last = UnixStream::connect(&ctl).unwrap();
    let opened = Instant::now();
    let closed_after = |mut c: &UnixStream| {
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut buf = [0u8; 64];
        let mut read = c.read(&mut buf);
        while matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::Interrupted) {
            read = c.read(&mut buf);
        }
        if !matches!(read, Ok(0)) {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            panic!(
                "{read:?} after {:?}, not a close; the daemon said:\n{said}",
                opened.elapsed()
            );
        }
    };
    closed_after(&last);
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_millis(4500) && waited < Duration::from_secs(9),
        "an idle connection was closed after {waited:?}"
    );
    closed_after(&slow);
    for c in &idle {
        closed_after(c);
    }
    s.status();
    sigterm(&mut server);
}

/// nbdinfo over TLS with the client credentials in `client_dir`; true if
/// it got the export's size.
fn nbdinfo_tls(port: u16, client_dir: &Path) -> bool {
    let uri = format!(
        "nbds://127.0.0.1:{port}/?tls-certificates={}",
        client_dir.display()
    );
    let out = Command::new("nbdinfo")
        .args(["--size", &uri])
        .output()
        .unwrap();
    out.status.success()
}

/// Serves on 0.0.0.0 (beyond loopback: the bind address decides) with
/// X.509 credentials and `extra` flags; connects through 127.0.0.1.
fn serve_network(s: &Setup, certs: &Path, extra: &[&str]) -> (KillOnDrop, u16) {
    let port = free_port();
    let addr = format!("0.0.0.0:{port}");
    let mut args = vec![
        "--tcp",
        &addr,
        "--tls-certificates",
        certs.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (server, _) = serve(s, &args, &[]);
    wait_for_tcp(&format!("127.0.0.1:{port}"));
    (server, port)
}

/// Beyond loopback, a TLS client without a certificate is refused unless
/// `--tls-verify-peer=off` is given; one with a certificate is served.
#[test]
fn x509_beyond_loopback_requires_client_certificates() {
    require_tool("nbdinfo", "libnbd-bin");
    let s = Setup::new("writeback");
    let pki = Pki::new(s.dir.path(), "ca");
    let anonymous = pki.client_dir_without_cert(s.dir.path(), "anonymous");
    let (mut server, port) = serve_network(&s, &pki.server_dir(), &[]);
    assert!(!nbdinfo_tls(port, &anonymous), "an anonymous client got in");
    assert!(
        nbdinfo_tls(port, &pki.client_dir()),
        "a certified client was refused"
    );
    sigterm(&mut server);
    let (mut server, port) = serve_network(&s, &pki.server_dir(), &["--tls-verify-peer=off"]);
    assert!(
        nbdinfo_tls(port, &anonymous),
        "refused with verification off"
    );
    sigterm(&mut server);
    let help = daemon::cli_ok_in(&s.state(), &["serve", "--help"]);
    assert!(
        help.contains("--tls-verify-peer") && help.contains("beyond loopback"),
        "{help}"
    );
}

/// Revokes `pki`'s client certificate with `openssl ca` and writes the
/// CA's CRL (v2, with a CRL number) to `<server dir>/ca-crl.pem`.
fn revoke_client_cert(pki: &Pki) {
    let root = &pki.root;
    std::fs::write(
        root.join("ca.cnf"),
        "[ca]\ndefault_ca = tc\n[tc]\ndatabase = index.txt\ncrlnumber = crlnumber\n\
         default_md = sha256\ndefault_crl_days = 2\n",
    )
    .unwrap();
    std::fs::write(root.join("index.txt"), "").unwrap();
    std::fs::write(root.join("crlnumber"), "01\n").unwrap();
    let ca = [
        "-config",
        "ca.cnf",
        "-keyfile",
        "ca-key.pem",
        "-cert",
        "ca-cert.pem",
    ];
    let mut revoke = vec!["ca"];
    revoke.extend_from_slice(&ca);
    revoke.extend_from_slice(&["-revoke", "client-cert.pem"]);
    openssl(root, &revoke);
    let mut crl = vec!["ca"];
    crl.extend_from_slice(&ca);
    crl.extend_from_slice(&["-gencrl", "-out", "ca-crl.pem"]);
    openssl(root, &crl);
    std::fs::copy(root.join("ca-crl.pem"), pki.server_dir().join("ca-crl.pem")).unwrap();
}

/// With ca-crl.pem beside the CA, a revoked client certificate is
/// refused and another of the same CA is served.
#[test]
fn a_revoked_client_certificate_is_refused() {
    require_tool("nbdinfo", "libnbd-bin");
    let s = Setup::new("writeback");
    let pki = Pki::new(s.dir.path(), "ca");
    let second = pki.second_client("second");
    let (mut server, port) = serve_network(&s, &pki.server_dir(), &[]);
    assert!(
        nbdinfo_tls(port, &pki.client_dir()),
        "before the revocation"
    );
    sigterm(&mut server);
    revoke_client_cert(&pki);
    let (mut server, port) = serve_network(&s, &pki.server_dir(), &[]);
    assert!(
        !nbdinfo_tls(port, &pki.client_dir()),
        "a revoked certificate got in"
    );
    assert!(
        nbdinfo_tls(port, &second),
        "an unrevoked certificate was refused"
    );
    sigterm(&mut server);
    // A CRL that is not one stops the start, naming the file.
    std::fs::write(pki.server_dir().join("ca-crl.pem"), "garbage\n").unwrap();
    let port = free_port().to_string();
    let addr = format!("0.0.0.0:{port}");
    let certs = pki.server_dir();
    let (cmd, _) = serve_cmd(
        &s,
        &[
            "--tcp",
            &addr,
            "--tls-certificates",
            certs.to_str().unwrap(),
        ],
        &[],
    );
    let out = run_to_end(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ca-crl.pem"), "{err}");
}

fn entry(name: &str) -> Entry {
    Entry {
        name: name.into(),
        origin: "/dev/origin".into(),
        more_origins: Vec::new(),
        cache: "/dev/cache".into(),
        more_caches: Vec::new(),
        created: registry::now_rfc3339(),
        distrust_clean: false,
    }
}

/// Two writers change one entry at once, 50 times each, each adding its
/// own member paths, while a third rewrites another entry: every change
/// is there at the end, no write failed, no temporary file is left.
#[test]
fn two_registry_writers_at_once_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    Registry::new(state.clone()).add(&entry("tc0")).unwrap();
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let state = state.clone();
            std::thread::spawn(move || {
                let reg = Registry::new(state);
                for i in 0..50 {
                    if w == 2 {
                        reg.add(&entry("other")).unwrap();
                        continue;
                    }
                    let member = format!("/dev/writer{w}-{i}");
                    let done = reg.update("tc0", |e| e.more_caches.push(member)).unwrap();
                    assert!(done.is_some());
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let got = Registry::new(state.clone()).get("tc0").unwrap().unwrap();
    assert_eq!(got.more_caches.len(), 100, "{:?}", got.more_caches);
    for w in 0..2 {
        for i in 0..50 {
            let member = format!("/dev/writer{w}-{i}");
            assert!(got.more_caches.contains(&member), "{member} lost");
        }
    }
    let left: Vec<_> = std::fs::read_dir(state.join("caches"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A cache set served: `replace-cache` swaps a member (the CLI updates
/// the registry), then the cache fails over (`give-up-cache`, through the
/// daemon, whose failover hook writes the registry). The entry keeps the
/// replacement and gains the distrust mark; the hook used to write back
/// the entry as it was at open, putting the replaced member back.
#[test]
fn a_failover_after_replace_cache_keeps_the_replacement() {
    let s = Setup {
        dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    };
    let file = |name: &str, bytes: u64| {
        let p = s.path(name);
        std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let origin = file("origin.img", 32 << 20);
    let (a, b, c) = (
        file("a.img", 16 << 20),
        file("b.img", 16 << 20),
        file("c.img", 16 << 20),
    );
    s.cli(&["create", "--origin", &origin, "--cache", &a, "--cache", &b]);
    let (mut server, _) = serve(&s, &[], &[]);
    s.cli(&["replace-cache", &b, &c]);
    let reg = Registry::new(s.state());
    assert_eq!(reg.get("tc0").unwrap().unwrap().more_caches, [c.as_str()]);
    s.cli(&["give-up-cache", "--lose-dirty-data"]);
    let after = reg.get("tc0").unwrap().unwrap();
    assert!(
        after.distrust_clean,
        "the failover was not recorded: {after:?}"
    );
    assert_eq!(
        after.more_caches,
        [c.as_str()],
        "the replacement was undone"
    );
    assert_eq!(after.cache, a);
    sigterm(&mut server);
}

/// The failover hook's own work against a real registry directory: the
/// entry changed since the open keeps its change; a removed entry is not
/// brought back.
#[test]
fn the_failover_hook_updates_the_entry_as_it_is_now() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new(dir.path().join("state"));
    let at_open = entry("tc0");
    reg.add(&at_open).unwrap();
    reg.update("tc0", |e| {
        *e = e.with_cache_replaced("/dev/cache", "/dev/new")
    })
    .unwrap();
    registry::record_failover(&reg, "tc0");
    let now = reg.get("tc0").unwrap().unwrap();
    assert_eq!(now.cache, "/dev/new");
    assert!(now.distrust_clean);
    reg.remove("tc0").unwrap();
    registry::record_failover(&reg, "tc0");
    assert!(
        reg.get("tc0").unwrap().is_none(),
        "a removed entry came back"
    );
}
