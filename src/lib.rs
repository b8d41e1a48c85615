//! tiercache: a userspace block cache. A slow origin device and a fast cache
//! device become one cached volume, served over NBD.
//!
//! Layout, ground floor up: `sync.rs` (ranked locks), `units.rs` (sizes for
//! people), `nbd/` (the NBD
//! protocol and TLS, shared by client and server), `device/` (every backend
//! behind one trait), `volume/` (the asynchronous API front ends call, and
//! `DeviceVolume` over a plain device), `engine/` (on-disk
//! format, metadata, cache modes, replacement, writeback), `frontend/`
//! (`nbd/`: the server; `ublk.rs`, behind the `ublk`
//! feature), `monitor/` (Prometheus metrics and the dashboard over HTTP),
//! `daemon/` (registry of named caches, control socket, the serving
//! daemon's runtime), and in the binary `cli/` (the operator commands:
//! flags and output).

pub mod daemon;
pub mod device;
pub mod engine;
pub mod frontend;
#[cfg(feature = "lockstat")]
pub mod lockstat;
pub mod monitor;
pub mod nbd;
pub mod sync;
pub mod units;
pub mod volume;
