//! The NBD protocol, shared by the server (`crate::frontend::nbd`) and the
//! NBD client origin (`crate::device::nbd`): the wire format (`proto`) and
//! TLS for both ends (`tls`), and with the `testing` feature the body of
//! the keys file's fuzz target (`fuzz`). It sits on the ground floor: it imports
//! nothing else of the crate. docs/nbd.md describes the server's behaviour
//! on the wire.

#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod proto;
pub mod tls;

pub use tls::{ClientCredentials, ServerCredentials, TlsAcceptor, TlsConnector};
