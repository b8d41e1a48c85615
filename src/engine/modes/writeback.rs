//! Writeback: writes go to the cache as dirty data and are acknowledged
//! there; background writeback copies them to the origin later.
//!
//! Crash safety: a block that was clean is never overwritten in place: its
//! new contents go to a free slot, and the `Map dirty` record that makes them
//! current is journalled only after that data is durable. A dirty block is
//! overwritten in place (exactly as a disk would: an unflushed write may be
//! torn, never mixed with another block's data), unless it is part of a run
//! of whole blocks that are not all dirty in adjacent slots: the run then
//! goes to new slots with one cache write, superseding the dirty slots the
//! same crash-safe way as clean ones (after aged writeback has cleaned a
//! random part of a region, this keeps a 1 MiB write one device write
//! instead of up to 256).

use super::super::io::{adjacent_slots, Segment, Stored};
use super::super::stats::bump;
use super::super::{Engine, EngineResult};

impl Engine {
    pub(crate) fn write_writeback(&self, segs: &[Segment], data: &[u8]) -> EngineResult<()> {
        self.write_cached_dirty(segs, data)
    }

    /// The write path of the modes that hold dirty data (writeback, writeonly).
    pub(crate) fn write_cached_dirty(&self, segs: &[Segment], data: &[u8]) -> EngineResult<()> {
        let cached = self.lookup_accessed(segs, |_| true);
        self.write_cached_dirty_with(segs, data, &cached)
    }

    /// `write_cached_dirty` with the segments' lookups already made (by
    /// `lookup_accessed`, under the block locks the caller holds).
    pub(crate) fn write_cached_dirty_with(
        &self,
        segs: &[Segment],
        data: &[u8],
        cached: &[Option<(u32, bool)>],
    ) -> EngineResult<()> {
        let bs = self.block_bytes;
        let hits = cached.iter().filter(|c| c.is_some()).count() as u64;
        bump(&self.stats.write_hits, hits);
        bump(&self.stats.write_misses, segs.len() as u64 - hits);
        let mut i = 0;
        while i < segs.len() {
            let seg = &segs[i];
            if !self.cacheable(seg.block) {
                bump(&self.stats.bypassed_ios, 1);
                self.origin_write(&data[seg.buf.clone()], seg.block * bs + seg.in_block)?;
                i += 1;
                continue;
            }
            // Whole blocks from here on, cached or not.
            let whole = segs[i..]
                .iter()
                .take_while(|s| self.full_block(s) && self.cacheable(s.block))
                .count();
            if let Some((slot, true)) = cached[i] {
                // Dirty blocks in adjacent slots are rewritten in place with
                // one device write, unless more whole blocks follow: then
                // they all go to new slots with one write (a dirty slot may
                // be superseded like a clean one; it is freed only once the
                // new mapping is durable).
                let run = adjacent_slots(&cached[i..], |dirty| dirty);
                if run >= whole {
                    let end = segs[i + run - 1].buf.end;
                    self.cache_write(slot, seg.in_block, &data[seg.buf.start..end])?;
                    i += run;
                    continue;
                }
            }
            // The run of whole blocks goes to new slots, stored together;
            // otherwise one block, completed from its old contents.
            let merged;
            let bytes: &[u8] = if whole > 0 {
                &data[seg.buf.start..segs[i + whole - 1].buf.end]
            } else {
                merged = self.merged_block(seg, data, cached[i])?;
                &merged
            };
            let (stored, why) = self.store_in_new_slots(seg.block, bytes, true)?;
            match why {
                Stored::Yes => i += stored,
                Stored::CacheError(e) => return Err(e.into()),
                Stored::NoSlot => {
                    // The block after the stored ones goes around the cache.
                    let at = stored * bs as usize;
                    self.write_around(&segs[i + stored], &bytes[at..at + bs as usize])?;
                    i += stored + 1;
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

    /// Every block is dirty or busy: writes one whole block around the
    /// cache and hurries writeback along.
    fn write_around(&self, seg: &Segment, full: &[u8]) -> EngineResult<()> {
        bump(&self.stats.bypassed_ios, 1);
        self.write_origin_invalidating(
            std::slice::from_ref(seg),
            full,
            seg.block * self.block_bytes,
        )?;
        self.wake_background();
        Ok(())
    }
}
