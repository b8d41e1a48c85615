//! NBD_CMD_BLOCK_STATUS with the `base:allocation` and `tiercache:cache`
//! metadata contexts: what nbdinfo --map shows for a cache with dirty,
//! clean and partly cached blocks, and the reply rules of proto.md checked
//! on raw bytes (one chunk per context, DONE on the last, REQ_ONE, extents
//! within the request, errors).

#[path = "common/nbd.rs"]
mod common;

use std::io::Write;
use std::process::Command;

use common::{Backend, RawClient, TestServer};
use tiercache::engine::Mode;
use tiercache::frontend::nbd::handshake::{CONTEXT_ID_BASE_ALLOCATION, CONTEXT_ID_CACHE};
use tiercache::nbd::proto;

const SIZE: u64 = 8 << 20;
const MIB: u64 = 1 << 20;

fn meta_query(queries: &[&str]) -> Vec<u8> {
    let mut d = 0u32.to_be_bytes().to_vec();
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// Structured replies, the given contexts, then GO (with or without block
/// sizes). Returns the context ids the server assigned, by name.
fn connect(
    s: &TestServer,
    contexts: &[&str],
    block_sizes: bool,
) -> (RawClient, Vec<(u32, String)>) {
    let mut c = s.client();
    c.read_hello();
    c.s.write_all(&3u32.to_be_bytes()).unwrap();
    c.send_option(proto::OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.read_option_reply().1, proto::REP_ACK);
    c.send_option(proto::OPT_SET_META_CONTEXT, &meta_query(contexts));
    let mut ids = Vec::new();
    loop {
        let (_, t, d) = c.read_option_reply();
        match t {
            proto::REP_META_CONTEXT => ids.push((
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                String::from_utf8(d[4..].to_vec()).unwrap(),
            )),
            proto::REP_ACK => break,
            other => panic!("SET_META_CONTEXT: reply {other:#x}"),
        }
    }
    let infos: &[u16] = if block_sizes {
        &[proto::INFO_BLOCK_SIZE]
    } else {
        &[]
    };
    c.send_option(proto::OPT_GO, &RawClient::info_data("", infos));
    while c.read_option_reply().1 != proto::REP_ACK {}
    (c, ids)
}

/// The chunks of one reply: (context id, (length, status) extents).
type Chunks = Vec<(u32, Vec<(u32, u32)>)>;

/// Sends BLOCK_STATUS and collects the chunks: (context id, extents), and
/// the error number of an error chunk (0 if none). Checks the framing.
fn block_status(c: &mut RawClient, flags: u16, offset: u64, len: u32) -> (Chunks, u32) {
    c.send_request(proto::CMD_BLOCK_STATUS, flags, 42, offset, len);
    let mut chunks = Vec::new();
    loop {
        let ch = c.read_reply_any();
        assert_eq!(ch.cookie, 42);
        match ch.reply_type {
            proto::REPLY_TYPE_BLOCK_STATUS => {
                chunks.push(proto::parse_block_status_payload(&ch.payload).unwrap())
            }
            proto::REPLY_TYPE_ERROR => {
                assert_ne!(ch.flags & proto::REPLY_FLAG_DONE, 0);
                return (
                    chunks,
                    u32::from_be_bytes(ch.payload[..4].try_into().unwrap()),
                );
            }
            other => panic!("unexpected chunk type {other}"),
        }
        if ch.flags & proto::REPLY_FLAG_DONE != 0 {
            return (chunks, 0);
        }
    }
}

/// Dirty 64 KiB at 1 MiB, clean cached 64 KiB at 2 MiB (a read), and a
/// 1 KiB write at 3 MiB + 512 (two dirty sectors of an otherwise empty
/// block).
fn populate(s: &TestServer) {
    let mut c = s.client();
    c.handshake(false);
    assert_eq!(c.write(1, MIB, &[1; 65536]), 0);
    assert_eq!(c.read(2, 2 * MIB, 65536).0, 0);
    assert_eq!(c.write(3, 3 * MIB + 512, &[3; 1024]), 0);
}

fn nbdinfo_map(s: &TestServer, context: Option<&str>) -> Vec<(u64, u64, u64)> {
    let mut cmd = Command::new("nbdinfo");
    match context {
        Some(ctx) => cmd.arg(format!("--map={ctx}")),
        None => cmd.arg("--map"),
    };
    let out = cmd
        .arg("--json")
        .arg(s.uri())
        .output()
        .expect("nbdinfo (Debian package libnbd-bin)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_u64().unwrap();
            (f("offset"), f("length"), f("type"))
        })
        .collect()
}

#[test]
fn nbdinfo_maps_the_cache() {
    let (c, d) = (proto::STATE_CACHED, proto::STATE_DIRTY);
    for (mode, written) in [(Mode::Writeback, c | d), (Mode::Writethrough, c)] {
        let s = TestServer::start_backend(SIZE, TestServer::test_config(), Backend::Engine(mode));
        populate(&s);
        // base:allocation: everything allocated data (see docs/nbd.md).
        assert_eq!(nbdinfo_map(&s, None), vec![(0, SIZE, 0)], "{mode:?}");
        let map = nbdinfo_map(&s, Some("tiercache:cache"));
        let want = vec![
            (0, MIB, 0),
            (MIB, 65536, u64::from(written)),
            (MIB + 65536, MIB - 65536, 0),
            (2 * MIB, 65536, u64::from(c)),
            (2 * MIB + 65536, MIB - 65536 + 512, 0),
            (3 * MIB + 512, 1024, u64::from(written)),
            (3 * MIB + 1536, SIZE - 3 * MIB - 1536, 0),
        ];
        assert_eq!(map, want, "{mode:?}");
    }
}

