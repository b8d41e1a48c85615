//! The read path. Sectors that hold data in the cache are read from it
//! (one device read per run of adjacent slots); the others come from the
//! origin, one request per contiguous stretch, and are kept: a block not
//! cached is stored whole, a block cached in part gets the sectors it
//! lacked (written into its slot, where they held nothing, so a crash
//! before their record is durable only leaves them empty).

use super::format::Record;
use super::request::{adjacent_slots, block_runs, Cached, Plan, Segment};
use super::sectors::{SectorRun, SectorSet, SECTOR_BYTES};
use super::stats::bump;
use super::EngineResult;
use crate::device::AlignedBuf;
use crate::engine::cache::Cache;

/// Largest gap a read miss reads through rather than making a second
/// origin request.
const GAP_READ_BYTES: usize = 1 << 20;

/// What a read miss fetches from the origin for one segment.
struct Fetch {
    /// Sectors of the block read from the origin.
    run: SectorRun,
    /// Where they land in the read's origin buffer, which mirrors the
    /// origin from the start of the first missing block.
    at: usize,
    /// Keep them: store the whole block in a new slot (no slot), or fill
    /// the slot's empty sectors (a slot holding part of the block).
    keep: bool,
}

/// Blocks a read miss fetched whole from the origin, to be stored in new
/// slots (`Cache::promote`), under the read's block locks. The read's data
/// may go back to the reader first (`Cache::read_request_into`).
pub(crate) struct Promotion {
    /// The origin data, from the read's first missing block on.
    data: AlignedBuf,
    /// Runs of adjacent blocks: the first, its offset in `data`, how many.
    runs: Vec<(u64, usize, usize)>,
}

impl Promotion {
    /// Bytes it holds (what a deferred promotion is charged).
    pub(crate) fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
}

impl Cache {
    /// The read of `segs` (non-empty) into `out` (the request's bytes)
    /// while their block locks are held; returns the blocks it fetched to
    /// keep, not yet stored. Every byte of `out` is written, by its
    /// segment (hit, miss or both), or the read fails.
    /// (`cached`: `lookup` of `segs` under these locks, hits kept
    /// as the plan's mode reads them.)
    pub(crate) fn read_locked(
        &self,
        segs: &[Segment],
        plan: &Plan,
        cached: &[Option<Cached>],
        out: &mut [u8],
    ) -> EngineResult<Option<Promotion>> {
        // Segments that need the origin are read together, after the hits.
        let (mut miss_segs, mut miss_cached) = (Vec::new(), Vec::new());
        // A request stays in one volume (`Cache::check_span`).
        let hits = cached.iter().filter(|c| c.is_some_and(|h| h.valid)).count();
        (self.origins.of_key(segs[0].block)).count_reads(hits as u64, (segs.len() - hits) as u64);
        let mut i = 0;
        while i < segs.len() {
            let seg = &segs[i];
            match cached[i] {
                Some(hit) if hit.valid => {
                    // Hits in adjacent slots: one device read.
                    let run = adjacent_slots(&cached[i..], |h| h.valid);
                    if run > 1 {
                        let end = segs[i + run - 1].buf.end;
                        if self
                            .cache_read(hit.slot, seg.in_block, &mut out[seg.buf.start..end])
                            .is_ok()
                        {
                            bump(&self.stats.read_hits, run as u64);
                            i += run;
                            continue;
                        }
                        // Fall back to block by block, which handles errors.
                    }
                    bump(&self.stats.read_hits, 1);
                    if let Err(e) =
                        self.cache_read(hit.slot, seg.in_block, &mut out[seg.buf.clone()])
                    {
                        if hit.dirty {
                            return Err(e.into());
                        }
                        // A clean copy is only a copy: serve the origin.
                        self.invalidate_failed(seg.block, hit.slot);
                        let at = seg.block * self.block_bytes + seg.in_block;
                        self.origin_read(&mut out[seg.buf.clone()], at)?;
                    }
                    i += 1;
                }
                _ => {
                    miss_segs.push(seg.clone());
                    miss_cached.push(cached[i]);
                    i += 1;
                }
            }
        }
        if miss_segs.is_empty() {
            return Ok(None);
        }
        self.read_misses(&miss_segs, &miss_cached, out, plan)
    }

    /// Stores a read's promotion (whole blocks, adjacent where the free
    /// slots allow). A full cache or a cache error only leaves the rest
    /// uncached.
    pub(crate) fn promote(&self, p: &Promotion) -> EngineResult<()> {
        self.promote_runs(&p.data, &p.runs)
    }

