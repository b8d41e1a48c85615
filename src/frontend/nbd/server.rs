//! The listener loop: accepts connections on Unix and TCP sockets, runs the
//! handshake (with the TLS upgrade, when the listener offers TLS) under a
//! time limit, then the transmission phase. Each connection is its own
//! task; a failing client ends only its connection.
//!
//! Each listener has slots of its own, of two kinds: handshakes under way
//! (taken at accept, given back when the handshake ends) and clients in
//! transmission (taken when the client asks to enter it, before the reply
//! that lets it in). So clients that connect and never finish a handshake
//! hold no slot a served client needs, and a flood on the TCP listener
//! leaves the local Unix socket's slots alone. qemu-nbd's CVE-2024-7409
//! was a slot taken before the handshake, held by clients that never
//! finished it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{debug, error, info, warn};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::handshake::{self, ExportInfo, HandshakeLimits, Negotiation, Step, TlsPolicy};
use super::ranges::RangeLocks;
use super::transmission::{
    self, shutdown_requested, Budget, ConnEnd, ConnLimits, ExportLimits, SharedExport,
};
use super::NbdError;
use crate::device::SECTOR_BYTES;
use crate::nbd::proto;
use crate::nbd::tls::{BoxStream, TlsAcceptor};
use crate::sync::{Mutex, Rank};
use crate::volume::Volume;

/// Server settings. Every field has a bound-keeping default.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The export's name; the default export "" is accepted as an alias.
    pub export_name: String,
    /// Sent as NBD_INFO_DESCRIPTION when a client asks.
    pub description: String,
    /// Advertise NBD_FLAG_READ_ONLY and fail writes with EPERM.
    pub read_only: bool,
    /// Largest READ/WRITE payload (NBD_INFO_BLOCK_SIZE maximum); a multiple
    /// of 512. Larger writes end the connection, larger reads get EINVAL.
    pub max_request_bytes: u32,
    /// Requests executing at once on one connection.
    pub max_in_flight_per_conn: usize,
    /// Bytes held by one connection's in-flight requests (payloads, read
    /// data); at least `max_request_bytes`. A client that has this much
    /// in flight is not read from until some of it is answered.
    pub max_buffered_bytes_per_conn: u32,
    /// The same bound over all connections together; at least
    /// `max_buffered_bytes_per_conn`.
    pub max_buffered_bytes_total: u64,
    /// Clients in transmission at once, per listener; a client that asks
    /// for more gets NBD_REP_ERR_POLICY to NBD_OPT_GO.
    pub max_connections: usize,
    /// Handshakes under way at once, per listener; connections beyond it
    /// are accepted and closed at once.
    pub max_handshakes: usize,
    /// Time a client has from connecting to entering transmission, the
    /// TLS handshake included.
    pub handshake_timeout: Duration,
    /// A connection whose reply writes or write payload make no progress
    /// for this long is closed (clients that stop reading replies).
    pub stall_timeout: Duration,
    /// A connection whose write payload, or reply, is not through within
    /// this long of its first byte is closed, however it progresses
    /// (clients that trickle).
    pub transfer_timeout: Duration,
    /// Options accepted before NBD_OPT_GO/EXPORT_NAME.
    pub max_options: u32,
    /// Longest option data accepted.
    pub max_option_bytes: u32,
    /// After shutdown is signalled, how long in-flight requests may take.
    pub shutdown_grace: Duration,
    /// Clients in the transmission phase now: the server counts, whoever
    /// holds a clone of the `Arc` reads (the daemon, to refuse a detach
    /// under a connected client).
    pub clients_connected: Arc<AtomicUsize>,
}

/// 64 MiB: what nbdkit accepts; twice the 32 MiB every client may assume.
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 64 << 20;

