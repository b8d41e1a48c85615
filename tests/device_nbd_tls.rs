//! The NBD origin client over TLS (`nbds://`, `nbds+unix://`) against
//! nbdkit with `--tls=require` (PSK and X.509 with client certificates)
//! and against tiercache's own server: round trips, several connections,
//! and the refusals (wrong key, untrusted CA, no client certificate, and a
//! plaintext URI against a server that requires TLS).

#[path = "common/nbd.rs"]
mod common;
#[path = "common/tls.rs"]
mod tls;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Backend, TestServer, TestTls};
use tiercache::device::nbd::NbdDevice;
use tiercache::device::{BlockDevice, DeviceError};
use tiercache::nbd::ServerCredentials;
use tls::{psk_file, require_tool, Pki};

/// nbdkit in the foreground, killed (by PID) on drop.
struct Nbdkit(Child);

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `nbdkit --tls=require TLS_ARGS memory 64M` on a loopback port or socket.
fn nbdkit(listen: &[&str], tls_args: &[&str], ready: impl Fn() -> bool) -> Nbdkit {
    require_tool("nbdkit", "nbdkit");
    let mut args = vec!["-f", "--exit-with-parent", "--tls=require"];
    args.extend_from_slice(listen);
    args.extend_from_slice(tls_args);
    args.extend_from_slice(&["memory", "64M"]);
    let mut child = Command::new("nbdkit")
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(child.try_wait().unwrap().is_none(), "nbdkit exited");
        assert!(Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    Nbdkit(child)
}

fn nbdkit_tcp(tls_args: &[&str]) -> (Nbdkit, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let p = port.to_string();
    let k = nbdkit(&["-i", "127.0.0.1", "-p", &p], tls_args, || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    (k, addr)
}

fn round_trips(dev: &dyn BlockDevice, tag: u8) {
    for (off, len) in [
        (0u64, 512usize),
        (4096, 65536),
        (1 << 20, 3 << 20),
        ((64 << 20) - 4096, 4096),
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect();
        dev.write_at(&data, off).unwrap();
        let mut back = vec![0u8; len];
        dev.read_at(&mut back, off).unwrap();
        assert!(back == data, "mismatch at {off}+{len}");
    }
    dev.flush().unwrap();
}

fn open_error(uri: &str) -> String {
    match NbdDevice::connect(uri, 1) {
        Ok(_) => panic!("{uri}: connected where it must be refused"),
        Err(e @ DeviceError::Open { .. }) => e.to_string(),
        Err(e) => panic!("{uri}: not an open error: {e}"),
    }
}

#[test]
fn psk_against_nbdkit() {
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("good"), "alice", 1);
    let wrong = psk_file(&scratch.path().join("wrong"), "alice", 9);
    let k = keys.to_str().unwrap().to_string();
    let (_server, addr) = nbdkit_tcp(&[&format!("--tls-psk={k}")]);
    let uri = format!("nbds://alice@{addr}/?tls-psk-file={k}");
    let dev = NbdDevice::connect(&uri, 1).unwrap();
    assert_eq!(dev.size_bytes(), 64 << 20);
    round_trips(&dev, 1);
    drop(dev);
    // nbdkit's memory plugin allows several connections; each runs TLS.
    let dev = NbdDevice::connect(&uri, 4).unwrap();
    assert_eq!(dev.connection_count(), 4);
    round_trips(&dev, 2);
    drop(dev);

    let e = open_error(&format!(
        "nbds://alice@{addr}/?tls-psk-file={}",
        wrong.display()
    ));
    assert!(e.contains("TLS"), "{e}");
    let e = open_error(&format!("nbd://{addr}/"));
    assert!(e.contains("TLS_REQD"), "{e}");
}

#[test]
fn psk_over_a_unix_socket() {
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("psk"), "bob", 3);
    let sock = scratch.path().join("nbdkit.sock");
    let s = sock.to_str().unwrap().to_string();
    let _server = nbdkit(
        &["-U", &s],
        &[&format!("--tls-psk={}", keys.display())],
        || std::os::unix::net::UnixStream::connect(&sock).is_ok(),
    );
    let uri = format!(
        "nbds+unix:///?socket={s}&tls-psk-file={}&tls-username=bob",
        keys.display()
    );
    let dev = NbdDevice::connect(&uri, 1).unwrap();
    round_trips(&dev, 3);
}

#[test]
fn certificates_against_nbdkit() {
    let scratch = tempfile::tempdir().unwrap();
    let pki = Pki::new(scratch.path(), "ca");
    let other = Pki::new(scratch.path(), "other-ca");
    let dir = pki.server_dir();
    let (_server, addr) = nbdkit_tcp(&[
        &format!("--tls-certificates={}", dir.display()),
        "--tls-verify-peer",
    ]);
    let uri = |d: &Path| format!("nbds://{addr}/?tls-certificates={}", d.display());
    let dev = NbdDevice::connect(&uri(&pki.client_dir()), 1).unwrap();
    round_trips(&dev, 4);
    drop(dev);
    // The server's certificate is from a CA the client does not trust.
    let e = open_error(&uri(&other.client_dir()));
    assert!(e.contains("TLS"), "{e}");
    // The server wants a client certificate.
    let e = open_error(&uri(&pki.client_dir_without_cert(scratch.path(), "nocert")));
    assert!(e.contains("TLS") || e.contains("closed"), "{e}");
    let foreign = pki.client_dir_with_cert_of(&other, scratch.path(), "foreign");
    open_error(&uri(&foreign));
}

/// tiercache's own server as the TLS origin of another cache's device.
#[test]
fn against_tiercache_itself() {
    let scratch = tempfile::tempdir().unwrap();
    let keys = psk_file(&scratch.path().join("psk"), "alice", 5);
    let s = TestServer::start_tcp(
        64 << 20,
        TestServer::test_config(),
        Backend::Device,
        Some(TestTls {
            creds: ServerCredentials::Psk { file: keys.clone() },
            required: true,
        }),
    );
    let uri = format!(
        "nbds://alice@{}/?tls-psk-file={}",
        s.tcp_addr(),
        keys.display()
    );
    let dev = NbdDevice::connect(&uri, 2).unwrap();
    assert_eq!(dev.connection_count(), 2);
    round_trips(&dev, 6);
    drop(dev);
    // What went through TLS is on the volume.
    let mut c = s.client();
    c.handshake(false);
    let (e, back) = c.read(1, 4096, 512);
    assert_eq!(e, 0);
    let want: Vec<u8> = (0..512usize)
        .map(|i| (i as u8).wrapping_mul(31) ^ 6)
        .collect();
    assert_eq!(back, want);
}
