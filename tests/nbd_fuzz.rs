//! The NBD fuzz targets' bodies (`tiercache::frontend::nbd::fuzz`) under seeded
//! mutation of valid inputs, so CI runs them without libFuzzer: option
//! haggling without TLS, with optional and with required TLS (options
//! inside TLS after STARTTLS included), request validation, and block
//! status encoding. The seed is printed; rerun with NBD_FUZZ_SEED. A
//! failing input is saved for replay with the fuzz target.
//!
//! The seed corpus in fuzz/seeds/ is written from the same inputs:
//! `cargo test --test nbd_fuzz -- --ignored write_fuzz_seeds`.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::frontend::nbd::fuzz;
use tiercache::frontend::nbd::handshake::TlsPolicy;
use tiercache::nbd::proto;

fn opt(code: u32, data: &[u8]) -> Vec<u8> {
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&code.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn info(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

fn session(flags: u32, options: &[Vec<u8>]) -> Vec<u8> {
    let mut s = flags.to_be_bytes().to_vec();
    for o in options {
        s.extend_from_slice(o);
    }
    s
}

/// Valid option sessions: (name, bytes after any policy byte).
fn option_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use proto::*;
    let contexts = proto::meta_context_request("", &["base:allocation", "tiercache:cache"]);
    vec![
        (
            "tls_go_contexts",
            session(
                3,
                &[
                    opt(OPT_STARTTLS, &[]),
                    opt(OPT_STRUCTURED_REPLY, &[]),
                    opt(OPT_SET_META_CONTEXT, &contexts),
                    opt(OPT_GO, &info("", &[INFO_BLOCK_SIZE])),
                ],
            ),
        ),
        (
            "refused_then_tls",
            session(
                3,
                &[
                    opt(OPT_LIST, &[]),
                    opt(OPT_GO, &info("disk", &[])),
                    opt(OPT_STARTTLS, &[]),
                    opt(OPT_STRUCTURED_REPLY, &[]),
                    opt(
                        OPT_LIST_META_CONTEXT,
                        &proto::meta_context_request("disk", &[]),
                    ),
                    opt(OPT_INFO, &info("", &[INFO_NAME, INFO_DESCRIPTION])),
                    opt(OPT_EXPORT_NAME, b""),
                ],
            ),
        ),
        (
            "plain_contexts_then_tls",
            session(
                1,
                &[
                    opt(OPT_STRUCTURED_REPLY, &[]),
                    opt(OPT_SET_META_CONTEXT, &contexts),
                    opt(OPT_STARTTLS, &[]),
                    opt(OPT_STARTTLS, &[]),
                    opt(OPT_GO, &info("", &[])),
                ],
            ),
        ),
        (
            "plain_export_name",
            session(3, &[opt(OPT_ABORT, &[]), opt(OPT_EXPORT_NAME, b"disk")]),
        ),
    ]
}

fn request_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use proto::*;
    let req = |config: u8, cmd: u16, flags: u16, off: u64, len: u32| {
        let mut b = vec![config];
        b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&7u64.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    };
    vec![
        (
            "block_status",
            req(0b1100, CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 4096, 1 << 20),
        ),
        ("unaligned_write", req(0, CMD_WRITE, CMD_FLAG_FUA, 7, 3)),
        ("unaligned_read_512", req(0b10, CMD_READ, 0, 511, 2)),
        (
            "zero_edges",
            req(0, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 100, 70_000),
        ),
        ("ro_trim", req(1, CMD_TRIM, 0, 0, 4096)),
    ]
}

fn block_status_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let input = |flags: u8, len: u32, extents: &[(u64, u32)]| {
        let mut b = vec![flags];
        b.extend_from_slice(&len.to_le_bytes());
        for &(l, f) in extents {
            b.extend_from_slice(&l.to_le_bytes());
            b.extend_from_slice(&f.to_le_bytes());
        }
        b
    };
    vec![
        (
            "mixed",
            input(0, 1 << 20, &[(512, 0), (65536, 3), (4096, 3), (1 << 30, 1)]),
        ),
        ("req_one", input(1, 4096, &[(100, 1), (100, 2)])),
        ("nothing", input(0, 4096, &[])),
        (
            "zero_lengths",
            input(0, 100, &[(0, 1), (0, 2), (7, 2), (u64::MAX, 0)]),
        ),
    ]
}

