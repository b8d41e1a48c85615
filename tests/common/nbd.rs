//! Shared helpers of the NBD tests, included with `#[path]` by
//! `nbd_protocol.rs` and `nbd_clients.rs`: an in-process server on a Unix
//! socket over a plain RAM device or over the cache engine, and a blocking
//! raw-socket client.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use tiercache::device::fault::FaultDevice;
use tiercache::device::ram::RamDevice;
use tiercache::engine::async_engine::AsyncEngine;
use tiercache::engine::{CreateOptions, Engine, Mode};
use tiercache::frontend::nbd::{serve, Listener, ServerConfig};
use tiercache::nbd::proto;
use tiercache::nbd::{ServerCredentials, TlsAcceptor};
use tiercache::volume::DeviceVolume;

/// Names of the server's runtime threads; a panic on one fails the tests.
const SERVER_THREAD: &str = "nbd-test-server";
static SERVER_PANICKED: AtomicBool = AtomicBool::new(false);

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            if name.starts_with(SERVER_THREAD) {
                SERVER_PANICKED.store(true, Ordering::SeqCst);
            }
            prev(info);
        }));
    });
}

/// Fails the test if any server thread has panicked so far.
pub fn assert_no_server_panic() {
    assert!(
        !SERVER_PANICKED.load(Ordering::SeqCst),
        "a server thread panicked (see the output above)"
    );
}

/// What the test server exports.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    /// `DeviceVolume` over a RAM device: the reference volume.
    Device,
    /// The cache engine in this mode, its cache a quarter of the volume
    /// (so eviction and writeback happen), over a RAM origin.
    Engine(Mode),
}

/// TLS on the test server's loopback TCP listener.
#[derive(Clone, Debug)]
pub struct TestTls {
    pub creds: ServerCredentials,
    pub required: bool,
}

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    /// The loopback TCP port, when the server listens on TCP too.
    pub tcp_port: Option<u16>,
    pub size_bytes: u64,
    shutdown: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Small limits so the tests can reach them: 1 MiB requests.
    pub fn test_config() -> ServerConfig {
        ServerConfig {
            max_request_bytes: 1 << 20,
            max_buffered_bytes_per_conn: 4 << 20,
            max_in_flight_per_conn: 16,
            handshake_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(5),
            ..ServerConfig::default()
        }
    }

    pub fn start(size_bytes: u64, config: ServerConfig) -> Self {
        Self::start_backend(size_bytes, config, Backend::Device)
    }

    pub fn start_backend(size_bytes: u64, config: ServerConfig, backend: Backend) -> Self {
        Self::start_full(size_bytes, config, backend, None, false, None)
    }

    /// Serves an engine the test built (and keeps: the test reads its
    /// status and closes it).
    pub fn start_engine(engine: Arc<Engine>, config: ServerConfig) -> Self {
        let size = engine.volume_bytes();
        Self::start_full(size, config, Backend::Device, None, false, Some(engine))
    }

    /// Also listens on a loopback TCP port (plaintext with `tls: None`).
    pub fn start_tcp(
        size_bytes: u64,
        config: ServerConfig,
        backend: Backend,
        tls: Option<TestTls>,
    ) -> Self {
        Self::start_full(size_bytes, config, backend, tls, true, None)
    }

    fn start_full(
        size_bytes: u64,
        config: ServerConfig,
        backend: Backend,
        tls: Option<TestTls>,
        tcp: bool,
        given: Option<Arc<Engine>>,
    ) -> Self {
        install_panic_hook();
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("nbd.sock");
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sock2 = sock.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{SERVER_THREAD}-main"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name(SERVER_THREAD)
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let mut listeners = vec![tiercache::daemon::socket::bind_private(&sock2)
                        .and_then(Listener::from_unix)
                        .expect("bind")];
                    let mut port = None;
                    if tcp {
                        let mut l = Listener::bind_tcp("127.0.0.1:0").await.expect("bind tcp");
                        port = l.local_addr().map(|a| a.port());
                        if let Some(t) = tls {
                            let acceptor = TlsAcceptor::new(&t.creds).expect("TLS credentials");
                            l = l.with_tls(acceptor, t.required);
                        }
                        listeners.push(l);
                    }
                    if let Some(engine) = given {
                        ready_tx.send(port).expect("ready");
                        let volume = Arc::new(AsyncEngine::new(engine));
                        serve(volume, listeners, config, shutdown_rx)
                            .await
                            .expect("serve");
                        return;
                    }
                    let origin = Arc::new(RamDevice::new("ram", size_bytes));
                    match backend {
                        Backend::Device => {
                            let volume = Arc::new(DeviceVolume::new(origin, 4096));
                            ready_tx.send(port).expect("ready");
                            serve(volume, listeners, config, shutdown_rx)
                                .await
                                .expect("serve");
                        }
                        Backend::Engine(mode) => {
                            // Metadata (at least ~1.1 MiB) plus a quarter of the volume.
                            let cache_bytes = (2 << 20) + size_bytes / 4;
                            let cache = Arc::new(FaultDevice::new("cache", cache_bytes, 1));
                            let opts = CreateOptions {
                                mode,
                                ..Default::default()
                            };
                            let engine = Engine::create(cache, origin, &opts).expect("create");
                            ready_tx.send(port).expect("ready");
                            let volume = Arc::new(AsyncEngine::new(engine.clone()));
                            serve(volume, listeners, config, shutdown_rx)
                                .await
                                .expect("serve");
                            engine.close().expect("clean shutdown");
                        }
                    }
                });
            })
            .expect("spawn server thread");
        let tcp_port = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server did not start");
        TestServer {
            dir,
            sock,
            tcp_port,
            size_bytes,
            shutdown,
            thread: Some(thread),
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    pub fn client(&self) -> RawClient {
        RawClient::connect(&self.sock)
    }

    /// `host:port` of the TCP listener.
    pub fn tcp_addr(&self) -> String {
        format!(
            "127.0.0.1:{}",
            self.tcp_port.expect("server listens on TCP")
        )
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !std::thread::panicking() {
            assert_no_server_panic();
        }
    }
}

