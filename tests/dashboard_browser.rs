//! The dashboard in a real browser: headless Chromium (Debian's `chromium`,
//! which scripts/test.sh installs) loads `serve --http`'s page while fio
//! writes and reads the volume; the charts and the heat map change, the
//! written regions show as dirty and then, after `tiercache flush`, as
//! clean cached ones, and the page logs no error. With a cache set of two
//! devices the page lists each device: state, used and dirty blocks,
//! errors.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/web.rs"]
mod web;

use std::process::Command;

use daemon::{need, sigterm, Setup};
use serde_json::{json, Value};
use web::{free_port, wait_http, Browser};

/// The written stretch: 4 MiB at the volume's start, which is heat-map
/// regions 0..64 of a 64 MiB volume (1024 regions of 64 KiB).
const WRITTEN_BYTES: u64 = 4 << 20;
const WRITTEN_REGIONS: u64 = 64;

fn fio(s: &Setup, args: &[&str]) {
    let out = Command::new("fio")
        .args(["--name=dash", "--ioengine=nbd", "--thread"])
        .arg(format!("--uri={}", s.uri()))
        .args(args)
        .output()
        .expect("running fio");
    assert!(
        out.status.success(),
        "fio {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// True if the browser tests can run here: fio and Chromium are
/// installed, and the run did not say to skip them (scripts/test.sh sets
/// TIERCACHE_SKIP_BROWSER when it cannot install Chromium).
fn browser_here() -> bool {
    need("fio", "fio");
    if let Ok(why) = std::env::var("TIERCACHE_SKIP_BROWSER") {
        eprintln!("SKIPPED: the dashboard browser test: {why}");
        return false;
    }
    assert!(
        web::have_chromium(),
        "chromium is missing: install the Debian package chromium (scripts/test.sh does, and \
         sets TIERCACHE_SKIP_BROWSER when it cannot)"
    );
    true
}

/// Headless Chromium on the dashboard at `addr`, once it drew two
/// snapshots.
fn open_dashboard(addr: &str) -> Browser {
    let mut b = Browser::start();
    b.call("Runtime.enable", json!({}));
    b.call("Log.enable", json!({}));
    b.call("Page.enable", json!({}));
    b.call("Page.navigate", json!({"url": format!("http://{addr}/")}));
    b.wait_for(
        "typeof tc === 'object' && tc.snapshots >= 2",
        20,
        "two snapshots",
    );
    b
}

/// JavaScript: every written region is drawn in state `state`, in a colour
/// whose `channel` (0 red, 2 blue) leads.
fn regions_drawn(state: &str, channel: usize) -> String {
    let other = 2 - channel;
    format!(
        "(() => {{ for (let i = 0; i < {WRITTEN_REGIONS}; i++) {{
             if (tc.cellState(i) !== '{state}') return false;
             const p = tc.cellPixel(i);
             if (!(p[{channel}] > p[1] + 40 && p[{channel}] > p[{other}] + 40)) return false;
           }} return true; }})()"
    )
}