/// Two minutes for one payload or reply: a 64 MiB request needs a client
/// that moves 0.55 MiB/s, which any link a block device is served over
/// does; a client that trickles holds its buffer that long at most.
pub const DEFAULT_TRANSFER_TIMEOUT: Duration = Duration::from_secs(120);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: String::new(),
            description: "tiercache".into(),
            read_only: false,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_in_flight_per_conn: 128,
            max_buffered_bytes_per_conn: 128 << 20,
            max_buffered_bytes_total: 512 << 20,
            max_connections: 64,
            max_handshakes: 64,
            handshake_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(60),
            transfer_timeout: DEFAULT_TRANSFER_TIMEOUT,
            max_options: 32,
            max_option_bytes: 64 << 10,
            shutdown_grace: Duration::from_secs(30),
            clients_connected: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl ServerConfig {
    fn validate(&self) -> Result<(), NbdError> {
        let bad = |m: &str| Err(NbdError::Config(m.into()));
        if self.max_request_bytes < SECTOR_BYTES as u32
            || !u64::from(self.max_request_bytes).is_multiple_of(SECTOR_BYTES)
        {
            return bad("max_request_bytes must be a non-zero multiple of 512");
        }
        if self.max_buffered_bytes_per_conn < self.max_request_bytes {
            return bad("max_buffered_bytes_per_conn must be at least max_request_bytes");
        }
        if self.max_buffered_bytes_total < u64::from(self.max_buffered_bytes_per_conn) {
            return bad("max_buffered_bytes_total must be at least max_buffered_bytes_per_conn");
        }
        // tokio's Semaphore holds at most usize::MAX >> 3 permits.
        if self.max_buffered_bytes_total > 1 << 48 {
            return bad("max_buffered_bytes_total must be at most 256 TiB");
        }
        if self.max_in_flight_per_conn == 0 || self.max_connections == 0 || self.max_handshakes == 0
        {
            return bad(
                "max_in_flight_per_conn, max_connections and max_handshakes must be positive",
            );
        }
        if self.export_name.len() > proto::STRING_BYTES_MAX || self.export_name.contains('\0') {
            return bad("export_name must be at most 4096 bytes without NUL");
        }
        if self.description.len() > proto::STRING_BYTES_MAX {
            return bad("description must be at most 4096 bytes");
        }
        Ok(())
    }
}

/// A socket to accept NBD clients on, and its TLS policy.
pub struct Listener {
    socket: Socket,
    tls: Option<ListenerTls>,
}

enum Socket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

#[derive(Clone)]
struct ListenerTls {
    acceptor: TlsAcceptor,
    required: bool,
}

impl Listener {
    /// A Unix socket listener without TLS, over a socket the caller bound
    /// (with mode 0600: `daemon/socket.rs`; a socket bound by `bind(2)`
    /// alone takes its mode from the umask). There is no `bind_unix`, so
    /// that no listener is made the loose way by mistake.
    /// Call inside the runtime.
    pub fn from_unix(l: std::os::unix::net::UnixListener) -> std::io::Result<Self> {
        l.set_nonblocking(true)?;
        UnixListener::from_std(l).map(|l| Listener {
            socket: Socket::Unix(l),
            tls: None,
        })
    }

    /// A TCP listener without TLS.
    pub async fn bind_tcp(addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<Self> {
        TcpListener::bind(addr).await.map(|l| Listener {
            socket: Socket::Tcp(l),
            tls: None,
        })
    }

    /// Offers TLS on this listener: with `required`, FORCEDTLS (no option
    /// but STARTTLS is answered before TLS is up), else optional.
    pub fn with_tls(mut self, acceptor: TlsAcceptor, required: bool) -> Self {
        self.tls = Some(ListenerTls { acceptor, required });
        self
    }

    /// The bound address of a TCP listener.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.socket {
            Socket::Tcp(l) => l.local_addr().ok(),
            Socket::Unix(_) => None,
        }
    }
}

/// Transmission flags for a volume under a configuration (proto.md
/// "Transmission flags").
pub fn transmission_flags<V: Volume>(volume: &V, config: &ServerConfig) -> u16 {
    let mut flags = proto::FLAG_HAS_FLAGS
        | proto::FLAG_SEND_FLUSH
        | proto::FLAG_SEND_FUA
        | proto::FLAG_SEND_TRIM
        | proto::FLAG_SEND_WRITE_ZEROES
        | proto::FLAG_SEND_FAST_ZERO
        | proto::FLAG_SEND_CACHE;
    if volume.flush_is_global() {
        flags |= proto::FLAG_CAN_MULTI_CONN;
    }
    if config.read_only {
        flags |= proto::FLAG_READ_ONLY;
    }
    flags
}

struct Shared<V> {
    config: ServerConfig,
    /// The exports, by index (`TransmissionMode::export`): a volume added
    /// online appends one (`Exports::add`). Copied on write: a handshake
    /// takes the list as it is and holds the lock only to clone it.
    exports: Mutex<Arc<Vec<Arc<Export<V>>>>>,
    /// The buffer budgets every export's requests share.
    buffered_total: Budget,
    receiving: Budget,
}

