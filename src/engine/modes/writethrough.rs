//! Writethrough: a write completes when the origin has it; whole blocks
//! are then cached clean, so re-reads hit. The cache never holds dirty data.
//!
//! Crash safety: cached copies of the written blocks are dropped and that
//! drop is committed before the origin is written, so a crash can never
//! leave a clean cached copy that disagrees with the origin.

use super::super::format::Record;
use super::super::io::Segment;
use super::super::stats::bump;
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_writethrough(
        &self,
        offset: u64,
        segs: &[Segment],
        data: &[u8],
    ) -> EngineResult<()> {
        self.count_write_hits(segs);
        self.invalidate_before_origin_write(segs)?;
        self.origin_write(data, offset)?;
        for seg in segs
            .iter()
            .filter(|s| self.full_block(s) && self.cacheable(s.block))
        {
            let Some(slot) = self.alloc_slot()? else {
                break;
            };
            if self.cache_write(slot, 0, &data[seg.buf.clone()]).is_err() {
                self.unalloc_slot(slot);
                break;
            }
            let mut m = self.meta.lock();
            self.append(
                &mut m,
                Record::Map {
                    slot,
                    block: seg.block,
                    dirty: false,
                },
            );
        }
        Ok(())
    }

    pub(crate) fn count_write_hits(&self, segs: &[Segment]) {
        let m = self.meta.lock();
        let hits = segs
            .iter()
            .filter(|s| m.table.lookup(s.block).is_some())
            .count() as u64;
        drop(m);
        bump(&self.stats.write_hits, hits);
        bump(&self.stats.write_misses, segs.len() as u64 - hits);
    }
}