#[test]
fn the_dashboard_shows_writes_dirty_then_clean_in_chromium() {
    if !browser_here() {
        return;
    }
    // Writeback only when asked: no idle drain, no age, high watermark.
    let s = Setup::with_sizes(
        64 << 20,
        16 << 20,
        &[
            "--mode",
            "writeback",
            "--writeback-idle",
            "0",
            "--writeback-age",
            "3600",
            "--writeback-high",
            "95",
            "--writeback-low",
            "90",
        ],
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = s.serve_with(&["--http", &addr]);
    wait_http(&addr, "/api/snapshot");

    let mut b = open_dashboard(&addr);
    assert_eq!(
        b.eval(&format!(
            "[...Array({WRITTEN_REGIONS}).keys()].every(i => tc.cellState(i) === 'empty')"
        )),
        json!(true),
        "nothing cached before fio"
    );
    let before: Value = b.eval("tc.signature()");

    // Writes (dirty in writeback), then reads of them (hits) for 3 s.
    fio(
        &s,
        &["--rw=write", "--bs=64k", &format!("--size={WRITTEN_BYTES}")],
    );
    fio(
        &s,
        &[
            "--rw=randread",
            "--bs=4k",
            &format!("--size={WRITTEN_BYTES}"),
            "--runtime=3",
            "--time_based",
        ],
    );
    b.wait_for(&regions_drawn("dirty", 0), 15, "the written regions dirty");
    b.wait_for(
        "tc.last.history.some(s => s.read_iops > 0) && tc.last.history.some(s => s.write_iops > 0)",
        10,
        "reads and writes in the time series",
    );
    b.wait_for(
        "tc.last.heat.hot.slice(0, 64).some(h => h > 0) && tc.last.mrc.points.length > 0",
        10,
        "hot regions and a miss-ratio curve",
    );
    let after: Value = b.eval("tc.signature()");
    for canvas in ["c-hit", "c-iops", "c-lat", "c-dirty", "c-heat", "c-mrc"] {
        assert_ne!(
            before[canvas], after[canvas],
            "canvas {canvas} did not change while fio ran"
        );
    }
    assert_eq!(
        b.eval("tc.cellState(512)"),
        json!("empty"),
        "a region fio never touched"
    );

    s.cli(&["flush"]);
    b.wait_for(
        &regions_drawn("cached", 2),
        15,
        "the written regions clean after flush",
    );
    assert_eq!(
        b.eval("document.getElementById('s-devices').hidden"),
        json!(true),
        "one cache device: no table of devices"
    );
    assert_eq!(b.eval("tc.failures"), json!(0), "failed polls");
    let errors = b.errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    drop(b);
    sigterm(&mut serve);
}

/// A cache set of two devices: the page lists both, healthy, each holding
/// the dirty blocks written (mirrored), and the set whole; a single device
/// (the test above) shows no such table.
#[test]
fn the_dashboard_lists_each_device_of_a_cache_set() {
    if !browser_here() {
        return;
    }
    let extra = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let second = extra.path().join("cache2.img");
    std::fs::File::create(&second)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let s = Setup::with_sizes(
        64 << 20,
        16 << 20,
        &[
            "--mode",
            "writeback",
            "--cache",
            second.to_str().unwrap(),
            "--writeback-idle",
            "0",
            "--writeback-age",
            "3600",
        ],
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = s.serve_with(&["--http", &addr]);
    wait_http(&addr, "/api/snapshot");
    let mut b = open_dashboard(&addr);
    fio(&s, &["--rw=write", "--bs=64k", "--size=1M"]);
    // Rows: a header, then one per device; column 5 is its dirty blocks.
    b.wait_for(
        "(() => { if (document.getElementById('s-devices').hidden) return false;
           const rows = [...document.querySelectorAll('#t-devices tr.healthy')];
           return rows.length === 2 && rows.every(r => r.cells[4].textContent !== '0'); })()",
        15,
        "both devices listed, healthy, with dirty blocks",
    );
    let names: Value = b.eval(
        "[...document.querySelectorAll('#t-devices tr.healthy')].map(r => r.cells[1].textContent)",
    );
    let names: Vec<&str> = names
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with("cache.img"))
            && names.iter().any(|n| n.ends_with("cache2.img")),
        "{names:?}"
    );
    assert_eq!(
        b.eval("document.getElementById('set-state').textContent.startsWith('(whole')"),
        json!(true)
    );
    // Each device's checksum errors (none here): a column of their own.
    assert_eq!(
        b.eval(
            "(() => { const rows = [...document.querySelectorAll('#t-devices tr')];
               return rows[0].cells[6].textContent === 'checksum errors'
                 && rows.slice(1).every(r => r.cells[6].textContent === '0'); })()"
        ),
        json!(true)
    );
    assert_eq!(b.eval("tc.failures"), json!(0), "failed polls");
    let errors = b.errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    drop(b);
    sigterm(&mut serve);
}

/// A cache of two origins: the heat map has a volume picker; written
/// through the second volume's export, its regions are dirty on its map
/// and the first volume's map stays empty.
#[test]
fn the_dashboard_picks_the_volume_whose_heat_map_it_shows() {
    if !browser_here() {
        return;
    }
    let extra = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let second = extra.path().join("logs.img");
    std::fs::File::create(&second)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let s = Setup::with_sizes(
        64 << 20,
        16 << 20,
        &[
            "--mode",
            "writeback",
            "--origin",
            second.to_str().unwrap(),
            "--volume",
            "data",
            "--volume",
            "logs",
            "--writeback-idle",
            "0",
            "--writeback-age",
            "3600",
        ],
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = s.serve_with(&["--http", &addr]);
    wait_http(&addr, "/api/snapshot");
    let mut b = open_dashboard(&addr);
    assert_eq!(
        b.eval(
            "(() => { const p = document.getElementById('heat-volume');
               return !p.hidden && [...p.options].map(o => o.textContent).join(','); })()"
        ),
        json!("data,logs"),
        "the picker lists both volumes"
    );
    let uri = format!("nbd+unix:///logs?socket={}", s.nbd_socket().display());
    let out = Command::new("fio")
        .args([
            "--name=dash",
            "--ioengine=nbd",
            "--thread",
            "--rw=write",
            "--bs=64k",
        ])
        .arg(format!("--uri={uri}"))
        .arg(format!("--size={WRITTEN_BYTES}"))
        .output()
        .expect("running fio");
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    b.wait_for(
        "tc.last.heats.length === 2 && tc.last.heats[1].dirty.slice(0, 64).every(d => d > 0)",
        15,
        "the logs volume's map dirty in the snapshot",
    );
    assert_eq!(
        b.eval(&format!(
            "[...Array({WRITTEN_REGIONS}).keys()].every(i => tc.cellState(i) === 'empty')"
        )),
        json!(true),
        "the data volume's map (shown first) stays empty"
    );
    b.eval("tc.selectVolume(1)");
    b.wait_for(
        &regions_drawn("dirty", 0),
        15,
        "the logs volume's regions dirty",
    );
    // The curve beside the map is the picked volume's own.
    assert_eq!(
        b.eval("document.getElementById('mrc-note').textContent.includes(\"volume logs's reads\")"),
        json!(true),
        "the curve is the logs volume's"
    );
    assert_eq!(b.eval("tc.failures"), json!(0), "failed polls");
    let errors = b.errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    drop(b);
    sigterm(&mut serve);
}
