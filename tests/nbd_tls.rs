//! TLS on the NBD server (proto.md "TLS support") against real clients:
//! nbdinfo, nbdcopy and qemu-img over `nbds://`, with X.509 certificates
//! (made here with openssl) and with pre-shared keys. Every refusal is
//! checked to write nothing: a wrong key, an unknown user, a wrong CA, a
//! client certificate from the wrong CA or none, and plaintext against a
//! listener that requires TLS. A plaintext client's whole view of a
//! `require` listener is captured and holds no byte of the volume.

#[path = "common/nbd.rs"]
mod common;
#[path = "common/tls.rs"]
mod tls;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Backend, TestServer, TestTls};
use rand::{RngCore, SeedableRng};
use tiercache::engine::Mode;
use tiercache::nbd::{proto, ServerCredentials};
use tls::{psk_file, require_tool, Pki};

const SIZE: u64 = 8 << 20;

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run_fails(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        !out.status.success(),
        "{cmd:?} succeeded where it must be refused"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn server(creds: ServerCredentials, required: bool) -> TestServer {
    let tls = TestTls { creds, required };
    TestServer::start_tcp(
        SIZE,
        TestServer::test_config(),
        Backend::Engine(Mode::Writeback),
        Some(tls),
    )
}

fn random_image(path: &Path, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; SIZE as usize];
    rand_chacha::ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut data);
    std::fs::write(path, &data).unwrap();
    data
}

/// The whole volume, read over the server's local (plaintext) Unix socket.
fn volume_contents(s: &TestServer) -> Vec<u8> {
    let mut c = s.client();
    c.handshake(false);
    let mut all = Vec::with_capacity(SIZE as usize);
    for (i, off) in (0..SIZE).step_by(1 << 20).enumerate() {
        let (e, d) = c.read(i as u64, off, 1 << 20);
        assert_eq!(e, 0);
        all.extend(d);
    }
    all
}

fn assert_untouched(s: &TestServer, what: &str) {
    assert!(
        volume_contents(s).iter().all(|&b| b == 0),
        "{what}: the refused client changed the volume"
    );
}

/// nbdinfo, nbdcopy both ways and qemu-img both ways over one TLS setup.
fn round_trips(s: &TestServer, uri: &str, qemu_object: &str, label: &str) {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("nbdcopy", "libnbd-bin");
    require_tool("qemu-img", "qemu-utils");
    let out = run_ok(Command::new("nbdinfo").arg("--json").arg(uri));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exports"][0]["export-size"], SIZE, "{label}: {v:#}");
    assert_eq!(v["TLS"], true, "{label}: {v:#}");

    let dir = s.dir.path();
    let (a, back) = (dir.join("a.img"), dir.join("back.img"));
    let data = random_image(&a, 7);
    run_ok(Command::new("nbdcopy").arg(&a).arg(uri));
    run_ok(Command::new("nbdcopy").arg(uri).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "{label}: nbdcopy round trip differs"
    );
    assert!(volume_contents(s) == data, "{label}: the volume differs");

    let b = dir.join("b.img");
    let data = random_image(&b, 8);
    let opts = format!(
        "driver=nbd,host=127.0.0.1,port={},tls-creds=tls0",
        s.tcp_port.unwrap()
    );
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "--object", qemu_object, "-f", "raw"])
            .arg(&b)
            .args(["--target-image-opts", &opts]),
    );
    std::fs::remove_file(&back).unwrap();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "--object", qemu_object, "--image-opts", &opts])
            .args(["-O", "raw"])
            .arg(&back),
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "{label}: qemu-img round trip differs"
    );
}

#[test]
fn x509_clients_round_trip() {
    let scratch = tempfile::tempdir().unwrap();
    let pki = Pki::new(scratch.path(), "ca");
    let s = server(
        ServerCredentials::Certificates {
            dir: pki.server_dir(),
            verify_peer: true,
        },
        true,
    );
    let uri = format!(
        "nbds://{}/?tls-certificates={}",
        s.tcp_addr(),
        pki.client_dir().display()
    );
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        pki.client_dir().display()
    );
    round_trips(&s, &uri, &object, "X.509");
}

