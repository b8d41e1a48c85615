//! Writethrough: a write completes when the origin has it; the written data
//! is then cached clean (whole blocks, and the sectors of a block written in
//! part), so re-reads hit. The cache never holds dirty data.
//!
//! Crash safety: cached copies of the written blocks are dropped and that
//! drop is committed before the origin is written, so a crash can never
//! leave a clean cached copy that disagrees with the origin.

use super::super::request::Segment;
use super::super::sectors::{SectorSet, SECTOR_BYTES};
use super::super::EngineResult;
use crate::engine::cache::Cache;

impl Cache {
    pub(crate) fn write_writethrough(
        &self,
        offset: u64,
        segs: &[Segment],
        data: &[u8],
        admit: bool,
    ) -> EngineResult<()> {
        self.count_write_hits(segs);
        self.write_origin_invalidating(segs, data, offset)?;
        if !admit {
            return Ok(());
        }
        // Caching the new data is an optimisation: no slot or a cache error
        // just leaves the rest uncached. Whole blocks form one run (a
        // request has at most a partial first and last segment).
        let cacheable = |s: &&Segment| self.cacheable(s.block);
        let whole: Vec<&Segment> = segs
            .iter()
            .filter(cacheable)
            .filter(|s| self.full_block(s))
            .collect();
        if let (Some(first), Some(last)) = (whole.first(), whole.last()) {
            self.store_in_new_slots(first.block, &data[first.buf.start..last.buf.end], false)?;
        }
        let sectors = (self.block_bytes / SECTOR_BYTES) as usize;
        for seg in segs
            .iter()
            .filter(cacheable)
            .filter(|s| !self.full_block(s))
        {
            let valid = SectorSet::of_run(sectors, seg.run());
            self.store_sectors(seg.block, &valid, &data[seg.buf.clone()], false)?;
        }
        Ok(())
    }
}
