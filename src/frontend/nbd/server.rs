//! The listener loop: accepts connections on Unix and TCP sockets, runs the
//! handshake under a time limit, then the transmission phase. Each
//! connection is its own task; a failing client ends only its connection.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use log::{error, info, warn};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

use super::handshake::{self, ExportInfo, HandshakeLimits};
use super::proto;
use super::transmission::{self, shutdown_requested, ConnEnd, ConnLimits, ExportLimits};
use super::NbdError;
use crate::device::SECTOR_BYTES;
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
    /// Payload and read-data bytes held by one connection's in-flight
    /// requests; at least `max_request_bytes`.
    pub max_buffered_bytes_per_conn: u32,
    /// Connections served at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Time a client has from connecting to entering transmission.
    pub handshake_timeout: Duration,
    /// Options accepted before NBD_OPT_GO/EXPORT_NAME.
    pub max_options: u32,
    /// Longest option data accepted.
    pub max_option_bytes: u32,
    /// After shutdown is signalled, how long in-flight requests may take.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: String::new(),
            description: "tiercache".into(),
            read_only: false,
            max_request_bytes: 32 << 20,
            max_in_flight_per_conn: 128,
            max_buffered_bytes_per_conn: 64 << 20,
            max_connections: 64,
            handshake_timeout: Duration::from_secs(30),
            max_options: 32,
            max_option_bytes: 64 << 10,
            shutdown_grace: Duration::from_secs(30),
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
        if self.max_in_flight_per_conn == 0 || self.max_connections == 0 {
            return bad("max_in_flight_per_conn and max_connections must be positive");
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

/// A socket to accept NBD clients on.
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    pub fn bind_unix(path: impl AsRef<Path>) -> std::io::Result<Self> {
        UnixListener::bind(path).map(Listener::Unix)
    }

    pub async fn bind_tcp(addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<Self> {
        TcpListener::bind(addr).await.map(Listener::Tcp)
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
    volume: Arc<V>,
    config: ServerConfig,
    export: ExportInfo,
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
    config.validate()?;
    let preferred = volume
        .preferred_block_bytes()
        .clamp(SECTOR_BYTES as u32, config.max_request_bytes);
    let export = ExportInfo {
        name: config.export_name.clone(),
        description: config.description.clone(),
        size_bytes: volume.size_bytes(),
        transmission_flags: transmission_flags(&*volume, &config),
        min_block_bytes: SECTOR_BYTES as u32,
        preferred_block_bytes: preferred,
        max_block_bytes: config.max_request_bytes,
    };
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let shared = Arc::new(Shared {
        volume,
        config,
        export,
    });
    let mut accept_loops = tokio::task::JoinSet::new();
    for listener in listeners {
        let shared = shared.clone();
        let connections = connections.clone();
        let shutdown = shutdown.clone();
        accept_loops.spawn(accept_loop(listener, shared, connections, shutdown));
    }
    while accept_loops.join_next().await.is_some() {}
    // Every connection holds one permit until it ends.
    let all = shared.config.max_connections as u32;
    let _ = connections.acquire_many(all).await;
    info!("NBD server stopped");
    Ok(())
}

async fn accept_loop<V: Volume>(
    listener: Listener,
    shared: Arc<Shared<V>>,
    connections: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown_requested(&mut shutdown) => return,
            a = accept(&listener) => a,
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
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            warn!(
                "{peer}: refused, {} connections open",
                shared.config.max_connections
            );
            continue;
        };
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match stream {
                Stream::Unix(s) => {
                    let (r, w) = s.into_split();
                    serve_connection(r, w, &peer, shared, shutdown).await
                }
                Stream::Tcp(s) => {
                    let _ = s.set_nodelay(true);
                    let (r, w) = s.into_split();
                    serve_connection(r, w, &peer, shared, shutdown).await
                }
            }
        });
    }
}

enum Stream {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn accept(listener: &Listener) -> std::io::Result<(Stream, String)> {
    match listener {
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            Ok((Stream::Unix(s), "unix client".into()))
        }
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            Ok((Stream::Tcp(s), addr.to_string()))
        }
    }
}

async fn serve_connection<R, W, V>(
    mut rd: R,
    mut wr: W,
    peer: &str,
    shared: Arc<Shared<V>>,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    V: Volume,
{
    let cfg = &shared.config;
    info!("{peer}: connected");
    let limits = HandshakeLimits {
        option_bytes_max: cfg.max_option_bytes,
        options_max: cfg.max_options,
    };
    let handshake = tokio::time::timeout(
        cfg.handshake_timeout,
        handshake::negotiate(&mut rd, &mut wr, &shared.export, limits),
    );
    let negotiated = tokio::select! {
        biased;
        _ = shutdown_requested(&mut shutdown) => {
            info!("{peer}: closed during handshake by server shutdown");
            return;
        }
        r = handshake => r.unwrap_or(Err(NbdError::Timeout)),
    };
    let mode = match negotiated {
        Ok(Some(mode)) => mode,
        Ok(None) => {
            info!("{peer}: aborted the handshake");
            return;
        }
        Err(NbdError::Io(e)) => {
            info!("{peer}: disconnected during handshake: {e}");
            return;
        }
        Err(e) => {
            warn!("{peer}: handshake failed: {e}");
            return;
        }
    };
    info!(
        "{peer}: transmission (structured replies: {})",
        mode.structured_replies
    );
    let export = ExportLimits {
        size_bytes: shared.export.size_bytes,
        read_only: cfg.read_only,
        max_request_bytes: cfg.max_request_bytes,
    };
    let conn_limits = ConnLimits {
        in_flight_max: cfg.max_in_flight_per_conn,
        buffered_bytes_max: cfg.max_buffered_bytes_per_conn,
        shutdown_grace: cfg.shutdown_grace,
    };
    let volume = shared.volume.clone();
    match transmission::run(rd, wr, volume, export, mode, conn_limits, shutdown).await {
        ConnEnd::Clean => info!("{peer}: disconnected"),
        ConnEnd::ServerShutdown => info!("{peer}: closed by server shutdown"),
        ConnEnd::Broken(why) => warn!("{peer}: connection dropped: {why}"),
    }
}
