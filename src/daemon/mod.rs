//! The daemon behind `tiercache serve`, as a library: the registry of
//! named caches (`registry`), the control socket that the other commands
//! talk to while a cache is served (`control`), and the daemon's life from
//! opening the cache to its clean shutdown (`run`), and what it serves on
//! with the guard against tearing down a device in use (`frontends`), and
//! systemd's readiness notification (`notify`); its sockets are its user's
//! alone (`socket`), the control socket's peers checked and bounded
//! (`control_listener`); with the `testing` feature, the bodies of the
//! control request and registry entry fuzz targets (`fuzz`). The binary's `serve`
//! only turns flags into a [`run::DaemonConfig`].

pub mod class;
pub mod control;
pub mod control_listener;
pub mod frontends;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod notify;
pub mod registry;
pub mod run;
pub mod socket;

pub use frontends::Frontends;
pub use registry::{Entry, Registry, RegistryError};
pub use run::{run, DaemonConfig, DaemonError, EngineSource, Service, TcpListen, UblkSettings};
