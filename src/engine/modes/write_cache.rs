//! Writeback: writes go to the cache as dirty data and are acknowledged
//! there; background writeback copies them to the origin later. A write of
//! any 512-byte multiple goes to the cache without reading the origin: the
//! slot records which sectors hold data.
//!
//! Crash safety: sectors holding clean data are never overwritten in place:
//! a write that covers some goes to a free slot (with the block's other
//! sectors copied from the old slot), and the records that make it current
//! are journalled only after that data is durable, all in one commit. A
//! write that covers only dirty sectors and sectors holding nothing goes
//! into the slot in place: like a disk, an unflushed write may be torn at
//! 512-byte granularity, and a sector that held nothing holds nothing again
//! after a crash until its record is durable. A run of whole blocks that
//! are not all writable in adjacent slots goes to new slots with one cache
//! write (after aged writeback has cleaned a random part of a region, this
//! keeps a 1 MiB write one device write instead of up to 256).

use super::super::format::Record;
use super::super::request::{adjacent_slots, Cached, Segment};
use super::super::sectors::{SectorSet, SECTOR_BYTES};
use super::super::stats::bump;
use super::super::table::slots::Stored;
use super::super::{EngineError, EngineResult};
use crate::device::AlignedBuf;
use crate::engine::cache::Cache;

impl Cache {
    /// Records the sectors that writes in place made dirty, where the slot
    /// was not already whole and dirty.
    pub(crate) fn record_in_place(&self, segs: &[Segment], cached: &[Option<Cached>]) {
        let mut m = self.meta.lock();
        for (seg, hit) in segs.iter().zip(cached) {
            let hit = hit.expect("written in place");
            if !(hit.whole && hit.dirty) {
                self.append(
                    &mut m,
                    Record::AddRun {
                        slot: hit.slot,
                        block: seg.block,
                        run: seg.run(),
                        dirty: true,
                    },
                );
            }
        }
    }

    /// Stores part of a block, dirty, in a new slot: the segment's sectors,
    /// and those the old slot held (copied from it; all of them become
    /// dirty, which is harmless for sectors equal to the origin).
    fn store_part(&self, seg: &Segment, data: &[u8], hit: Option<Cached>) -> EngineResult<Stored> {
        let sectors = (self.block_bytes / SECTOR_BYTES) as usize;
        let mut valid = SectorSet::of_run(sectors, seg.run());
        let old = match hit {
            Some(h) => {
                let (v, _) = self.meta.sector_sets(h.slot);
                let hull = v.union(&valid).hull().expect("non-empty");
                let mut buf = AlignedBuf::zeroed(hull.count as usize * SECTOR_BYTES as usize);
                let from = hull.first as u64 * SECTOR_BYTES;
                match self.cache_read(h.slot, from, &mut buf) {
                    Ok(()) => Some((v, buf, from)),
                    Err(e) if h.dirty => return Err(e.into()),
                    // Clean sectors are only copies: leave them behind.
                    Err(_) => None,
                }
            }
            None => None,
        };
        let Some((v, mut buf, from)) = old else {
            return self.store_sectors(seg.block, &valid, &data[seg.buf.clone()], true);
        };
        valid = valid.union(&v);
        let at = (seg.in_block - from) as usize;
        buf[at..at + seg.buf.len()].copy_from_slice(&data[seg.buf.clone()]);
        self.store_sectors(seg.block, &valid, &buf, true)
    }
}

impl Cache {
    /// The cache route (writeback and writeonly modes), with the segments'
    /// lookups already made (by `lookup_accessed`, under the block locks
    /// the caller holds). Without `admit`, writes that would need a new slot
    /// go around the cache; writes into cached dirty or empty sectors still
    /// go to the cache.
    pub(crate) fn write_cached_dirty_with(
        &self,
        segs: &[Segment],
        data: &[u8],
        cached: &[Option<Cached>],
        admit: bool,
    ) -> EngineResult<()> {
        // In flush order a write around the cache must first write every
        // closed group back (writeback/order/flush.rs): caching it costs
        // less.
        let admit = admit || self.order.older_groups_pending(self);
        let hits = cached.iter().filter(|c| c.is_some()).count() as u64;
        bump(&self.stats.write_hits, hits);
        bump(&self.stats.write_misses, segs.len() as u64 - hits);
        let mut i = 0;
        // Waits for writeback to free slots, at most a few per request.
        let mut waits = 0;
        while i < segs.len() {
            i += self.write_cached_step(&segs[i..], data, &cached[i..], admit, &mut waits)?;
        }
        self.write_back_if_mode_changed(segs)
    }