fn mutate(rng: &mut ChaCha8Rng, s: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..6) {
        if s.is_empty() {
            s.push(rng.gen());
            continue;
        }
        let at = rng.gen_range(0..s.len());
        match rng.gen_range(0..7) {
            0 => s[at] ^= 1 << rng.gen_range(0..8),
            1 => s[at] = rng.gen(),
            2 => s.truncate(at),
            3 => {
                let junk: Vec<u8> = (0..rng.gen_range(1..16)).map(|_| rng.gen()).collect();
                s.splice(at..at, junk);
            }
            4 => {
                let end = (at + rng.gen_range(1..32)).min(s.len());
                s.drain(at..end);
            }
            5 => {
                // Repeat a slice: options and extents come in runs.
                let end = (at + rng.gen_range(1..64)).min(s.len());
                let piece = s[at..end].to_vec();
                let to = rng.gen_range(0..=s.len());
                s.splice(to..to, piece);
            }
            _ => s[at] = [0, 0xff, 0x7f, 0x80][rng.gen_range(0..4)],
        }
    }
}

fn seed() -> u64 {
    let seed = std::env::var("NBD_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (rerun with NBD_FUZZ_SEED={seed})");
    seed
}

/// Runs `body` on every seed unchanged, then on `runs` mutations.
fn mutation_test(
    target: &str,
    seeds: Vec<Vec<u8>>,
    runs: u32,
    body: impl Fn(&[u8]) + std::panic::RefUnwindSafe,
) {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for s in &seeds {
        body(s);
    }
    for i in 0..runs {
        let mut input = seeds[rng.gen_range(0..seeds.len())].clone();
        mutate(&mut rng, &mut input);
        if std::panic::catch_unwind(|| body(&input)).is_err() {
            let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{target}-{seed}-{i}"));
            std::fs::write(&path, &input).unwrap();
            panic!(
                "{target}: mutation {i} of seed {seed} failed; input saved to {} (replay with fuzz target {target})",
                path.display()
            );
        }
    }
}

fn values(v: Vec<(&'static str, Vec<u8>)>) -> Vec<Vec<u8>> {
    v.into_iter().map(|(_, b)| b).collect()
}

#[test]
fn options_without_tls_survive_mutation() {
    mutation_test("nbd_options", values(option_seeds()), 100_000, |d| {
        fuzz::options(TlsPolicy::Off, d);
    });
}

#[test]
fn options_with_tls_survive_mutation() {
    let mut seeds = Vec::new();
    for (_, s) in option_seeds() {
        for policy in [0u8, 1] {
            let mut b = vec![policy];
            b.extend_from_slice(&s);
            seeds.push(b);
        }
    }
    // The unmutated sessions end where they should.
    let ends: Vec<_> = seeds
        .iter()
        .map(|s| {
            let tls = if s[0] & 1 == 0 {
                TlsPolicy::Optional
            } else {
                TlsPolicy::Required
            };
            fuzz::options(tls, &s[1..])
        })
        .collect();
    assert_eq!(ends[1], fuzz::OptionsEnd::Transmission { tls: true });
    assert_eq!(ends[3], fuzz::OptionsEnd::Transmission { tls: true });
    mutation_test("nbd_options_tls", seeds, 200_000, |d| {
        let Some((&policy, rest)) = d.split_first() else {
            return;
        };
        let tls = if policy & 1 == 0 {
            TlsPolicy::Optional
        } else {
            TlsPolicy::Required
        };
        fuzz::options(tls, rest);
    });
}

#[test]
fn requests_survive_mutation() {
    mutation_test(
        "nbd_requests",
        values(request_seeds()),
        100_000,
        fuzz::request,
    );
}

#[test]
fn block_status_survives_mutation() {
    mutation_test(
        "nbd_block_status",
        values(block_status_seeds()),
        100_000,
        fuzz::block_status,
    );
}

/// Writes the seeds above into fuzz/seeds/:
/// `cargo test --test nbd_fuzz -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    for (name, s) in option_seeds() {
        write("nbd_options", name, &s);
        for (policy, p) in [("optional", 0u8), ("required", 1)] {
            let mut b = vec![p];
            b.extend_from_slice(&s);
            write("nbd_options_tls", &format!("{name}_{policy}"), &b);
        }
    }
    for (name, s) in request_seeds() {
        write("nbd_requests", name, &s);
    }
    for (name, s) in block_status_seeds() {
        write("nbd_block_status", name, &s);
    }
}
