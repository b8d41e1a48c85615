//! tiercache: a userspace block cache. A slow origin device and a fast cache
//! device become one cached volume, served over NBD.
//!
//! Layout: `device/` (every backend behind one trait), `engine/` (on-disk
//! format, metadata, cache modes, replacement, writeback), `frontend/`
//! (`nbd/`: wire protocol and server; `ublk.rs`, behind the `ublk`
//! feature), `monitor/` (Prometheus metrics and the dashboard over HTTP),
//! `daemon/` (registry of named caches, control socket, the serving
//! daemon's runtime), and in the binary `cli/` (the operator commands:
//! flags and output).

pub mod daemon;
pub mod device;
pub mod engine;
pub mod frontend;
pub mod monitor;
pub mod sync;
/// The NBD front end under its long-standing path.
pub use frontend::nbd;
pub mod volume;
