//! One cache in front of several origins, through the `tiercache` binary
//! and real NBD clients: `create --origin A --origin B --volume ...` makes
//! one cache of two volumes, `serve` serves each as the NBD export of its
//! name (the empty name is the first), data written through one export
//! lands on its own origin and nowhere else, and `status`, `check` and
//! `detach` speak of every volume.

mod common;
#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/web.rs"]
mod web;

use std::path::Path;
use std::process::Command;

use daemon::{first_difference, nbdcopy, need, sigterm, Setup};

const DATA_BYTES: u64 = 24 << 20;
const LOGS_BYTES: u64 = 8 << 20;

/// A directory with two origins (`data.img`, 24 MiB; `logs.img`, 8 MiB), a
/// cache file of 8 MiB, and a state directory with no cache yet.
fn two_origins() -> Setup {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = Setup { dir };
    for (name, bytes) in [
        ("data.img", DATA_BYTES),
        ("logs.img", LOGS_BYTES),
        ("cache.img", 8 << 20),
    ] {
        std::fs::File::create(s.path(name))
            .unwrap()
            .set_len(bytes)
            .unwrap();
    }
    s
}

fn path_str(s: &Setup, name: &str) -> String {
    s.path(name).to_str().unwrap().to_string()
}

/// `tiercache create` of one cache over `data.img` and `logs.img`.
fn create_two(s: &Setup, extra: &[&str]) -> std::process::Output {
    let (data, logs, cache) = (
        path_str(s, "data.img"),
        path_str(s, "logs.img"),
        path_str(s, "cache.img"),
    );
    let mut args = vec![
        "create", "--origin", &data, "--origin", &logs, "--cache", &cache,
    ];
    args.extend_from_slice(extra);
    s.cli_output(&args)
}

