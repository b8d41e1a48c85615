//! Devices are claimed, and nothing overwrites what it should not (issue
//! 32): the built binary against files and loop devices.
//!
//! - A device one tiercache writes is refused to every other opener (a
//!   second daemon from another state directory, `create --force`, a RAM
//!   cache over a served origin), naming the holder's PID and its cache;
//!   block devices through O_EXCL, which binds other programs too.
//! - `create` refuses a device that holds something (ext4, LVM, GPT, swap,
//!   a tiercache cache) unless told `--wipe`, and replacing a registered
//!   cache with dirty blocks needs `--lose-dirty-data`.
//! - `status`, `check` and `top` write no byte of any device.

#[path = "common/daemon.rs"]
mod daemon;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use daemon::{cli_in, need, sigterm, KillOnDrop, Setup};
use tiercache::daemon::registry::{open_cache, Registry};
use tiercache::device::nbd::NbdDevice;
use tiercache::device::{open_device, BlockDevice};
use tiercache::engine::{Engine, OpenOptions};

const ORIGIN_BYTES: u64 = 64 << 20;
const CACHE_BYTES: u64 = 16 << 20;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts success; returns stdout.
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tiercache failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts a refusal whose error line holds every one of `what`: exit 4
/// (busy) for a device in use, else 7 (refused for safety).
fn refused(out: &Output, what: &[&str]) -> String {
    let err = stderr(out);
    let busy = (what.iter()).any(|w| w.contains("in use") || w.contains("exclusively"));
    let code = if busy { 4 } else { 7 };
    assert_eq!(out.status.code(), Some(code), "not refused: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("tiercache: error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    for w in what {
        assert!(line.contains(w), "expected '{w}' in: {line}");
    }
    line.to_string()
}

/// The file's SHA-256, or "missing".
fn sha256(path: &Path) -> String {
    if !path.exists() {
        return "missing".into();
    }
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

fn sha256_all(paths: &[PathBuf]) -> Vec<String> {
    paths.iter().map(|p| sha256(p)).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A second state directory that has the same cache registered (the
/// mistake of issue 32: a copied or restored registry, or two hosts'
/// configurations pointing at one device).
fn second_state_dir(setup: &Setup) -> PathBuf {
    let b = setup.path("state-b");
    std::fs::create_dir_all(b.join("caches")).unwrap();
    std::fs::copy(
        setup.state().join("caches/tc0.json"),
        b.join("caches/tc0.json"),
    )
    .unwrap();
    b
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// A served writeback cache holding a flushed megabyte written through
/// NBD; returns the daemon and the data.
fn served_with_data(setup: &Setup) -> (KillOnDrop, Vec<u8>) {
    let server = setup.serve();
    let data = pattern(1 << 20, 0x5a);
    let dev = NbdDevice::connect(&setup.uri(), 1).unwrap();
    dev.write_at(&data, 0).unwrap();
    dev.flush().unwrap();
    (server, data)
}

/// The served volume still reads `data`; after a clean stop the metadata
/// checks out.
fn first_daemon_intact(setup: &Setup, mut server: KillOnDrop, data: &[u8]) {
    let dev = NbdDevice::connect(&setup.uri(), 1).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back == data, "the first daemon's data changed");
    drop(dev);
    sigterm(&mut server);
    let check = setup.cli(&["check"]);
    assert!(check.contains(": ok"), "{check}");
}

#[test]
fn a_second_serve_of_one_cache_file_is_refused_naming_the_first() {
    let setup = Setup::with_sizes(ORIGIN_BYTES, CACHE_BYTES, &["--mode", "writeback"]);
    let (server, data) = served_with_data(&setup);
    let b = second_state_dir(&setup);
    let pid = server.id().to_string();
    let line = refused(
        &cli_in(&b, &["serve"]),
        &[
            "cache.img is in use",
            &pid,
            "locked for writing",
            "cache 'tc0'",
        ],
    );
    assert!(line.contains(s(&setup.state())), "{line}");
    // Looking is refused too: a reader would see the writer's half-done work.
    for cmd in [&["status"][..], &["check"]] {
        refused(&cli_in(&b, cmd), &["in use", &pid]);
    }
    first_daemon_intact(&setup, server, &data);
}

#[test]
fn create_over_a_served_cache_from_another_state_dir_is_refused() {
    let setup = Setup::with_sizes(ORIGIN_BYTES, CACHE_BYTES, &["--mode", "writeback"]);
    let (server, data) = served_with_data(&setup);
    let b = second_state_dir(&setup);
    let pid = server.id().to_string();
    let (origin, cache) = (setup.path("origin.img"), setup.path("cache.img"));
    let other_origin = setup.path("other-origin.img");
    std::fs::File::create(&other_origin)
        .unwrap()
        .set_len(ORIGIN_BYTES)
        .unwrap();
    let create = |state: &Path, origin: &Path, extra: &[&str]| {
        let mut args = vec!["create", "--origin", s(origin), "--cache", s(&cache)];
        args.extend_from_slice(extra);
        cli_in(state, &args)
    };
    // The registered name, with every consent flag: still refused.
    let all = ["--force", "--wipe", "--lose-dirty-data"];
    refused(&create(&b, &origin, &all), &["in use", &pid]);
    refused(&create(&b, &origin, &["--force"]), &["in use", &pid]);
    // A fresh state directory, another origin: the cache device is held.
    let c = setup.path("state-c");
    refused(
        &create(&c, &other_origin, &["--wipe", "--lose-dirty-data"]),
        &["cache.img is in use", &pid, "cache 'tc0'"],
    );
    assert!(!c.join("caches/tc0.json").exists(), "registered anyway");
    first_daemon_intact(&setup, server, &data);
}

#[test]
fn a_ram_cache_over_the_origin_of_a_served_writeback_cache_is_refused() {
    let setup = Setup::with_sizes(ORIGIN_BYTES, CACHE_BYTES, &["--mode", "writeback"]);
    let (server, data) = served_with_data(&setup);
    let pid = server.id().to_string();
    let origin = setup.path("origin.img");
    let out = cli_in(
        &setup.path("state-ram"),
        &["serve", "--origin", s(&origin), "--ram-cache", "8M"],
    );
    refused(
        &out,
        &["origin.img is in use", &pid, "the origin of cache 'tc0'"],
    );
    first_daemon_intact(&setup, server, &data);
}

/// A loop device over a new file in the test's directory, detached when
/// dropped.
struct Loop {
    dev: String,
}

impl Loop {
    fn new(file: &Path, bytes: u64) -> Loop {
        std::fs::File::create(file).unwrap().set_len(bytes).unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show", s(file)])
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup failed (this test needs root and loop devices): {}",
            stderr(&out)
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

/// A program that is not tiercache holds `dev` with O_EXCL (as mkfs or a
/// mount would) while the returned child lives.
fn hold_exclusively(dev: &str) -> KillOnDrop {
    let script = format!(
        "import os, sys, time\nfd = os.open({dev:?}, os.O_RDONLY | os.O_EXCL)\n\
         print('held', flush=True)\ntime.sleep(120)\n"
    );
    let mut child = KillOnDrop(
        Command::new("python3")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held", "the holder did not start");
    child
}

#[test]
fn loop_devices_are_claimed_with_o_excl() {
    need("losetup", "mount");
    need("python3", "python3");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let origin = Loop::new(&dir.path().join("origin.img"), ORIGIN_BYTES);
    let cache = Loop::new(&dir.path().join("cache.img"), CACHE_BYTES);
    let a = dir.path().join("state-a");
    let create = ["create", "--origin", &origin.dev, "--cache", &cache.dev];
    ok(&cli_in(&a, &create));
    let mut server = KillOnDrop(
        Command::new(daemon::BIN)
            .arg("serve")
            .env("TIERCACHE_STATE_DIR", &a)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    daemon::wait_for_socket(&a.join("tc0.sock"));
    let pid = server.id().to_string();
    let b = dir.path().join("state-b");
    std::fs::create_dir_all(b.join("caches")).unwrap();
    std::fs::copy(a.join("caches/tc0.json"), b.join("caches/tc0.json")).unwrap();
    refused(
        &cli_in(&b, &["serve"]),
        &[&format!("{} is in use", cache.dev), &pid, "cache 'tc0'"],
    );
    let ram = ["serve", "--origin", &origin.dev, "--ram-cache", "8M"];
    refused(&cli_in(&b, &ram), &[&origin.dev, "in use", &pid]);
    sigterm(&mut server);

    // O_EXCL binds programs that are not tiercache: one holds the cache.
    let holder = hold_exclusively(&cache.dev);
    let c = dir.path().join("state-c");
    let out = cli_in(&c, &create);
    refused(
        &out,
        &["exclusively (O_EXCL)", &holder.id().to_string(), &cache.dev],
    );
    drop(holder);
    // Free again: the old cache is there, created over with --wipe.
    let wiped = [&create[..], &["--wipe"]].concat();
    ok(&cli_in(&c, &wiped));
}

/// A 16 MiB file made by `make`, for the signature cases.
fn device_file(dir: &Path, name: &str, make: impl FnOnce(&Path)) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .set_len(CACHE_BYTES)
        .unwrap();
    make(&p);
    p
}

fn run(cmd: &str, args: &[&str], stdin: &str) {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", stderr(&out));
}

#[test]
fn create_refuses_a_device_that_holds_something_without_wipe() {
    need("mkfs.ext4", "e2fsprogs");
    need("sfdisk", "fdisk");
    need("mkswap", "util-linux");
    need("blkid", "util-linux");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let d = dir.path();
    let origin = d.join("origin.img");
    std::fs::File::create(&origin)
        .unwrap()
        .set_len(ORIGIN_BYTES)
        .unwrap();
    let ext4 = device_file(d, "ext4.img", |p| run("mkfs.ext4", &["-q", "-F", s(p)], ""));
    let gpt = device_file(d, "gpt.img", |p| {
        run("sfdisk", &["-q", s(p)], "label: gpt\n,4MiB\n")
    });
    let swap = device_file(d, "swap.img", |p| run("mkswap", &[s(p)], ""));
    let lvm = device_file(d, "lvm.img", |p| {
        // pvcreate's label: "LABELONE" in sector 1, type "LVM2 001" at 24.
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(b"LABELONE", 512).unwrap();
        f.write_all_at(b"LVM2 001", 512 + 24).unwrap();
    });
    let ours = device_file(d, "tiercache.img", |p| {
        let other = d.join("other-origin.img");
        std::fs::File::create(&other)
            .unwrap()
            .set_len(ORIGIN_BYTES)
            .unwrap();
        let args = ["create", "--origin", s(&other), "--cache", s(p)];
        ok(&cli_in(&d.join("state-other"), &args));
    });
    let cases = [
        (&ext4, "an ext4 filesystem"),
        (&gpt, "a GPT partition table"),
        (&swap, "Linux swap space"),
        (&lvm, "an LVM2 physical volume"),
        (
            &ours,
            "already holds a tiercache cache (mode writeback, 0 dirty blocks",
        ),
    ];
    for (i, (dev, what)) in cases.into_iter().enumerate() {
        let state = d.join(format!("state-{i}"));
        let before = sha256_all(&[origin.clone(), dev.clone()]);
        let args = ["create", "--origin", s(&origin), "--cache", s(dev)];
        refused(&cli_in(&state, &args), &[what, "--wipe"]);
        assert_eq!(sha256_all(&[origin.clone(), dev.clone()]), before, "{what}");
        assert!(
            !state.join("caches/tc0.json").exists(),
            "{what}: registered"
        );
        let out = ok(&cli_in(&state, &[&args[..], &["--wipe"]].concat()));
        assert!(out.contains("created cache 'tc0'"), "{out}");
        assert!(ok(&cli_in(&state, &["check"])).contains(": ok"));
        // What other tools would find is gone too (blkid exits 2: nothing).
        let blkid = Command::new("blkid").args(["-p", s(dev)]).output().unwrap();
        assert_eq!(
            blkid.status.code(),
            Some(2),
            "{what}: blkid still finds {blkid:?}"
        );
        // The origin is never written by create.
        assert_eq!(sha256(&origin), before[0]);
        ok(&cli_in(&state, &["detach"]));
    }
}

/// Writes `blocks` 4 KiB blocks through the engine and closes it cleanly:
/// they stay dirty (no background writeback ran).
fn write_dirty(cache: Arc<dyn BlockDevice>, origin: &Path, blocks: u64) {
    let opts = OpenOptions {
        no_background: true,
        ..OpenOptions::default()
    };
    let engine = Engine::open(cache, open_device(s(origin)).unwrap(), &opts).unwrap();
    for b in 0..blocks {
        engine
            .write(b * 8192, &pattern(4096, b as u8), false)
            .unwrap();
    }
    engine.close().unwrap();
}

#[test]
fn create_force_over_a_registered_cache_with_dirty_blocks_is_refused() {
    let setup = Setup::with_sizes(ORIGIN_BYTES, CACHE_BYTES, &["--mode", "writeback"]);
    let (origin, cache) = (setup.path("origin.img"), setup.path("cache.img"));
    write_dirty(open_device(s(&cache)).unwrap(), &origin, 1000);
    let blank = setup.path("blank.img");
    std::fs::File::create(&blank)
        .unwrap()
        .set_len(CACHE_BYTES)
        .unwrap();
    let entry = setup.state().join("caches/tc0.json");
    let all = [origin.clone(), cache.clone(), blank.clone(), entry];
    let before = sha256_all(&all);
    let create = |c: &Path, extra: &[&str]| {
        let mut args = vec!["create", "--origin", s(&origin), "--cache", s(c)];
        args.extend_from_slice(extra);
        setup.cli_output(&args)
    };
    let says = ["1000 dirty blocks", "--lose-dirty-data", "tiercache flush"];
    refused(&create(&cache, &["--force"]), &says);
    refused(&create(&cache, &["--force", "--wipe"]), &says);
    // Another device: the old cache would be unregistered, its data lost.
    refused(&create(&blank, &["--force"]), &says);
    // Wiping the old device under another name: its dirty blocks count too.
    refused(
        &cli_in(
            &setup.path("state-b"),
            &[
                "create",
                "--origin",
                s(&blank),
                "--cache",
                s(&cache),
                "--wipe",
            ],
        ),
        &["1000 dirty blocks", "--lose-dirty-data"],
    );
    assert_eq!(
        sha256_all(&all),
        before,
        "a refused create changed something"
    );
    let status: serde_json::Value =
        serde_json::from_str(&setup.cli(&["status", "--json"])).unwrap();
    assert_eq!(status["cache_blocks_dirty"], 1000);
    // Said in as many words: done.
    let out = create(&cache, &["--force", "--wipe", "--lose-dirty-data"]);
    ok(&out);
    let status: serde_json::Value =
        serde_json::from_str(&setup.cli(&["status", "--json"])).unwrap();
    assert_eq!(status["cache_blocks_dirty"], 0);
}

/// Runs every read-only command on the cache of `state` and asserts that
/// none changed a byte of `devices`; returns `status --json`.
fn look_without_writing(state: &Path, devices: &[PathBuf]) -> serde_json::Value {
    let before = sha256_all(devices);
    let commands: [&[&str]; 5] = [
        &["status"],
        &["status", "--json"],
        &["check"],
        &["check", "--json"],
        &["top", "--count", "1"],
    ];
    let mut json = serde_json::Value::Null;
    for cmd in commands {
        let out = ok(&cli_in(state, cmd));
        assert_eq!(sha256_all(devices), before, "`{}` wrote", cmd.join(" "));
        match cmd {
            ["status"] => assert!(out.contains("not served"), "{out}"),
            ["status", "--json"] => json = serde_json::from_str(&out).unwrap(),
            ["check"] => assert!(out.contains(": ok"), "{out}"),
            _ => {}
        }
    }
    assert_eq!(json["state"], "not served", "{json}");
    json
}

/// Dirty blocks, a journal to replay, no clean shutdown: one device, and a
/// cache set of two.
#[test]
fn read_only_commands_write_no_byte_after_a_crash() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let origin = dir.path().join("origin.img");
    std::fs::File::create(&origin)
        .unwrap()
        .set_len(ORIGIN_BYTES)
        .unwrap();
    for members in [1usize, 2] {
        let state = dir.path().join(format!("state-{members}"));
        let caches: Vec<PathBuf> = (0..members)
            .map(|i| dir.path().join(format!("cache-{members}-{i}.img")))
            .collect();
        let mut args = vec!["create", "--origin", s(&origin)];
        for c in &caches {
            std::fs::File::create(c)
                .unwrap()
                .set_len(CACHE_BYTES)
                .unwrap();
            args.extend(["--cache", s(c)]);
        }
        ok(&cli_in(&state, &args));
        let paths: Vec<String> = caches.iter().map(|c| s(c).to_string()).collect();
        let opts = OpenOptions {
            no_background: true,
            ..OpenOptions::default()
        };
        let engine = Engine::open(
            open_cache(&paths, false, open_device).unwrap(),
            open_device(s(&origin)).unwrap(),
            &opts,
        )
        .unwrap();
        for b in 0..64u64 {
            engine.write(b * 4096, &pattern(4096, 7), false).unwrap();
        }
        // Committed to the journal, then the process "dies".
        engine.flush().unwrap();
        engine.abandon();
        drop(engine);
        let devices: Vec<PathBuf> = caches.iter().cloned().chain([origin.clone()]).collect();
        let json = look_without_writing(&state, &devices);
        assert_eq!(json["cache_blocks_dirty"], 64, "{members} members");
        let check = ok(&cli_in(&state, &["check"]));
        assert!(check.contains("shut down cleanly: no"), "{check}");
        assert!(!check.contains("journal pages to replay: 0"), "{check}");
        assert!(check.contains("format 2, mode writeback"), "{check}");
    }
}

/// A killed daemon leaves records in its crash log only: status shows them
/// applied (in memory) and writes nothing; the log itself is not changed.
#[test]
fn read_only_commands_write_no_byte_with_a_crash_log() {
    let setup = Setup::with_sizes(ORIGIN_BYTES, CACHE_BYTES, &["--mode", "writeback"]);
    // The background commits once a second: a kill right after the writes
    // nearly always leaves some of them in the log only; try again if not.
    let logged = (0..5).any(|_| {
        let mut server = setup.serve();
        let dev = NbdDevice::connect(&setup.uri(), 1).unwrap();
        for b in 0..64u64 {
            dev.write_at(&pattern(4096, b as u8), b * 4096).unwrap();
        }
        server.kill().unwrap();
        server.wait().unwrap();
        setup
            .cli(&["check"])
            .contains("records the last daemon acknowledged but did not journal")
    });
    assert!(logged, "no kill left records in the crash log");
    let log = Registry::new(setup.state()).crash_log_path("tc0");
    let devices = [setup.path("cache.img"), setup.path("origin.img"), log];
    let json = look_without_writing(&setup.state(), &devices);
    assert!(
        json["stats"]["crash_log_records_recovered"].as_u64() > Some(0),
        "{json}"
    );
    assert!(json["cache_blocks_dirty"].as_u64() > Some(0), "{json}");
    // The log lives in shared memory, outside the test's directory.
    let _ = std::fs::remove_file(&devices[2]);
}
