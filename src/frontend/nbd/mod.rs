//! The NBD front end: wire format (`proto`), handshake, transmission and the
//! listener loop (`server`), plus [`DeviceVolume`], which exports a plain
//! [`BlockDevice`](crate::device::BlockDevice).

pub mod device_volume;
pub mod handshake;
pub mod proto;
pub mod server;
pub mod transmission;

pub use device_volume::DeviceVolume;
pub use server::{serve, Listener, ServerConfig};

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
    /// The handshake did not finish within the configured time.
    #[error("handshake timed out")]
    Timeout,
    /// The server configuration is unusable.
    #[error("bad configuration: {0}")]
    Config(String),
}
