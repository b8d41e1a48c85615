//! The `tiercache` command end to end: the built binary against files on
//! the real disk (O_DIRECT needs a real filesystem, not tmpfs), with a
//! private state directory per test.

#[path = "common/daemon.rs"]
mod daemon;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Output;

use tiercache::device::file::create_file;
use tiercache::device::{fnv1a64, open_device};
use tiercache::engine::format::Layout;
use tiercache::engine::{Engine, OpenOptions};

const ORIGIN_BYTES: u64 = 16 << 20;
const CACHE_BYTES: u64 = 8 << 20;

struct Setup {
    dir: tempfile::TempDir,
    state: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::Builder::new()
            .prefix("cli-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let state = dir.path().join("state");
        Setup { dir, state }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// A sparse (all-zero) file.
    fn sparse(&self, name: &str, size_bytes: u64) -> String {
        let p = self.path(name);
        create_file(&p, size_bytes).expect("create file");
        p
    }

    /// A file full of non-zero bytes, so that any write shows in its hash
    /// (writing zeroes over a sparse file would not).
    fn filled(&self, name: &str, size_bytes: u64) -> String {
        let p = self.path(name);
        let data: Vec<u8> = (0..size_bytes).map(|i| (i % 251) as u8 | 0x80).collect();
        std::fs::write(&p, data).expect("write file");
        p
    }

    fn tc(&self, args: &[&str]) -> Output {
        self.tc_in(&self.state, args)
    }

    /// `tiercache create --origin ORIGIN --cache CACHE EXTRA...`.
    fn create(&self, origin: &str, cache: &str, extra: &[&str]) -> Output {
        let mut args = vec!["create", "--origin", origin, "--cache", cache];
        args.extend_from_slice(extra);
        self.tc(&args)
    }

    fn tc_in(&self, state: &std::path::Path, args: &[&str]) -> Output {
        daemon::cli_in(state, args)
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts success and returns stdout.
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tiercache failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// Asserts a failure with exit `code` and exactly one stderr line, the
/// error, containing `what`.
fn fails(out: &Output, code: i32, what: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}\nstdout:\n{}\nstderr:\n{err}",
        stdout(out)
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got:\n{err}");
    assert!(
        lines[0].starts_with("tiercache: error: "),
        "not an error line: {err}"
    );
    assert!(lines[0].contains(what), "expected '{what}' in: {err}");
}

fn hash(path: &str) -> u64 {
    fnv1a64(&std::fs::read(path).expect("read file"))
}

fn status_json(s: &Setup) -> serde_json::Value {
    let text = ok(&s.tc(&["status", "--json"]));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{text}"))
}

fn pattern(offset: u64, len: usize, seed: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i) / 512 % 200) as u8 + seed)
        .collect()
}

/// Writes through the engine library, as a client of the volume would,
/// and shuts down cleanly.
fn write_through_engine(origin: &str, cache: &str, writes: &[(u64, usize, u8)]) {
    let opts = OpenOptions {
        no_background: true,
        ..OpenOptions::default()
    };
    let engine = Engine::open(
        open_device(cache).unwrap(),
        open_device(origin).unwrap(),
        &opts,
    )
    .expect("open cache");
    for &(offset, len, seed) in writes {
        engine
            .write(offset, &pattern(offset, len, seed), false)
            .expect("write");
    }
    engine.flush().expect("flush");
    engine.close().expect("close");
}

fn origin_holds(origin: &str, offset: u64, len: usize, seed: u8) -> bool {
    let f = std::fs::File::open(origin).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf == pattern(offset, len, seed)
}