    /// A segment of a block the cache never holds (a partial last block:
    /// `Cache::cacheable`) goes to the origin.
    fn write_uncacheable(&self, seg: &Segment, data: &[u8]) -> EngineResult<usize> {
        self.drain_first()?;
        bump(&self.stats.bypassed_ios, 1);
        let at = seg.block * self.block_bytes + seg.in_block;
        self.origin_write(&data[seg.buf.clone()], at)?;
        Ok(1)
    }

    /// Writes `segs[0]`, and with it the segments that follow where one
    /// device write covers them; returns how many segments are done (0: it
    /// waited for writeback to free slots and tries again).
    fn write_cached_step(
        &self,
        segs: &[Segment],
        data: &[u8],
        cached: &[Option<Cached>],
        admit: bool,
        waits: &mut u32,
    ) -> EngineResult<usize> {
        let cache = &self;
        let seg = &segs[0];
        if !cache.cacheable(seg.block) {
            return self.write_uncacheable(seg, data);
        }
        // Whole blocks from here on, cached or not.
        let whole = segs
            .iter()
            .take_while(|s| cache.full_block(s) && cache.cacheable(s.block))
            .count();
        if let Some(hit) = cached[0].filter(|h| h.writable) {
            // Writable segments in adjacent slots are written in place with
            // one device write, unless more whole blocks follow: then they
            // all go to new slots with one write (a dirty slot may be
            // superseded like a clean one; it is freed only once the new
            // mapping is durable).
            let run = adjacent_slots(cached, |h| h.writable);
            if run >= whole && cache.placement.overwrites_in_place(whole, admit) {
                let end = segs[run - 1].buf.end;
                cache.cache_write(hit.slot, seg.in_block, &data[seg.buf.start..end])?;
                cache.record_in_place(&segs[..run], &cached[..run]);
                return Ok(run);
            }
        }
        if !admit {
            self.write_around(seg, data)?;
            return Ok(1);
        }
        if whole > 0 {
            let bytes = &data[seg.buf.start..segs[whole - 1].buf.end];
            let (stored, why) = cache.store_in_new_slots(seg.block, bytes, true)?;
            return match why {
                Stored::Yes => Ok(stored),
                Stored::CacheError(e) => Err(e.into()),
                Stored::NoSlot if *waits < 3 && self.wait_for_slots() => {
                    *waits += 1;
                    Ok(stored)
                }
                Stored::NoSlot => {
                    self.write_around(&segs[stored], data)?;
                    Ok(stored + 1)
                }
            };
        }
        match cache.store_part(seg, data, cached[0])? {
            Stored::Yes => Ok(1),
            Stored::CacheError(e) => Err(e.into()),
            Stored::NoSlot if *waits < 3 && self.wait_for_slots() => {
                *waits += 1;
                Ok(0)
            }
            Stored::NoSlot => {
                self.write_around(seg, data)?;
                Ok(1)
            }
        }
    }

    /// This write read the mode before it dirtied its blocks; a switch to
    /// a mode without dirty data (set-mode, detach) may have happened
    /// meanwhile, and its `write_back_all` may have looked before these blocks
    /// were dirty. Write them back now, under this write's block locks.
    /// (The mode is read after the dirtying records were appended, both
    /// under the metadata lock: either this sees the new mode, or the
    /// switch's first dirty snapshot sees these blocks.)
    pub(crate) fn write_back_if_mode_changed(&self, segs: &[Segment]) -> EngineResult<()> {
        // One request's segments are of one volume.
        let Some(first) = segs.first() else {
            return Ok(());
        };
        if self.origins.of_key(first.block).mode().holds_dirty() {
            return Ok(());
        }
        for seg in segs {
            let cached = self.meta.lookup(seg.block);
            if let Some((slot, true)) = cached {
                self.write_back_one(seg.block, slot)?;
            }
        }
        Ok(())
    }

    /// A write of the cache route that must go to the origin while an
    /// older flush group is not there yet gives up its block locks first:
    /// `DrainFirst` (pipeline.rs writes the closed groups back, then the
    /// request again).
    fn drain_first(&self) -> EngineResult<()> {
        if self.order.older_groups_pending(self) {
            return Err(EngineError::DrainFirst);
        }
        Ok(())
    }

    /// Writes the segment around the cache (admission said no, or every
    /// block stayed dirty or busy while it waited) and hurries writeback
    /// along.
    fn write_around(&self, seg: &Segment, data: &[u8]) -> EngineResult<()> {
        self.drain_first()?;
        bump(&self.stats.bypassed_ios, 1);
        self.write_origin_invalidating(
            std::slice::from_ref(seg),
            &data[seg.buf.clone()],
            seg.block * self.block_bytes + seg.in_block,
        )?;
        self.bell.wake();
        Ok(())
    }
}
