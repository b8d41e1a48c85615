//! A real Ceph cluster as tiercache's origin (issue 23, docs/ceph.md).
//!
//! `scripts/ceph-up.sh` starts a single-node cluster (mon, mgr, one OSD on
//! a file-backed BlueStore) in a temporary directory. An RBD image holding
//! a known pattern becomes tiercache's origin two ways: served by
//! qemu-nbd's rbd driver (`nbd+unix://`), and opened by librbd in tiercache
//! (`rbd://`). Either way librbd's cache is made a writeback cache holding
//! dirty data for up to a minute, and the image has no exclusive-lock
//! feature (with it, another client opening the image makes the lock
//! holder write its cache out, flush or not): only a flush makes written
//! data visible to other Ceph clients. tiercache caches the image in
//! writeback mode on a cache file smaller than the data written. Real
//! clients write through tiercache's NBD export: nbdcopy (sequential),
//! libnbd from Python (sector-sized writes, the last sector), fio (4K
//! random writes, verified). Then Ceph itself is read, not through
//! tiercache:
//!
//! - after `tiercache flush`, with the origin's librbd still open: `rbd
//!   export` equals what tiercache served, and fio's rbd engine verifies
//!   its region (`--verify_only`);
//! - after one more write and `tiercache detach`: `rbd export` again.
//!
//! Then tiercache in passthrough over the same `rbd://` image: nbdcopy
//! reads it all, every read sent with `rbd_aio_read` and completed on
//! librbd's threads (engine/io/submitted.rs), and gets what `rbd export`
//! gets; libnbd writes sectors and blocks through it, each sent with
//! `rbd_aio_write`, then flushes, and `rbd export` holds them.
//!
//! Runs in CI (scripts/test.sh): the cluster is up in ~11 s on the 2-core
//! machines, the whole test takes ~35 s (~5 s of it the teardown). The
//! tools are required; a missing one fails the test with the Debian
//! package to install.

#[path = "common/ceph.rs"]
mod ceph;
#[path = "common/daemon.rs"]
mod daemon;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ceph::{ok, workdir, Cluster, HOLDING_CACHE};
use daemon::{cli_ok_in, need, wait_for_socket, KillOnDrop, BIN};

const IMAGE_BYTES: u64 = 256 << 20;
const CACHE_BYTES: u64 = 64 << 20;
/// nbdcopy writes this many bytes of tag 2 at offset 0.
const COPY_BYTES: u64 = 32 << 20;
/// fio's 4K random writes (and its verify) cover this region.
const FIO_OFFSET: u64 = 64 << 20;
const FIO_BYTES: u64 = 64 << 20;