#[test]
fn psk_clients_round_trip() {
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("psk"), "alice", 1);
    let s = server(ServerCredentials::Psk { file: keys.clone() }, true);
    let uri = format!(
        "nbds://alice@{}/?tls-psk-file={}",
        s.tcp_addr(),
        keys.display()
    );
    let object = format!(
        "tls-creds-psk,id=tls0,endpoint=client,username=alice,dir={}",
        keys.parent().unwrap().display()
    );
    round_trips(&s, &uri, &object, "PSK");
}

#[test]
fn psk_refusals_write_nothing() {
    require_tool("nbdcopy", "libnbd-bin");
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("good"), "alice", 1);
    let wrong = psk_file(&scratch.path().join("wrong"), "alice", 2);
    let stranger = psk_file(&scratch.path().join("stranger"), "mallory", 1);
    let s = server(ServerCredentials::Psk { file: keys }, true);
    let img = scratch.path().join("data.img");
    random_image(&img, 3);
    let addr = s.tcp_addr();
    let cases = [
        (
            format!("nbds://alice@{addr}/?tls-psk-file={}", wrong.display()),
            "wrong key",
        ),
        (
            format!("nbds://mallory@{addr}/?tls-psk-file={}", stranger.display()),
            "unknown user",
        ),
        (format!("nbd://{addr}/"), "plaintext"),
    ];
    for (uri, what) in cases {
        let err = run_fails(Command::new("nbdcopy").arg(&img).arg(&uri));
        eprintln!("{what}: refused: {}", err.trim());
        assert_untouched(&s, what);
    }
}

#[test]
fn x509_refusals_write_nothing() {
    require_tool("nbdcopy", "libnbd-bin");
    let scratch = tempfile::tempdir().unwrap();
    let pki = Pki::new(scratch.path(), "ca");
    let other = Pki::new(scratch.path(), "other-ca");
    let s = server(
        ServerCredentials::Certificates {
            dir: pki.server_dir(),
            verify_peer: true,
        },
        true,
    );
    let img = scratch.path().join("data.img");
    random_image(&img, 4);
    let addr = s.tcp_addr();
    let uri = |dir: &Path| format!("nbds://{addr}/?tls-certificates={}", dir.display());
    let foreign_cert = pki.client_dir_with_cert_of(&other, scratch.path(), "foreign-cert");
    let no_cert = pki.client_dir_without_cert(scratch.path(), "no-cert");
    let cases = [
        // The client does not trust the server's CA.
        (
            uri(&other.client_dir()),
            "server certificate from an untrusted CA",
        ),
        // The server does not trust the client's CA.
        (uri(&foreign_cert), "client certificate from the wrong CA"),
        (uri(&no_cert), "no client certificate"),
        (format!("nbd://{addr}/"), "plaintext"),
    ];
    for (uri, what) in cases {
        let err = run_fails(Command::new("nbdcopy").arg(&img).arg(&uri));
        eprintln!("{what}: refused: {}", err.trim());
        assert_untouched(&s, what);
    }
    // The right credentials still work afterwards.
    run_ok(
        Command::new("nbdcopy")
            .arg(&img)
            .arg(uri(&pki.client_dir())),
    );
}

/// Reads every byte the server sends until it closes (or 5 s of silence).
fn drain(s: &mut TcpStream, into: &mut Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("server neither answered nor closed: {e}"),
        }
    }
}

