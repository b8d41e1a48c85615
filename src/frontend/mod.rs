//! Front ends: how a [`crate::volume::Volume`] reaches a client. NBD lives
//! in `crate::nbd` (wire protocol and server); ublk serves the volume as a
//! kernel block device.

#[cfg(feature = "ublk")]
pub mod ublk;
