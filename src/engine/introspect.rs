//! Read-only questions about what the cache holds, for front ends that
//! report it (NBD block status, the `tiercache:cache` metadata context).
//! Takes the metadata lock once per call, does no I/O and leaves the
//! replacement policy alone (a lookup here is not an access).

use super::sectors::{SectorRun, SECTOR_BYTES};
use super::Engine;
use crate::volume::{Extent, CACHE_CACHED, CACHE_DIRTY};

/// Blocks looked up per call at most, so the metadata lock is held briefly
/// (about 8,000 lookups); the caller asks again for the rest.
const BLOCKS_PER_CALL_MAX: u64 = 8192;

impl Engine {
    /// Which bytes of `[offset, offset + len)` the cache holds
    /// ([`CACHE_CACHED`]) and which of those the origin does not have yet
    /// ([`CACHE_DIRTY`]), sector by sector, as extents in order from
    /// `offset`. Covers at least one byte and at most `len` (fewer after
    /// [`BLOCKS_PER_CALL_MAX`] blocks). The partial last block of an
    /// origin is never cached.
    pub fn cache_state(&self, offset: u64, len: u64) -> Vec<Extent> {
        let end = offset.saturating_add(len).min(self.volume_bytes);
        if len == 0 || offset >= end {
            // Outside the contract (the caller checks the range): nothing
            // is cached there.
            return vec![Extent {
                len: len.max(1),
                flags: 0,
            }];
        }
        let bs = self.block_bytes;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |len: u64, flags: u32| match out.last_mut() {
            Some(e) if e.flags == flags => e.len += len,
            _ => out.push(Extent { len, flags }),
        };
        let first = offset / bs;
        let last = ((end - 1) / bs).min(first + BLOCKS_PER_CALL_MAX - 1);
        let meta = self.meta.lock();
        let whole_block = SectorRun::new(0, meta.table().sectors());
        for block in first..=last {
            let block_start = block * bs;
            let (lo, hi) = (offset.max(block_start), end.min(block_start + bs));
            let found = if block < self.origin_blocks {
                meta.table().cached(block, whole_block)
            } else {
                None
            };
            match found {
                None => push(hi - lo, 0),
                Some(l) if l.whole => {
                    let dirty = if l.dirty { CACHE_DIRTY } else { 0 };
                    push(hi - lo, CACHE_CACHED | dirty)
                }
                Some(l) => {
                    let (valid, dirty) = meta.table().sector_sets(l.slot);
                    let mut pos = lo;
                    while pos < hi {
                        let sector = ((pos - block_start) / SECTOR_BYTES) as usize;
                        let next = (block_start + (sector as u64 + 1) * SECTOR_BYTES).min(hi);
                        let flags = match (valid.contains(sector), dirty.contains(sector)) {
                            (false, _) => 0,
                            (true, false) => CACHE_CACHED,
                            (true, true) => CACHE_CACHED | CACHE_DIRTY,
                        };
                        push(next - pos, flags);
                        pos = next;
                    }
                }
            }
        }
        out
    }
}
