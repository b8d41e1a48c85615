//! The NBD server: handshake, transmission and the listener loop
//! (`server`), and the range locks that make read-modify-write safe
//! (`ranges`), over the protocol module it shares with the NBD client
//! origin (`crate::nbd`: wire format and TLS); the fuzz harnesses (`fuzz`,
//! and `fuzz_session`: the whole server under an allocation cap) are built
//! with the `testing` feature. docs/nbd.md describes the server's
//! behaviour on the wire.

#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz_session;
pub mod handshake;
pub mod ranges;
pub mod server;
pub mod transmission;

pub use server::{serve, serve_export_set, serve_exports, Exports, Listener, ServerConfig};

/// Errors of the NBD layer. Per-connection errors end only that connection
/// and are logged; `serve` itself returns only configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// A socket read or write failed (including a client that vanished).
    #[error("socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The client sent bytes that are not valid NBD.
    #[error("protocol violation: {0}")]
    Protocol(#[from] crate::nbd::proto::ProtoError),
    /// The client exceeded a bound the server puts on it.
    #[error("limit exceeded: {0}")]
    Limit(&'static str),
    /// The server ended the handshake without a reply, as the spec requires
    /// for e.g. NBD_OPT_EXPORT_NAME of an unknown export.
    #[error("refused: {0}")]
    Refused(&'static str),
    /// TLS could not be set up, or its handshake with the client failed.
    #[error("TLS: {0}")]
    Tls(#[from] crate::nbd::tls::TlsError),
    /// The handshake did not finish within the configured time.
    #[error("handshake timed out")]
    Timeout,
    /// The server configuration is unusable.
    #[error("bad configuration: {0}")]
    Config(String),
}
