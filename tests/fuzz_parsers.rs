//! The bodies of the fuzz targets of every parser of untrusted bytes but
//! the NBD server's (tests/nbd_fuzz.rs) and the whole server
//! (tests/fuzz_session.rs), under seeded mutation of valid inputs, so CI
//! runs them without libFuzzer: the NBD client's option and reply parsing
//! (bytes from an origin server), NBD and RBD URIs, the TLS-PSK keys file,
//! cache-set labels (bytes from a device), the monitoring server's request
//! heads, control socket requests and registry entries. The seed is
//! printed; rerun with FUZZ_SEED. A failing input is saved for replay with
//! the fuzz target of the same name.
//!
//! The seed corpus in fuzz/seeds/ is written from the same inputs:
//! `cargo test --test fuzz_parsers -- --ignored write_fuzz_seeds`.

#[path = "common/mutation.rs"]
mod mutation;

use mutation::{mutation_test, values, write_seeds};
use tiercache::daemon::fuzz as daemon_fuzz;
use tiercache::device::fuzz as device_fuzz;
use tiercache::device::nbd::fuzz as client_fuzz;
use tiercache::device::set::{Geometry, Label};
use tiercache::monitor::fuzz as monitor_fuzz;
use tiercache::nbd::fuzz as nbd_fuzz;
use tiercache::nbd::proto::*;

const SEED_VAR: &str = "FUZZ_SEED";

fn greeting(flags: u16) -> Vec<u8> {
    let mut g = NBDMAGIC.to_be_bytes().to_vec();
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&flags.to_be_bytes());
    g
}

fn option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut r = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&option.to_be_bytes());
    r.extend_from_slice(&reply_type.to_be_bytes());
    r.extend_from_slice(&(data.len() as u32).to_be_bytes());
    r.extend_from_slice(data);
    r
}

fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut d = INFO_EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    option_reply(OPT_GO, REP_INFO, &d)
}

fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [min, preferred, max] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    option_reply(OPT_GO, REP_INFO, &d)
}

fn cat(mode: u8, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![mode];
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

/// Servers' sides of handshakes: (name, mode byte and server bytes).
fn client_option_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let both = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
    let flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN;
    let go = vec![
        info_export(1 << 30, flags),
        info_block_size(512, 4096, 1 << 20),
        option_reply(OPT_GO, REP_ACK, &[]),
    ];
    let mut export_name_reply = (1u64 << 20).to_be_bytes().to_vec();
    export_name_reply.extend_from_slice(&flags.to_be_bytes());
    let mut floods = vec![greeting(both)];
    floods.extend(std::iter::repeat_n(info_export(4096, flags), 100));
    vec![
        ("go", cat(0, &[vec![greeting(both)], go.clone()].concat())),
        (
            "tls_go",
            cat(
                3,
                &[
                    vec![greeting(both), option_reply(OPT_STARTTLS, REP_ACK, &[])],
                    go,
                ]
                .concat(),
            ),
        ),
        (
            "go_unsupported_then_export_name",
            cat(
                2,
                &[
                    greeting(FLAG_FIXED_NEWSTYLE),
                    option_reply(OPT_GO, REP_ERR_UNSUP, &[]),
                    export_name_reply.clone(),
                    vec![0; 124],
                ],
            ),
        ),
        (
            "oldstyle_export_name",
            cat(0, &[greeting(FLAG_NO_ZEROES), export_name_reply]),
        ),
        (
            "refused",
            cat(
                1,
                &[
                    greeting(both),
                    option_reply(OPT_STARTTLS, REP_ERR_POLICY, b"no TLS here"),
                ],
            ),
        ),
        // 100 NBD_REP_INFO: the client stops at OPTION_REPLIES_MAX.
        ("info_flood", cat(0, &floods)),
    ]
}

fn simple_reply(cookie: u64, errno: u32, data: &[u8]) -> Vec<u8> {
    let mut r = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&errno.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(data);
    r
}