#[test]
fn block_status_replies_follow_the_spec() {
    let s = TestServer::start_backend(
        SIZE,
        TestServer::test_config(),
        Backend::Engine(Mode::Writeback),
    );
    populate(&s);
    let (mut c, ids) = connect(
        &s,
        &["base:allocation", "tiercache:cache", "x-unknown:foo"],
        true,
    );
    assert_eq!(
        ids,
        vec![
            (CONTEXT_ID_BASE_ALLOCATION, "base:allocation".to_string()),
            (CONTEXT_ID_CACHE, "tiercache:cache".to_string()),
        ]
    );
    let len = 2 * MIB as u32;
    let (chunks, e) = block_status(&mut c, 0, MIB - 512, len);
    assert_eq!(e, 0);
    assert_eq!(chunks.len(), 2, "one chunk per selected context");
    for (id, extents) in &chunks {
        let total: u64 = extents.iter().map(|x| u64::from(x.0)).sum();
        assert!(
            total <= u64::from(len) && total > 0,
            "context {id}: {total} bytes"
        );
        assert!(
            extents.iter().all(|x| x.0 % 512 == 0),
            "context {id}: {extents:?}"
        );
    }
    assert_eq!(chunks[0], (CONTEXT_ID_BASE_ALLOCATION, vec![(len, 0)]));
    let cached = proto::STATE_CACHED | proto::STATE_DIRTY;
    assert_eq!(
        chunks[1],
        (
            CONTEXT_ID_CACHE,
            vec![
                (512, 0),
                (65536, cached),
                (MIB as u32 - 65536, 0),
                (65536, proto::STATE_CACHED),
                (MIB as u32 - 65536 - 512, 0)
            ]
        )
    );
    // REQ_ONE: one extent per context, within the request.
    let (chunks, _) = block_status(&mut c, proto::CMD_FLAG_REQ_ONE, MIB - 512, len);
    assert_eq!(chunks[1], (CONTEXT_ID_CACHE, vec![(512, 0)]));
    assert_eq!(chunks[0].1.len(), 1);
    // Errors: beyond the end, unaligned for a client that agreed to 512,
    // length 0, unknown flags.
    for (flags, off, len) in [
        (0, SIZE - 512, 1024u32),
        (0, 100, 512),
        (0, 0, 0),
        (1 << 9, 0, 512),
    ] {
        let (chunks, e) = block_status(&mut c, flags, off, len);
        assert!(chunks.is_empty());
        assert_eq!(e, proto::EINVAL, "flags {flags:#x} at {off}+{len}");
    }
    // A byte-granular client gets byte-granular extents.
    let (mut g, _) = connect(&s, &["tiercache:cache"], false);
    let (chunks, e) = block_status(&mut g, 0, 3 * MIB + 700, 1000);
    assert_eq!(e, 0);
    assert_eq!(
        chunks,
        vec![(CONTEXT_ID_CACHE, vec![(836, cached), (164, 0)])]
    );
    // No context selected: EINVAL.
    let (mut n, ids) = connect(&s, &[], true);
    assert!(ids.is_empty());
    let (chunks, e) = block_status(&mut n, 0, 0, 4096);
    assert!(chunks.is_empty());
    assert_eq!(e, proto::EINVAL);
}

#[test]
fn a_plain_device_reports_nothing_cached() {
    let s = TestServer::start_backend(SIZE, TestServer::test_config(), Backend::Device);
    populate(&s);
    assert_eq!(nbdinfo_map(&s, Some("tiercache:cache")), vec![(0, SIZE, 0)]);
    assert_eq!(nbdinfo_map(&s, None), vec![(0, SIZE, 0)]);
}

/// A cache_state over a huge range of partly cached blocks stops once it
/// has the extents one reply carries: it does not walk (under the
/// metadata lock) blocks whose extents would be thrown away. Before, it
/// built every extent of 8,192 blocks (here 6,145) for the server to cut.
#[test]
fn cache_state_stops_at_the_extents_a_reply_carries() {
    use std::sync::Arc;
    use tiercache::device::ram::RamDevice;
    use tiercache::engine::{CreateOptions, Engine};
    use tiercache::volume::EXTENTS_PER_CALL_MAX;

    let block = 64u64 << 10;
    let origin = Arc::new(RamDevice::new("origin", 256 * MIB));
    let cache = Arc::new(RamDevice::new("cache", 32 * MIB));
    let opts = CreateOptions {
        mode: Mode::Writeback,
        block_bytes: block as u32,
        allow_data_loss: true,
        ..Default::default()
    };
    let engine = Engine::create(cache, origin, &opts).expect("create");
    // Every other sector of 48 blocks: a dirty extent and an empty one per
    // two sectors, 6,144 in all.
    for b in 0..48u64 {
        for s in (0..128u64).step_by(2) {
            engine
                .write(b * block + s * 512, &[7u8; 512], false)
                .unwrap();
        }
    }
    let e = engine.cache_state(0, 200 * MIB);
    assert_eq!(e.len(), EXTENTS_PER_CALL_MAX, "extents built for one call");
    assert_eq!(e.iter().map(|x| x.len).sum::<u64>(), 8 * block);
    assert!(e.iter().all(|x| x.len == 512));
    // Past the written blocks, one extent of the whole range.
    let rest = engine.cache_state(48 * block, 200 * MIB);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].len, 200 * MIB);
    engine.close().unwrap();
}
