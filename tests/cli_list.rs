//! `tiercache list` over three caches at once: one served (asked through
//! its daemon, dirty after writes from a real NBD client), one at rest
//! (read in place, read-only) and one whose cache device is gone (listed
//! as unavailable, the others still listed, nothing written anywhere).

#[path = "common/daemon.rs"]
mod daemon;

use std::path::Path;

use daemon::Setup;
use tiercache::device::nbd::NbdDevice;
use tiercache::device::BlockDevice;

fn sparse(path: &Path, bytes: u64) -> String {
    std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
    path.to_str().unwrap().to_string()
}

fn file_hash(path: &str) -> u64 {
    tiercache::device::fnv1a64(&std::fs::read(path).unwrap())
}

#[test]
fn list_shows_served_resting_and_lost_caches() {
    let s = Setup::new("writeback");
    let (o2, c2) = (
        sparse(&s.path("cold-origin.img"), 32 << 20),
        sparse(&s.path("cold-cache.img"), 16 << 20),
    );
    s.cli(&["create", "--name", "cold", "--origin", &o2, "--cache", &c2]);
    let (o3, c3) = (
        sparse(&s.path("gone-origin.img"), 32 << 20),
        sparse(&s.path("gone-cache.img"), 16 << 20),
    );
    s.cli(&["create", "--name", "gone", "--origin", &o3, "--cache", &c3]);
    std::fs::remove_file(&c3).unwrap();

    let _daemon = s.serve_with(&["--name", "tc0"]);
    let dev = NbdDevice::connect(&s.uri(), 1).unwrap();
    dev.write_at(&vec![7u8; 1 << 20], 0).unwrap();
    dev.flush().unwrap();
    // 256 blocks read from the cache, 256 from the origin.
    let mut back = vec![0u8; 1 << 20];
    dev.read_at(&mut back, 0).unwrap();
    dev.read_at(&mut back, 8 << 20).unwrap();

    let resting = [o2.clone(), c2.clone(), o3.clone()];
    let before: Vec<u64> = resting.iter().map(|p| file_hash(p)).collect();
    let out = s.cli_output(&["list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cache 'gone'") && err.contains("No such file"),
        "{err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["schema_version"], 1);
    let caches = json["caches"].as_array().unwrap();
    let names: Vec<&str> = caches.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cold", "gone", "tc0"]);
    let (cold, gone, tc0) = (&caches[0], &caches[1], &caches[2]);

    assert_eq!(tc0["state"], "ok");
    assert_eq!(tc0["dirty_bytes"], 1 << 20, "{tc0}");
    assert!(
        tc0["served"][0].as_str().unwrap().starts_with("nbd:"),
        "{tc0}"
    );
    assert_eq!(tc0["volumes"][0]["name"], "tc0/vol0");
    assert_eq!(tc0["volumes"][0]["size_bytes"], 64 << 20);
    assert_eq!(tc0["volumes"][0]["dirty_bytes"], 1 << 20);
    assert_eq!(tc0["volumes"][0]["hit_percent"], 50.0, "{tc0}");
    assert_eq!(tc0["hit_percent"], 50.0, "{tc0}");

    assert_eq!(cold["state"], "ok");
    assert_eq!(cold["served"].as_array().unwrap().len(), 0);
    assert_eq!(cold["volumes"][0]["devices"][0], o2.as_str());
    assert_eq!(gone["state"], "unavailable");
    assert!(gone["error"].as_str().unwrap().contains("No such file"));
    let after: Vec<u64> = resting.iter().map(|p| file_hash(p)).collect();
    assert_eq!(before, after, "list wrote a device");

    // The table: chosen fields, sorted descending by dirty bytes, in
    // bytes, no headings, separated.
    let out = s.cli(&[
        "list",
        "-o",
        "name,dirty,state",
        "-O",
        "-dirty,name",
        "--units",
        "b",
        "--noheadings",
        "--separator",
        ";",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "tc0;1048576;ok",
            "tc0/vol0;1048576;ok",
            "cold;0;ok",
            "cold/vol0;0;ok",
            "gone;-;unavailable"
        ],
        "{out}"
    );
    let table = s.cli(&["list"]);
    let head = table.lines().next().unwrap();
    for field in [
        "NAME", "TYPE", "MODE", "STATE", "SIZE", "USED%", "DIRTY%", "HIT%", "SERVED",
    ] {
        assert!(head.contains(field), "{head}");
    }
    let bad = s.cli_output(&["list", "-o", "colour"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}