#[test]
fn round_trip_create_status_flush_set_mode_detach() {
    let s = Setup::new();
    let origin = s.sparse("origin.img", ORIGIN_BYTES);
    let cache = s.sparse("cache.img", CACHE_BYTES);

    let out = ok(&s.create(
        &origin,
        &cache,
        &[
            "--block-size",
            "64KiB",
            "--policy",
            "fifo",
            "--writeback-high",
            "80",
            "--max-dirty-age",
            "9",
        ],
    ));
    assert!(out.contains("created cache 'tc0'"), "{out}");
    let reg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.state.join("caches/tc0.json")).unwrap())
            .unwrap();
    assert_eq!(reg["name"], "tc0");
    assert_eq!(reg["origin"], origin.as_str());
    assert_eq!(reg["cache"], cache.as_str());
    assert!(reg["created"].as_str().unwrap().ends_with('Z'));

    let table = ok(&s.tc(&["status"]));
    for want in ["mode", "writeback", "fifo", "64 KiB", "16 MiB", "hit ratio"] {
        assert!(table.contains(want), "'{want}' missing from:\n{table}");
    }
    let st = status_json(&s);
    assert_eq!(st["name"], "tc0");
    assert_eq!(st["mode"], "writeback");
    assert_eq!(st["policy"], "fifo");
    assert_eq!(st["block_bytes"], 65536);
    assert_eq!(st["volume_bytes"], ORIGIN_BYTES);
    assert_eq!(st["writeback"]["high_pct"], 80);
    assert_eq!(st["writeback"]["max_age_secs"], 9);
    assert_eq!(st["cache_blocks_dirty"], 0);

    // Settings persist across commands.
    ok(&s.tc(&["set-writeback", "--high", "60", "--low", "10", "--age", "5"]));
    let st = status_json(&s);
    assert_eq!(st["writeback"]["high_pct"], 60);
    assert_eq!(st["writeback"]["low_pct"], 10);
    assert_eq!(st["writeback"]["max_age_secs"], 5);
    // The same bound by the name of what it bounds: how long a lost cache
    // device can leave the origin stale.
    ok(&s.tc(&["set-writeback", "--max-dirty-age", "4"]));
    assert_eq!(status_json(&s)["writeback"]["max_age_secs"], 4);
    fails(
        &s.tc(&["set-writeback", "--low", "90"]),
        2,
        "above the high",
    );
    let before = hash(&cache);
    fails(&s.tc(&["set-writeback", "--high", "101"]), 2, "above 100%");
    fails(
        &s.tc(&["set-writeback", "--age", "0"]),
        2,
        "at least 1 second",
    );
    assert_eq!(hash(&cache), before, "refused settings opened the cache");

    // Admission and policy, persisted, refused with a clear error.
    let st = status_json(&s);
    assert_eq!(
        st["admission_settings"]["sequential_cutoff_bytes"],
        4 << 20,
        "the default cutoff"
    );
    let out = ok(&s.tc(&[
        "set-admission",
        "--sequential-cutoff",
        "8M",
        "--promote-after",
        "2",
        "--guard",
        "off",
    ]));
    assert!(out.contains("streams over 8 MiB go around"), "{out}");
    let st = status_json(&s);
    assert_eq!(st["admission_settings"]["sequential_cutoff_bytes"], 8 << 20);
    assert_eq!(st["admission_settings"]["promote_after"], 2);
    assert_eq!(st["admission_settings"]["guard"], false);
    let before = hash(&cache);
    fails(
        &s.tc(&["set-admission", "--promote-after", "0"]),
        2,
        "outside 1..=15",
    );
    fails(
        &s.tc(&["set-admission", "--guard", "maybe"]),
        2,
        "on or off",
    );
    fails(
        &s.tc(&["set-admission", "--sequential-cutoff", "1000"]),
        2,
        "multiple of 512",
    );
    fails(
        &s.tc(&["set-policy", "clock"]),
        2,
        "unknown replacement policy 'clock'",
    );
    assert_eq!(hash(&cache), before, "refused settings opened the cache");
    let out = ok(&s.tc(&["set-policy", "s3fifo"]));
    assert!(out.contains("fifo -> s3fifo"), "{out}");
    assert_eq!(status_json(&s)["policy"], "s3fifo");
    ok(&s.tc(&["set-policy", "fifo"]));

    // Dirty data written through the library, then `flush`.
    write_through_engine(&origin, &cache, &[(0, 65536, 1), (1 << 20, 1 << 20, 2)]);
    assert!(
        !origin_holds(&origin, 1 << 20, 1 << 20, 2),
        "writeback mode wrote the origin at once"
    );
    assert_eq!(status_json(&s)["cache_blocks_dirty"], 17);
    let out = ok(&s.tc(&["flush"]));
    assert!(out.contains("17 blocks"), "{out}");
    assert_eq!(status_json(&s)["cache_blocks_dirty"], 0);
    assert!(origin_holds(&origin, 0, 65536, 1));
    assert!(origin_holds(&origin, 1 << 20, 1 << 20, 2));
    let out = ok(&s.tc(&["check"]));
    assert!(out.contains(": ok"), "{out}");

    // Leaving writeback writes dirty data back first.
    write_through_engine(&origin, &cache, &[(4 << 20, 65536, 3)]);
    let out = ok(&s.tc(&["set-mode", "writethrough"]));
    assert!(out.contains("writeback -> writethrough"), "{out}");
    assert!(out.contains("1 dirty blocks written back"), "{out}");
    assert!(origin_holds(&origin, 4 << 20, 65536, 3));
    assert_eq!(status_json(&s)["mode"], "writethrough");
    fails(&s.tc(&["set-mode", "fast"]), 2, "unknown cache mode 'fast'");
    ok(&s.tc(&["set-mode", "writeback"]));

    // Detach writes back what is dirty and leaves the origin alone.
    write_through_engine(&origin, &cache, &[(8 << 20, 2 << 20, 4)]);
    assert!(!origin_holds(&origin, 8 << 20, 2 << 20, 4));
    let out = ok(&s.tc(&["detach"]));
    assert!(out.contains("32 blocks written back"), "{out}");
    assert!(out.contains("stands alone"), "{out}");
    for (offset, len, seed) in [
        (0, 65536, 1),
        (1 << 20, 1 << 20, 2),
        (4 << 20, 65536, 3),
        (8 << 20, 2 << 20, 4),
    ] {
        assert!(
            origin_holds(&origin, offset, len, seed),
            "origin lacks data at {offset}"
        );
    }
    assert!(!s.state.join("caches/tc0.json").exists());
    fails(&s.tc(&["status"]), 3, "no cache; run tiercache create");
    // The cache device holds no cache any more.
    fails(&s.tc(&["check", "--cache", &cache]), 5, "damage");
}