/// One export: what clients are told of it and what serves it.
struct Export<V> {
    info: ExportInfo,
    shared: SharedExport<V>,
    /// The volume's block size (what requests are charged depends on it).
    block_bytes: u32,
}

impl<V: Volume> Shared<V> {
    /// The exports `volumes` (name, volume); their requests share the
    /// server's buffer budgets.
    fn new(volumes: Vec<(String, Arc<V>)>, config: ServerConfig) -> Shared<V> {
        let total = config.max_buffered_bytes_total;
        let shared = Shared {
            exports: Mutex::new(Rank::NbdExports, Arc::new(Vec::new())),
            buffered_total: Budget::new(total),
            receiving: Budget::new((total / 2).max(1)),
            config,
        };
        let exports = (volumes.into_iter())
            .map(|(name, volume)| Arc::new(shared.export(name, volume)))
            .collect();
        *shared.exports.lock() = Arc::new(exports);
        shared
    }

    /// Export `name` of `volume`, charged to the server's budgets.
    fn export(&self, name: String, volume: Arc<V>) -> Export<V> {
        let config = &self.config;
        let block_bytes = volume.preferred_block_bytes().max(SECTOR_BYTES as u32);
        let info = ExportInfo {
            name,
            description: config.description.clone(),
            size_bytes: volume.size_bytes(),
            transmission_flags: transmission_flags(&*volume, config),
            min_block_bytes: SECTOR_BYTES as u32,
            preferred_block_bytes: block_bytes.min(config.max_request_bytes),
            max_block_bytes: config.max_request_bytes,
        };
        let shared = SharedExport {
            volume,
            locks: RangeLocks::new(),
            buffered_total: self.buffered_total.clone(),
            receiving: self.receiving.clone(),
        };
        Export {
            info,
            shared,
            block_bytes,
        }
    }

    /// The exports now.
    fn exports(&self) -> Arc<Vec<Arc<Export<V>>>> {
        self.exports.lock().clone()
    }

    /// The exports as a new client's handshake tells them: each volume's
    /// size as of now (a volume that grew online, `tiercache resize`, is
    /// told to connections made after it; one made before keeps the size it
    /// was told, as the NBD protocol has it).
    fn infos(&self) -> Vec<ExportInfo> {
        (self.exports().iter())
            .map(|e| ExportInfo {
                size_bytes: e.shared.volume.size_bytes(),
                ..e.info.clone()
            })
            .collect()
    }
}

/// The exports of a server, which can take one more while it runs (a
/// volume added online: `tiercache add-origin`).
pub struct Exports<V>(Arc<Shared<V>>);

impl<V: Volume> Exports<V> {
    /// The exports `volumes` (name, volume) under `config`: at least one,
    /// names distinct.
    pub fn new(volumes: Vec<(String, Arc<V>)>, config: ServerConfig) -> Result<Self, NbdError> {
        config.validate()?;
        check_export_names(&volumes)?;
        Ok(Exports(Arc::new(Shared::new(volumes, config))))
    }

    /// One more export, `name` of `volume`, for clients that connect from
    /// now on; refused for a name in use.
    pub fn add(&self, name: String, volume: Arc<V>) -> Result<(), NbdError> {
        let export = Arc::new(self.0.export(name, volume));
        let mut list = self.0.exports.lock();
        let mut named: Vec<(String, Arc<V>)> = (list.iter())
            .map(|e| (e.info.name.clone(), e.shared.volume.clone()))
            .collect();
        named.push((export.info.name.clone(), export.shared.volume.clone()));
        check_export_names(&named)?;
        let mut next: Vec<Arc<Export<V>>> = list.iter().cloned().collect();
        next.push(export);
        *list = Arc::new(next);
        Ok(())
    }
}

impl<V: Volume> Exports<V> {
    /// Takes the exports of `names` away, for clients that connect from
    /// now on (the empty name then means the first export left); returns
    /// the names gone. Clients connected to one keep their connection; its
    /// volume answers them as it is (a removed volume: with errors).
    pub fn remove(&self, names: &[&str]) -> Vec<String> {
        let mut list = self.0.exports.lock();
        let named = |e: &Arc<Export<V>>| names.contains(&e.info.name.as_str());
        let gone: Vec<String> = (list.iter().filter(|e| named(e)))
            .map(|e| e.info.name.clone())
            .collect();
        let next: Vec<Arc<Export<V>>> = list.iter().filter(|e| !named(e)).cloned().collect();
        *list = Arc::new(next);
        gone
    }
}

