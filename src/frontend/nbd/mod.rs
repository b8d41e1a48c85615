//! The NBD front end: wire format (`proto`), handshake, transmission and the
//! listener loop (`server`), TLS (`tls`, shared with the NBD origin client),
//! the range locks that make read-modify-write safe (`ranges`), the fuzz
//! harnesses (`fuzz`), plus [`DeviceVolume`], which exports a plain
//! [`BlockDevice`](crate::device::BlockDevice). docs/nbd.md describes the
//! server's behaviour on the wire.

pub mod device_volume;
pub mod fuzz;
pub mod handshake;
pub mod proto;
pub mod ranges;
pub mod server;
pub mod tls;
pub mod transmission;

pub use device_volume::DeviceVolume;
pub use server::{serve, Listener, ServerConfig};
pub use tls::{ClientCredentials, ServerCredentials, TlsAcceptor, TlsConnector};

/// Errors of the NBD layer. Per-connection errors end only that connection
/// and are logged; `serve` itself returns only configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// A socket read or write failed (including a client that vanished).
    #[error("socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The client sent bytes that are not valid NBD.
    #[error("protocol violation: {0}")]
    Protocol(#[from] proto::ProtoError),
    /// The client exceeded a bound the server puts on it.
    #[error("limit exceeded: {0}")]
    Limit(&'static str),
    /// The server ended the handshake without a reply, as the spec requires
    /// for e.g. NBD_OPT_EXPORT_NAME of an unknown export.
    #[error("refused: {0}")]
    Refused(&'static str),
    /// TLS could not be set up, or its handshake with the client failed.
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    /// The handshake did not finish within the configured time.
    #[error("handshake timed out")]
    Timeout,
    /// The server configuration is unusable.
    #[error("bad configuration: {0}")]
    Config(String),
}
