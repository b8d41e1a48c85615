//! Passthrough: every read and write goes to the origin. Writes drop cached
//! copies (committed first), so the blocks still cached stay valid and the
//! cache is warm again when another mode is switched on. The one exception:
//! while a switch to passthrough is still writing dirty blocks back, reads
//! of those blocks are served from the cache (engine/io.rs).

use super::super::request::Segment;
use super::super::stats::bump;
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_passthrough(
        &self,
        offset: u64,
        segs: &[Segment],
        data: &[u8],
    ) -> EngineResult<()> {
        bump(&self.stats.bypassed_ios, 1);
        self.write_origin_invalidating(segs, data, offset)
    }
}
