//! Front ends: how a [`crate::volume::Volume`] reaches a client, side by
//! side over the one `Volume` API: `nbd` (the server, over the protocol
//! module `crate::nbd` it shares with the NBD origin client) and
//! `ublk` (the kernel block device, behind the `ublk` feature).

pub mod nbd;
#[cfg(feature = "ublk")]
pub mod ublk;
