//! Writeback: writes go to the cache as dirty data and are acknowledged
//! there; background writeback copies them to the origin later.
//!
//! Crash safety: a block that was clean is never overwritten in place: its
//! new contents go to a free slot, and the `Map dirty` record that makes them
//! current is journalled only after that data is durable. A dirty block is
//! overwritten in place (exactly as a disk would: an unflushed write may be
//! torn, never mixed with another block's data).

use super::super::io::{Segment, Stored};
use super::super::stats::bump;
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_writeback(&self, segs: &[Segment], data: &[u8]) -> EngineResult<()> {
        self.write_cached_dirty(segs, data)
    }

    /// The write path of the modes that hold dirty data (writeback, writeonly).
    pub(crate) fn write_cached_dirty(&self, segs: &[Segment], data: &[u8]) -> EngineResult<()> {
        let bs = self.block_bytes;
        for seg in segs {
            if !self.cacheable(seg.block) {
                bump(&self.stats.bypassed_ios, 1);
                self.origin_write(&data[seg.buf.clone()], seg.block * bs + seg.in_block)?;
                continue;
            }
            let cached = {
                let mut m = self.meta.lock();
                let c = m.table.lookup(seg.block);
                if let Some((slot, _)) = c {
                    m.policy.accessed(slot);
                }
                c
            };
            bump(
                if cached.is_some() {
                    &self.stats.write_hits
                } else {
                    &self.stats.write_misses
                },
                1,
            );
            if let Some((slot, true)) = cached {
                self.cache_write(slot, seg.in_block, &data[seg.buf.clone()])?;
                continue;
            }
            let full = self.merged_block(seg, data, cached)?;
            match self.store_in_new_slot(seg.block, &full, true)? {
                Stored::Yes => {}
                Stored::CacheError(e) => return Err(e.into()),
                Stored::NoSlot => {
                    // Every block is dirty or busy: write around the cache
                    // for this block and hurry writeback along.
                    bump(&self.stats.bypassed_ios, 1);
                    self.write_origin_invalidating(
                        std::slice::from_ref(seg),
                        &full,
                        seg.block * bs,
                    )?;
                    self.wake_background();
                }
            }
        }
        self.write_back_if_mode_changed(segs)
    }

    /// This write read the mode before it dirtied its blocks; a switch to
    /// a mode without dirty data (set-mode, detach) may have happened
    /// meanwhile, and its `flush_all` may have looked before these blocks
    /// were dirty. Write them back now, under this write's block locks.
    /// (The mode is read after the dirtying records were appended, both
    /// under the metadata lock: either this sees the new mode, or the
    /// switch's first dirty snapshot sees these blocks.)
    fn write_back_if_mode_changed(&self, segs: &[Segment]) -> EngineResult<()> {
        if self.mode().holds_dirty() {
            return Ok(());
        }
        for seg in segs {
            let cached = self.meta.lock().table.lookup(seg.block);
            if let Some((slot, true)) = cached {
                self.write_back_one(seg.block, slot)?;
            }
        }
        Ok(())
    }
}
