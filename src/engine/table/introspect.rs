//! Read-only questions about what the cache holds, for front ends that
//! report it (NBD block status, the `tiercache:cache` metadata context).
//! Takes the metadata lock once per call, does no I/O and leaves the
//! replacement policy alone (a lookup here is not an access).

use super::lock::MetaLock;
use super::sectors::{SectorRun, SectorSet, SECTOR_BYTES};
use crate::engine::origin::Origin;
use crate::volume::{Extent, CACHE_CACHED, CACHE_DIRTY, EXTENTS_PER_CALL_MAX};

/// Blocks looked up per call at most, so the metadata lock is held briefly
/// (about 8,000 lookups); the caller asks again for the rest.
const BLOCKS_PER_CALL_MAX: u64 = 8192;

/// Extents in order, adjacent runs of one status merged, at most
/// `EXTENTS_PER_CALL_MAX`: the walk stops at the first run that does not
/// fit, so a range of partly cached blocks (up to one extent per sector,
/// 2,048 in a 1 MiB block) is not built in full under the metadata lock
/// only for the NBD server to cut it to 1,024.
struct Extents(Vec<Extent>);

impl Extents {
    /// Adds `len` bytes of `flags`; false (nothing added) once full.
    fn push(&mut self, len: u64, flags: u32) -> bool {
        let full = self.0.len() == EXTENTS_PER_CALL_MAX;
        match self.0.last_mut() {
            Some(e) if e.flags == flags => e.len += len,
            _ if full => return false,
            _ => self.0.push(Extent { len, flags }),
        }
        true
    }
}

impl MetaLock {
    /// Which bytes of `[offset, offset + len)` the cache holds
    /// ([`CACHE_CACHED`]) and which of those the origin does not have yet
    /// ([`CACHE_DIRTY`]), sector by sector, as extents in order from
    /// `offset`. Covers at least one byte and at most `len` (fewer after
    /// [`BLOCKS_PER_CALL_MAX`] blocks or [`EXTENTS_PER_CALL_MAX`]
    /// extents). The partial last block of an origin is never cached.
    /// `offset` is an address of `origin`'s volume (origin/address.rs).
    pub(crate) fn cache_state(&self, origin: &Origin, offset: u64, len: u64) -> Vec<Extent> {
        let end = offset
            .saturating_add(len)
            .min(origin.base() + origin.bytes());
        if len == 0 || offset >= end {
            // Outside the contract (the caller checks the range): nothing
            // is cached there.
            return vec![Extent {
                len: len.max(1),
                flags: 0,
            }];
        }
        let bs = origin.block_bytes();
        let mut out = Extents(Vec::new());
        let first = offset / bs;
        let last = ((end - 1) / bs).min(first + BLOCKS_PER_CALL_MAX - 1);
        let meta = self.lock();
        let whole_block = SectorRun::new(0, meta.table().sectors());
        for block in first..=last {
            let block_start = block * bs;
            let (lo, hi) = (offset.max(block_start), end.min(block_start + bs));
            let found = if origin.cacheable(block) {
                meta.table().cached(block, whole_block)
            } else {
                None
            };
            let room = match found {
                None => out.push(hi - lo, 0),
                Some(l) if l.whole => {
                    let dirty = if l.dirty { CACHE_DIRTY } else { 0 };
                    out.push(hi - lo, CACHE_CACHED | dirty)
                }
                Some(l) => {
                    let (valid, dirty) = meta.table().sector_sets(l.slot);
                    push_sectors(&mut out, block_start, lo..hi, &valid, &dirty)
                }
            };
            if !room {
                break;
            }
        }
        out.0
    }
}

/// The bytes `range` of the partly cached block at `block_start`, sector by
/// sector; false once `out` is full.
fn push_sectors(
    out: &mut Extents,
    block_start: u64,
    range: std::ops::Range<u64>,
    valid: &SectorSet,
    dirty: &SectorSet,
) -> bool {
    let mut pos = range.start;
    while pos < range.end {
        let sector = ((pos - block_start) / SECTOR_BYTES) as usize;
        let next = (block_start + (sector as u64 + 1) * SECTOR_BYTES).min(range.end);
        let flags = match (valid.contains(sector), dirty.contains(sector)) {
            (false, _) => 0,
            (true, false) => CACHE_CACHED,
            (true, true) => CACHE_CACHED | CACHE_DIRTY,
        };
        if !out.push(next - pos, flags) {
            return false;
        }
        pos = next;
    }
    true
}