    /// Stores `runs` of `data` (first block, offset in `data`, how many
    /// adjacent blocks): a promotion's, or a submitted read's
    /// (io/submitted.rs), under the read's block locks.
    pub(crate) fn promote_runs(
        &self,
        data: &[u8],
        runs: &[(u64, usize, usize)],
    ) -> EngineResult<()> {
        let bs = self.block_bytes as usize;
        let mut stored_whole = 0u64;
        let mut result = Ok(());
        for &(block, at, n) in runs {
            match self.store_in_new_slots(block, &data[at..at + n * bs], false) {
                Ok((stored, _)) => stored_whole += stored as u64,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        bump(&self.stats.promotions, stored_whole);
        result
    }

    /// Drops a clean cached copy after a cache read error.
    fn invalidate_failed(&self, block: u64, slot: u32) {
        let mut m = self.meta.lock();
        if m.table().lookup(block) == Some((slot, false)) {
            self.append(&mut m, Record::Unmap { slot });
        }
    }

    /// Reads the segments of a request that lack some sectors (no slot, or a
    /// slot holding part of the block), ascending, not necessarily adjacent:
    /// what the origin must supply is read with one request per stretch,
    /// reading through gaps of up to `GAP_READ_BYTES` (data the cache holds
    /// or that is not asked for: a second request costs a slow origin more
    /// than the extra bytes), the sectors the cache holds from the cache;
    /// with the plan's promotion the fetched data is kept.
    fn read_misses(
        &self,
        segs: &[Segment],
        cached: &[Option<Cached>],
        out: &mut [u8],
        plan: &Plan,
    ) -> EngineResult<Option<Promotion>> {
        bump(&self.stats.read_misses, segs.len() as u64);
        let fetches = self.plan_fetches(segs, cached, plan);
        if let Some(range) = straight_read(segs, cached, &fetches) {
            // Nothing kept and nothing cached: the origin's bytes are the
            // reader's, read into its buffer with no copy.
            let at = segs[0].block * self.block_bytes + segs[0].in_block;
            self.origin_read(&mut out[range], at)?;
            bump(&self.stats.bypassed_ios, segs.len() as u64);
            return Ok(None);
        }
        let fetch_end = |f: &Fetch| f.at + f.run.count as usize * SECTOR_BYTES as usize;
        // `tmp` mirrors the origin from the first fetch on (`Fetch::at`).
        let base = segs[0].block * self.block_bytes;
        // Only what the origin reads below is ever read from `tmp` (every
        // fetch lies in one of its reads).
        let mut tmp = AlignedBuf::to_overwrite(fetches.iter().map(fetch_end).max().unwrap_or(0));
        let mut k = 0;
        while k < fetches.len() {
            let (start, mut end) = (fetches[k].at, fetch_end(&fetches[k]));
            let mut n = 1;
            while k + n < fetches.len() && fetches[k + n].at <= end + GAP_READ_BYTES {
                end = end.max(fetch_end(&fetches[k + n]));
                n += 1;
            }
            self.origin_read(&mut tmp[start..end], base + start as u64)?;
            k += n;
        }
        for (k, seg) in segs.iter().enumerate() {
            let f = &fetches[k];
            match cached[k] {
                Some(hit) => self.complete_partial(seg, hit, f, &tmp, out)?,
                None => {
                    let from = f.at + (seg.in_block - f.run.first as u64 * SECTOR_BYTES) as usize;
                    out[seg.buf.clone()].copy_from_slice(&tmp[from..from + seg.buf.len()]);
                }
            }
            if !f.keep {
                bump(&self.stats.bypassed_ios, 1);
            }
        }
        // Uncached blocks fetched whole are kept, in runs of adjacent blocks.
        let kept = (0..segs.len()).filter(|&k| cached[k].is_none() && fetches[k].keep);
        let runs = block_runs(kept.map(|k| (segs[k].block, fetches[k].at)));
        Ok((!runs.is_empty()).then_some(Promotion { data: tmp, runs }))
    }

    /// Whether a read miss of `block`, which the cache holds none of,
    /// keeps it (the plan promotes it and it is cacheable, checked by the
    /// caller): admission decides, counting the miss.
    pub(crate) fn keeps_miss(&self, block: u64, plan: &Plan) -> bool {
        let misses = self.admission.missed(block);
        let promote = self.admission.promotes(plan.admission, misses);
        if !promote && plan.admits() {
            bump(&self.stats.cold_bypasses, 1);
        }
        promote
    }

    /// What to fetch from the origin for each segment: a block not cached
    /// is fetched whole when it is to be kept (promoted: the plan and
    /// admission allow it); a block cached in part, from its first to its
    /// last empty sector when kept (filling it), else the segment's empty
    /// sectors; anything else, the segment itself.
    fn plan_fetches(&self, segs: &[Segment], cached: &[Option<Cached>], plan: &Plan) -> Vec<Fetch> {
        let spb = (self.block_bytes / SECTOR_BYTES) as usize;
        let keeps: Vec<bool> = segs
            .iter()
            .zip(cached)
            .map(|(seg, hit)| {
                plan.promote
                    && self.cacheable(seg.block)
                    && match hit {
                        // A block already in the cache in part was admitted.
                        Some(_) => plan.admits(),
                        None => self.keeps_miss(seg.block, plan),
                    }
            })
            .collect();
        let m = self.meta.lock();
        let base = segs[0].block * self.block_bytes;
        segs.iter()
            .zip(cached)
            .zip(keeps)
            .map(|((seg, hit), keep)| {
                let (run, keep) = match hit {
                    None if keep => (SectorRun::new(0, spb), true),
                    None => (seg.run(), false),
                    Some(h) => {
                        let (valid, _) = m.table().sector_sets(h.slot);
                        let empty = valid.complement();
                        let want = if keep {
                            empty
                        } else {
                            empty.intersect(&SectorSet::of_run(spb, seg.run()))
                        };
                        (want.hull().expect("a miss lacks some sector"), keep)
                    }
                };
                let at = (seg.block * self.block_bytes + run.first as u64 * SECTOR_BYTES - base)
                    as usize;
                Fetch { run, at, keep }
            })
            .collect()
    }

    /// Completes a segment of a block cached in part: the sectors the slot
    /// holds come from the cache, the rest from the fetched origin data;
    /// when the fetch is kept, the slot's empty sectors in it are filled.
    fn complete_partial(
        &self,
        seg: &Segment,
        hit: Cached,
        f: &Fetch,
        tmp: &[u8],
        out: &mut [u8],
    ) -> EngineResult<()> {
        let (valid, _) = self.meta.sector_sets(hit.slot);
        let sb = SECTOR_BYTES as usize;
        let fetched = |s: usize| f.at + (s - f.run.first as usize) * sb;
        let seg_first = (seg.in_block / SECTOR_BYTES) as usize;
        let cached_part = valid.intersect(&SectorSet::of_run(valid.sectors(), seg.run()));
        if let Some(h) = cached_part.hull() {
            let lo = seg.buf.start + (h.first as usize - seg_first) * sb;
            let hi = seg.buf.start + (h.end() - seg_first) * sb;
            if let Err(e) =
                self.cache_read(hit.slot, h.first as u64 * SECTOR_BYTES, &mut out[lo..hi])
            {
                if hit.dirty {
                    return Err(e.into());
                }
                // Clean sectors are copies: take them from the origin.
                self.invalidate_failed(seg.block, hit.slot);
                let at = seg.block * self.block_bytes + seg.in_block;
                self.origin_read(&mut out[seg.buf.clone()], at)?;
                return Ok(());
            }
        }
        for s in seg.run().range().filter(|&s| !valid.contains(s)) {
            let o = seg.buf.start + (s - seg_first) * sb;
            out[o..o + sb].copy_from_slice(&tmp[fetched(s)..fetched(s) + sb]);
        }
        if !f.keep {
            return Ok(());
        }
        // Fill the empty sectors in the fetched run, then record them.
        let empty_in_fetch = valid
            .complement()
            .intersect(&SectorSet::of_run(valid.sectors(), f.run));
        for r in empty_in_fetch.runs() {
            let bytes = &tmp[fetched(r.first as usize)..fetched(r.end())];
            if self
                .cache_write(hit.slot, r.first as u64 * SECTOR_BYTES, bytes)
                .is_err()
            {
                return Ok(());
            }
        }
        let mut m = self.meta.lock();
        self.append(
            &mut m,
            Record::AddRun {
                slot: hit.slot,
                block: seg.block,
                run: f.run,
                dirty: false,
            },
        );
        drop(m);
        bump(&self.stats.promotions, 1);
        Ok(())
    }
}

/// Where a read miss's origin data can go straight into the reader's
/// buffer: every segment uncached and not kept, and the segments one
/// stretch of the buffer with no gap (a gap is a hit already read into
/// it). That stretch, if so. Then each fetch is its segment
/// (`plan_fetches`), and segments adjacent in the buffer are adjacent
/// blocks of the request, so the stretch is one stretch of the origin.
fn straight_read(
    segs: &[Segment],
    cached: &[Option<Cached>],
    fetches: &[Fetch],
) -> Option<std::ops::Range<usize>> {
    let (first, last) = (segs.first()?, segs.last()?);
    let no_gap = segs.windows(2).all(|w| w[0].buf.end == w[1].buf.start);
    let nothing_kept = cached
        .iter()
        .zip(fetches)
        .all(|(c, f)| c.is_none() && !f.keep);
    (no_gap && nothing_kept).then_some(first.buf.start..last.buf.end)
}
