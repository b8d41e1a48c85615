//! The NBD fuzz targets' bodies (`tiercache::frontend::nbd::fuzz`) under seeded
//! mutation of valid inputs, so CI runs them without libFuzzer: option
//! haggling without TLS, with optional and with required TLS (options
//! inside TLS after STARTTLS included), request validation, and block
//! status encoding. The seed is printed; rerun with NBD_FUZZ_SEED. A
//! failing input is saved for replay with the fuzz target.
//!
//! The seed corpus in fuzz/seeds/ is written from the same inputs:
//! `cargo test --test nbd_fuzz -- --ignored write_fuzz_seeds`.

#[path = "common/mutation.rs"]
mod mutation;

use std::path::Path;

use mutation::values;
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

/// Runs `body` on every seed unchanged, then on `runs` mutations
/// (`NBD_FUZZ_SEED` replays a run).
fn mutation_test(
    target: &str,
    seeds: Vec<Vec<u8>>,
    runs: u32,
    body: impl Fn(&[u8]) + std::panic::RefUnwindSafe,
) {
    mutation::mutation_test(target, "NBD_FUZZ_SEED", seeds, runs, body);
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
