//! The NBD client backend against real servers (nbdkit, qemu-nbd) started
//! here. The servers are required: a missing tool fails the test with the
//! Debian package to install.

#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/servers.rs"]
mod servers;

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use servers::{listening, nbdkit_unix, spawn, unix_uri, wait_ready, Server};
use tiercache::device::nbd::NbdDevice;
use tiercache::device::{open_device, BlockDevice, DeviceError};

/// `qemu-nbd -t -f raw -k SOCK FILE`, with a 16 MiB image.
fn qemu_nbd(extra: &[&str]) -> (Server, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("qemu.sock");
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut args = vec!["-t", "-f", "raw", "-k", sock.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(img.to_str().unwrap());
    let mut child = spawn("qemu-nbd", "qemu-utils", &args);
    wait_ready(&mut child, "qemu-nbd", || listening(&sock));
    let server = Server {
        child,
        uri: unix_uri(&sock, ""),
        dir: Some(dir),
    };
    (server, img)
}

/// A byte pattern that differs per offset and per `tag`.
fn pattern(offset: u64, len: usize, tag: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
            x as u8 ^ tag
        })
        .collect()
}

fn round_trips(dev: &dyn BlockDevice) {
    let size = dev.size_bytes();
    let cases: [(u64, usize); 7] = [
        (0, 512),
        (512, 4096),
        (4096 * 3, 65536),
        (1 << 20, (1 << 20) + 512),
        ((5 << 20) - 512, 8192),
        (size - 512, 512),
        (size - (3 << 20), 3 << 20),
    ];
    for (i, &(off, len)) in cases.iter().enumerate() {
        let data = pattern(off, len, i as u8);
        dev.write_at(&data, off).unwrap();
        let mut back = vec![0u8; len];
        dev.read_at(&mut back, off).unwrap();
        assert!(back == data, "mismatch at {off}+{len}");
    }
    dev.flush().unwrap();
}

#[test]
fn nbdkit_memory_round_trip() {
    let server = nbdkit_unix(&["memory", "64M"]);
    let dev = open_device(&server.uri).unwrap();
    assert_eq!(dev.size_bytes(), 64 << 20);
    assert_eq!(dev.name(), server.uri);
    round_trips(&*dev);

    // The client refuses ranges beyond the end and unaligned ranges itself.
    let mut buf = vec![0u8; 4096];
    let err = dev.read_at(&mut buf, 64 << 20).unwrap_err();
    assert!(matches!(err, DeviceError::OutOfRange { .. }), "{err}");
    let err = dev.write_at(&buf[..100], 0).unwrap_err();
    assert!(matches!(err, DeviceError::Unaligned { .. }), "{err}");

    // nbdkit's memory plugin supports trim; trimmed bytes read back as zero.
    dev.discard(1 << 20, 1 << 20).unwrap();
    dev.read_at(&mut buf, 1 << 20).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn identity_is_stable_and_follows_the_normalized_uri() {
    let server = nbdkit_unix(&["memory", "1M"]);
    let a = NbdDevice::connect(&server.uri, 1).unwrap();
    let b = NbdDevice::connect(&server.uri.replace(":///", "://"), 1).unwrap();
    assert_ne!(a.identity(), 0);
    assert_eq!(a.identity(), b.identity());
    let other = NbdDevice::connect(&server.uri.replace(":///", ":///other"), 1).unwrap();
    assert_ne!(a.identity(), other.identity());
}

#[test]
fn qemu_nbd_round_trip_reaches_the_file() {
    let (server, img) = qemu_nbd(&[]);
    let dev = open_device(&server.uri).unwrap();
    assert_eq!(dev.size_bytes(), 16 << 20);
    round_trips(&*dev);
    let data = pattern(8192, 4096, 0x5a);
    dev.write_at(&data, 8192).unwrap();
    dev.flush().unwrap();
    let on_disk = std::fs::read(&img).unwrap();
    assert!(on_disk[8192..8192 + 4096] == data[..]);
}

#[test]
fn qemu_nbd_unknown_export_is_a_clear_open_error() {
    let (server, _img) = qemu_nbd(&["-x", "disk0"]);
    let good = server.uri.replace(":///", ":///disk0");
    NbdDevice::connect(&good, 1).unwrap();
    let bad = server.uri.replace(":///", ":///nope");
    let err = NbdDevice::connect(&bad, 1).err().unwrap();
    let msg = err.to_string();
    assert!(matches!(err, DeviceError::Open { .. }), "{msg}");
    assert!(
        msg.contains("'nope'") && msg.contains("NBD_REP_ERR_UNKNOWN"),
        "{msg}"
    );
}

/// 16 threads write and verify their own regions at once, so requests and
/// replies interleave on the connection (the delay filter reorders replies).
fn hammer(dev: Arc<dyn BlockDevice>, seed: u64, ops_per_thread: usize) {
    const THREADS: u64 = 16;
    let region = dev.size_bytes() / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let dev = Arc::clone(&dev);
            thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ t);
                let base = t * region;
                // Model: the tag last written to each 4 KiB block of the region.
                let blocks = (region / 4096) as usize;
                let mut model = vec![None::<u8>; blocks];
                for op in 0..ops_per_thread {
                    let first = rng.gen_range(0..blocks);
                    let count = rng.gen_range(1..=16.min(blocks - first));
                    let off = base + first as u64 * 4096;
                    if rng.gen_bool(0.5) {
                        let tag = (op as u8) | 1;
                        let mut data = Vec::new();
                        for b in 0..count {
                            data.extend(pattern(off + b as u64 * 4096, 4096, tag));
                        }
                        dev.write_at(&data, off).unwrap();
                        model[first..first + count].fill(Some(tag));
                    } else {
                        let mut back = vec![0u8; count * 4096];
                        dev.read_at(&mut back, off).unwrap();
                        for b in 0..count {
                            let block_off = off + b as u64 * 4096;
                            let want = match model[first + b] {
                                Some(tag) => pattern(block_off, 4096, tag),
                                None => vec![0u8; 4096],
                            };
                            assert!(
                                back[b * 4096..(b + 1) * 4096] == want[..],
                                "seed {seed}: thread {t} block at {block_off} differs"
                            );
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join()
            .expect("a hammer thread failed (see its seed above)");
    }
}

#[test]
fn sixteen_threads_with_delayed_reads() {
    let server = nbdkit_unix(&["--filter=delay", "memory", "64M", "delay-read=1ms"]);
    let dev: Arc<dyn BlockDevice> = open_device(&server.uri).unwrap();
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    hammer(Arc::clone(&dev), seed, 300);
    dev.flush().unwrap();
}

#[test]
fn sixteen_threads_on_qemu_nbd() {
    let (server, _img) = qemu_nbd(&["--shared=4"]);
    let dev: Arc<dyn BlockDevice> = open_device(&server.uri).unwrap();
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    hammer(dev, seed, 300);
}

#[test]
fn server_errors_carry_the_errno() {
    let server = nbdkit_unix(&[
        "--filter=error",
        "memory",
        "1M",
        "error=ENOSPC",
        "error-pwrite-rate=100%",
    ]);
    let dev = open_device(&server.uri).unwrap();
    let err = dev.write_at(&[7u8; 4096], 0).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DeviceError::Io { .. }), "{msg}");
    assert!(msg.contains("ENOSPC (errno 28)"), "{msg}");
    // Reads still work on the same connection.
    let mut buf = [1u8; 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 4096]);
}

