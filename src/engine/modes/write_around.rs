//! The around route (writearound and passthrough modes): writes go to the
//! origin only and drop any cached copy (committed before the origin write,
//! as in writethrough). In writearound reads still promote, so the cache
//! holds what is read, not what is written.

use super::super::request::Segment;
use super::super::stats::bump;
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_around_cache(
        &self,
        offset: u64,
        segs: &[Segment],
        data: &[u8],
    ) -> EngineResult<()> {
        self.cache.count_write_hits(segs);
        bump(&self.cache.stats.bypassed_ios, 1);
        self.write_origin_invalidating(segs, data, offset)
    }
}