/// The names of a server's exports: at least one, distinct, each an NBD
/// string without NUL.
fn check_export_names<V>(volumes: &[(String, Arc<V>)]) -> Result<(), NbdError> {
    let bad = |m: String| Err(NbdError::Config(m));
    if volumes.is_empty() {
        return bad("a server needs an export".into());
    }
    for (i, (name, _)) in volumes.iter().enumerate() {
        if name.len() > proto::STRING_BYTES_MAX || name.contains('\0') {
            return bad(format!(
                "export name {name:?}: at most 4096 bytes without NUL"
            ));
        }
        if volumes[..i].iter().any(|(n, _)| n == name) {
            return bad(format!("two exports are named {name:?}"));
        }
    }
    Ok(())
}

/// Serves one connection already accepted on `stream`, from the greeting to
/// its end, as a listener without TLS would: the entry point of the
/// whole-server fuzz body (`fuzz_session.rs`).
#[cfg(any(test, feature = "testing"))]
pub async fn serve_stream<V: Volume>(
    volume: Arc<V>,
    config: ServerConfig,
    stream: UnixStream,
) -> Result<(), NbdError> {
    config.validate()?;
    let name = config.export_name.clone();
    let shared = Arc::new(Shared::new(vec![(name, volume)], config));
    let slots = Slots::new(&shared.config);
    let handshake = slots
        .handshakes
        .clone()
        .try_acquire_owned()
        .expect("a fresh listener has handshake slots");
    let conn = Conn {
        peer: "fuzz client".into(),
        tls: None,
        shared,
        connections: slots.connections.clone(),
        handshake,
    };
    let (_shutdown_tx, shutdown) = watch::channel(false);
    serve_connection(stream, conn, shutdown).await;
    Ok(())
}

/// One listener's slots: handshakes under way, clients in transmission.
#[derive(Clone)]
struct Slots {
    handshakes: Arc<Semaphore>,
    connections: Arc<Semaphore>,
}

impl Slots {
    fn new(config: &ServerConfig) -> Slots {
        Slots {
            handshakes: Arc::new(Semaphore::new(config.max_handshakes)),
            connections: Arc::new(Semaphore::new(config.max_connections)),
        }
    }

    /// Waits until every slot is free: every connection has ended.
    async fn drained(&self, config: &ServerConfig) {
        let _ = self
            .handshakes
            .acquire_many(config.max_handshakes as u32)
            .await;
        let _ = self
            .connections
            .acquire_many(config.max_connections as u32)
            .await;
    }
}

/// Serves `volume` on every listener until `shutdown` becomes true, then
/// stops accepting, lets connections finish their in-flight requests
/// (bounded by `shutdown_grace`) and returns. Returns an error only for an
/// unusable configuration.
pub async fn serve<V: Volume>(
    volume: Arc<V>,
    listeners: Vec<Listener>,
    config: ServerConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<(), NbdError> {
    let name = config.export_name.clone();
    serve_exports(vec![(name, volume)], listeners, config, shutdown).await
}

/// `serve` for several exports, `volumes` (name, volume): a client picks
/// one by name, and the empty name is the first. Their requests share the
/// buffer budgets and connection limits of `config`, whose `export_name`
/// is not used.
pub async fn serve_exports<V: Volume>(
    volumes: Vec<(String, Arc<V>)>,
    listeners: Vec<Listener>,
    config: ServerConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<(), NbdError> {
    let exports = Exports::new(volumes, config)?;
    serve_export_set(&exports, listeners, shutdown).await
}

/// `serve_exports` of `exports`, which may take more while it serves.
pub async fn serve_export_set<V: Volume>(
    exports: &Exports<V>,
    listeners: Vec<Listener>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), NbdError> {
    let shared = exports.0.clone();
    let mut accept_loops = tokio::task::JoinSet::new();
    let mut all_slots = Vec::new();
    for listener in listeners {
        let slots = Slots::new(&shared.config);
        all_slots.push(slots.clone());
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        accept_loops.spawn(accept_loop(listener, shared, slots, shutdown));
    }
    while accept_loops.join_next().await.is_some() {}
    for slots in &all_slots {
        slots.drained(&shared.config).await;
    }
    info!("NBD server stopped");
    Ok(())
}

async fn accept_loop<V: Volume>(
    listener: Listener,
    shared: Arc<Shared<V>>,
    slots: Slots,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown_requested(&mut shutdown) => return,
            a = accept(&listener.socket) => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // E.g. EMFILE: back off instead of spinning.
                error!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(handshake) = slots.handshakes.clone().try_acquire_owned() else {
            warn!(
                "{peer}: refused, {} handshakes under way on this listener",
                shared.config.max_handshakes
            );
            continue;
        };
        let conn = Conn {
            peer,
            tls: listener.tls.clone(),
            shared: shared.clone(),
            connections: slots.connections.clone(),
            handshake,
        };
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            match stream {
                Stream::Unix(s) => serve_connection(s, conn, shutdown).await,
                Stream::Tcp(s) => {
                    let _ = s.set_nodelay(true);
                    serve_connection(s, conn, shutdown).await
                }
            }
        });
    }
}