#[test]
fn bad_arguments_write_nothing() {
    let s = Setup::new();
    let origin = s.filled("origin.img", ORIGIN_BYTES);
    let cache = s.filled("cache.img", CACHE_BYTES);
    let small_cache = s.filled("small.img", 1 << 20);
    let tiny_origin = s.filled("tiny.img", 32 << 10);
    let files = [&origin, &cache, &small_cache, &tiny_origin];
    let hashes = || files.iter().map(|f| hash(f)).collect::<Vec<_>>();
    let before = hashes();
    let missing = s.path("missing.img");

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--block-size", "3000"], "block size '3000' is invalid"),
        (vec!["--block-size", "2M"], "power of two"),
        (vec!["--block-size", "lots"], "not a size"),
        (vec!["--mode", "fast"], "unknown cache mode 'fast'"),
        (vec!["--policy", "random"], "unknown replacement policy"),
        (
            vec!["--placement", "sideways"],
            "unknown placement 'sideways'",
        ),
        (
            vec!["--writeback-order", "random"],
            "unknown writeback order 'random'",
        ),
        (vec!["--writeback-high", "101"], "above 100"),
        (vec!["--writeback-low", "60"], "above the high"),
        (vec!["--name", "a/b"], "invalid cache name"),
    ];
    for (extra, what) in cases {
        fails(&s.create(&origin, &cache, &extra), 2, what);
    }
    // Exit 3: not there; 2: not usable as asked (tiercache --help).
    let device_cases: Vec<([&str; 4], i32, &str)> = vec![
        (["--origin", &missing, "--cache", &cache], 3, "No such file"),
        (
            ["--origin", &origin, "--cache", &missing],
            3,
            "No such file",
        ),
        (
            ["--origin", &origin, "--cache", &small_cache],
            2,
            "too small",
        ),
        (["--origin", &origin, "--cache", "ram:64M"], 2, "RAM"),
        (["--origin", &origin, "--cache", &origin], 2, "same device"),
    ];
    for (args, code, what) in device_cases {
        let mut args = args.to_vec();
        args.insert(0, "create");
        fails(&s.tc(&args), code, what);
    }
    fails(
        &s.create(&tiny_origin, &cache, &["--block-size", "64K"]),
        2,
        "smaller than one cache block",
    );
    assert_eq!(hashes(), before, "a refused create wrote a device");
    fails(&s.tc(&["status"]), 3, "no cache; run tiercache create");

    // Over an existing cache.
    ok(&s.create(&origin, &cache, &[]));
    let created = hashes();
    fails(&s.create(&origin, &cache, &[]), 7, "already registered");
    fails(
        &s.create(&origin, &cache, &["--name", "tc1"]),
        7,
        "already used by cache 'tc0'",
    );
    let other_state = s.dir.path().join("other-state");
    fails(
        &s.tc_in(
            &other_state,
            &["create", "--origin", &origin, "--cache", &cache],
        ),
        7,
        "already holds a tiercache cache",
    );
    fails(
        &s.tc(&["status", "--name", "nope"]),
        3,
        "no cache named 'nope'; registered: tc0",
    );
    fails(
        &s.tc(&["flush", "--name", "nope"]),
        3,
        "no cache named 'nope'",
    );
    fails(
        &s.tc(&["detach", "--name", "nope"]),
        3,
        "no cache named 'nope'",
    );
    fails(&s.tc(&["set-mode", "fast"]), 2, "unknown cache mode");
    assert_eq!(hashes(), created, "a refused command wrote a device");

    // --force replaces the registration; the device holding the old cache
    // also takes --wipe (one flag, one consent).
    let writethrough = ["--force", "--mode", "writethrough"];
    fails(&s.create(&origin, &cache, &writethrough), 7, "pass --wipe");
    assert_eq!(hashes(), created, "a refused create wrote a device");
    let out = ok(&s.create(&origin, &cache, &[&writethrough[..], &["--wipe"]].concat()));
    assert!(out.contains("writethrough"), "{out}");
    assert_eq!(status_json(&s)["mode"], "writethrough");
    assert_eq!(hashes()[0], before[0], "create wrote the origin");
}

