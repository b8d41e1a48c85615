//! The spec's default block sizes (proto.md "Block size constraints"): a
//! client that did not ask for block sizes may send byte-granular
//! requests, and the server serves them correctly, by read-modify-write of
//! partial sectors in the server. Seeded property tests against an
//! in-memory model (the seed is printed; rerun with NBD_MODEL_SEED), a
//! race of unaligned writes into the same sectors from several connections,
//! requests up to 64 MiB, and the errors the spec asks for.

#[path = "common/nbd.rs"]
mod common;
#[path = "common/mutation.rs"]
mod mutation;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use common::{Backend, RawClient, TestServer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::engine::Mode;
use tiercache::frontend::nbd::ServerConfig;
use tiercache::nbd::proto;

const BACKENDS: [Backend; 3] = [
    Backend::Device,
    Backend::Engine(Mode::Writeback),
    Backend::Engine(Mode::Writethrough),
];

fn seed() -> u64 {
    mutation::seed("NBD_MODEL_SEED")
}

/// Handshake with NBD_OPT_GO but no NBD_INFO_BLOCK_SIZE request: the
/// client did not agree to any block size, so byte granularity applies.
fn granular_client(s: &TestServer) -> RawClient {
    let mut c = s.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    c.send_option(proto::OPT_GO, &RawClient::info_data("", &[]));
    loop {
        let (_, t, _) = c.read_option_reply();
        match t {
            proto::REP_ACK => return c,
            proto::REP_INFO => {}
            other => panic!("GO refused: {other:#x}"),
        }
    }
}

/// Handshake with NBD_OPT_EXPORT_NAME (no option replies, no block sizes).
fn export_name_client(s: &TestServer) -> RawClient {
    let mut c = s.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    c.send_option(proto::OPT_EXPORT_NAME, b"");
    c.read_n(10);
    c
}

/// One request of a batch, and what its reply must be.
enum Req {
    Write { off: u64, data: Vec<u8> },
    Zero { off: u64, len: u32 },
    Trim { off: u64, len: u32 },
    Read { off: u64, len: u32 },
    Cache { off: u64, len: u32 },
}

/// The model: the volume's bytes, and which of them a trim made
/// unspecified (proto.md NBD_CMD_TRIM) until written again.
struct Model {
    bytes: Vec<u8>,
    known: Vec<bool>,
}

impl Model {
    fn apply(&mut self, r: &Req) {
        match r {
            Req::Write { off, data } => {
                let o = *off as usize;
                self.bytes[o..o + data.len()].copy_from_slice(data);
                self.known[o..o + data.len()].fill(true);
            }
            Req::Zero { off, len } => {
                let (o, n) = (*off as usize, *len as usize);
                self.bytes[o..o + n].fill(0);
                self.known[o..o + n].fill(true);
            }
            Req::Trim { off, len } => {
                let (o, n) = (*off as usize, *len as usize);
                self.known[o..o + n].fill(false);
            }
            Req::Read { .. } | Req::Cache { .. } => {}
        }
    }

    fn check(&self, off: u64, got: &[u8], what: &str) {
        let o = off as usize;
        for (i, &b) in got.iter().enumerate() {
            if self.known[o + i] && self.bytes[o + i] != b {
                panic!(
                    "{what}: byte {} is {b:#04x}, the model says {:#04x}",
                    o + i,
                    self.bytes[o + i]
                );
            }
        }
    }
}

/// Sends a batch pipelined and checks every reply (all must succeed).
fn run_batch(c: &mut RawClient, batch: &[Req], model: &Model, what: &str) {
    let mut wire = Vec::new();
    for (i, r) in batch.iter().enumerate() {
        let cookie = i as u64;
        let (cmd, off, len) = match r {
            Req::Write { off, data } => (proto::CMD_WRITE, *off, data.len() as u32),
            Req::Zero { off, len } => (proto::CMD_WRITE_ZEROES, *off, *len),
            Req::Trim { off, len } => (proto::CMD_TRIM, *off, *len),
            Req::Read { off, len } => (proto::CMD_READ, *off, *len),
            Req::Cache { off, len } => (proto::CMD_CACHE, *off, *len),
        };
        wire.extend(RawClient::request_bytes(cmd, 0, cookie, off, len));
        if let Req::Write { data, .. } = r {
            wire.extend_from_slice(data);
        }
    }
    let mut w = c.s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&wire).unwrap());
    let mut seen = vec![false; batch.len()];
    for _ in 0..batch.len() {
        let (cookie, errno) = c.read_simple_reply();
        let i = cookie as usize;
        assert!(
            !std::mem::replace(&mut seen[i], true),
            "{what}: cookie {i} twice"
        );
        assert_eq!(errno, 0, "{what}: request {i} failed");
        if let Req::Read { off, len } = batch[i] {
            let got = c.read_n(len as usize);
            model.check(off, &got, &format!("{what}: read {off}+{len}"));
        }
    }
    sender.join().unwrap();
}