/// Pending requests and reply streams: (name, input).
fn client_reply_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // Four requests: reads of 512 and 16 bytes, a write, a read of 4096.
    let pending = vec![3u8, 1, 0, 2, 1, 16, 0, 0, 0, 0, 1, 0, 16];
    let with = |replies: &[Vec<u8>]| {
        let mut v = pending.clone();
        v.extend(replies.concat());
        v
    };
    vec![
        (
            "in_order",
            with(&[
                simple_reply(1, 0, &[7; 512]),
                simple_reply(2, 0, &[8; 16]),
                simple_reply(3, 0, &[]),
                simple_reply(4, 0, &[9; 4096]),
            ]),
        ),
        (
            "errors_out_of_order",
            with(&[
                simple_reply(3, 28, &[]),
                simple_reply(1, 5, &[]),
                simple_reply(4, 0, &[1; 4096]),
            ]),
        ),
        (
            "unknown_cookie",
            with(&[simple_reply(2, 0, &[8; 16]), simple_reply(9, 0, &[])]),
        ),
        ("cut_short", with(&[simple_reply(4, 0, &[9; 100])])),
    ]
}

fn uri_seeds() -> Vec<(&'static str, Vec<u8>)> {
    [
        ("tcp", "nbd://Server.example:10900/disk%201"),
        ("v6", "nbd://[::1]/"),
        ("unix", "nbd+unix:///exp?socket=/run/nbd%20x.sock"),
        ("tls_psk", "nbds://alice@h/e?tls-psk-file=/etc/k.psk"),
        ("tls_x509", "nbds+unix:///?socket=/s&tls-certificates=/pki"),
        ("rbd", "rbd://tc/img?conf=/etc/ceph/ceph.conf&id=client.tc"),
        ("rbd_encoded", "rbd://p%2Fq/i%20j?id=x"),
    ]
    .into_iter()
    .map(|(n, u)| (n, u.as_bytes().to_vec()))
    .collect()
}

fn psk_seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "two_users",
            b"# psktool\nalice:00ff10ab\nbob:0102\n".to_vec(),
        ),
        (
            "spaces_and_case",
            b"  carol:DEADbeef  \n\n#x:zz\ndave:00\r\n".to_vec(),
        ),
    ]
}

fn label_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let label = |count: usize, generation: u64, stale_mask: u32| Label {
        member_index: 0,
        set_id: 0x5e7,
        generation,
        stale_mask,
        flags: 0,
        geometry: Geometry {
            block_bytes: 4096,
            meta_bytes: 4096 * 8,
            mirror_slots: 16,
            stripe_slots: vec![4; count],
            member_bytes: vec![1 << 20; count],
        },
        serials: [0; tiercache::device::set::MAX_MEMBERS],
    };
    let input = |flags: u8, copies: &[Label]| {
        let mut v = vec![flags];
        for l in copies {
            v.extend_from_slice(&l.to_page()[..256]);
        }
        v
    };
    vec![
        ("two_copies", input(3, &[label(2, 4, 0), label(2, 5, 0)])),
        ("open_whole", input(4 | 3, &[label(3, 2, 0)])),
        ("open_short_member", input(8 | 4 | 3, &[label(2, 2, 0)])),
        ("open_degraded", input(32 | 16 | 4 | 3, &[label(4, 9, 0)])),
        (
            "open_stale_missing",
            input(16 | 4 | 3, &[label(3, 7, 0b100)]),
        ),
    ]
}