/// Bytes `[offset, offset + len)` of the pattern `tag`: every aligned
/// 8-byte word differs by position and tag.
fn pattern(offset: u64, len: u64, tag: u64) -> Vec<u8> {
    let first = offset / 8;
    let last = (offset + len).div_ceil(8);
    let mut out = Vec::with_capacity(((last - first) * 8) as usize);
    for w in first..last {
        let mut x = (w ^ tag.rotate_left(40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ tag;
        x ^= x >> 29;
        out.extend_from_slice(&x.to_le_bytes());
    }
    let skip = (offset - first * 8) as usize;
    out[skip..skip + len as usize].to_vec()
}

/// The writes made with libnbd from Python: (offset, length, tag). Inside
/// nbdcopy's region, sectors in the middle of cache blocks over the
/// origin's pattern, one sector, and the image's last sector. (Not below
/// 512 bytes: tiercache advertises a 512-byte minimum block size, and
/// libnbd refuses smaller requests.)
const SMALL_WRITES: [(u64, u64, u64); 4] = [
    (100 * 512, 3 * 512, 3),
    ((200 << 20) + 3 * 512, 11 * 512, 4),
    ((150 << 20) + 7 * 512, 512, 5),
    (IMAGE_BYTES - 512, 512, 6),
];

/// Writes each (offset, length, tag) with libnbd (Debian's python3-libnbd;
/// the pyenv python3 has no `nbd` module), then flushes.
fn nbd_python_writes(uri: &str, dir: &Path, writes: &[(u64, u64, u64)]) {
    let mut script = format!("import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\n");
    for (i, &(offset, len, tag)) in writes.iter().enumerate() {
        let file = dir.join(format!("small-{i}.bin"));
        std::fs::write(&file, pattern(offset, len, tag)).unwrap();
        script += &format!(
            "h.pwrite(open({:?}, 'rb').read(), {offset})\n",
            file.to_str().unwrap()
        );
    }
    script += "h.flush()\nh.shutdown()\n";
    ok(
        Command::new("/usr/bin/python3")
            .args(["-c", &script])
            .output(),
        "/usr/bin/python3 (libnbd)",
        &[],
    );
}

/// fio's 4K random writes over the fio region, with `verify_only` checking
/// instead of writing; `engine` is `nbd` (with the URI) or `rbd`.
fn fio_args(engine: &[&str], verify_only: bool) -> Vec<String> {
    let mut args: Vec<String> = engine.iter().map(|s| s.to_string()).collect();
    args.extend(
        [
            "--name=verify",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            &format!("--offset={FIO_OFFSET}"),
            &format!("--size={FIO_BYTES}"),
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ]
        .map(String::from),
    );
    if verify_only {
        args.push("--verify_only".into());
    }
    args
}

/// Checks fio's JSON: no job error, and `what` bytes read back and verified.
fn fio_verified(stdout: &str, what: &str) {
    let v = daemon::fio_json(stdout.as_bytes());
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio job error {what}: {stdout}");
    let read_bytes = job["read"]["io_bytes"].as_u64().unwrap_or(0);
    assert_eq!(
        read_bytes, FIO_BYTES,
        "fio read back {read_bytes} bytes {what}, expected {FIO_BYTES}"
    );
}

/// Compares two images outside the fio region; names the first difference.
fn assert_same_outside_fio(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: sizes differ");
    let fio = FIO_OFFSET as usize..(FIO_OFFSET + FIO_BYTES) as usize;
    let first_diff = (0..got.len())
        .step_by(4096)
        .filter(|&o| !fio.contains(&o))
        .find(|&o| got[o..o + 4096] != want[o..o + 4096]);
    if let Some(o) = first_diff {
        panic!("{what}: the 4 KiB block at byte {o} differs");
    }
}

fn wait_exit(child: &mut Child, what: &str, limit: Duration) {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < limit, "{what} still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn data_written_through_tiercache_reaches_the_rbd_image() {
    ceph::need_ceph();
    for (tool, package) in [
        ("qemu-nbd", "qemu-utils"),
        ("nbdcopy", "libnbd-bin"),
        ("fio", "fio"),
    ] {
        need(tool, package);
    }
    let t0 = Instant::now();
    let cluster = Cluster::up();
    let cluster_s = t0.elapsed().as_secs_f64();

    // The origin through qemu-nbd's rbd driver, as nbd+unix://.
    let t1 = Instant::now();
    let work = workdir("ceph-qemu-");
    let image = "via-qemu-nbd";
    import_pattern(&cluster, image, work.path());
    let qemu_sock = work.path().join("rbd.sock");
    let qemu_log = work.path().join("qemu-nbd.log");
    let cache_opts: String = HOLDING_CACHE
        .iter()
        .map(|(k, v)| format!(":{k}={v}"))
        .collect();
    let mut qemu = KillOnDrop(
        Command::new("qemu-nbd")
            .args(["-t", "--shared=8", "-f", "raw", "-k"])
            .arg(&qemu_sock)
            // qemu's default cache mode (writeback) turns librbd's cache on.
            .arg(format!(
                "rbd:tc/{image}:conf={}:id=admin{cache_opts}",
                cluster.conf.display()
            ))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&qemu_log).unwrap())
            .stderr(std::fs::File::create(work.path().join("qemu-nbd.err")).unwrap())
            .spawn()
            .expect("run qemu-nbd (qemu-utils)"),
    );
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&qemu_sock).is_err() {
        if let Some(st) = qemu.try_wait().unwrap() {
            panic!(
                "qemu-nbd exited with {st} (is qemu-block-extra, the rbd driver, installed?): {}",
                std::fs::read_to_string(work.path().join("qemu-nbd.err")).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "qemu-nbd did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let origin = format!("nbd+unix:///?socket={}", qemu_sock.display());
    cache_round_trip(&cluster, image, &origin, &[], work.path());
    daemon::sigterm(&mut qemu);
    let qemu_s = t1.elapsed().as_secs_f64();

    // The origin through librbd in tiercache itself, as rbd://; the same
    // cache settings through CEPH_ARGS.
    let t2 = Instant::now();
    let work = workdir("ceph-native-");
    let image = "native";
    import_pattern(&cluster, image, work.path());
    let origin = cluster.uri(image);
    // A wrong image or pool is refused at create, saying which.
    for (wrong, says) in [
        ("tc/missing", "opening image 'missing' in pool 'tc'"),
        ("nopool/native", "opening pool 'nopool'"),
    ] {
        let uri = format!("rbd://{wrong}?conf={}", cluster.conf.display());
        let out = daemon::cli_in(
            &work.path().join("state"),
            &["create", "--origin", &uri, "--cache", "/dev/null"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{uri}: {err}");
    }
    cache_round_trip(
        &cluster,
        image,
        &origin,
        &[("CEPH_ARGS", &ceph::holding_cache_args())],
        work.path(),
    );
    // The daemon closed the image as it ended: no watch is left behind
    // (a process that exits without rbd_close leaves it for 30 s).
    let status = ok(
        cluster
            .command("rbd")
            .args(["status", &format!("tc/{image}")])
            .output(),
        "rbd",
        &["status"],
    );
    assert!(status.contains("Watchers: none"), "{status}");
    passthrough_round_trip(&cluster, image, &origin, work.path());
    eprintln!(
        "ceph_rbd: cluster up in {cluster_s:.1} s; via qemu-nbd {qemu_s:.1} s; \
         native rbd:// {:.1} s",
        t2.elapsed().as_secs_f64()
    );
}

/// Creates `tc/IMAGE` holding pattern 1.
fn import_pattern(cluster: &Cluster, image: &str, dir: &Path) {
    cluster.import(image, &pattern(0, IMAGE_BYTES, 1), dir);
}

/// tiercache writeback over `origin` (the image `tc/IMAGE` holding pattern
/// 1), on a cache smaller than what is written; `serve_env` is added to the
/// daemon's environment. Real clients write, then Ceph is read directly
/// after `flush` and after `detach`.
fn cache_round_trip(
    cluster: &Cluster,
    image: &str,
    origin: &str,
    serve_env: &[(&str, &str)],
    dir: &Path,
) {
    let path = |name: &str| dir.join(name);
    let mut model = pattern(0, IMAGE_BYTES, 1);
    let state = path("state");
    let tc = |args: &[&str]| cli_ok_in(&state, args);
    let (mut serve, uri) = serve_cache(origin, "writeback", serve_env, &state, &path("cache.img"));
    let serve_log = state.join("serve.log");

    // nbdcopy: pattern 2 over the first 32 MiB.
    let copy = pattern(0, COPY_BYTES, 2);
    std::fs::write(path("copy.bin"), &copy).unwrap();
    ok(
        Command::new("nbdcopy")
            .arg(path("copy.bin"))
            .arg(&uri)
            .output(),
        "nbdcopy",
        &["copy.bin", &uri],
    );
    model[..COPY_BYTES as usize].copy_from_slice(&copy);

    // libnbd from Python: sector-sized writes.
    nbd_python_writes(&uri, dir, &SMALL_WRITES);
    for &(offset, len, tag) in &SMALL_WRITES {
        model[offset as usize..(offset + len) as usize].copy_from_slice(&pattern(offset, len, tag));
    }

    // fio: 4K random writes QD16 over 64 MiB, each block read back and
    // checked through tiercache.
    let uri_arg = format!("--uri={uri}");
    let args = fio_args(&["--ioengine=nbd", &uri_arg], false);
    let out = ok(
        Command::new("fio").args(&args).current_dir(dir).output(),
        "fio",
        &[],
    );
    fio_verified(&out, &format!("through tiercache ({origin})"));

    // Everything tiercache serves, read with nbdcopy: the model outside
    // the fio region (misses come from Ceph).
    ok(
        Command::new("nbdcopy")
            .arg(&uri)
            .arg(path("served.bin"))
            .output(),
        "nbdcopy",
        &[&uri, "served.bin"],
    );
    let served = std::fs::read(path("served.bin")).unwrap();
    std::fs::remove_file(path("served.bin")).unwrap();
    assert_same_outside_fio(
        &served,
        &model,
        &format!("what tiercache serves ({origin})"),
    );
    let st: serde_json::Value = serde_json::from_str(&tc(&["status", "--json"])).unwrap();
    assert!(
        st["stats"]["blocks_written_back"].as_u64().unwrap() > 0,
        "the cache (smaller than the data) wrote nothing back before the flush: {st}"
    );
    if origin.starts_with("rbd://") {
        // Misses of whole blocks none of which is cached went to librbd
        // with `rbd_aio_read` and were promoted when they came back.
        let submitted = st["stats"]["origin_reads_submitted"].as_u64().unwrap();
        assert!(submitted > 0, "no read was submitted to librbd: {st}");
        assert!(st["stats"]["promotions"].as_u64().unwrap() > 0, "{st}");
    }

    // `tiercache flush`: Ceph itself holds everything, with the origin's
    // librbd (and its cache) still open.
    let out = tc(&["flush"]);
    assert!(out.contains("; 0 dirty"), "{out}");
    let exported = cluster.export(image, &path("export.bin"));
    assert!(
        exported == served,
        "after tiercache flush, rbd export of {image} differs from what tiercache served ({origin})"
    );
    let out = ok(
        cluster
            .command("fio")
            .args(fio_args(
                &[
                    "--ioengine=rbd",
                    "--clientname=admin",
                    "--pool=tc",
                    &format!("--rbdname={image}"),
                ],
                true,
            ))
            .current_dir(dir)
            .output(),
        "fio (rbd engine, verify_only)",
        &[],
    );
    fio_verified(&out, &format!("from the RBD image {image} with librbd"));

    // One more write, left dirty; `detach` writes it back and ends serve.
    let last = [((40 << 20) + 4096, 8192, 7)];
    nbd_python_writes(&uri, dir, &last);
    let mut after = served;
    for &(offset, len, tag) in &last {
        after[offset as usize..(offset + len) as usize].copy_from_slice(&pattern(offset, len, tag));
    }
    let out = tc(&["detach"]);
    assert!(out.contains("stands alone"), "{out}");
    wait_exit(&mut serve, "tiercache serve", Duration::from_secs(30));
    assert!(
        serve.try_wait().unwrap().is_some_and(|s| s.success()),
        "serve failed after detach: {}",
        std::fs::read_to_string(&serve_log).unwrap_or_default()
    );
    let exported = cluster.export(image, &path("export.bin"));
    assert!(
        exported == after,
        "after tiercache detach, rbd export of {image} differs from what was written ({origin})"
    );
}

/// Writes through passthrough: (offset, length, tag), sectors and blocks.
const PT_WRITES: &[(u64, u64, u64)] = &[
    (0, 4096, 7),
    ((100 << 20) + 512, 1024, 8),
    ((180 << 20) - 4096, 3 * 4096, 9),
];

/// tiercache passthrough over `origin` (the image `tc/IMAGE`): nbdcopy reads
/// the whole volume, every read a miss the cache does not keep, each sent
/// with `rbd_aio_read` and completed on librbd's threads (`status`'s
/// `origin_reads_submitted`); then `PT_WRITES` and a flush, each write
/// sent with `rbd_aio_write` (`origin_writes_submitted`). What it read,
/// with the writes, is what `rbd export` reads.
fn passthrough_round_trip(cluster: &Cluster, image: &str, origin: &str, dir: &Path) {
    let state = dir.join("state-pt");
    let tc = |args: &[&str]| cli_ok_in(&state, args);
    let (mut serve, uri) = serve_cache(
        origin,
        "passthrough",
        &[],
        &state,
        &dir.join("cache-pt.img"),
    );
    let served_path = dir.join("served-pt.bin");
    ok(
        Command::new("nbdcopy")
            .args(["--requests=16", &uri])
            .arg(&served_path)
            .output(),
        "nbdcopy",
        &[&uri, "served-pt.bin"],
    );
    let mut served = std::fs::read(&served_path).unwrap();
    std::fs::remove_file(&served_path).unwrap();
    nbd_python_writes(&uri, dir, PT_WRITES);
    for &(offset, len, tag) in PT_WRITES {
        served[offset as usize..(offset + len) as usize]
            .copy_from_slice(&pattern(offset, len, tag));
    }
    let st: serde_json::Value = serde_json::from_str(&tc(&["status", "--json"])).unwrap();
    let submitted = st["stats"]["origin_reads_submitted"].as_u64().unwrap();
    assert!(
        submitted > 0 && submitted == st["stats"]["origin_reads"].as_u64().unwrap(),
        "passthrough reads over rbd:// did not all go through rbd_aio_read: {st}"
    );
    let writes = st["stats"]["origin_writes_submitted"].as_u64().unwrap();
    assert!(
        writes == PT_WRITES.len() as u64
            && writes == st["stats"]["origin_writes"].as_u64().unwrap(),
        "passthrough writes over rbd:// did not all go through rbd_aio_write: {st}"
    );
    daemon::sigterm(&mut serve);
    wait_exit(
        &mut serve,
        "tiercache serve (passthrough)",
        Duration::from_secs(30),
    );
    let exported = cluster.export(image, &dir.join("export-pt.bin"));
    assert!(
        exported == served,
        "passthrough over {origin} served other bytes than rbd export of {image} reads"
    );
}

/// `tiercache create` of a cache in `mode` over `origin` on a new cache
/// file of `CACHE_BYTES` at `cache`, in the state directory `state`, then
/// `serve` (its log `state/serve.log`, `serve_env` added to its
/// environment), waited for; returns the daemon and its NBD URI.
fn serve_cache(
    origin: &str,
    mode: &str,
    serve_env: &[(&str, &str)],
    state: &Path,
    cache: &Path,
) -> (KillOnDrop, String) {
    std::fs::File::create(cache)
        .unwrap()
        .set_len(CACHE_BYTES)
        .unwrap();
    let cache = cache.to_str().unwrap();
    cli_ok_in(
        state,
        &[
            "create", "--origin", origin, "--cache", cache, "--mode", mode,
        ],
    );
    std::fs::create_dir_all(state).unwrap();
    let serve = KillOnDrop(
        Command::new(BIN)
            .arg("serve")
            .env("TIERCACHE_STATE_DIR", state)
            .envs(serve_env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(state.join("serve.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let sock = state.join("tc0.nbd");
    wait_for_socket(&sock);
    wait_for_socket(&state.join("tc0.sock"));
    (serve, format!("nbd+unix:///?socket={}", sock.display()))
}
