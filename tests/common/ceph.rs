//! The single-node Ceph cluster of `scripts/ceph-up.sh` for the tests that
//! use an RBD image as the origin (docs/ceph.md): `ceph_rbd.rs`,
//! `ceph_frozen.rs` and `ceph_ordered.rs`, which include it with `#[path]`
//! beside `common/daemon.rs` (as `mod daemon`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The Ceph tools the tests drive: tool -> Debian package.
const TOOLS: [(&str, &str); 5] = [
    ("ceph", "ceph-common"),
    ("rbd", "ceph-common"),
    ("ceph-mon", "ceph-mon"),
    ("ceph-osd", "ceph-osd"),
    ("ceph-mgr", "ceph-mgr"),
];

/// Fails with the Debian package to install if a Ceph tool is missing.
pub fn need_ceph() {
    for (tool, package) in TOOLS {
        crate::daemon::need(tool, package);
    }
}

/// The cluster of `scripts/ceph-up.sh DIR`, stopped with
/// `scripts/ceph-down.sh DIR` when dropped, on panic too; or the cluster
/// `scripts/test.sh` shares between the test binaries
/// (`TIERCACHE_CEPH_CLUSTER`), which it stops itself.
pub struct Cluster {
    dir: PathBuf,
    pub conf: PathBuf,
    /// Ours to stop: `None` for the shared cluster.
    _tmp: Option<tempfile::TempDir>,
}

/// How long a test waits for the shared cluster to come up (it starts
/// while the tests build).
const SHARED_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

impl Cluster {
    /// A cluster for one test binary: `scripts/test.sh`'s shared one when
    /// `TIERCACHE_CEPH_CLUSTER` names its directory (waiting for
    /// `up.done`, failing with its log on `up.failed`), else one of its own.
    /// Images in the shared cluster are the binaries' own: each names them
    /// apart, and none outlives its binary in use.
    pub fn up() -> Cluster {
        if let Some(shared) = std::env::var_os("TIERCACHE_CEPH_CLUSTER") {
            return Cluster::shared(PathBuf::from(shared));
        }
        let tmp = workdir("ceph-");
        let dir = tmp.path().join("cluster");
        let cluster = Cluster {
            conf: dir.join("ceph.conf"),
            dir,
            _tmp: Some(tmp),
        };
        let out = Command::new(script("ceph-up.sh"))
            .arg(&cluster.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/ceph-up.sh");
        assert!(
            out.status.success(),
            "scripts/ceph-up.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    fn shared(top: PathBuf) -> Cluster {
        let t = std::time::Instant::now();
        while !top.join("up.done").exists() {
            if top.join("up.failed").exists() || t.elapsed() > SHARED_UP_LIMIT {
                panic!(
                    "the shared Ceph cluster in {} did not come up:\n{}",
                    top.display(),
                    std::fs::read_to_string(top.join("up.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let dir = top.join("cluster");
        Cluster {
            conf: dir.join("ceph.conf"),
            dir,
            _tmp: None,
        }
    }

    /// The PID of one of the cluster's daemons (`osd.0`, `mon.a`, ...).
    pub fn pid(&self, daemon: &str) -> u32 {
        let f = self.dir.join("run").join(format!("{daemon}.pid"));
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .parse()
            .unwrap()
    }

    /// `program` with this cluster's CEPH_CONF (ceph, rbd, fio's rbd engine).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("CEPH_CONF", &self.conf).stdin(Stdio::null());
        c
    }

    /// Runs `rbd ARGS`, asserting success; returns its stdout.
    pub fn rbd(&self, args: &[&str]) -> String {
        ok(self.command("rbd").args(args).output(), "rbd", args)
    }

    /// `rbd://tc/IMAGE` with this cluster's config.
    pub fn uri(&self, image: &str) -> String {
        format!("rbd://tc/{image}?conf={}", self.conf.display())
    }

    /// Creates `tc/IMAGE` holding `data`, imported with librbd (through the
    /// file `dir/IMAGE.bin`, removed after). No exclusive-lock feature:
    /// with it, another client opening the image (rbd export, fio) makes
    /// the lock holder write its cache out, flush or not.
    pub fn import(&self, image: &str, data: &[u8], dir: &Path) {
        let file = dir.join(format!("{image}.bin"));
        std::fs::write(&file, data).unwrap();
        self.rbd(&[
            "import",
            "--no-progress",
            "--image-feature",
            "layering",
            file.to_str().unwrap(),
            &format!("tc/{image}"),
        ]);
        std::fs::remove_file(&file).unwrap();
    }

    /// The whole image as Ceph holds it, read by librbd in `rbd export`.
    pub fn export(&self, image: &str, to: &Path) -> Vec<u8> {
        self.rbd(&[
            "export",
            "--no-progress",
            &format!("tc/{image}"),
            to.to_str().unwrap(),
        ]);
        let data = std::fs::read(to).unwrap();
        std::fs::remove_file(to).unwrap();
        data
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self._tmp.is_none() {
            return;
        }
        match Command::new(script("ceph-down.sh"))
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "scripts/ceph-down.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run scripts/ceph-down.sh: {e}"),
        }
    }
}

pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// A temporary directory in cargo's test scratch directory.
pub fn workdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Asserts that a command ran and succeeded; returns its stdout.
pub fn ok(out: std::io::Result<Output>, program: &str, args: &[&str]) -> String {
    let out = out.unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// librbd's cache as a writeback cache from the start that holds data
/// until a flush (or a minute, or 24 MiB dirty), so that what another
/// client reads from Ceph is what was flushed: Ceph options, as `:`-joined
/// `key=value` for qemu's rbd driver and `--key=value` for CEPH_ARGS.
pub const HOLDING_CACHE: [(&str, &str); 3] = [
    ("rbd_cache_policy", "writeback"),
    ("rbd_cache_writethrough_until_flush", "false"),
    ("rbd_cache_max_dirty_age", "60"),
];

/// `HOLDING_CACHE` as CEPH_ARGS for a process using librbd (`rbd://`).
pub fn holding_cache_args() -> String {
    HOLDING_CACHE
        .iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}