/// Picks a range of 1 byte to ~3 sectors (sometimes up to 40 KiB) that
/// does not overlap any byte of `taken`; ranges may share sectors.
fn free_range(rng: &mut ChaCha8Rng, size: u64, taken: &[(u64, u64)]) -> Option<(u64, u32)> {
    for _ in 0..20 {
        let len = if rng.gen_bool(0.1) {
            rng.gen_range(1..40_000u64)
        } else {
            rng.gen_range(1..1600u64)
        };
        // Cluster offsets in a few hot sectors, so ranges share them often.
        let off = if rng.gen_bool(0.5) {
            rng.gen_range(0..8u64) * 512 + rng.gen_range(0..512)
        } else {
            rng.gen_range(0..size - 1)
        };
        let len = len.min(size - off);
        if taken.iter().all(|&(a, b)| off + len <= a || b <= off) {
            return Some((off, len as u32));
        }
    }
    None
}

fn model_round(
    s: &TestServer,
    c: &mut RawClient,
    rng: &mut ChaCha8Rng,
    model: &mut Model,
    what: &str,
) {
    let size = s.size_bytes;
    // A batch of changes on disjoint byte ranges (their order is free, so
    // the model's result is the only correct one), then a batch of reads.
    let mut taken = Vec::new();
    let mut batch = Vec::new();
    for _ in 0..rng.gen_range(1..12) {
        let Some((off, len)) = free_range(rng, size, &taken) else {
            continue;
        };
        taken.push((off, off + u64::from(len)));
        batch.push(match rng.gen_range(0..10) {
            0 => Req::Zero { off, len },
            1 => Req::Trim { off, len },
            2 => Req::Cache { off, len },
            _ => Req::Write {
                off,
                data: (0..len).map(|_| rng.gen()).collect(),
            },
        });
    }
    run_batch(c, &batch, model, what);
    for r in &batch {
        model.apply(r);
    }
    let reads: Vec<Req> = (0..rng.gen_range(1..8))
        .map(|_| {
            let off = rng.gen_range(0..size - 1);
            let len = rng.gen_range(1..3000u64).min(size - off) as u32;
            Req::Read { off, len }
        })
        .chain(taken.iter().map(|&(a, b)| Req::Read {
            off: a,
            len: (b - a) as u32,
        }))
        .collect();
    run_batch(c, &reads, model, what);
}

#[test]
fn byte_granular_requests_match_the_model() {
    let seed = seed();
    for backend in BACKENDS {
        let size = (2 << 20) + 2048 * 3;
        let s = TestServer::start_backend(size, TestServer::test_config(), backend);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ size);
        let mut model = Model {
            bytes: vec![0; size as usize],
            known: vec![true; size as usize],
        };
        let mut a = granular_client(&s);
        let mut b = export_name_client(&s);
        for round in 0..150 {
            let what = format!("seed {seed} {backend:?} round {round}");
            let c = if round % 2 == 0 { &mut a } else { &mut b };
            model_round(&s, c, &mut rng, &mut model, &what);
        }
        // The whole volume, read back in unaligned pieces.
        let mut off = 0u64;
        while off < size {
            let len = rng.gen_range(1..300_000u64).min(size - off) as u32;
            let (e, got) = a.read(1, off, len);
            assert_eq!(e, 0);
            model.check(off, &got, &format!("seed {seed} {backend:?} final read"));
            off += u64::from(len);
        }
    }
}

