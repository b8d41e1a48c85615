//! Shared helpers for the engine tests.
#![allow(dead_code)]

use std::sync::Arc;

use tiercache::device::fault::FaultDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::format::Layout;

/// A cache device size holding about `slots` blocks of `block_bytes`.
pub fn cache_bytes_for(slots: u64, block_bytes: u32) -> u64 {
    // Binary search the smallest size whose layout has >= slots.
    let (mut lo, mut hi) = (1u64 << 16, 1u64 << 34);
    while lo + 4096 < hi {
        let mid = (lo + (hi - lo) / 2) / 4096 * 4096;
        match Layout::compute(mid, block_bytes) {
            Ok(l) if l.slot_count >= slots => hi = mid,
            _ => lo = mid,
        }
    }
    hi
}

pub fn fault_dev(name: &str, size: u64, seed: u64) -> (Arc<FaultDevice>, DeviceRef) {
    let d = Arc::new(FaultDevice::new(name, size, seed));
    let r: DeviceRef = d.clone();
    (d, r)
}

/// Deterministic content of one 512-byte sector at a given version
/// (version 0 is the origin's initial content).
pub fn sector_content(sector: u64, version: u64) -> [u8; 512] {
    let mut out = [0u8; 512];
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    let mut x = sector.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ version.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ 1;
    for chunk in out[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// Decodes (sector, version) from a sector and checks the whole sector.
pub fn decode_sector(data: &[u8]) -> Option<(u64, u64)> {
    let sector = u64::from_le_bytes(data[..8].try_into().ok()?);
    let version = u64::from_le_bytes(data[8..16].try_into().ok()?);
    (sector_content(sector, version)[..] == data[..512]).then_some((sector, version))
}

/// An origin image whose every sector holds version 0.
pub fn initial_origin(size: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    for (i, s) in v.chunks_mut(512).enumerate() {
        s.copy_from_slice(&sector_content(i as u64, 0));
    }
    v
}

// ---------------------------------------------------------------------------
// Reliability suite (issue 5): shared switches.

/// True when the long forms of the reliability tests run
/// (`TIERCACHE_LONG=1`, as `scripts/reliability.sh` sets it).
pub fn long_form() -> bool {
    std::env::var("TIERCACHE_LONG").is_ok_and(|v| v == "1")
}

/// The seed of a randomized test: `TIERCACHE_SEED` if set, else from the clock.
pub fn seed() -> u64 {
    std::env::var("TIERCACHE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}
