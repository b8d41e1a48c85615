//! Writethrough: a write completes when the origin has it; whole blocks
//! are then cached clean, so re-reads hit. The cache never holds dirty data.
//!
//! Crash safety: cached copies of the written blocks are dropped and that
//! drop is committed before the origin is written, so a crash can never
//! leave a clean cached copy that disagrees with the origin.

use super::super::io::{Segment, Stored};
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_writethrough(
        &self,
        offset: u64,
        segs: &[Segment],
        data: &[u8],
    ) -> EngineResult<()> {
        self.count_write_hits(segs);
        self.write_origin_invalidating(segs, data, offset)?;
        for seg in segs
            .iter()
            .filter(|s| self.full_block(s) && self.cacheable(s.block))
        {
            // Caching the new data is an optimisation: no slot or a cache
            // error just leaves the block uncached.
            if !matches!(
                self.store_in_new_slot(seg.block, &data[seg.buf.clone()], false)?,
                Stored::Yes
            ) {
                break;
            }
        }
        Ok(())
    }
}
