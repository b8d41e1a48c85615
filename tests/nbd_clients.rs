//! Real NBD clients against the in-process server: nbdinfo, qemu-img,
//! nbdcopy, libnbd's Python binding and fio, each against the plain
//! reference volume and against the cache engine (writeback and
//! writethrough, cache a quarter of the volume). A missing tool fails the test
//! with the Debian package to install (tests never skip silently).

#[path = "common/nbd.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Backend, TestServer};
use rand::{RngCore, SeedableRng};
use tiercache::engine::Mode;

const SIZE: u64 = 32 << 20;

const BACKENDS: [Backend; 3] = [
    Backend::Device,
    Backend::Engine(Mode::Writeback),
    Backend::Engine(Mode::Writethrough),
];

/// Starts a test server for each backend in turn.
fn servers() -> impl Iterator<Item = (Backend, TestServer)> {
    BACKENDS.into_iter().map(|b| {
        (
            b,
            TestServer::start_backend(SIZE, TestServer::test_config(), b),
        )
    })
}

/// Panics with the Debian package name if `tool` is not installed.
fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
        || Path::new(tool).is_file();
    assert!(
        found,
        "{tool} not found: install the Debian package {package} (apt-get install {package})"
    );
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A file of random bytes with one all-zero MiB in the middle, so copies
/// exercise NBD_CMD_WRITE_ZEROES too.
fn random_image(path: &Path, bytes: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    rand_chacha::ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut data);
    let mid = bytes / 2;
    data[mid..mid + (1 << 20)].fill(0);
    std::fs::write(path, &data).unwrap();
    data
}

#[test]
fn nbdinfo_reports_size_and_flags() {
    require_tool("nbdinfo", "libnbd-bin");
    for (backend, server) in servers() {
        let out = run(Command::new("nbdinfo").arg("--json").arg(server.uri()));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo JSON");
        let e = &v["exports"][0];
        assert_eq!(e["export-size"], SIZE, "{v:#}");
        for flag in [
            "can_multi_conn",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_fast_zero",
            "can_cache",
            "can_flush",
        ] {
            assert_eq!(e[flag], true, "{backend:?}: {flag} in {v:#}");
        }
        assert_eq!(e["is_read_only"], false, "{v:#}");
        assert_eq!(e["block_size_minimum"], 512, "{v:#}");
        assert_eq!(e["block_size_preferred"], 4096, "{v:#}");
        assert_eq!(e["block_size_maximum"], 1 << 20, "{v:#}");
        assert_eq!(v["protocol"], "newstyle-fixed", "{v:#}");
    }
}

#[test]
fn qemu_img_convert_round_trip() {
    require_tool("qemu-img", "qemu-utils");
    for (backend, server) in servers() {
        let dir = server.dir.path();
        // Fill the export with non-zero bytes first, so the zero MiB of the
        // second image must really be written (as WRITE_ZEROES).
        let (a, b, back) = (dir.join("a.img"), dir.join("b.img"), dir.join("back.img"));
        random_image(&a, SIZE as usize, 1);
        let data = random_image(&b, SIZE as usize, 2);
        for src in [&a, &b] {
            run(Command::new("qemu-img")
                .args(["convert", "-n", "-f", "raw", "-O", "raw"])
                .arg(src)
                .arg(server.uri()));
        }
        run(Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(server.uri())
            .arg(&back));
        // qemu-img's own comparison of the export with the source image.
        run(Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&b)
            .arg(server.uri()));
        assert!(
            std::fs::read(&back).unwrap() == data,
            "{backend:?}: qemu-img round trip differs"
        );
    }
}

#[test]
fn nbdcopy_round_trip() {
    require_tool("nbdcopy", "libnbd-bin");
    for (backend, server) in servers() {
        let dir = server.dir.path();
        let (a, b, back) = (dir.join("a.img"), dir.join("b.img"), dir.join("back.img"));
        random_image(&a, SIZE as usize, 3);
        let data = random_image(&b, SIZE as usize, 4);
        for src in [&a, &b] {
            // CAN_MULTI_CONN is set, so nbdcopy uses several connections.
            run(Command::new("nbdcopy").arg(src).arg(server.uri()));
        }
        run(Command::new("nbdcopy").arg(server.uri()).arg(&back));
        assert!(
            std::fs::read(&back).unwrap() == data,
            "{backend:?}: nbdcopy round trip differs"
        );
    }
}

const PYTHON: &str = "/usr/bin/python3";

/// Exercises every command through libnbd, with the client-side checks
/// off (strict mode 0) so the server's own validation answers.
const NBD_SCRIPT: &str = r#"
import errno, sys
import nbd

