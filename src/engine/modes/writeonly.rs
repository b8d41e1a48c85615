//! Writeonly (as dm-writecache): writes are cached as dirty data exactly as
//! in writeback; reads are served from the cache when it holds the block,
//! but a read miss never promotes (see `Mode::promotes_reads`).

use super::super::request::Segment;
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_writeonly(&self, segs: &[Segment], data: &[u8]) -> EngineResult<()> {
        self.write_cached_dirty(segs, data)
    }
}
