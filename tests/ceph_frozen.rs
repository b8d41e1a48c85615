//! A Ceph OSD that stops answering (SIGSTOP: a wedged OSD, a partition
//! without a reset) under an `rbd://` origin (issue 32):
//!
//! - writeback: fio verify with a flush every 16 writes runs through the
//!   cache while the OSD is stopped, no flush waits for it, `status` says
//!   the origin is not answering once writeback's requests time out
//!   (`serve --origin-timeout 3`, librbd's `rados_osd_op_timeout`);
//! - writethrough: a flush fails after the timeout, not never (librbd
//!   acknowledges the write itself from its cache), and every later one
//!   until the write is made again;
//! - once the OSD runs again, writes work, `tiercache flush` writes
//!   everything back and `rbd export` equals what the volume serves.
//!
//! The cluster is scripts/ceph-up.sh's (tests/common/ceph.rs).

#[path = "common/ceph.rs"]
mod ceph;
#[path = "common/daemon.rs"]
mod daemon;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ceph::{ok, workdir, Cluster};
use daemon::{cli_ok_in, need, wait_for_socket, KillOnDrop, BIN};
use serde_json::Value;

const IMAGE_BYTES: u64 = 64 << 20;

/// fio over the volume in 4 KiB blocks.
fn fio(uri: &str, name: &str, args: &[&str]) -> Result<Value, String> {
    let args: Vec<&str> = ["--bs=4k"].iter().chain(args).copied().collect();
    daemon::fio_nbd(uri, name, &args)
}

struct Volume<'a> {
    cluster: &'a Cluster,
    dir: &'a Path,
    image: String,
}

impl Volume<'_> {
    fn tc(&self, args: &[&str]) -> String {
        cli_ok_in(&self.dir.join("state"), args)
    }
    fn uri(&self) -> String {
        let sock = self.dir.join("state").join("tc0.nbd");
        format!("nbd+unix:///?socket={}", sock.display())
    }
    fn wait_health(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let state = self.dir.join("state");
        daemon::wait_origin_health(&state, what, Duration::from_secs(60), done)
    }

    /// A new image and a cache of `mode` over it, served.
    fn serve(&self, mode: &str) -> KillOnDrop {
        let size = format!("{}M", IMAGE_BYTES >> 20);
        let name = format!("tc/{}", self.image);
        self.cluster.rbd(&[
            "create",
            "--size",
            &size,
            "--image-feature",
            "layering",
            &name,
        ]);
        let cache = self.dir.join("cache.img");
        std::fs::File::create(&cache)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let origin = self.cluster.uri(&self.image);
        let cache = cache.to_str().unwrap();
        self.tc(&[
            "create", "--origin", &origin, "--cache", cache, "--mode", mode,
        ]);
        self.tc(&["set-writeback", "--age", "1"]);
        let state = self.dir.join("state");
        let child = Command::new(BIN)
            .args(["serve", "--origin-timeout", "3"])
            .env("TIERCACHE_STATE_DIR", &state)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("serve.log")).unwrap())
            .spawn()
            .unwrap();
        let child = KillOnDrop(child);
        wait_for_socket(&state.join("tc0.nbd"));
        wait_for_socket(&state.join("tc0.sock"));
        child
    }

    /// After `tiercache flush`, Ceph holds what the volume serves.
    fn assert_written_back(&self) {
        let out = self.tc(&["flush"]);
        assert!(out.contains("; 0 dirty"), "{out}");
        let served = self.dir.join("served.bin");
        ok(
            Command::new("nbdcopy")
                .arg(self.uri())
                .arg(&served)
                .output(),
            "nbdcopy",
            &[],
        );
        let served = std::fs::read(&served).unwrap();
        let exported = self
            .cluster
            .export(&self.image, &self.dir.join("export.bin"));
        assert!(
            exported == served,
            "rbd export of {} differs from the volume",
            self.image
        );
    }
}