/// A blocking NBD client that speaks raw bytes, for malformed-input tests.
pub struct RawClient {
    pub s: UnixStream,
}

pub struct Chunk {
    pub flags: u16,
    pub reply_type: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

impl RawClient {
    pub fn connect(path: &Path) -> Self {
        let s = UnixStream::connect(path).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        RawClient { s }
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).expect("read from server");
        b
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes(b[at..at + 2].try_into().unwrap())
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// Reads the server hello and checks it.
    pub fn read_hello(&mut self) {
        let h = self.read_n(18);
        assert_eq!(Self::u64_at(&h, 0), proto::NBDMAGIC);
        assert_eq!(Self::u64_at(&h, 8), proto::IHAVEOPT);
        assert_eq!(Self::u16_at(&h, 16), 3, "FIXED_NEWSTYLE | NO_ZEROES");
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).expect("send option");
    }

    /// Reads one option reply: (option, reply type, data).
    pub fn read_option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let h = self.read_n(20);
        assert_eq!(Self::u64_at(&h, 0), proto::OPTION_REPLY_MAGIC);
        let len = Self::u32_at(&h, 16) as usize;
        let data = self.read_n(len);
        (Self::u32_at(&h, 8), Self::u32_at(&h, 12), data)
    }

    pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// Full handshake via NBD_OPT_GO; returns (size, transmission flags).
    pub fn handshake(&mut self, structured: bool) -> (u64, u16) {
        self.read_hello();
        self.s.write_all(&3u32.to_be_bytes()).unwrap();
        if structured {
            self.send_option(proto::OPT_STRUCTURED_REPLY, &[]);
            let (_, t, _) = self.read_option_reply();
            assert_eq!(t, proto::REP_ACK);
        }
        self.send_option(
            proto::OPT_GO,
            &Self::info_data("", &[proto::INFO_BLOCK_SIZE]),
        );
        let mut export = None;
        loop {
            let (opt, t, d) = self.read_option_reply();
            assert_eq!(opt, proto::OPT_GO);
            match t {
                proto::REP_ACK => break,
                proto::REP_INFO if Self::u16_at(&d, 0) == proto::INFO_EXPORT => {
                    export = Some((Self::u64_at(&d, 2), Self::u16_at(&d, 10)));
                }
                proto::REP_INFO => {}
                other => panic!("unexpected reply {other:#x} to NBD_OPT_GO"),
            }
        }
        export.expect("NBD_INFO_EXPORT in reply to GO")
    }

    pub fn request_bytes(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut b = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    pub fn send_request(&mut self, cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
        let b = Self::request_bytes(cmd, flags, cookie, offset, len);
        self.s.write_all(&b).expect("send request");
    }

    /// Reads a simple reply header: (cookie, errno).
    pub fn read_simple_reply(&mut self) -> (u64, u32) {
        let h = self.read_n(16);
        assert_eq!(Self::u32_at(&h, 0), proto::SIMPLE_REPLY_MAGIC);
        (Self::u64_at(&h, 8), Self::u32_at(&h, 4))
    }

    /// Reads a structured reply chunk (the server sends simple replies for
    /// successful non-read commands; this reads either and reports a simple
    /// reply as reply_type NONE with DONE and the error in the payload).
    pub fn read_reply_any(&mut self) -> Chunk {
        let m = self.read_n(4);
        let magic = Self::u32_at(&m, 0);
        if magic == proto::SIMPLE_REPLY_MAGIC {
            let r = self.read_n(12);
            return Chunk {
                flags: proto::REPLY_FLAG_DONE,
                reply_type: proto::REPLY_TYPE_NONE,
                cookie: Self::u64_at(&r, 4),
                payload: r[0..4].to_vec(),
            };
        }
        assert_eq!(magic, proto::STRUCTURED_REPLY_MAGIC);
        let h = self.read_n(16);
        let len = Self::u32_at(&h, 12) as usize;
        Chunk {
            flags: Self::u16_at(&h, 0),
            reply_type: Self::u16_at(&h, 2),
            cookie: Self::u64_at(&h, 4),
            payload: self.read_n(len),
        }
    }

    pub fn write(&mut self, cookie: u64, offset: u64, data: &[u8]) -> u32 {
        self.send_request(proto::CMD_WRITE, 0, cookie, offset, data.len() as u32);
        self.s.write_all(data).unwrap();
        let (c, e) = self.read_simple_reply();
        assert_eq!(c, cookie);
        e
    }

    /// A simple-reply read; returns (errno, data).
    pub fn read(&mut self, cookie: u64, offset: u64, len: u32) -> (u32, Vec<u8>) {
        self.send_request(proto::CMD_READ, 0, cookie, offset, len);
        let (c, e) = self.read_simple_reply();
        assert_eq!(c, cookie);
        if e != 0 {
            return (e, Vec::new());
        }
        (0, self.read_n(len as usize))
    }

    /// True once the server has closed the connection; panics if it is
    /// still open after the read timeout. Data still arriving is skipped.
    pub fn expect_closed(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) => panic!("connection not closed by the server: {e}"),
            }
        }
    }
}

/// Connects a fresh client and checks a write and read round trip.
pub fn check_healthy(server: &TestServer) {
    let mut c = server.client();
    c.handshake(false);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(c.write(1, 8192, &data), 0);
    let (e, back) = c.read(2, 8192, 4096);
    assert_eq!(e, 0);
    assert_eq!(back, data);
    c.send_request(proto::CMD_DISC, 0, 3, 0, 0);
    c.expect_closed();
}