#[test]
fn read_only_export_refuses_writes_clearly() {
    let server = nbdkit_unix(&["-r", "memory", "1M"]);
    let dev = NbdDevice::connect(&server.uri, 1).unwrap();
    assert!(dev.is_read_only());
    let err = dev.write_at(&[0u8; 512], 0).unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    let mut buf = [0u8; 512];
    dev.read_at(&mut buf, 0).unwrap();
}

#[test]
fn old_non_fixed_handshake_uses_export_name() {
    // Masking every handshake flag makes nbdkit speak plain (non-fixed)
    // newstyle: no NBD_OPT_GO, and 124 zero bytes after EXPORT_NAME.
    let server = nbdkit_unix(&["--mask-handshake=0", "memory", "16M"]);
    let dev = open_device(&server.uri).unwrap();
    assert_eq!(dev.size_bytes(), 16 << 20);
    round_trips(&*dev);
}

#[test]
fn killing_the_server_fails_requests_instead_of_hanging() {
    let mut server = nbdkit_unix(&["--filter=delay", "memory", "64M", "delay-read=2ms"]);
    let dev: Arc<dyn BlockDevice> = open_device(&server.uri).unwrap();
    let (tx, rx) = mpsc::channel();
    for t in 0..8u64 {
        let dev = Arc::clone(&dev);
        let tx = tx.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            let mut i = 0u64;
            let err = loop {
                let off = ((t * 97 + i) % 1000) * 65536;
                let r = if i.is_multiple_of(2) {
                    dev.read_at(&mut buf, off)
                } else {
                    dev.write_at(&buf, off)
                };
                if let Err(e) = r {
                    break e;
                }
                i += 1;
            };
            tx.send(err).unwrap();
        });
    }
    drop(tx);
    thread::sleep(Duration::from_millis(300));
    server.kill();
    for _ in 0..8 {
        let err = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a request hung after the server died");
        assert!(matches!(err, DeviceError::Io { .. }), "{err}");
    }
    // Later requests fail at once.
    let started = Instant::now();
    let err = dev.flush().unwrap_err();
    assert!(err.to_string().contains("connection lost"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// A TCP port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn tcp_with_multiple_connections() {
    let port = free_port().to_string();
    let mut child = spawn(
        "nbdkit",
        "nbdkit",
        &[
            "-f",
            "--exit-with-parent",
            "-i",
            "127.0.0.1",
            "-p",
            &port,
            "memory",
            "32M",
        ],
    );
    let addr = format!("127.0.0.1:{port}");
    wait_ready(&mut child, "nbdkit", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    let server = Server {
        child,
        uri: format!("nbd://127.0.0.1:{port}/"),
        dir: None,
    };
    // nbdkit's memory plugin advertises NBD_FLAG_CAN_MULTI_CONN.
    let dev = NbdDevice::connect(&server.uri, 4).unwrap();
    assert_eq!(dev.connection_count(), 4);
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    // The hammer's model starts from an all-zero device, so it goes first.
    hammer(Arc::clone(&dev), seed, 200);
    dev.flush().unwrap();
    round_trips(&*dev);
    drop(dev);

    let single = open_device(&server.uri).unwrap();
    round_trips(&*single);
}

#[test]
fn bad_uris_and_missing_servers_give_open_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody.sock");
    let cases = [
        ("nbd://".to_string(), "needs a host"),
        ("nbd+unix:///".to_string(), "socket="),
        ("nbd+unix:///?socket=relative".to_string(), "not absolute"),
        ("nbds://host/".to_string(), "TLS"),
        (unix_uri(&missing, ""), "nobody.sock"),
        (format!("nbd://127.0.0.1:{}/", free_port()), "127.0.0.1"),
    ];
    for (uri, want) in cases {
        let err = open_device(&uri).err().unwrap();
        let msg = err.to_string();
        assert!(matches!(err, DeviceError::Open { .. }), "{uri}: {msg}");
        assert!(msg.contains(want), "{uri}: '{msg}' lacks '{want}'");
    }
}

#[test]
fn requests_are_split_at_the_servers_maximum_block_size() {
    // The policy filter advertises a 64 KiB maximum via NBD_INFO_BLOCK_SIZE
    // and fails larger requests with EINVAL, so an unsplit request would fail.
    let server = nbdkit_unix(&[
        "--filter=blocksize-policy",
        "memory",
        "16M",
        "blocksize-maximum=64K",
        "blocksize-error-policy=error",
    ]);
    let dev = open_device(&server.uri).unwrap();
    round_trips(&*dev);
    let data = pattern(4096, (1 << 20) + 4096, 9);
    dev.write_at(&data, 4096).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read_at(&mut back, 4096).unwrap();
    assert!(back == data);
}

#[test]
fn larger_minimum_block_size_is_refused_at_open() {
    let server = nbdkit_unix(&[
        "--filter=blocksize-policy",
        "memory",
        "1M",
        "blocksize-minimum=4096",
    ]);
    let err = open_device(&server.uri).err().unwrap();
    assert!(err.to_string().contains("4096-byte aligned"), "{err}");
}

/// `tiercache create --origin nbd+unix://...` registers the URI as given
/// (not as a path), and the cache works over it: data written through the
/// cache reaches qemu-nbd's file after `detach`.
#[test]
fn cli_creates_a_cache_over_an_nbd_origin() {
    let (server, img) = qemu_nbd(&[]);
    let dir = tempfile::Builder::new()
        .prefix("nbd-origin-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let state = dir.path().join("state");
    let cache = dir.path().join("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let tc = |args: &[&str]| daemon::cli_ok_in(&state, args);
    tc(&[
        "create",
        "--origin",
        &server.uri,
        "--cache",
        cache.to_str().unwrap(),
        "--mode",
        "writeback",
    ]);
    let status = tc(&["status", "--json"]);
    assert!(status.contains(&server.uri), "{status}");
    // Write through the engine (offline, as a library user would), then
    // detach with the CLI: the origin file must hold the data.
    {
        let engine = tiercache::engine::Engine::open(
            tiercache::device::open_device(cache.to_str().unwrap()).unwrap(),
            tiercache::device::open_device(&server.uri).unwrap(),
            &tiercache::engine::OpenOptions::default(),
        )
        .unwrap();
        engine
            .write(1 << 20, &pattern(1 << 20, 65536, 7), false)
            .unwrap();
        engine.close().unwrap();
    }
    tc(&["detach"]);
    let data = std::fs::read(&img).unwrap();
    assert_eq!(
        &data[1 << 20..(1 << 20) + 65536],
        &pattern(1 << 20, 65536, 7)[..]
    );
}