/// An accepted connection, holding its handshake slot.
struct Conn<V> {
    peer: String,
    tls: Option<ListenerTls>,
    shared: Arc<Shared<V>>,
    /// The listener's transmission slots, one of which the client takes
    /// when it asks to enter transmission.
    connections: Arc<Semaphore>,
    handshake: OwnedSemaphorePermit,
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

async fn accept(socket: &Socket) -> std::io::Result<(Stream, String)> {
    match socket {
        Socket::Unix(l) => {
            let (s, _) = l.accept().await?;
            Ok((Stream::Unix(s), "unix client".into()))
        }
        Socket::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            Ok((Stream::Tcp(s), addr.to_string()))
        }
    }
}

/// One client in `ServerConfig::clients_connected` while it lives.
struct Connected(Arc<AtomicUsize>);

impl Connected {
    fn count(clients: &Arc<AtomicUsize>) -> Connected {
        clients.fetch_add(1, Ordering::Relaxed);
        Connected(clients.clone())
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A plaintext socket whose halves can be owned by two tasks without a
/// lock (an encrypted stream is split with `tokio::io::split`).
trait PlainStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Read: AsyncRead + Unpin + Send + 'static;
    type Write: AsyncWrite + Unpin + Send + 'static;
    fn split_owned(self) -> (Self::Read, Self::Write);
}

impl PlainStream for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn split_owned(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

impl PlainStream for UnixStream {
    type Read = tokio::net::unix::OwnedReadHalf;
    type Write = tokio::net::unix::OwnedWriteHalf;
    fn split_owned(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

/// The stream transmission runs on.
enum Negotiated<S> {
    Plain(S),
    Tls(BoxStream),
}

/// A client let into transmission: its stream, what it negotiated, and its
/// transmission slot.
struct Admitted<S> {
    stream: Negotiated<S>,
    mode: handshake::TransmissionMode,
    _slot: OwnedSemaphorePermit,
}

/// Greeting and option haggling, with the TLS upgrade on NBD_OPT_STARTTLS;
/// a client enters transmission only with a slot from `admit`.
/// `Ok(None)`: the client aborted.
async fn handshake_phase<S: PlainStream>(
    mut s: S,
    exports: Vec<ExportInfo>,
    limits: HandshakeLimits,
    tls: Option<ListenerTls>,
    admit: &mut impl FnMut() -> Option<OwnedSemaphorePermit>,
) -> Result<Option<Admitted<S>>, NbdError> {
    let flags = handshake::greet(&mut s).await?;
    let policy = match &tls {
        None => TlsPolicy::Off,
        Some(t) if t.required => TlsPolicy::Required,
        Some(_) => TlsPolicy::Optional,
    };
    let mut neg = Negotiation::new(exports, flags, policy);
    let mut seen = 0;
    match handshake::haggle(&mut s, &mut neg, limits, &mut seen, admit).await? {
        Step::Abort => return Ok(None),
        Step::Transmission(mode, slot) => {
            let stream = Negotiated::Plain(s);
            return Ok(Some(Admitted {
                stream,
                mode,
                _slot: slot,
            }));
        }
        Step::StartTls => {}
    }
    let tls = tls.expect("STARTTLS is acknowledged only when TLS is offered");
    let (mut t, what) = tls.acceptor.accept(s).await?;
    info!("TLS up ({what})");
    neg.tls_started();
    match handshake::haggle(&mut t, &mut neg, limits, &mut seen, admit).await? {
        Step::Abort => Ok(None),
        Step::Transmission(mode, slot) => {
            let stream = Negotiated::Tls(t);
            Ok(Some(Admitted {
                stream,
                mode,
                _slot: slot,
            }))
        }
        Step::StartTls => unreachable!("a second STARTTLS is refused"),
    }
}

/// The handshake, bounded by the handshake timeout and cut short by a
/// server shutdown; `None` (logged) if it did not reach transmission.
async fn negotiate<S: PlainStream, V: Volume>(
    s: S,
    conn: &Conn<V>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Admitted<S>> {
    let (peer, cfg) = (&conn.peer, &conn.shared.config);
    let limits = HandshakeLimits {
        option_bytes_max: cfg.max_option_bytes,
        options_max: cfg.max_options,
    };
    let mut admit = || {
        let slot = conn.connections.clone().try_acquire_owned().ok();
        if slot.is_none() {
            warn!(
                "{peer}: not let into transmission, {} clients in it on this listener",
                cfg.max_connections
            );
        }
        slot
    };
    let handshake = tokio::time::timeout(
        cfg.handshake_timeout,
        handshake_phase(s, conn.shared.infos(), limits, conn.tls.clone(), &mut admit),
    );
    let negotiated = tokio::select! {
        biased;
        _ = shutdown_requested(shutdown) => {
            info!("{peer}: closed during handshake by server shutdown");
            return None;
        }
        r = handshake => r.unwrap_or(Err(NbdError::Timeout)),
    };
    match negotiated {
        Ok(Some(n)) => Some(n),
        Ok(None) => {
            info!("{peer}: aborted the handshake");
            None
        }
        Err(NbdError::Io(e)) => {
            // Mostly probes (is the server there?), which connect and
            // hang up: not worth a line at the daemon's default level.
            debug!("{peer}: disconnected during handshake: {e}");
            None
        }
        Err(e) => {
            warn!("{peer}: handshake failed: {e}");
            None
        }
    }
}

async fn serve_connection<S: PlainStream, V: Volume>(
    s: S,
    conn: Conn<V>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (peer, shared) = (&conn.peer, &conn.shared);
    let cfg = &shared.config;
    // The transmission line below says it at info, once negotiated.
    debug!("{peer}: connected");
    let Some(admitted) = negotiate(s, &conn, &mut shutdown).await else {
        return;
    };
    // The handshake slot is free for the next client.
    drop(conn.handshake);
    let Admitted {
        stream,
        mode,
        _slot,
    } = admitted;
    let encrypted = matches!(stream, Negotiated::Tls(_));
    let served = shared.exports()[mode.export].clone();
    info!(
        "{peer}: transmission of export {:?} (TLS: {encrypted}, structured replies: {}, minimum block: {})",
        served.info.name, mode.structured_replies, mode.min_block_bytes
    );
    let export = ExportLimits {
        // As told in the handshake, or larger if the volume grew since.
        size_bytes: served.shared.volume.size_bytes(),
        read_only: cfg.read_only,
        max_request_bytes: cfg.max_request_bytes,
        min_block_bytes: mode.min_block_bytes,
        contexts: mode.contexts,
        block_bytes: served.block_bytes,
    };
    let conn_limits = ConnLimits {
        in_flight_max: cfg.max_in_flight_per_conn,
        buffered_bytes_max: cfg.max_buffered_bytes_per_conn,
        shutdown_grace: cfg.shutdown_grace,
        stall_timeout: cfg.stall_timeout,
        transfer_timeout: cfg.transfer_timeout,
    };
    let ex = served.shared.clone();
    let _counted = Connected::count(&cfg.clients_connected);
    let end = match stream {
        Negotiated::Plain(s) => {
            let (r, w) = s.split_owned();
            transmission::run(r, w, ex, export, mode, conn_limits, shutdown).await
        }
        Negotiated::Tls(t) => {
            let (r, w) = tokio::io::split(t);
            transmission::run(r, w, ex, export, mode, conn_limits, shutdown).await
        }
    };
    match end {
        ConnEnd::Clean => info!("{peer}: disconnected"),
        ConnEnd::ServerShutdown => info!("{peer}: closed by server shutdown"),
        ConnEnd::Broken(why) => warn!("{peer}: connection dropped: {why}"),
    }
}