/// `create_two` with `extra`, which must succeed.
fn create_two_ok(s: &Setup, extra: &[&str]) {
    let out = create_two(s, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The file `name` of `s` (a device of the cache) now has `bytes` bytes.
fn set_len(s: &Setup, name: &str, bytes: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(s.path(name));
    f.unwrap().set_len(bytes).unwrap()
}

/// A file of `bytes` whose every 512-byte sector names `tag` and itself.
fn pattern(path: &Path, tag: &str, bytes: u64) {
    let mut v = Vec::with_capacity(bytes as usize);
    for sector in 0..bytes / 512 {
        let mut s = format!("{tag} sector {sector} ").into_bytes();
        s.resize(512, b'.');
        v.extend_from_slice(&s);
    }
    std::fs::write(path, v).unwrap();
}

/// The value of metric `name`'s series for `volume` in a metrics text.
fn series_in(text: &str, name: &str, volume: &str) -> Option<f64> {
    let l = (text.lines()).find(|l| {
        l.starts_with(&format!("{name}{{")) && l.contains(&format!("volume=\"{volume}\""))
    })?;
    l.rsplit(' ').next()?.parse().ok()
}

fn export_uri(s: &Setup, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", s.nbd_socket().display())
}

#[test]
fn two_origins_are_two_exports_and_each_keeps_its_own_data() {
    need("nbdinfo", "libnbd-bin");
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    let out = create_two(&s, &["--volume", "data", "--volume", "logs"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("volume data:") && said.contains("volume logs:"),
        "{said}"
    );
    let mut server = s.serve();
    // Both exports are listed, each with its own size.
    assert_eq!(
        export_sizes(&s),
        vec![("data".into(), DATA_BYTES), ("logs".into(), LOGS_BYTES)]
    );
    // The same sectors of both volumes get different data; the empty
    // name is the first volume.
    let (data_in, logs_in) = (s.path("data.in"), s.path("logs.in"));
    pattern(&data_in, "data", DATA_BYTES);
    pattern(&logs_in, "logs", LOGS_BYTES);
    nbdcopy(&data_in, export_uri(&s, "data"));
    nbdcopy(&logs_in, export_uri(&s, "logs"));
    for (export, expect) in [("data", &data_in), ("logs", &logs_in), ("", &data_in)] {
        let back = s.path("back.out");
        let _ = std::fs::remove_file(&back);
        nbdcopy(export_uri(&s, export), &back);
        assert_eq!(first_difference(&back, expect), None, "export {export:?}");
    }
    // An unknown export is refused by name.
    let unknown = Command::new("nbdinfo")
        .arg(export_uri(&s, "nope"))
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    // Status speaks of both volumes and what the cache holds of each.
    let st = s.status();
    let volumes = st["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2);
    assert_eq!(volumes[0]["name"], "data");
    assert_eq!(volumes[1]["name"], "logs");
    assert_eq!(volumes[1]["bytes"], LOGS_BYTES);
    let dirty = |v: &serde_json::Value| v["cache_blocks_dirty"].as_u64().unwrap();
    assert_eq!(
        dirty(&volumes[0]) + dirty(&volumes[1]),
        st["cache_blocks_dirty"].as_u64().unwrap()
    );
    assert_eq!(
        st["frontends"]["nbd_exports"],
        serde_json::json!(["data", "logs"])
    );
    let text = s.cli(&["status"]);
    assert!(text.contains("data: ") && text.contains("logs: "), "{text}");
    assert!(text.contains("NBD exports data, logs"), "{text}");
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    // Offline: check names both volumes; detach writes each volume back
    // to its own origin.
    let check = s.cli(&["check"]);
    assert!(check.contains("volume logs"), "{check}");
    let detach = s.cli(&["detach"]);
    assert!(detach.contains("the origins"), "{detach}");
    assert_eq!(first_difference(&s.path("data.img"), &data_in), None);
    assert_eq!(first_difference(&s.path("logs.img"), &logs_in), None);
}

#[test]
fn flush_and_warm_take_a_volume() {
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    // No background writeback while the test looks.
    let quiet = [
        "--writeback-idle",
        "0",
        "--writeback-age",
        "3600",
        "--writeback-high",
        "90",
        "--writeback-low",
        "80",
        "--volume",
        "data",
        "--volume",
        "logs",
    ];
    assert!(create_two(&s, &quiet).status.success());
    let metrics = format!("127.0.0.1:{}", daemon::free_port());
    let mut server = s.serve_with(&["--metrics", &metrics]);
    web::wait_http(&metrics, "/metrics");
    let one_mib = s.path("one.in");
    pattern(&one_mib, "one", 1 << 20);
    nbdcopy(&one_mib, export_uri(&s, "data"));
    nbdcopy(&one_mib, export_uri(&s, "logs"));
    let dirty = |s: &Setup| -> Vec<u64> {
        let st = s.status();
        let v = st["volumes"].as_array().unwrap().clone();
        v.iter()
            .map(|v| v["cache_blocks_dirty"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(dirty(&s), vec![256, 256]);
    let said = s.cli(&["flush", "--volume", "logs"]);
    assert!(
        said.contains("volume 'logs'") && said.contains("256 blocks"),
        "{said}"
    );
    assert_eq!(dirty(&s), vec![256, 0], "only logs is written back");
    let out = s.cli_output(&["flush", "--volume", "nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("its volumes: data, logs"),
        "{err}"
    );
    // Warm promotes from the volume named: logs' blocks past the first MiB.
    let used = |s: &Setup, v: usize| {
        s.status()["volumes"][v]["cache_blocks_used"]
            .as_u64()
            .unwrap()
    };
    let before = (used(&s, 0), used(&s, 1));
    let said = s.cli(&[
        "warm", "--volume", "logs", "--offset", "1M", "--length", "2M",
    ]);
    assert!(said.contains("512 blocks"), "{said}");
    assert_eq!((used(&s, 0), used(&s, 1)), (before.0, before.1 + 512));
    let out = s.cli_output(&["warm", "--volume", "logs", "--offset", "8M"]);
    assert!(!out.status.success(), "an offset at logs' end is refused");
    // logs leaves writeback alone; data keeps its dirty blocks and mode.
    nbdcopy(&one_mib, export_uri(&s, "logs"));
    let said = s.cli(&["set-mode", "writethrough", "--volume", "logs"]);
    assert!(
        said.contains("volume 'logs'") && said.contains("writeback -> writethrough"),
        "{said}"
    );
    let st = s.status();
    assert_eq!(st["volumes"][0]["mode"], "writeback");
    assert_eq!(st["volumes"][1]["mode"], "writethrough");
    assert_eq!(dirty(&s), vec![256, 0]);
    let text = s.cli(&["status"]);
    assert!(
        text.contains("per volume: data writeback, logs writethrough"),
        "{text}"
    );
    // The metrics have a series per volume (taken every second or so: the
    // first copy that shows data's dirty blocks).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let text = loop {
        let (code, text) = web::get(&metrics, "/metrics").unwrap();
        assert_eq!(code, 200);
        let data_dirty = series_in(&text, "tiercache_volume_dirty_blocks", "data");
        if data_dirty == Some(256.0) || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let series = |name: &str, volume: &str| -> f64 {
        series_in(&text, name, volume).unwrap_or_else(|| panic!("no {name} of {volume} in {text}"))
    };
    assert_eq!(series("tiercache_volume_dirty_blocks", "data"), 256.0);
    assert_eq!(series("tiercache_volume_dirty_blocks", "logs"), 0.0);
    assert_eq!(
        series("tiercache_volume_size_bytes", "logs"),
        LOGS_BYTES as f64
    );
    assert!(text.contains("mode=\"writethrough\""), "{text}");
    s.cli(&["flush"]);
    assert_eq!(dirty(&s), vec![0, 0]);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let head = std::fs::read(s.path("logs.img")).unwrap();
    assert_eq!(head[..1 << 20], std::fs::read(&one_mib).unwrap()[..]);
}

#[test]
fn bad_volume_arguments_are_refused_and_write_nothing() {
    let s = two_origins();
    let data = path_str(&s, "data.img");
    let cache = path_str(&s, "cache.img");
    let refused = |out: std::process::Output, says: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && err.contains(says), "{says}: {err}");
        assert!(!s.state().join("caches/tc0.json").exists());
        let head = std::fs::read(s.path("cache.img")).unwrap();
        assert!(head.iter().all(|&b| b == 0), "the cache device was written");
    };
    refused(create_two(&s, &["--volume", "data"]), "2 --origin");
    refused(
        create_two(&s, &["--volume", "a", "--volume", "a"]),
        "two volumes are named 'a'",
    );
    refused(
        create_two(&s, &["--volume", "a", "--volume", "b/c"]),
        "may hold only letters",
    );
    refused(
        s.cli_output(&[
            "create", "--origin", &data, "--origin", &data, "--cache", &cache,
        ]),
        "given twice",
    );
}

#[test]
fn one_volume_front_ends_are_refused_for_several_volumes() {
    let s = two_origins();
    let out = create_two(&s, &[]);
    assert!(out.status.success());
    let serve = Command::new(daemon::BIN)
        .args(["serve", "--export-name", "disk"])
        .env("TIERCACHE_STATE_DIR", s.state())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&serve.stderr);
    assert!(!serve.status.success(), "{err}");
    assert!(
        err.contains("holds 2 volumes (vol0, vol1)") && err.contains("--export-name"),
        "{err}"
    );
}

/// `add-origin` puts a second origin behind a cache of one (format 2
/// becomes 3): the first volume's data, dirty blocks included, stays;
/// the new volume is served under its name in its own mode. A cut between
/// the superblock and the registry (emulated: the registry entry put back
/// as it was) is refused at open, naming the command, and running it
/// again finishes it.
#[test]
fn add_origin_adds_a_volume_and_finishes_when_run_again() {
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    let (data, logs, cache) = (
        path_str(&s, "data.img"),
        path_str(&s, "logs.img"),
        path_str(&s, "cache.img"),
    );
    let quiet = ["--writeback-idle", "0", "--writeback-age", "3600"];
    let mut args = vec!["create", "--origin", &data, "--cache", &cache];
    args.extend_from_slice(&quiet);
    s.cli(&args);
    let mut server = s.serve();
    let one_mib = s.path("one.in");
    pattern(&one_mib, "one", 1 << 20);
    nbdcopy(&one_mib, export_uri(&s, ""));
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let entry = std::fs::read(s.state().join("caches/tc0.json")).unwrap();

    let said = add_logs_writethrough(&s, &logs);
    assert!(said.contains("volume logs added"), "{said}");
    // The cut: the registry as it was before.
    std::fs::write(s.state().join("caches/tc0.json"), &entry).unwrap();
    let out = s.cli_output(&["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("run it again"),
        "{err}"
    );
    let out = s.cli_output(&["add-origin", "--origin", &logs, "--volume", "other"]);
    assert!(!out.status.success(), "another name does not finish it");
    let said = s.cli(&["add-origin", "--origin", &logs, "--volume", "logs"]);
    assert!(said.contains("cut short"), "{said}");
    let again = s.cli_output(&["add-origin", "--origin", &logs]);
    assert!(!again.status.success(), "the same origin twice");

    let mut server = s.serve();
    let st = s.status();
    let volumes = st["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2);
    assert_eq!(volumes[0]["cache_blocks_dirty"], 256, "{st}");
    assert_eq!(volumes[1]["name"], "logs");
    assert_eq!(volumes[1]["mode"], "writethrough");
    nbdcopy(&one_mib, export_uri(&s, "logs"));
    let back = s.path("back.out");
    nbdcopy(export_uri(&s, "vol0"), &back);
    let want = std::fs::read(&one_mib).unwrap();
    assert_eq!(std::fs::read(&back).unwrap()[..1 << 20], want[..]);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let check = s.cli(&["check"]);
    assert!(check.contains("format 3"), "{check}");
    s.cli(&["detach"]);
    let head = |f: &str| std::fs::read(s.path(f)).unwrap()[..1 << 20].to_vec();
    assert_eq!(head("data.img"), want);
    assert_eq!(head("logs.img"), want);
}

/// `tiercache add-origin` of `logs` as volume logs in writethrough; what
/// it printed.
fn add_logs_writethrough(s: &Setup, logs: &str) -> String {
    s.cli(&[
        "add-origin",
        "--origin",
        logs,
        "--volume",
        "logs",
        "--mode",
        "writethrough",
    ])
}

/// The sizes `nbdinfo --list --json` reports for the exports, by name.
fn export_sizes(s: &Setup) -> Vec<(String, u64)> {
    let list = Command::new("nbdinfo")
        .args(["--list", "--json", &s.uri()])
        .output()
        .unwrap();
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    (list["exports"].as_array().unwrap().iter())
        .map(|e| {
            let name = e["export-name"].as_str().unwrap().to_string();
            (name, e["export-size"].as_u64().unwrap())
        })
        .collect()
}

/// `tiercache resize` takes an origin that grew: served, online (a new
/// NBD connection sees the new size and can write at its end, which
/// reaches the origin); not served, at the open. An origin that shrank is
/// refused with a clear error, the volume left at its size. Without
/// resize, a restart refuses the grown origin (it could be another one).
#[test]
fn resize_takes_a_grown_origin_online_and_refuses_a_shrunk_one() {
    need("nbdinfo", "libnbd-bin");
    need("nbdsh", "libnbd-bin");
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    create_two_ok(&s, &["--volume", "data", "--volume", "logs"]);
    let grow = |name: &str, bytes: u64| set_len(&s, name, bytes);
    let mut server = s.serve();
    grow("logs.img", 2 * LOGS_BYTES);
    let said = s.cli(&["resize", "--volume", "logs"]);
    assert!(
        said.contains("volume 'logs'") && said.contains("-> 16 MiB"),
        "{said}"
    );
    assert_eq!(
        export_sizes(&s),
        vec![("data".into(), DATA_BYTES), ("logs".into(), 2 * LOGS_BYTES)]
    );
    // A write at the new end, through a connection made after the resize.
    let tail = s.path("tail.in");
    pattern(&tail, "tail", 1 << 20);
    let at_end = format!("nbd+unix:///logs?socket={}", s.nbd_socket().display());
    let status = Command::new("nbdsh")
        .args(["-u", &at_end, "-c"])
        .arg(format!(
            "h.pwrite(open('{}', 'rb').read(), {}); h.flush()",
            tail.display(),
            2 * LOGS_BYTES - (1 << 20)
        ))
        .env("PATH", "/usr/bin:/bin")
        .status()
        .unwrap();
    assert!(status.success(), "nbdsh pwrite at the new end");
    let st = s.status();
    assert_eq!(st["volumes"][1]["bytes"], 2 * LOGS_BYTES, "{st}");
    // Shrunk: refused, nothing changes.
    grow("data.img", DATA_BYTES / 2);
    let out = s.cli_output(&["resize"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not shrink"), "{err}");
    assert_eq!(s.status()["volumes"][0]["bytes"], DATA_BYTES);
    grow("data.img", DATA_BYTES);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    s.cli(&["flush"]);
    let back = std::fs::read(s.path("logs.img")).unwrap();
    let want = std::fs::read(&tail).unwrap();
    assert_eq!(back[(2 * LOGS_BYTES - (1 << 20)) as usize..], want[..]);

    // Offline: a grown origin is refused at open until resize takes it.
    grow("data.img", 2 * DATA_BYTES);
    let out = s.cli_output(&["flush"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("grown"), "{err}");
    let said = s.cli(&["resize"]);
    assert!(
        said.contains("volume 'data'") && said.contains("-> 48 MiB"),
        "{said}"
    );
    assert!(
        said.contains("volume 'logs'") && said.contains("unchanged"),
        "{said}"
    );
    let mut server = s.serve();
    assert_eq!(
        export_sizes(&s),
        vec![
            ("data".into(), 2 * DATA_BYTES),
            ("logs".into(), 2 * LOGS_BYTES)
        ]
    );
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let check = s.cli(&["check"]);
    assert!(
        check.contains("no problems") || check.contains("ok"),
        "{check}"
    );
}

/// A cache of volumes data and logs that writes nothing back by itself,
/// served, with the first MiB of each written through NBD (a pattern,
/// returned with the server): it is dirty in the cache.
fn serve_two_dirty(s: &Setup) -> (daemon::KillOnDrop, std::path::PathBuf) {
    let quiet = ["--volume", "data", "--volume", "logs"];
    let never = ["--writeback-idle", "0", "--writeback-age", "3600"];
    create_two_ok(s, &[&quiet[..], &never[..]].concat());
    let server = s.serve();
    let one_mib = s.path("one.in");
    pattern(&one_mib, "one", 1 << 20);
    nbdcopy(&one_mib, export_uri(s, "data"));
    nbdcopy(&one_mib, export_uri(s, "logs"));
    (server, one_mib)
}

/// `tiercache remove-origin --volume data` takes the first of two volumes
/// out of a cache no daemon serves: its dirty data reaches data.img, which
/// stands alone, and the cache serves logs alone (under the empty export
/// name). Cut between the cache's change and the registry's, every open
/// refuses naming the command, and running it again finishes it. (Served:
/// `remove_origin_while_served…`.)
#[test]
fn remove_origin_leaves_the_origin_alone_and_finishes_when_run_again() {
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    let (mut server, one_mib) = serve_two_dirty(&s);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let entry = std::fs::read(s.state().join("caches/tc0.json")).unwrap();
    let out = s.cli_output(&["remove-origin", "--volume", "nothere"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no volume 'nothere'"),
        "{err}"
    );

    let said = s.cli(&["remove-origin", "--volume", "data"]);
    assert!(
        said.contains("volume data removed") && said.contains("stands alone"),
        "{said}"
    );
    let want = std::fs::read(&one_mib).unwrap();
    let head = |f: &str| std::fs::read(s.path(f)).unwrap()[..1 << 20].to_vec();
    assert_eq!(head("data.img"), want, "written back before it was removed");
    // The cut: the registry as it was before.
    std::fs::write(s.state().join("caches/tc0.json"), &entry).unwrap();
    let out = s.cli_output(&["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("remove-origin"),
        "{err}"
    );
    // `detach --volume` is the same command.
    let said = s.cli(&["detach", "--volume", "data"]);
    assert!(said.contains("cut short"), "{said}");

    let mut server = s.serve();
    let st = s.status();
    let volumes = st["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 1, "{st}");
    assert_eq!(volumes[0]["name"], "logs");
    assert_eq!(volumes[0]["cache_blocks_dirty"], 256, "{st}");
    let back = s.path("back.out");
    nbdcopy(export_uri(&s, ""), &back);
    assert_eq!(std::fs::read(&back).unwrap()[..1 << 20], want[..]);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    s.cli(&["detach"]);
    assert_eq!(head("logs.img"), want);
}

#[test]
fn set_share_changes_shares_offline_and_live_and_refuses_what_cannot_hold() {
    let s = two_origins();
    create_two_ok(&s, &["--volume", "data", "--volume", "logs"]);
    let said = s.cli(&["set-share", "--volume", "data", "--min", "25%"]);
    assert!(said.contains("sharing global"), "{said}");
    assert!(
        said.contains("data") && said.contains("min 25%, max none"),
        "{said}"
    );
    let refused = |args: &[&str], why: &str| {
        let out = s.cli_output(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{args:?}: {err}"
        );
    };
    refused(
        &["set-share", "--volume", "data", "--min", "120"],
        "0 to 100",
    );
    refused(&["set-share"], "nothing to change");
    refused(&["set-share", "--min", "10"], "--volume");
    refused(&["set-share", "--sharing", "fair"], "global, curve");
    refused(
        &["set-share", "--volume", "logs", "--min", "80"],
        "guaranteed 25% of the cache",
    );
    refused(
        &["set-share", "--volume", "data", "--max", "20"],
        "above the maximum",
    );

    let mut server = s.serve();
    let said = s.cli(&["set-share", "--sharing", "curve"]);
    assert!(said.contains("sharing curve"), "{said}");
    s.cli(&["set-share", "--volume", "logs", "--max", "50"]);
    let st = s.status();
    assert_eq!(st["sharing"], "curve", "{st}");
    assert_eq!(st["volumes"][0]["share"]["min_permille"], 250, "{st}");
    assert_eq!(st["volumes"][1]["share"]["max_permille"], 500, "{st}");
    let text = s.cli(&["status"]);
    assert!(text.contains("share") && text.contains("sharing"), "{text}");
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    // Recorded: the next open has them.
    let st = s.status();
    assert_eq!(st["sharing"], "curve", "{st}");
    assert_eq!(st["volumes"][1]["share"]["max_permille"], 500, "{st}");
    s.cli(&["check"]);
}

/// `add-origin` of a served cache: the daemon adds the volume and exports
/// it at once, while a client of the first volume stays connected and
/// writing; the cache of one origin becomes one of two (format 3), its
/// first volume gaining the export of its name. A run cut short after the
/// daemon's add (the registry as before) finishes when run again, still
/// served, and a restart serves both.
#[test]
fn add_origin_while_served_exports_the_volume_at_once_beside_a_connected_client() {
    need("nbdsh", "libnbd-bin");
    need("nbdinfo", "libnbd-bin");
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    let (data, logs, cache) = (
        path_str(&s, "data.img"),
        path_str(&s, "logs.img"),
        path_str(&s, "cache.img"),
    );
    s.cli(&["create", "--origin", &data, "--cache", &cache]);
    let mut server = s.serve();
    let entry = std::fs::read(s.state().join("caches/tc0.json")).unwrap();
    // A client of the first volume writes, waits through the add, writes
    // again on the same connection and reads both back.
    let script = "import time\n\
        h.pwrite(b'A' * 65536, 0)\n\
        time.sleep(2)\n\
        h.pwrite(b'B' * 65536, 65536)\n\
        h.flush()\n\
        assert h.pread(131072, 0) == b'A' * 65536 + b'B' * 65536";
    let client = Command::new("nbdsh")
        .args(["-u", &export_uri(&s, ""), "-c", script])
        .env("PATH", "/usr/bin:/bin")
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let said = add_logs_writethrough(&s, &logs);
    assert!(said.contains("added while served"), "{said}");
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "the first volume's client: {out:?}");
    let mut names: Vec<String> = export_sizes(&s).into_iter().map(|e| e.0).collect();
    names.sort();
    assert_eq!(names, ["", "logs", "vol0"]);
    let tail = s.path("logs.in");
    pattern(&tail, "logs", 1 << 20);
    nbdcopy(&tail, export_uri(&s, "logs"));
    let want = std::fs::read(&tail).unwrap();
    assert_eq!(
        std::fs::read(s.path("logs.img")).unwrap()[..1 << 20],
        want[..],
        "writethrough"
    );
    let st = s.status();
    assert_eq!(st["volumes"][1]["mode"], "writethrough", "{st}");
    // Cut short after the daemon's add: run again, it only registers.
    std::fs::write(s.state().join("caches/tc0.json"), &entry).unwrap();
    let said = s.cli(&["add-origin", "--origin", &logs, "--volume", "logs"]);
    assert!(said.contains("cut short"), "{said}");
    let out = s.cli_output(&["add-origin", "--origin", &logs, "--volume", "again"]);
    assert!(!out.status.success(), "the same origin twice");
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());

    let mut server = s.serve();
    let back = s.path("back.out");
    nbdcopy(export_uri(&s, "logs"), &back);
    assert_eq!(std::fs::read(&back).unwrap()[..1 << 20], want[..]);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let check = s.cli(&["check"]);
    assert!(check.contains("format 3"), "{check}");
}

/// `tiercache resize --cache`: a cache file that grew is taken by the
/// daemon that serves it, with clients connected before and after: the
/// new blocks hold data the old size could not, everything reads back
/// through a restart, and `check` says format 4. Not served, a grown
/// device is taken the same way. (A shrunk one: tests/cache_grow.rs.)
#[test]
fn resize_cache_takes_a_grown_cache_device_online_and_offline() {
    need("nbdcopy", "libnbd-bin");
    let s = two_origins();
    create_two_ok(&s, &["--volume", "data", "--volume", "logs"]);
    let mut server = s.serve();
    let before = s.status()["cache_blocks_total"].as_u64().unwrap();
    let (a, b) = (s.path("a.in"), s.path("b.in"));
    pattern(&a, "first", DATA_BYTES);
    pattern(&b, "second", DATA_BYTES);
    nbdcopy(&a, export_uri(&s, "data"));
    set_len(&s, "cache.img", 40 << 20);
    let said = s.cli(&["resize", "--cache"]);
    assert!(
        said.contains("MiB -> ") && said.contains("blocks of 4 KiB"),
        "{said}"
    );
    let after = s.status()["cache_blocks_total"].as_u64().unwrap();
    assert!(after > 4 * before, "{before} -> {after} blocks");
    // 24 MiB of data: more blocks than the cache had before the grow.
    nbdcopy(&b, export_uri(&s, "data"));
    let st = s.status();
    assert!(st["cache_blocks_used"].as_u64().unwrap() > before, "{st}");
    let back = s.path("back.out");
    nbdcopy(export_uri(&s, "data"), &back);
    assert_eq!(first_difference(&b, &back), None);
    let again = s.cli(&["resize", "--cache"]);
    assert!(again.contains("unchanged"), "{again}");
    // A request naming the cache and a volume (the CLI never sends one) is
    // refused, not half carried out.
    let reply = control_line(&s, "{\"op\":\"resize\",\"volume\":\"data\",\"cache\":true}");
    assert!(reply.contains("not both"), "{reply}");
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let checked = s.cli(&["check"]);
    assert!(
        checked.contains("format 4") || checked.contains("format version 4"),
        "{checked}"
    );

    // Offline: grown again.
    set_len(&s, "cache.img", 48 << 20);
    let said = s.cli(&["resize", "--cache"]);
    assert!(said.contains(" -> "), "{said}");
    let mut server = s.serve();
    assert!(s.status()["cache_blocks_total"].as_u64().unwrap() > after);
    std::fs::remove_file(&back).unwrap();
    nbdcopy(export_uri(&s, "data"), &back);
    assert_eq!(first_difference(&b, &back), None);
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
}

/// `tiercache remove-origin` of a served cache: the daemon takes the first
/// of two volumes out while a client stays connected to the other and
/// keeps writing, without an error. The removed volume's dirty data is on
/// data.img, its export is gone, and the daemon holds data.img open no
/// more. Run again, it says there is no such volume. After a restart the
/// cache opens with logs alone (the record taken out at the open), served
/// as the empty export name too, everything logs was written intact.
#[test]
fn remove_origin_while_served_keeps_the_other_volume_serving() {
    need("nbdcopy", "libnbd-bin");
    need("nbdsh", "libnbd-bin");
    need("nbdinfo", "libnbd-bin");
    let s = two_origins();
    let (mut server, one_mib) = serve_two_dirty(&s);
    // A client of logs writing 4 KiB blocks past the first MiB until told
    // to stop; it prints how many it wrote.
    let stop = s.path("stop");
    let script = format!(
        "import os\nn = 0\nwhile not os.path.exists('{}') or n < 50:\n    \
         h.pwrite(bytes([n % 251]) * 4096, (1 << 20) + (n % 64) * 4096)\n    n += 1\n\
         h.flush()\nprint(n)",
        stop.display()
    );
    let writer = Command::new("nbdsh")
        .args(["-u", &export_uri(&s, "logs"), "-c", &script])
        .env("PATH", "/usr/bin:/bin")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let said = s.cli(&["remove-origin", "--volume", "data"]);
    std::fs::write(&stop, "").unwrap();
    let out = writer.wait_with_output().unwrap();
    assert!(out.status.success(), "the client of logs saw an error");
    let n: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        said.contains("removed while served") && said.contains("stands alone"),
        "{said}"
    );
    let want = std::fs::read(&one_mib).unwrap();
    let head = |f: &str| std::fs::read(s.path(f)).unwrap()[..1 << 20].to_vec();
    assert_eq!(head("data.img"), want, "written back before it was removed");
    let names: Vec<String> = export_sizes(&s).into_iter().map(|e| e.0).collect();
    assert_eq!(names, ["logs"]);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", server.id())).unwrap();
    let held = fds.filter_map(|f| std::fs::read_link(f.ok()?.path()).ok());
    let data = std::fs::canonicalize(s.path("data.img")).unwrap();
    assert!(
        held.into_iter().all(|p| p != data),
        "the daemon let data.img go"
    );
    let st = s.status();
    assert_eq!(st["volumes"].as_array().unwrap().len(), 1, "{st}");
    let out = s.cli_output(&["remove-origin", "--volume", "data"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no volume 'data'"),
        "{err}"
    );

    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
    let mut server = s.serve();
    let st = s.status();
    let volumes = st["volumes"].as_array().unwrap();
    assert_eq!(
        (volumes.len(), volumes[0]["name"].as_str()),
        (1, Some("logs")),
        "{st}"
    );
    let back = s.path("back.out");
    nbdcopy(export_uri(&s, ""), &back);
    let back = std::fs::read(&back).unwrap();
    assert_eq!(back[..1 << 20], want[..]);
    for k in n.saturating_sub(64)..n {
        let at = (1 << 20) + (k % 64) as usize * 4096;
        assert_eq!(back[at], (k % 251) as u8, "the client's write {k}");
    }
    sigterm(&mut server);
    assert!(server.wait().unwrap().success());
}

/// Sends one request line to the daemon's control socket as a client of
/// its own would, and returns the whole reply.
fn control_line(s: &Setup, line: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(s.state().join("tc0.sock")).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    c.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    reply
}