fn option(code: u32, data: &[u8]) -> Vec<u8> {
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&code.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// A plaintext client tries everything against a `require` listener; all
/// it ever receives is the greeting and NBD_REP_ERR_TLS_REQD replies.
#[test]
fn plaintext_client_receives_no_volume_byte() {
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("psk"), "alice", 1);
    let s = server(ServerCredentials::Psk { file: keys }, true);
    // Fill the volume with a marker over the local socket.
    let marker = b"SECRET-VOLUME-BYTES!".repeat(4096 / 20 + 1)[..4096].to_vec();
    let mut local = s.client();
    local.handshake(false);
    for i in 0..(SIZE / 4096) {
        assert_eq!(local.write(i, i * 4096, &marker), 0);
    }

    let info = common::RawClient::info_data("", &[proto::INFO_BLOCK_SIZE]);
    let mut meta = 0u32.to_be_bytes().to_vec();
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&15u32.to_be_bytes());
    meta.extend_from_slice(b"base:allocation");
    let refused_options = [
        (proto::OPT_LIST, vec![]),
        (proto::OPT_INFO, info.clone()),
        (proto::OPT_GO, info),
        (proto::OPT_STRUCTURED_REPLY, vec![]),
        (proto::OPT_LIST_META_CONTEXT, meta.clone()),
        (proto::OPT_SET_META_CONTEXT, meta),
        (99, b"junk".to_vec()),
    ];
    let mut received = Vec::new();
    let mut c = TcpStream::connect(s.tcp_addr()).unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    received.extend_from_slice(&hello);
    c.write_all(&3u32.to_be_bytes()).unwrap();
    for (code, data) in &refused_options {
        c.write_all(&option(*code, data)).unwrap();
        let mut h = [0u8; 20];
        c.read_exact(&mut h).unwrap();
        let reply_type = u32::from_be_bytes(h[12..16].try_into().unwrap());
        assert_eq!(reply_type, proto::REP_ERR_TLS_REQD, "option {code}");
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut msg = vec![0u8; len];
        c.read_exact(&mut msg).unwrap();
        received.extend_from_slice(&h);
        received.extend_from_slice(&msg);
    }
    // NBD_OPT_EXPORT_NAME cannot be refused with an error: the server
    // closes. A read request sent right behind it gets nothing.
    let mut tail = option(proto::OPT_EXPORT_NAME, b"");
    tail.extend(common::RawClient::request_bytes(
        proto::CMD_READ,
        0,
        1,
        0,
        4096,
    ));
    let _ = c.write_all(&tail);
    let before = received.len();
    drain(&mut c, &mut received);
    assert_eq!(received.len(), before, "bytes after NBD_OPT_EXPORT_NAME");
    assert!(
        !received
            .windows(8)
            .any(|w| marker.windows(8).any(|m| m == w)),
        "volume bytes reached a plaintext client"
    );
    // Greeting plus one reply per option, nothing else.
    let replies: usize = refused_options.len();
    let messages = received.len() - 18 - 20 * replies;
    assert!(messages < 100 * replies, "unexpectedly long replies");
    // The same through libnbd, with TLS off.
    let probe = r#"
import sys, nbd
h = nbd.NBD()
h.set_tls(nbd.TLS_DISABLE)
try:
    h.connect_tcp("127.0.0.1", sys.argv[1])
except nbd.Error as e:
    print("refused:", e)
    sys.exit(0)
sys.exit("connected without TLS")
"#;
    let port = s.tcp_port.unwrap().to_string();
    let out = run_ok(Command::new("/usr/bin/python3").args(["-c", probe, &port]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("refused"));
}

/// `--tls=on`: plaintext and TLS clients both work.
#[test]
fn optional_tls_serves_both() {
    require_tool("nbdinfo", "libnbd-bin");
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("psk"), "alice", 1);
    let s = server(ServerCredentials::Psk { file: keys.clone() }, false);
    let plain = run_ok(Command::new("nbdinfo").arg(format!("nbd://{}/", s.tcp_addr())));
    assert!(String::from_utf8_lossy(&plain.stdout).contains("without TLS"));
    let tls = run_ok(Command::new("nbdinfo").arg(format!(
        "nbds://alice@{}/?tls-psk-file={}",
        s.tcp_addr(),
        keys.display()
    )));
    assert!(String::from_utf8_lossy(&tls.stdout).contains("with TLS"));
}