#[test]
fn default_name_needs_exactly_one_cache() {
    let s = Setup::new();
    fails(&s.tc(&["flush"]), 3, "no cache; run tiercache create");
    for n in ["a", "b"] {
        let origin = s.sparse(&format!("{n}-origin.img"), ORIGIN_BYTES);
        let cache = s.sparse(&format!("{n}-cache.img"), CACHE_BYTES);
        ok(&s.create(&origin, &cache, &["--name", n]));
    }
    fails(
        &s.tc(&["status"]),
        2,
        "several caches are registered (a, b); pick one with --name",
    );
    let st: serde_json::Value =
        serde_json::from_str(&ok(&s.tc(&["status", "--json", "--name", "b"]))).unwrap();
    assert_eq!(st["name"], "b");
    ok(&s.tc(&["detach", "--name", "a"]));
    assert_eq!(status_json(&s)["name"], "b");
}

#[test]
fn check_reports_corrupted_checkpoint() {
    let s = Setup::new();
    let origin = s.sparse("origin.img", ORIGIN_BYTES);
    let cache = s.sparse("cache.img", CACHE_BYTES);
    ok(&s.create(&origin, &cache, &[]));
    write_through_engine(&origin, &cache, &[(0, 1 << 20, 5)]);
    let out = ok(&s.tc(&["check", "--json"]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["cache_blocks_dirty"], 256);

    // Damage the first page of both checkpoint areas.
    let layout = Layout::compute(CACHE_BYTES, 4096).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    for area in layout.checkpoint_offset {
        f.write_all_at(&[0xEE; 64], area + 100).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);

    let before = hash(&cache);
    let out = s.tc(&["check"]);
    fails(&out, 5, "metadata damage found");
    let text = stdout(&out);
    assert!(
        text.contains("DAMAGE") && text.contains("checkpoint"),
        "{text}"
    );
    let out = s.tc(&["check", "--json"]);
    fails(&out, 5, "metadata damage found");
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["ok"], false);
    fails(
        &s.tc(&["check", "--cache", &cache]),
        5,
        "metadata damage found",
    );
    assert_eq!(hash(&cache), before, "check wrote the cache device");
    // The engine refuses it too, in one line.
    fails(&s.tc(&["status"]), 5, "corrupted");
    assert_eq!(
        hash(&cache),
        before,
        "a refused open wrote the cache device"
    );
}

#[test]
fn usage_errors_are_one_line() {
    let s = Setup::new();
    fails(&s.tc(&["create", "--cache", "x"]), 2, "--origin");
    fails(&s.tc(&["status", "--bogus"]), 2, "--bogus");
    fails(
        &s.tc(&["check", "--name", "a", "--cache", "b"]),
        2,
        "cannot be used with",
    );
    fails(&s.tc(&["frobnicate"]), 2, "frobnicate");
    let help = ok(&s.tc(&["--help"]));
    assert!(help.contains("set-writeback"), "{help}");
}

#[test]
fn demo_runs() {
    let s = Setup::new();
    let dir = s.path("demo");
    let out = ok(&s.tc(&["demo", "--dir", &dir]));
    assert!(out.contains("metadata ok"), "{out}");
    assert!(out.contains("verify"), "{out}");
    // The slowed origin against the cache, and the dashboard's address.
    assert!(
        out.contains("origin alone") && out.contains("faster"),
        "{out}"
    );
    assert!(out.contains("dashboard on http://127.0.0.1:"), "{out}");
    // Running it again replaces the files.
    let out = ok(&s.tc(&["demo", "--dir", &dir, "--http", "off"]));
    assert!(!out.contains("dashboard on"), "{out}");
}

