//! The log placement's cleaner: keeps whole segments free ahead of the
//! cursor (table/segments.rs), so new data keeps going down in order, and
//! discards the segments it frees.
//!
//! A segment is freed whole: of the segments the cursor will reach next
//! (a few, oldest first), the one that costs least to empty is chosen.
//! Dirty blocks, and the clean blocks the replacement policy would keep
//! (`Policy::keep_in_log`: S3-FIFO while a block's access count lasts;
//! the others, a block used since it was stored: a second chance, as in
//! CLOCK), are copied to the cursor, so a hot block survives and dirty
//! data never waits for the origin; the other clean blocks are evicted. A
//! block whose lock is held stays; its segment is freed on a later pass.
//!
//! A moved block is mapped to its new slot by the same records a write
//! uses, so the old slot is freed only once the new mapping is durable;
//! the segment becomes whole at the commit that follows, leaves the free
//! bitmap, is discarded on the cache device, and returns to the bitmap.
//! Nothing is ever discarded under a mapping.
//!
//! With writeback in flush order (table/groups.rs), a moved dirty block
//! joins the open group, which is right only for a block of the open
//! group: dirty data of a closed group, and the older versions kept for
//! one (shadows), are *pinned* (`Meta::pinned`). A segment holding a
//! pinned slot is not chosen, and one chosen before a flush pinned a slot
//! of it is given back once nothing else in it can move; its group's
//! writeback unpins it. (A flush between choosing a block and moving it
//! leaves its old slot as the closed group's shadow: the same bytes twice,
//! in order, the segment freed a little later.)

use super::super::format::Record;
use super::super::sectors::SECTOR_BYTES;
use super::super::stats::bump;
use super::super::table::slots::Stored;
use super::super::table::Meta;
use crate::device::AlignedBuf;
use crate::engine::cache::Cache;

/// Segments compared per choice, oldest first.
const CANDIDATES: usize = 8;
/// Segments freed per background pass at most (each ends in a commit).
const SEGMENTS_PER_PASS: usize = 16;

/// A pass over the segment being emptied.
struct Plan {
    /// Its pool (for dirty data, or the own pool).
    dirty: bool,
    /// Blocks to move, locked.
    moves: Vec<(u32, u64)>,
    evicted: usize,
    /// Blocks whose lock was held: they stay for now.
    busy: usize,
}

/// The cleaner keeps the block in `slot` (moves it) rather than evict it:
/// dirty, or worth keeping in the replacement policy's judgement (S3-FIFO:
/// its access count lasts; the others: used since it was stored there).
fn must_move(m: &Meta, slot: u32, dirty: bool) -> bool {
    dirty || m.keep_in_log(slot)
}

impl Cache {
    /// Whole segments the background keeps free in a pool: an eighth of
    /// them (at least the free-slot reserve's worth, and two), so a burst
    /// of writes finds whole segments while the cleaner catches up.
    fn segment_reserve(&self, m: &Meta, slots_per_segment: u32) -> usize {
        let segments = m.table().dirty_slots() as usize / slots_per_segment as usize;
        (self.reserve_slots(m) / slots_per_segment as usize)
            .max(segments / 8)
            .max(2)
    }

    /// The slots the cache fills before it counts as full: all of them,
    /// less (with the log placement) the whole segments the cleaner keeps
    /// free, which are never used for long. Admission's occupancy is of
    /// these: counted against every slot, a log cache never looked more
    /// than about 85% full, and admission stayed open to scans.
    pub(crate) fn usable_slots(&self, m: &Meta) -> u64 {
        let all = m.table().slot_count();
        match m.log() {
            Some(g) => all.saturating_sub(self.segment_reserve(m, g.slots) as u64 * g.slots as u64),
            None => all,
        }
    }