/// Several connections write disjoint bytes interleaved inside the same
/// few sectors at once. A read-modify-write that is not serialised against
/// the others loses their bytes; none may be lost.
#[test]
fn concurrent_unaligned_writes_to_one_sector_lose_nothing() {
    let seed = seed();
    for backend in [Backend::Device, Backend::Engine(Mode::Writeback)] {
        let s = TestServer::start_backend(1 << 20, TestServer::test_config(), backend);
        let writers = 4u64;
        let rounds = 40u64;
        let span = 4 * 512u64; // four sectors, shared by every writer
        let piece = 7u64; // writer w owns the 7-byte pieces p with p % 4 == w
        let mut threads = Vec::new();
        for w in 0..writers {
            let mut c = granular_client(&s);
            threads.push(std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed + w);
                for round in 0..rounds {
                    let mut batch = Vec::new();
                    let mut p = w;
                    while (p + 1) * piece <= span {
                        let tag = (w as u8) << 6 | (round as u8 & 0x3f);
                        batch.push(Req::Write {
                            off: p * piece,
                            data: vec![tag; piece as usize],
                        });
                        p += writers;
                    }
                    // Shuffle so pieces of one sector go out in any order.
                    for i in (1..batch.len()).rev() {
                        batch.swap(i, rng.gen_range(0..=i));
                    }
                    let model = Model {
                        bytes: Vec::new(),
                        known: Vec::new(),
                    };
                    run_batch(&mut c, &batch, &model, &format!("writer {w}"));
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        let mut c = granular_client(&s);
        let (e, got) = c.read(1, 0, span as u32);
        assert_eq!(e, 0);
        let last = (rounds - 1) as u8 & 0x3f;
        for p in 0..span / piece {
            let want = ((p % writers) as u8) << 6 | last;
            let at = (p * piece) as usize;
            assert!(
                got[at..at + piece as usize].iter().all(|&b| b == want),
                "seed {seed} {backend:?}: piece {p} lost its last write: {:?}",
                &got[at..at + piece as usize]
            );
        }
    }
}

fn big_config() -> ServerConfig {
    ServerConfig {
        handshake_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_secs(5),
        ..ServerConfig::default()
    }
}

/// 64 MiB requests (what nbdkit takes), aligned and not; beyond that a
/// read is refused with EINVAL and a write ends the connection.
#[test]
fn requests_up_to_64_mib() {
    let size = 160u64 << 20;
    let s = TestServer::start_backend(size, big_config(), Backend::Device);
    let mut c = granular_client(&s);
    let max = 64u32 << 20;
    let mut rng = ChaCha8Rng::seed_from_u64(64);
    let data: Vec<u8> = (0..max).map(|_| rng.gen()).collect();
    for off in [0u64, 1 << 20, (70 << 20) + 3] {
        assert_eq!(c.write(1, off, &data), 0, "64 MiB write at {off}");
        let (e, back) = c.read(2, off, max);
        assert_eq!(e, 0);
        assert!(back == data, "64 MiB round trip at {off} differs");
    }
    let (e, _) = c.read(3, 0, max + 1);
    assert_eq!(e, proto::EINVAL);
    c.send_request(proto::CMD_WRITE, 0, 4, 0, max + 512);
    c.expect_closed();
}

/// Errors per proto.md for a byte-granular client.
#[test]
fn byte_granular_errors() {
    use proto::*;
    let s = TestServer::start_backend(1 << 20, TestServer::test_config(), Backend::Device);
    let size = s.size_bytes;
    let mut c = granular_client(&s);
    let mut expect = |cmd, flags, off, len: u32, payload: &[u8], errno| {
        c.send_request(cmd, flags, 9, off, len);
        c.s.write_all(payload).unwrap();
        assert_eq!(
            c.read_simple_reply(),
            (9, errno),
            "cmd {cmd} at {off}+{len}"
        );
        if errno == 0 && cmd == CMD_READ {
            c.read_n(len as usize);
        }
    };
    expect(CMD_WRITE, 0, size - 1, 2, &[1, 2], ENOSPC);
    expect(CMD_WRITE_ZEROES, 0, size - 3, 5, &[], ENOSPC);
    expect(CMD_READ, 0, size - 1, 2, &[], EINVAL);
    expect(CMD_TRIM, 0, size - 1, 2, &[], EINVAL);
    expect(CMD_CACHE, 0, size - 1, 2, &[], EINVAL);
    expect(CMD_BLOCK_STATUS, 0, 1, 2, &[], EINVAL);
    expect(CMD_WRITE, 1 << 12, 3, 3, &[1, 2, 3], EINVAL);
    expect(CMD_READ, 0, size - 1, 1, &[], 0);
    expect(CMD_WRITE, CMD_FLAG_FUA, size - 1, 1, &[7], 0);
    expect(CMD_TRIM, 0, 3, 100, &[], 0);
    expect(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 5, 1, &[], 0);
    // Nothing was corrupted: only the last byte was written.
    let (e, all) = c.read(10, 0, size as u32);
    assert_eq!(e, 0);
    assert!(all[..size as usize - 1].iter().all(|&b| b == 0));
    assert_eq!(all[size as usize - 1], 7);
}

/// libnbd without a block size request sends unaligned requests as they
/// come; they read back exactly.
#[test]
fn libnbd_without_block_sizes() {
    let script = r#"
import sys, nbd
h = nbd.NBD()
h.set_request_block_size(False)
h.connect_uri(sys.argv[1])
h.pwrite(b"hello, world", 1000)
h.pwrite(b"XY", 1005)
assert h.pread(12, 1000) == b"helloXYworld", h.pread(12, 1000)
h.zero(3, 1001)
assert h.pread(14, 999) == b"\0h\0\0\0oXYworld\0", h.pread(14, 999)
h.shutdown()
print("ok")
"#;
    for backend in BACKENDS {
        let s = TestServer::start_backend(1 << 20, TestServer::test_config(), backend);
        let out = Command::new("/usr/bin/python3")
            .args(["-c", script, &s.uri()])
            .output()
            .expect("/usr/bin/python3 (Debian package python3-libnbd)");
        assert!(
            out.status.success(),
            "{backend:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