fn http_seeds() -> Vec<(&'static str, Vec<u8>)> {
    [
        (
            "metrics",
            &b"\x00GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        ),
        (
            "dashboard",
            b"\x01GET /app.js?v=1 HTTP/1.1\r\nAccept: */*\r\n\r\n",
        ),
        ("head", b"\x01HEAD / HTTP/1.0\n\n"),
        ("post", b"\x01POST /api/snapshot HTTP/1.1\r\n\r\n"),
        ("unfinished", b"\x00GET / HTTP/1.1\r\nHost: x\r\n"),
    ]
    .into_iter()
    .map(|(n, b)| (n, b.to_vec()))
    .collect()
}

fn control_seeds() -> Vec<(&'static str, Vec<u8>)> {
    [
        ("status", r#"{"op":"status"}"#),
        ("flush", r#"{"op":"flush"}"#),
        ("set_mode", r#"{"op":"set-mode","mode":"writearound"}"#),
        (
            "set_writeback",
            r#"{"op":"set-writeback","settings":{"high_pct":60,"low_pct":20,"max_age_secs":30,"idle_secs":5}}"#,
        ),
        (
            "set_admission",
            r#"{"op":"set-admission","settings":{"sequential_cutoff_bytes":4194304,"promote_after":3,"selective_above_pct":80,"guard":true}}"#,
        ),
        ("set_policy", r#"{"op":"set-policy","policy":"lru"}"#),
        ("warm", r#"{"op":"warm","offset":4096,"length":1048576}"#),
        ("detach", r#"{"op":"detach","force":false}"#),
        ("give_up", r#"{"op":"give-up-cache"}"#),
        (
            "replace",
            r#"{"op":"replace-cache","member":1,"device":"/dev/x"}"#,
        ),
    ]
    .into_iter()
    .map(|(n, l)| (n, format!("{l}\n").into_bytes()))
    .collect()
}

fn registry_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let one = r#"{
  "name": "tc0",
  "origin": "/dev/disk/by-id/ata-X",
  "cache": "/dev/nvme0n1p3",
  "created": "2026-11-26T10:00:00Z",
  "distrust_clean": false
}
"#;
    let set = r#"{"name":"tc0","origin":"nbds://u@h/e?tls-psk-file=/k","cache":"/dev/a","more_caches":["/dev/b","/dev/c"],"created":"2026-11-26T10:00:00Z","distrust_clean":true}"#;
    vec![
        ("one_device", one.as_bytes().to_vec()),
        ("cache_set", set.as_bytes().to_vec()),
    ]
}

#[test]
fn client_options_survive_mutation() {
    let seeds = values(client_option_seeds());
    mutation_test(
        "nbd_client_options",
        SEED_VAR,
        seeds,
        20_000,
        client_fuzz::client_options,
    );
}

#[test]
fn client_replies_survive_mutation() {
    let seeds = values(client_reply_seeds());
    mutation_test(
        "nbd_client_replies",
        SEED_VAR,
        seeds,
        20_000,
        client_fuzz::client_replies,
    );
}

#[test]
fn uris_survive_mutation() {
    mutation_test(
        "device_uris",
        SEED_VAR,
        values(uri_seeds()),
        50_000,
        client_fuzz::uris,
    );
}

#[test]
fn psk_keys_survive_mutation() {
    mutation_test(
        "tls_psk_keys",
        SEED_VAR,
        values(psk_seeds()),
        50_000,
        nbd_fuzz::psk_keys,
    );
}

#[test]
fn set_labels_survive_mutation() {
    mutation_test(
        "set_label",
        SEED_VAR,
        values(label_seeds()),
        30_000,
        device_fuzz::set_label,
    );
}

#[test]
fn http_requests_survive_mutation() {
    mutation_test(
        "monitor_http",
        SEED_VAR,
        values(http_seeds()),
        20_000,
        monitor_fuzz::http_request,
    );
}

#[test]
fn control_requests_survive_mutation() {
    mutation_test(
        "control_request",
        SEED_VAR,
        values(control_seeds()),
        5_000,
        daemon_fuzz::control_request,
    );
}

#[test]
fn registry_entries_survive_mutation() {
    mutation_test(
        "registry_entry",
        SEED_VAR,
        values(registry_seeds()),
        30_000,
        daemon_fuzz::registry_entry,
    );
}

/// Inputs the fuzz targets failed on (fuzz/regressions/<target>/, named
/// after the bug) must now pass.
#[test]
fn fuzz_regressions() {
    type Body = fn(&[u8]);
    let bodies: [(&str, Body); 8] = [
        ("nbd_client_options", client_fuzz::client_options),
        ("nbd_client_replies", client_fuzz::client_replies),
        ("device_uris", client_fuzz::uris),
        ("tls_psk_keys", nbd_fuzz::psk_keys),
        ("set_label", device_fuzz::set_label),
        ("monitor_http", monitor_fuzz::http_request),
        ("control_request", daemon_fuzz::control_request),
        ("registry_entry", daemon_fuzz::registry_entry),
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut replayed = 0;
    for (target, body) in bodies {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for file in dir {
            let path = file.unwrap().path();
            eprintln!("{target}: {}", path.display());
            body(&std::fs::read(&path).unwrap());
            replayed += 1;
        }
    }
    assert!(replayed >= 2, "the regression inputs are missing");
}

/// Writes the seeds above into fuzz/seeds/:
/// `cargo test --test fuzz_parsers -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    write_seeds("nbd_client_options", &client_option_seeds());
    write_seeds("nbd_client_replies", &client_reply_seeds());
    write_seeds("device_uris", &uri_seeds());
    write_seeds("tls_psk_keys", &psk_seeds());
    write_seeds("set_label", &label_seeds());
    write_seeds("monitor_http", &http_seeds());
    write_seeds("control_request", &control_seeds());
    write_seeds("registry_entry", &registry_seeds());
}
