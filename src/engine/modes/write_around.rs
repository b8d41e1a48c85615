//! The around route (writearound and passthrough modes): writes go to the
//! origin only and drop any cached copy (committed before the origin write,
//! as in writethrough). In writearound reads still promote, so the cache
//! holds what is read, not what is written.

use super::super::request::Segment;
use super::super::stats::bump;
use super::super::EngineResult;
use crate::engine::cache::Cache;

impl Cache {
    pub(crate) fn write_around_cache(
        &self,
        offset: u64,
        segs: &[Segment],
        data: &[u8],
    ) -> EngineResult<()> {
        self.count_write_hits(segs);
        bump(&self.stats.bypassed_ios, 1);
        self.write_origin_invalidating(segs, data, offset)
    }
}
