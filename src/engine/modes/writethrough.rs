//! Writethrough: a write completes when the origin has it; whole blocks
//! are then cached clean, so re-reads hit. The cache never holds dirty data.
//!
//! Crash safety: cached copies of the written blocks are dropped and that
//! drop is committed before the origin is written, so a crash can never
//! leave a clean cached copy that disagrees with the origin.

use super::super::io::Segment;
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
        // Caching the new data is an optimisation: no slot or a cache error
        // just leaves the rest uncached. Only whole blocks are cached; they
        // form one run (a request has at most a partial first and last).
        let whole: Vec<&Segment> = segs
            .iter()
            .filter(|s| self.full_block(s) && self.cacheable(s.block))
            .collect();
        if let (Some(first), Some(last)) = (whole.first(), whole.last()) {
            self.store_in_new_slots(first.block, &data[first.buf.start..last.buf.end], false)?;
        }
        Ok(())
    }
}