h = nbd.NBD()
h.set_request_structured_replies(True)
h.connect_uri(sys.argv[1])
assert h.get_structured_replies_negotiated()
size = h.get_size()
assert size == int(sys.argv[2]), size
assert h.can_fua() and h.can_flush() and h.can_trim() and h.can_zero()
assert h.can_fast_zero() and h.can_cache() and h.can_multi_conn()
assert not h.is_read_only()
assert h.get_block_size(nbd.SIZE_MINIMUM) == 512
h.set_strict_mode(0)

def expect_errno(want, f, *args, **kw):
    try:
        f(*args, **kw)
    except nbd.Error as e:
        assert e.errnum == want, (e.errnum, want, str(e))
        return
    raise AssertionError("expected errno %d" % want)

data = bytes(range(256)) * 16 * 4
h.pwrite(data, 65536, nbd.CMD_FLAG_FUA)
assert h.pread(len(data), 65536) == data
h.flush()
h.trim(4096, 65536)
h.zero(4096, 65536 + 4096)
assert h.pread(4096, 65536 + 4096) == bytes(4096)
assert h.pread(4096, 65536 + 8192) == data[8192:12288]
h.zero(4096, 0, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
expect_errno(errno.ENOTSUP, h.zero, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
h.cache(1 << 20, 0)
expect_errno(errno.EINVAL, h.pread, 512, size)
expect_errno(errno.EINVAL, h.pread, 100, 0)
expect_errno(errno.ENOSPC, h.pwrite, bytes(512), size)
h.pwrite(b"\x01" * 512, size - 512)
assert h.pread(512, size - 512) == b"\x01" * 512

# Many requests in flight at once, completed out of order.
bufs = [nbd.Buffer(4096) for _ in range(64)]
cookies = [h.aio_pread(bufs[i], i * 4096) for i in range(64)]
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
h.shutdown()
print("ok")
"#;

#[test]
fn libnbd_python_commands() {
    assert!(
        Path::new(PYTHON).is_file(),
        "{PYTHON} not found: install the Debian package python3"
    );
    let probe = Command::new(PYTHON).args(["-c", "import nbd"]).output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "{PYTHON} cannot import nbd: install the Debian package python3-libnbd"
    );
    for (backend, server) in servers() {
        let out = run(Command::new(PYTHON)
            .args(["-c", NBD_SCRIPT])
            .arg(server.uri())
            .arg(SIZE.to_string()));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ok",
            "{backend:?}"
        );
    }
}

/// Runs fio's nbd engine and returns its JSON report.
fn fio(server: &TestServer, extra: &[&str]) -> serde_json::Value {
    let out = run(Command::new("fio")
        .args([
            "--name=nbd",
            "--ioengine=nbd",
            "--bs=4k",
            "--iodepth=32",
            "--numjobs=4",
            "--size=4M",
            "--offset_increment=4M",
            "--group_reporting=0",
            "--output-format=json",
        ])
        .arg(format!("--uri={}", server.uri()))
        .args(extra));
    let text = String::from_utf8_lossy(&out.stdout);
    // fio's nbd engine prints a line before the JSON.
    let json = &text[text.find('{').expect("fio JSON output")..];
    serde_json::from_str(json).unwrap_or_else(|e| panic!("fio JSON: {e}\n{text}"))
}

fn assert_fio_clean(report: &serde_json::Value, dir: &str, backend: Backend) {
    let jobs = report["jobs"].as_array().expect("fio jobs");
    assert_eq!(jobs.len(), 4, "{backend:?}: {report:#}");
    for job in jobs {
        assert_eq!(job["error"], 0, "{backend:?}: fio job error: {job:#}");
        assert!(
            job[dir]["io_bytes"].as_u64().unwrap_or(0) >= 4 << 20,
            "{backend:?}: fio job did too little {dir}: {job:#}"
        );
    }
}

#[test]
fn fio_randwrite_verify_then_randread() {
    require_tool("fio", "fio");
    for (backend, server) in servers() {
        let w = fio(
            &server,
            &["--rw=randwrite", "--verify=crc32c", "--do_verify=1"],
        );
        assert_fio_clean(&w, "write", backend);
        // Verification reads are reported as reads.
        assert_fio_clean(&w, "read", backend);
        let r = fio(
            &server,
            &["--rw=randwrite", "--verify=crc32c", "--verify_only"],
        );
        assert_fio_clean(&r, "read", backend);
        let r = fio(&server, &["--rw=randread"]);
        assert_fio_clean(&r, "read", backend);
    }
}