fn writeback_with_a_stopped_osd(cluster: &Cluster, osd: u32) {
    let work = workdir("ceph-frozen-wb-");
    let v = Volume {
        cluster,
        dir: work.path(),
        image: "frozen-wb".into(),
    };
    let mut serve = v.serve("writeback");
    fio(
        &v.uri(),
        "fill",
        &["--rw=randwrite", "--size=16M", "--io_size=2M", "--fsync=16"],
    )
    .unwrap();
    daemon::signal(osd, libc::SIGSTOP);
    let t = Instant::now();
    let json = fio(
        &v.uri(),
        "during",
        &[
            "--rw=randwrite",
            "--offset=32M",
            "--size=16M",
            "--io_size=4M",
            "--iodepth=8",
            "--fsync=16",
            "--verify=crc32c",
            "--verify_fatal=1",
        ],
    );
    let took = t.elapsed();
    let json = json.unwrap_or_else(|e| {
        daemon::signal(osd, libc::SIGCONT);
        panic!("fio failed while the OSD was stopped: {e}")
    });
    let job = &json["jobs"][0];
    let sync_max_ms = job["sync"]["lat_ns"]["max"].as_u64().unwrap_or(0) / 1_000_000;
    eprintln!("writeback, OSD stopped: fio took {took:?}, slowest flush {sync_max_ms} ms");
    let h = v.wait_health("the stop to be seen", |h| h["reachable"] == false);
    eprintln!("origin health with the OSD stopped: {h}");
    daemon::signal(osd, libc::SIGCONT);
    assert!(
        sync_max_ms < 1000,
        "a flush waited {sync_max_ms} ms for the stopped OSD"
    );
    v.wait_health("the OSD back", |h| h["reachable"] == true);
    v.assert_written_back();
    daemon::sigterm(&mut serve);
}

/// A 4 KiB write and a flush at `offset` from libnbd in Python (Debian's
/// python3-libnbd); what the flush said, and how long both took.
fn write_and_flush(uri: &str, offset: u64) -> (Result<(), String>, Duration) {
    let script = format!(
        "import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\nh.pwrite(b'w' * 4096, {offset})\n\
         try:\n    h.flush()\n    print('flushed')\nexcept nbd.Error as e:\n    print('failed:', e)\n"
    );
    let t = Instant::now();
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .output()
        .expect("/usr/bin/python3 with python3-libnbd");
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match text.as_str() {
        "flushed" => (Ok(()), took),
        _ => (Err(text), took),
    }
}

fn writethrough_with_a_stopped_osd(cluster: &Cluster, osd: u32) {
    let work = workdir("ceph-frozen-wt-");
    let v = Volume {
        cluster,
        dir: work.path(),
        image: "frozen-wt".into(),
    };
    let mut serve = v.serve("writethrough");
    fio(
        &v.uri(),
        "before",
        &["--rw=randwrite", "--size=4M", "--fsync=8"],
    )
    .unwrap();
    // fio's last writes may follow its last flush: one more, so that the
    // stopped OSD's failed flush covers only the write below.
    write_and_flush(&v.uri(), 0).0.unwrap();
    daemon::signal(osd, libc::SIGSTOP);
    // librbd acknowledges the write from its cache (writearound, Ceph's
    // default); the flush is what needs the OSD.
    let (r, took) = write_and_flush(&v.uri(), 8 << 20);
    daemon::signal(osd, libc::SIGCONT);
    eprintln!("writethrough, OSD stopped: a write and flush took {took:?}: {r:?}");
    let err = r.expect_err("a writethrough flush succeeded with the OSD stopped");
    assert!(err.contains("failed"), "{err}");
    assert!(took < Duration::from_secs(20), "bounded: {took:?}");
    // The write the failed flush covered may be lost: flushes fail until
    // it is written again.
    let (r, _) = write_and_flush(&v.uri(), 16 << 20);
    let err = r.expect_err("a flush after a lost write succeeded");
    assert!(err.contains("EIO"), "{err}");
    let (r, _) = write_and_flush(&v.uri(), 8 << 20);
    r.unwrap();
    fio(
        &v.uri(),
        "after",
        &[
            "--rw=randwrite",
            "--size=4M",
            "--fsync=8",
            "--verify=crc32c",
            "--verify_fatal=1",
        ],
    )
    .unwrap();
    v.assert_written_back();
    daemon::sigterm(&mut serve);
}

#[test]
fn a_stopped_osd_hangs_no_writeback_flush_and_fails_writethrough_in_bounded_time() {
    ceph::need_ceph();
    need("fio", "fio");
    need("nbdcopy", "libnbd-bin");
    let cluster = Cluster::up();
    let osd = cluster.pid("osd.0");
    writeback_with_a_stopped_osd(&cluster, osd);
    writethrough_with_a_stopped_osd(&cluster, osd);
}
