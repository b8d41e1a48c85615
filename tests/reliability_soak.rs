//! Issue 5, scenario 10: soak. fio through `tiercache serve` (writeback,
//! 4 KiB blocks) for a minute (ten with `TIERCACHE_LONG=1`): three write
//! jobs of random sizes from 512 B to 128 KiB at 512-byte-aligned offsets,
//! each in its own 48 MiB region, with crc32c verify headers checked as
//! they go (`verify_backlog`) and at the end, a flush every 64 writes; one
//! job reading random sizes over the whole 256 MiB volume. The cache holds
//! 16 MiB and writeback starts at 20% dirty, so writeback and eviction
//! never stop. Afterwards: no verify error, writeback and eviction counted
//! in the status, and after `tiercache flush` the origin file equals the
//! volume (copied out with nbdcopy) byte for byte.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use std::process::Command;
use std::time::Instant;

use daemon::{fio_json, need, Setup};

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 256 * MIB;
const CACHE_BYTES: u64 = 16 * MIB;
const WRITE_JOB_BYTES: u64 = 48 * MIB;

#[test]
fn soak_fio_verify_small_cache() {
    need("fio", "fio");
    need("nbdcopy", "libnbd-bin");
    // TIERCACHE_SOAK_SECS overrides the length (for a quick or a longer run).
    let runtime_secs: u64 = std::env::var("TIERCACHE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if common::long_form() { 600 } else { 60 });
    let setup = Setup::with_sizes(
        VOLUME_BYTES,
        CACHE_BYTES,
        &[
            "--mode",
            "writeback",
            "--writeback-high",
            "20",
            "--writeback-low",
            "5",
            "--writeback-age",
            "1",
        ],
    );
    let mut server = setup.serve();
    let uri = setup.uri();
    let started = Instant::now();
    let out = Command::new("fio")
        .args([
            "--thread",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--time_based",
            &format!("--runtime={runtime_secs}"),
            "--bsrange=512-128k",
            "--iodepth=8",
            "--output-format=json",
            // Writers: overlapping random sizes need the log of the
            // latest write per range (norandommap) and no two overlapping
            // writes in flight (serialize_overlap), or verify would judge
            // a race it caused.
            "--name=write",
            "--rw=randwrite",
            "--numjobs=3",
            &format!("--size={WRITE_JOB_BYTES}"),
            &format!("--offset_increment={WRITE_JOB_BYTES}"),
            "--norandommap=1",
            "--serialize_overlap=1",
            "--verify=crc32c",
            "--verify_backlog=64",
            "--verify_fatal=1",
            "--fsync=64",
            // Reader: all over the volume, promotions and evictions.
            "--name=read",
            "--rw=randread",
            "--numjobs=1",
            "--offset=0",
            &format!("--size={VOLUME_BYTES}"),
        ])
        .current_dir(setup.dir.path())
        .output()
        .unwrap();
    let fio_secs = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed: {stdout} {stderr}");
    // "norandommap given for variable block sizes, verify limited" is
    // expected: a write overlapping an older one replaces it in fio's log.
    assert!(
        !stderr.contains("verify:") && !stderr.contains("verify failed"),
        "fio reported: {stderr}"
    );
    let v = fio_json(&out.stdout);
    let (mut writes, mut reads, mut verify_reads, mut written_bytes) = (0u64, 0u64, 0u64, 0u64);
    for job in v["jobs"].as_array().unwrap() {
        assert_eq!(job["error"], 0, "fio job {} failed", job["jobname"]);
        writes += job["write"]["total_ios"].as_u64().unwrap();
        written_bytes += job["write"]["io_bytes"].as_u64().unwrap();
        let r = job["read"]["total_ios"].as_u64().unwrap();
        reads += r;
        // A write job's reads are its verify reads.
        if job["jobname"] == "write" {
            verify_reads += r;
        }
    }
    assert!(writes > 0 && reads > 0, "fio did no I/O: {stdout}");
    let st = setup.status();
    let s = &st["stats"];
    let count = |k: &str| s[k].as_u64().unwrap();
    assert!(count("blocks_written_back") > 0, "no writeback: {st}");
    assert!(count("demotions") > 0, "no eviction: {st}");
    assert!(count("promotions") > 0, "no promotion: {st}");
    // Final flush: then the origin alone must hold the volume.
    let flushed = setup.cli(&["flush"]);
    assert!(flushed.contains("0 dirty"), "{flushed}");
    let copy = setup.path("volume.img");
    daemon::nbdcopy(&uri, &copy);
    daemon::sigterm(&mut server);
    let check = setup.cli(&["check"]);
    assert!(check.contains("shut down cleanly: yes"), "{check}");
    if let Some(at) = daemon::first_difference(&copy, &setup.path("origin.img")) {
        panic!("after the final flush the origin differs from the volume at byte {at}");
    }
    eprintln!(
        "soak: fio {fio_secs:.0} s (runtime {runtime_secs} s): {writes} writes ({} MiB), {reads} reads \
         ({verify_reads} of them verify reads), 0 verify errors; {} blocks written back, {} promoted, {} evicted, \
         {} commits; origin == volume ({} MiB compared)",
        written_bytes / MIB,
        count("blocks_written_back"),
        count("promotions"),
        count("demotions"),
        count("commits"),
        VOLUME_BYTES / MIB
    );
}