    /// A pool (for dirty data, or the own pool for clean data) that has
    /// fewer whole segments than the reserve.
    pub(crate) fn short_pool(&self, m: &Meta) -> Option<bool> {
        let g = m.log()?;
        let reserve = self.segment_reserve(m, g.slots);
        let mirror = m.pools().segments(true)?;
        if mirror.whole() < reserve {
            return Some(true);
        }
        let own = m.pools().segments(false)?;
        (!std::ptr::eq(own, mirror) && own.whole() < reserve).then_some(false)
    }

    /// Frees segments until each pool has its reserve of whole ones (or
    /// `SEGMENTS_PER_PASS` were tried); returns how many were emptied. The
    /// log placement's background step (placement/log.rs).
    pub(crate) fn clean_segments(&self) -> usize {
        if !self.admitting() {
            return 0;
        }
        let mut emptied = 0;
        for _ in 0..SEGMENTS_PER_PASS {
            let Some(plan) = self.plan_cleaning() else {
                break;
            };
            let mut moved = 0;
            let tried = plan.moves.len();
            for (slot, block) in plan.moves {
                moved += self.move_block(slot, block) as usize;
                self.origins.of_key(block).locks().unlock(block);
            }
            if moved + plan.evicted == 0 && (tried > 0 || plan.busy > 0) {
                // No progress (no slot to move to, or every block busy):
                // give its free slots back to writers and try later.
                self.meta.end_cleaning(plan.dirty);
                break;
            }
            emptied += 1;
            // The evictions and moves become durable; the emptied segment
            // turns whole and is discarded (`commit` calls
            // `discard_freed_segments`).
            if let Err(e) = self.commit() {
                log::warn!("segment cleaning: commit: {e}");
                break;
            }
        }
        emptied
    }

    /// Chooses the segment to empty in a pool short of whole ones (or goes
    /// on with the one being emptied), evicts what it can of it and locks
    /// the blocks to move. `None`: nothing worth doing now.
    fn plan_cleaning(&self) -> Option<Plan> {
        let mut m = self.meta.lock();
        // A segment being emptied is finished first, short or not: its
        // held slots are no use to writers meanwhile.
        let in_progress = [true, false].into_iter().find(|&d| {
            m.pools()
                .segments(d)
                .is_some_and(|s| s.cleaning().is_some())
        });
        let dirty = match in_progress {
            Some(d) => d,
            None => self.short_pool(&m)?,
        };
        let seg = match m.pools().segments(dirty)?.cleaning() {
            Some(seg) => seg,
            None => self.choose_segment(&mut m, dirty)?,
        };
        Some(self.plan_segment(&mut m, dirty, seg))
    }

    /// The segment of the `dirty` pool to empty next, begun: the most
    /// slots won, the oldest of equals; `None` if none wins a quarter.
    fn choose_segment(&self, m: &mut Meta, dirty: bool) -> Option<std::ops::Range<u32>> {
        // In flush order a segment holding data its group pins is passed
        // over, so look further for ones that are not.
        let look = if m.groups().is_some() {
            CANDIDATES * 4
        } else {
            CANDIDATES
        };
        let (moves, seg) = m
            .pools()
            .segments(dirty)?
            .candidates(look)
            .into_iter()
            .filter_map(|r| Some((self.moves_needed(m, r.clone())?, r)))
            .take(CANDIDATES)
            .min_by_key(|(moves, r)| std::cmp::Reverse(r.len() - moves))?;
        // Worth it only if a quarter of the segment is won: moving more
        // would write the cache device more than clients do.
        if (seg.len() - moves) * 4 < seg.len() {
            return None;
        }
        m.begin_cleaning(dirty, seg.clone());
        bump(&self.stats.segments_cleaned, 1);
        Some(seg)
    }

