//! Front ends: how a [`crate::volume::Volume`] reaches a client, side by
//! side over the one `Volume` API: `nbd` (wire protocol and server; also
//! `crate::nbd`, whose protocol module the NBD origin client shares) and
//! `ublk` (the kernel block device, behind the `ublk` feature).

pub mod nbd;
#[cfg(feature = "ublk")]
pub mod ublk;
