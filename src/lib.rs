//! tiercache: a userspace block cache. A slow origin device and a fast cache
//! device become one cached volume, served over NBD.
//!
//! Layout: `device/` (every backend behind one trait), `engine/` (on-disk
//! format, metadata, cache modes, replacement, writeback), `frontend/`
//! (ublk, behind the `ublk` feature), `nbd/` (wire
//! protocol and server), `cli/` (the operator commands).

pub mod device;
pub mod engine;
pub mod frontend;
pub mod nbd;
pub mod volume;