    /// Evicts what it can of `seg` and locks the blocks to move.
    fn plan_segment(&self, m: &mut Meta, dirty: bool, seg: std::ops::Range<u32>) -> Plan {
        let mut plan = Plan {
            dirty,
            moves: Vec::new(),
            evicted: 0,
            busy: 0,
        };
        for slot in seg {
            if m.pinned(slot) {
                // A flush closed its group since the segment was chosen.
                plan.busy += 1;
                continue;
            }
            let Some((block, dirty)) = m.table().slot_block(slot) else {
                continue;
            };
            if !self.origins.of_key(block).locks().try_lock(block) {
                plan.busy += 1;
                continue;
            }
            let keep = must_move(m, slot, dirty);
            if !dirty {
                m.log_pass(slot, block, keep);
            }
            if keep {
                plan.moves.push((slot, block));
                continue;
            }
            self.evict_slot(m, slot);
            self.origins.of_key(block).locks().unlock(block);
            plan.evicted += 1;
        }
        plan
    }

    /// Blocks of `seg` the cleaner would move (`must_move`); `None` if a
    /// slot of it is pinned (`Meta::pinned`): the segment cannot be
    /// emptied before its flush group is on the origin.
    fn moves_needed(&self, m: &Meta, seg: std::ops::Range<u32>) -> Option<usize> {
        let mut moves = 0;
        for s in seg {
            if m.pinned(s) {
                return None;
            }
            moves += m
                .table()
                .slot_block(s)
                .is_some_and(|(_, d)| must_move(m, s, d)) as usize;
        }
        Some(moves)
    }

    /// Evicts the clean block in `slot` (its lock held). The unmap takes it
    /// out of the replacement policy, which does not choose victims here.
    fn evict_slot(&self, m: &mut Meta, slot: u32) {
        self.append(m, Record::Unmap { slot });
        bump(&self.stats.demotions, 1);
    }

    /// Copies `block` (locked by the caller) from `slot` to a new slot at
    /// the cursor, dirty if it was. A clean block that cannot be moved (no
    /// slot, an unreadable slot) is evicted instead; a dirty one stays.
    /// True if the slot was freed (moved, evicted or superseded).
    fn move_block(&self, slot: u32, block: u64) -> bool {
        // Superseded or dropped meanwhile: nothing to move.
        let Some((valid, dirty)) = self.meta.held_at(block, slot) else {
            return true;
        };
        let Some(hull) = valid.hull() else {
            return false;
        };
        let from = hull.first as u64 * SECTOR_BYTES;
        let mut buf = AlignedBuf::zeroed(hull.count as usize * SECTOR_BYTES as usize);
        let stored = match self.cache_read(slot, from, &mut buf) {
            Ok(()) if valid.is_full() => self
                .store_in_new_slots(block, &buf, dirty)
                .map(|(_, why)| why),
            Ok(()) => self.store_sectors(block, &valid, &buf, dirty),
            Err(e) => Ok(Stored::CacheError(e)),
        };
        match stored {
            Ok(Stored::Yes) => {
                bump(&self.stats.blocks_moved, 1);
                true
            }
            _ if dirty => false,
            _ => {
                let mut m = self.meta.lock();
                if m.table().lookup(block) == Some((slot, false)) {
                    self.evict_slot(&mut m, slot);
                }
                true
            }
        }
    }

    /// Discards the segments that became whole since the last call, then
    /// gives their slots back to the free bitmap: after every commit with
    /// the log placement (placement/log.rs).
    pub(crate) fn discard_freed_segments(&self) {
        let trims = self.meta.take_trims();
        if trims.is_empty() {
            return;
        }
        let helps = self.io.cache().discard_helps();
        for r in trims {
            if helps {
                let at = self.regions.slot_offset(r.start);
                let len = r.len() as u64 * self.block_bytes;
                match self.io.cache().discard(at, len) {
                    Ok(()) => bump(&self.stats.segments_discarded, 1),
                    Err(e) => log::debug!("cache discard of a free segment: {e}"),
                }
            }
            self.meta.trim_done(r);
        }
        self.bell.slots_freed();
    }
}
