//! A lost state directory loses nothing: `tiercache scan` finds the cache
//! on its device, `tiercache import` registers it again (under its old
//! name or a new one), and its dirty data, including writes a daemon
//! killed with SIGKILL had acknowledged and only its crash log held, is
//! served and written back. A wrong origin, a device already registered
//! and a device with no cache are refused with their exit codes.

#[path = "common/daemon.rs"]
mod daemon;

use std::process::{Command, Stdio};

use daemon::{wait_for_socket, KillOnDrop, Setup, BIN};
use tiercache::device::nbd::NbdDevice;
use tiercache::device::BlockDevice;

const DIRTY: usize = 1 << 20;

fn origin_holds(s: &Setup, fill: u8) -> bool {
    let data = std::fs::read(s.path("origin.img")).unwrap();
    data[..DIRTY].iter().all(|b| *b == fill)
}

/// Serves the cache, writes `DIRTY` bytes of `fill` with a flush (so they
/// are acknowledged durable), then kills the daemon with SIGKILL.
fn write_and_kill(s: &Setup, fill: u8) {
    write_ranges_and_kill(s, &[(0, DIRTY)], fill)
}

/// As `write_and_kill`, at each `(offset, length)`.
fn write_ranges_and_kill(s: &Setup, ranges: &[(u64, usize)], fill: u8) {
    let child = Command::new(BIN)
        .arg("serve")
        .env("TIERCACHE_STATE_DIR", s.state())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    wait_for_socket(&s.nbd_socket());
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    for &(offset, len) in ranges {
        dev.write_at(&vec![fill; len], offset).unwrap();
    }
    dev.flush().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

fn code(out: &std::process::Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_wiped_state_directory_loses_nothing() {
    // No idle or age writeback: the data stays dirty on the cache.
    let args = ["--writeback-idle", "0", "--writeback-age", "3600"];
    let s = Setup::with_sizes(64 << 20, 16 << 20, &args);
    write_and_kill(&s, 0x5a);
    assert!(!origin_holds(&s, 0x5a), "written back already");
    std::fs::remove_dir_all(s.state()).unwrap();

    let cache = s.path("cache.img").to_str().unwrap().to_string();
    let origin = s.path("origin.img").to_str().unwrap().to_string();
    let scanned = s.cli(&["scan", &cache]);
    assert!(
        scanned.contains("tiercache cache 'tc0'")
            && scanned.contains("volume vol0: origin of 64 MiB")
            && scanned.contains("not registered: tiercache import"),
        "{scanned}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&s.cli(&["scan", "--json", &cache])).unwrap();
    assert_eq!(json["schema_version"], 1);
    assert_eq!(json["caches"][0]["volumes"][0]["origin_bytes"], 64 << 20);
    assert_eq!(json["caches"][0]["mode"], "writeback");

    // A file origin is not searched for: it must be given.
    let (c, err) = code(&s.cli_output(&["import", &cache]));
    assert_eq!(c, Some(3), "{err}");
    assert!(err.contains("give it with --origin"), "{err}");
    // Another file of the same size is not the origin.
    let wrong = s.path("wrong.img");
    std::fs::File::create(&wrong)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let wrong = wrong.to_str().unwrap();
    let (c, err) = code(&s.cli_output(&["import", &cache, "--origin", wrong]));
    assert_eq!(c, Some(7), "{err}");
    assert!(err.contains("origin mismatch"), "{err}");
    let (c, err) = code(&s.cli_output(&["import", wrong, "--origin", &origin]));
    assert_eq!(c, Some(3), "{err}");
    assert!(err.contains("no tiercache cache on"), "{err}");
    assert!(!s.state().join("caches").exists() || s.cli(&["list", "--noheadings"]).is_empty());

    // Under a new name: the killed daemon's crash log comes along.
    let out = s.cli(&["import", &cache, "--origin", &origin, "--name", "back"]);
    assert!(out.contains("cache 'back' imported"), "{out}");
    let st: serde_json::Value =
        serde_json::from_str(&s.cli(&["status", "--json", "--name", "back"])).unwrap();
    assert_eq!(st["cache_blocks_dirty"], (DIRTY / 4096) as u64, "{st}");
    let scanned = s.cli(&["scan", &cache]);
    assert!(scanned.contains("registered as 'back'"), "{scanned}");
    let (c, err) = code(&s.cli_output(&["import", &cache, "--origin", &origin, "--name", "x"]));
    assert_eq!(c, Some(7), "{err}");
    assert!(
        err.contains("already belongs to the registered cache 'back'"),
        "{err}"
    );

    s.cli(&["flush", "--name", "back"]);
    assert!(
        origin_holds(&s, 0x5a),
        "the dirty data did not reach the origin"
    );
}

#[test]
fn import_under_the_old_name_after_a_kill() {
    let args = ["--writeback-idle", "0", "--writeback-age", "3600"];
    let s = Setup::with_sizes(64 << 20, 16 << 20, &args);
    write_and_kill(&s, 0xa5);
    std::fs::remove_dir_all(s.state()).unwrap();
    let cache = s.path("cache.img").to_str().unwrap().to_string();
    let origin = s.path("origin.img").to_str().unwrap().to_string();
    s.cli(&["import", &cache, "--origin", &origin]);
    let list = s.cli(&["list", "-o", "name,dirty", "--units", "b", "--noheadings"]);
    assert!(list.lines().next().unwrap().starts_with("tc0"), "{list}");
    assert!(list.contains(&DIRTY.to_string()), "{list}");
    // Served again, the data reads back before any writeback.
    let _daemon = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    let mut back = vec![0u8; DIRTY];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|b| *b == 0xa5), "the volume lost its data");
}

/// A cache whose device is gone for good (the file deleted, as a dead SSD
/// the kernel dropped) can still be dealt with: give-up-cache refuses
/// until told in explicit words, then drops the registration and leaves
/// the origin untouched.
#[test]
fn a_cache_whose_device_is_gone_can_be_forgotten() {
    let args = ["--writeback-idle", "0", "--writeback-age", "3600"];
    let s = Setup::with_sizes(64 << 20, 16 << 20, &args);
    // 64 MiB in 1,024 regions of 64 KiB: the map names 0-1 MiB and the
    // one region at 40 MiB + 8 KiB.
    write_ranges_and_kill(&s, &[(0, DIRTY), ((40 << 20) + 8192, 4096)], 0x3c);
    let origin_before = std::fs::read(s.path("origin.img")).unwrap();
    std::fs::remove_file(s.path("cache.img")).unwrap();
    let stale =
        "  {origin}: 1.1 MiB in 2 ranges (regions of 64 KiB)\n    0+1048576\n    41943040+65536\n";
    let origin = s.path("origin.img").to_str().unwrap().to_string();
    let stale = stale.replace("{origin}", &origin);

    let (c, err) = code(&s.cli_output(&["status"]));
    assert_eq!(c, Some(3), "{err}");
    let (c, err) = code(&s.cli_output(&["give-up-cache"]));
    assert_eq!(c, Some(7), "{err}");
    let (c, err) = code(&s.cli_output(&["give-up-cache", "--lose-dirty-data"]));
    assert_eq!(c, Some(7), "{err}");
    assert!(err.contains("--forget") && err.contains("is gone"), "{err}");
    let out = s.cli_output(&["give-up-cache", "--lose-dirty-data"]);
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains(&stale),
        "the refusal names the stale ranges: {out}"
    );
    let out = s.cli(&["give-up-cache", "--lose-dirty-data", "--forget"]);
    assert!(
        out.contains("cache 'tc0' forgotten") && out.contains(&stale),
        "{out}"
    );
    assert!(!s.state().join("stale-maps/tc0.json").exists());
    assert!(s.cli(&["list", "--noheadings"]).is_empty());
    assert_eq!(
        std::fs::read(s.path("origin.img")).unwrap(),
        origin_before,
        "forgetting wrote the origin"
    );
    // The origin is free again: a new cache goes in front of it.
    std::fs::File::create(s.path("cache2.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let cache2 = s.path("cache2.img").to_str().unwrap().to_string();
    s.cli(&["create", "--origin", &origin, "--cache", &cache2]);
}

/// A loop device over a new file, detached when dropped.
struct Loop {
    dev: String,
}

impl Loop {
    fn new(file: &std::path::Path, bytes: u64) -> Loop {
        std::fs::File::create(file).unwrap().set_len(bytes).unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show", file.to_str().unwrap()])
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup failed (this test needs root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// On block devices nothing needs naming: `scan` without arguments reads
/// every block device of the machine and finds the cache, and `import`
/// finds its origin among them by the identity the cache recorded.
#[test]
fn block_devices_are_found_without_names() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let origin = Loop::new(&dir.path().join("origin.img"), 64 << 20);
    let cache = Loop::new(&dir.path().join("cache.img"), 16 << 20);
    let state = dir.path().join("state");
    let cli = |args: &[&str]| daemon::cli_in(&state, args);
    let ok = |args: &[&str]| daemon::cli_ok_in(&state, args);
    ok(&[
        "create",
        "--origin",
        &origin.dev,
        "--cache",
        &cache.dev,
        "--writeback-idle",
        "0",
    ]);
    ok(&["warm", "--offset", "0", "--length", "1M"]);
    std::fs::remove_dir_all(&state).unwrap();

    let found = ok(&["scan"]);
    assert!(
        found.contains(&format!("{}: tiercache cache 'tc0'", cache.dev))
            && found.contains("not registered"),
        "scan of every block device:\n{found}"
    );
    // udev's question, and the unit's ExecCondition at boot: a name no
    // device records skips the unit (1); the recorded one is imported (0).
    let udev = ok(&["scan", "--udev", &cache.dev]);
    assert_eq!(udev, "TIERCACHE_NAME=tc0\n");
    assert_eq!(ok(&["scan", "--udev", &origin.dev]), "");
    let skip = cli(&["import", "--boot", "nope"]);
    assert_eq!(skip.status.code(), Some(1), "{skip:?}");
    // An expected skip is a notice (syslog 5 under the journal), not an error.
    let err = String::from_utf8_lossy(&skip.stderr);
    assert!(
        err.starts_with("tiercache: notice: no cache named 'nope'"),
        "{err}"
    );
    let journal = Command::new(BIN)
        .args(["import", "--boot", "nope"])
        .env("TIERCACHE_STATE_DIR", &state)
        .env("JOURNAL_STREAM", "8:1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&journal.stderr);
    assert!(err.starts_with("<5>tiercache: notice: "), "{err}");
    let out = ok(&["import", "--boot", "tc0"]);
    assert!(out.contains(&format!("over {}", origin.dev)), "{out}");
    let again = cli(&["import", "--boot", "tc0"]);
    assert_eq!(again.status.code(), Some(0), "registered: {again:?}");
    let st = ok(&["status", "--json"]);
    assert!(
        st.contains(&format!("\"origin\": \"{}\"", origin.dev)),
        "{st}"
    );
    let found = ok(&["scan", &cache.dev]);
    assert!(found.contains("registered as 'tc0'"), "{found}");
    // Detached, the loop devices are free again for Drop.
    let detach = cli(&["detach"]);
    assert!(detach.status.success(), "{detach:?}");
}

/// The name on the device follows the registry: a cache imported under
/// a new name records it the first time a daemon serves it, so a registry
/// lost again brings it back under the name it was last served as.
#[test]
fn a_daemon_records_the_name_it_serves_under() {
    let s = Setup::with_sizes(64 << 20, 16 << 20, &[]);
    let cache = s.path("cache.img").to_str().unwrap().to_string();
    let origin = s.path("origin.img").to_str().unwrap().to_string();
    assert!(s.cli(&["scan", &cache]).contains("tiercache cache 'tc0'"));
    std::fs::remove_dir_all(s.state()).unwrap();
    s.cli(&["import", &cache, "--origin", &origin, "--name", "renamed"]);
    let mut daemon = KillOnDrop(
        Command::new(BIN)
            .args(["serve", "--name", "renamed"])
            .env("TIERCACHE_STATE_DIR", s.state())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&s.state().join("renamed.sock"));
    daemon::sigterm(&mut daemon);
    daemon.wait().unwrap();
    let scanned = s.cli(&["scan", &cache]);
    assert!(scanned.contains("tiercache cache 'renamed'"), "{scanned}");
}

/// Two crash logs can name one cache (a header names it by creation
/// second, origin identity and size, and a file origin's identity is an
/// inode a deleted file's successor may reuse: the suite met this). Import
/// takes the log this state directory kept under the name the cache
/// records, never another because it is newer; with only strangers to
/// choose from it refuses rather than guess.
#[test]
fn import_takes_the_cache_s_own_crash_log_among_look_alikes() {
    let args = ["--writeback-idle", "0", "--writeback-age", "3600"];
    let s = Setup::with_sizes(64 << 20, 16 << 20, &args);
    write_and_kill(&s, 0x77);
    let reg = tiercache::daemon::Registry::new(s.state());
    let own = reg.crash_log_path("tc0");
    assert!(own.exists(), "no crash log at {}", own.display());
    // Look-alikes another state directory could have left, written later.
    let dir = own.parent().unwrap();
    let strangers: Vec<std::path::PathBuf> = (0..2)
        .map(|i| {
            let p = dir.join(format!(
                "{:016x}-tc0.crashlog",
                0x5eed_0000 + i + std::process::id() as u64
            ));
            std::fs::copy(&own, &p).unwrap();
            p
        })
        .collect();
    struct Remove(Vec<std::path::PathBuf>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let _cleanup = Remove(strangers.clone());
    std::fs::remove_dir_all(s.state()).unwrap();
    let cache = s.path("cache.img").to_str().unwrap().to_string();
    let origin = s.path("origin.img").to_str().unwrap().to_string();
    s.cli(&["import", &cache, "--origin", &origin, "--name", "back"]);
    let moved = reg.crash_log_path("back");
    assert!(
        moved.exists() && !own.exists(),
        "the own log was not the one taken"
    );
    assert!(
        strangers.iter().all(|p| p.exists()),
        "a look-alike was moved"
    );
    s.cli(&["flush", "--name", "back"]);
    assert!(origin_holds(&s, 0x77), "the crash log's writes were lost");

    // Only look-alikes, under another name: refused, nothing moved.
    std::fs::remove_dir_all(s.state()).unwrap();
    let _ = std::fs::remove_file(&moved); // a clean close removes it
    let (c, err) = code(&s.cli_output(&["import", &cache, "--origin", &origin, "--name", "x"]));
    assert_eq!(c, Some(7), "{err}");
    assert!(err.contains("several crash logs match"), "{err}");
    assert!(strangers.iter().all(|p| p.exists()));
}

/// A serve in `state` (another host's state directory, say), waited for.
fn serve_in(state: &std::path::Path, name: &str) -> KillOnDrop {
    let child = Command::new(BIN)
        .args(["serve", "--name", name])
        .env("TIERCACHE_STATE_DIR", state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = KillOnDrop(child);
    wait_for_socket(&state.join(format!("{name}.nbd")));
    wait_for_socket(&state.join(format!("{name}.sock")));
    child
}

fn uri_in(state: &std::path::Path, name: &str) -> String {
    format!(
        "nbd+unix:///?socket={}",
        state.join(format!("{name}.nbd")).display()
    )
}

/// Serves `name` in `state` and writes DIRTY bytes of `fill` at `offset`,
/// flushed; the daemon goes on.
fn serve_and_write(state: &std::path::Path, name: &str, offset: u64, fill: u8) -> KillOnDrop {
    let daemon = serve_in(state, name);
    let dev = NbdDevice::connect(&uri_in(state, name), 1).unwrap();
    dev.write_at(&vec![fill; DIRTY], offset).unwrap();
    dev.flush().unwrap();
    daemon
}

/// docs/operations.md, "Moving a cache to another host", as written: the
/// old host stops its daemon (a clean shutdown), the disks move, and the
/// new host, whose state directory (and crash log directory) never heard
/// of the cache, finds it with `scan`, registers it with `import DEV
/// --name` (its origin found by the identity the cache recorded) and
/// serves its dirty data. Two state directories on one machine stand for
/// the two hosts; the loop devices for disks that keep their identity
/// (a WWID or serial) when they move.
#[test]
fn a_cache_moves_to_another_host() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let origin = Loop::new(&dir.path().join("origin.img"), 64 << 20);
    let cache = Loop::new(&dir.path().join("cache.img"), 16 << 20);
    let (old, new) = (dir.path().join("old-host"), dir.path().join("new-host"));
    daemon::cli_ok_in(
        &old,
        &[
            "create",
            "--name",
            "mv0",
            "--origin",
            &origin.dev,
            "--cache",
            &cache.dev,
            "--writeback-idle",
            "0",
            "--writeback-age",
            "3600",
        ],
    );
    let mut daemon = serve_and_write(&old, "mv0", 4096, 0x7e);
    // systemctl stop tiercache@mv0
    daemon::sigterm(&mut daemon.0);
    assert!(daemon.0.wait().unwrap().success());

    // The new host.
    let found = daemon::cli_ok_in(&new, &["scan"]);
    assert!(
        found.contains(&format!("{}: tiercache cache 'mv0'", cache.dev))
            && found.contains(&format!("not registered: tiercache import {}", cache.dev)),
        "scan on the new host:\n{found}"
    );
    assert!(
        found.contains("shut down cleanly: yes") && found.contains("1 MiB dirty"),
        "{found}"
    );
    let out = daemon::cli_ok_in(&new, &["import", &cache.dev, "--name", "mv0"]);
    assert!(out.contains(&format!("over {}", origin.dev)), "{out}");
    let mut daemon = serve_in(&new, "mv0");
    let dev = NbdDevice::connect(&uri_in(&new, "mv0"), 1).unwrap();
    let mut back = vec![0u8; DIRTY];
    dev.read_at(&mut back, 4096).unwrap();
    assert!(
        back.iter().all(|&b| b == 0x7e),
        "the moved cache's dirty data"
    );
    drop(dev);
    let st: serde_json::Value = serde_json::from_str(&daemon::cli_ok_in(
        &new,
        &["status", "--name", "mv0", "--json"],
    ))
    .unwrap();
    assert_eq!(st["cache_blocks_dirty"], 256, "{st}");
    daemon::sigterm(&mut daemon.0);
    assert!(daemon.0.wait().unwrap().success());
    // Written back there, the origin holds it alone.
    daemon::cli_ok_in(&new, &["detach", "--name", "mv0"]);
    let mut on_origin = vec![0u8; DIRTY];
    let f = std::fs::File::open(dir.path().join("origin.img")).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut on_origin, 4096).unwrap();
    assert!(on_origin.iter().all(|&b| b == 0x7e), "detach wrote it back");
}

/// A cache set is found from its members and imported whole: `scan`
/// groups the members by the set's identity, `import A B` registers the
/// set, and its dirty data (mirrored on both) is served after a kill and a
/// wiped state directory.
#[test]
fn a_cache_set_is_scanned_and_imported() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (origin, a, b) = (path("origin.img"), path("a.img"), path("b.img"));
    for (f, bytes) in [(&origin, 64u64 << 20), (&a, 16 << 20), (&b, 16 << 20)] {
        std::fs::File::create(f).unwrap().set_len(bytes).unwrap();
    }
    let state = dir.path().join("state");
    daemon::cli_ok_in(
        &state,
        &[
            "create",
            "--origin",
            &origin,
            "--cache",
            &a,
            "--cache",
            &b,
            "--writeback-idle",
            "0",
            "--writeback-age",
            "3600",
        ],
    );
    let mut daemon = serve_and_write(&state, "tc0", 0, 0x42);
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    std::fs::remove_dir_all(&state).unwrap();

    let found = daemon::cli_ok_in(&state, &["scan", &a, &b, &origin]);
    assert!(
        found.contains(&format!("{a}, {b}: tiercache cache set"))
            && found.contains("(2 of 2 members here) 'tc0'"),
        "scan groups the members:\n{found}"
    );
    // One member alone is not the set: import wants every member.
    let one = daemon::cli_in(&state, &["import", &a, "--origin", &origin]);
    assert_ne!(one.status.code(), Some(0), "{one:?}");
    daemon::cli_ok_in(&state, &["import", &a, &b, "--origin", &origin]);
    let mut daemon = serve_in(&state, "tc0");
    let dev = NbdDevice::connect(&uri_in(&state, "tc0"), 1).unwrap();
    let mut back = vec![0u8; DIRTY];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&x| x == 0x42), "the set's dirty data");
    drop(dev);
    let st: serde_json::Value =
        serde_json::from_str(&daemon::cli_ok_in(&state, &["status", "--json"])).unwrap();
    assert_eq!(st["cache_blocks_dirty"], 256, "{st}");
    assert_eq!(st["cache_set_state"], "whole", "{st}");
    daemon::sigterm(&mut daemon.0);
    daemon.0.wait().unwrap();
}

/// docs/operations.md, "The origin died": a cache whose origin is gone
/// cannot be opened, so `detach` cannot write its dirty data back; it is
/// dropped from the registry with `forget --devices-gone`, which writes
/// nothing: the cache device keeps the data, and the cache comes back
/// with `import` if the origin does. A cache whose devices are all there
/// is refused (detach is the way), and so is one a daemon serves.
#[test]
fn a_cache_whose_origin_is_gone_is_forgotten_and_comes_back() {
    let args = ["--writeback-idle", "0", "--writeback-age", "3600"];
    let s = Setup::with_sizes(64 << 20, 16 << 20, &args);
    let refused = s.cli_output(&["forget", "--devices-gone"]);
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("tiercache detach"));
    write_and_kill(&s, 0x6d);
    let (origin, cache) = (s.path("origin.img"), s.path("cache.img"));
    let cache_before = std::fs::read(&cache).unwrap();
    // The origin "dies": it is moved out of its path.
    std::fs::rename(&origin, s.path("away.img")).unwrap();
    for cmd in [&["status"][..], &["detach"], &["detach", "--force"]] {
        let (c, err) = code(&s.cli_output(cmd));
        assert_eq!(c, Some(3), "{cmd:?}: {err}");
    }
    let (c, err) = code(&s.cli_output(&["forget"]));
    assert_eq!(c, Some(7), "{err}");
    assert!(
        err.contains("--devices-gone") && err.contains("origin.img"),
        "{err}"
    );
    let out = s.cli(&["forget", "--devices-gone"]);
    assert!(
        out.contains("cache 'tc0' forgotten; nothing was written"),
        "{out}"
    );
    assert!(out.contains("tiercache import"), "{out}");
    assert!(s.cli(&["list", "--noheadings"]).is_empty());
    assert!(
        std::fs::read(&cache).unwrap() == cache_before,
        "forget wrote the cache device"
    );
    // The origin returns: the cache, dirty data and all, comes back.
    std::fs::rename(s.path("away.img"), &origin).unwrap();
    let (cache, origin) = (cache.to_str().unwrap(), origin.to_str().unwrap());
    s.cli(&["import", cache, "--origin", origin]);
    let _daemon = s.serve();
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    let mut back = vec![0u8; DIRTY];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0x6d), "the dirty data came back");
    let served = s.cli_output(&["forget", "--devices-gone"]);
    assert_eq!(served.status.code(), Some(4), "{served:?}");
}