/// A cache set from the CLI: create with two cache devices, status names
/// both members, bad arguments are refused with a message and change no
/// byte, a missing member needs `--degraded` (serve) or `replace-cache`,
/// which rebuilds onto a new device and updates the registry.
#[test]
fn cache_set_create_status_replace_and_bad_arguments() {
    let s = Setup::new();
    let origin = s.filled("origin.img", ORIGIN_BYTES);
    let a = s.sparse("a.img", CACHE_BYTES);
    let b = s.sparse("b.img", CACHE_BYTES);
    let c = s.sparse("c.img", CACHE_BYTES);
    let tiny = s.filled("tiny.img", 1 << 20);
    let files = [&origin, &a, &b, &c, &tiny];
    let hashes = || files.iter().map(|f| hash(f)).collect::<Vec<_>>();
    let before = hashes();
    for (args, what) in [
        (vec!["--cache", &a, "--cache", &a], "given twice"),
        (vec!["--cache", &a, "--cache", &tiny], "too small"),
        (
            vec!["--cache", &a, "--cache", &b, "--mirror-share", "0"],
            "mirror share",
        ),
        (
            vec!["--cache", &a, "--cache", &b, "--mirror-share", "101"],
            "mirror share",
        ),
        (vec!["--cache", &a, "--cache", &origin], "same device"),
    ] {
        let mut full = vec!["create", "--origin", &origin];
        full.extend(args);
        fails(&s.tc(&full), 2, what);
    }
    assert_eq!(hashes(), before, "a refused create changed a device");

    ok(&s.create(&origin, &a, &["--cache", &b]));
    let st = status_json(&s);
    assert_eq!(st["cache_set_state"], "whole");
    assert_eq!(st["cache_members"][0]["device"], a.as_str());
    assert_eq!(st["cache_members"][1]["device"], b.as_str());
    let text = ok(&s.tc(&["status"]));
    assert!(text.contains("cache set") && text.contains(&b), "{text}");

    // Replacing: not a member, or a cache that is not a set.
    fails(&s.tc(&["replace-cache", &c, &tiny]), 3, "not a member");
    // b disappears: opening needs --degraded or a replacement.
    std::fs::remove_file(&b).unwrap();
    fails(&s.tc(&["status"]), 6, "replace-cache");
    ok(&s.tc(&["replace-cache", &b, &c]));
    let st = status_json(&s);
    assert_eq!(st["cache_set_state"], "whole", "{st}");
    assert_eq!(st["cache_members"][1]["device"], c.as_str());
    ok(&s.tc(&["detach"]));
}

/// `create --placement log`: the placement is kept in the superblock, and
/// `status` (text and JSON, each opening the cache again) shows it.
#[test]
fn the_log_placement_is_created_and_shown() {
    let s = Setup::new();
    let origin = s.filled("origin.img", ORIGIN_BYTES);
    let cache = s.sparse("cache.img", CACHE_BYTES);
    let out = ok(&s.create(&origin, &cache, &["--placement", "log"]));
    assert!(out.contains("placement log"), "{out}");
    let text = ok(&s.tc(&["status"]));
    assert!(
        text.lines()
            .any(|l| l.contains("placement") && l.contains("log (") && l.contains("free segments")),
        "{text}"
    );
    let json = status_json(&s);
    assert_eq!(json["placement"], "log", "{json}");
    assert!(json["free_segments"].as_u64().unwrap() > 0, "{json}");
}

/// `create --writeback-order flush`: kept in the superblock; `status` (text
/// and JSON, each opening the cache again) shows it with its groups; a
/// clean close writes the closed groups back (a checkpoint keeps none).
#[test]
fn flush_order_is_created_and_shown() {
    let s = Setup::new();
    let origin = s.filled("origin.img", ORIGIN_BYTES);
    let cache = s.sparse("cache.img", CACHE_BYTES);
    let out = ok(&s.create(&origin, &cache, &["--writeback-order", "flush"]));
    assert!(out.contains("writeback order flush"), "{out}");
    write_through_engine(&origin, &cache, &[(0, 8192, 1), (1 << 20, 4096, 2)]);
    let text = ok(&s.tc(&["status"]));
    assert!(
        text.lines()
            .any(|l| l.contains("writeback order") && l.contains("flush (group")),
        "{text}"
    );
    let json = status_json(&s);
    assert_eq!(json["writeback_order"], "flush", "{json}");
    assert!(json["flush_groups"]["open"].is_u64(), "{json}");
    // The engine's flush closed the group, its close wrote it back.
    assert!(origin_holds(&origin, 0, 8192, 1));
    assert!(origin_holds(&origin, 1 << 20, 4096, 2));
    assert_eq!(json["cache_blocks_dirty"], 0, "{json}");
    assert_eq!(json["flush_groups"]["closed_pending"], 0, "{json}");
}
