//! Trim, zeroing, flush, and the pieces every write route shares. Writes
//! are resolved and dispatched in `pipeline.rs`; each route is in `modes/`.

use super::format::Record;
use super::observe::latency::Op;
use super::request::Segment;
use super::stats::bump;
use super::EngineResult;
use crate::device::AlignedBuf;
use crate::engine::cache::Cache;
use crate::volume::{pieces, EFFECT_PIECE_BYTES};

impl Cache {
    pub(crate) fn count_write_hits(&self, segs: &[Segment]) {
        let hits = self.meta.count_cached(segs.iter().map(|s| s.block));
        bump(&self.stats.write_hits, hits);
        bump(&self.stats.write_misses, segs.len() as u64 - hits);
    }
}

impl Cache {
    /// Writes zeroes over a range.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.check_span(offset, len, true)?;
        let chunk_bytes = (1u64 << 20).max(self.block_bytes);
        let zeroes = AlignedBuf::zeroed(chunk_bytes.min(len) as usize);
        // Chunks end on multiples of the chunk, so full blocks stay whole.
        for (at, n) in pieces(offset, offset + len, chunk_bytes) {
            self.write(at, &zeroes[..n as usize], false)?;
        }
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    /// Discards a range: cached copies of whole blocks in it are dropped
    /// (dirty ones too: their contents no longer matter) and the origin is
    /// told. The range reads as unspecified data until written again.
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.timed_request(Op::Trim, || self.trim_untimed(offset, len, fua))
    }

    fn trim_untimed(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.check_open()?;
        self.check_span(offset, len, true)?;
        bump(&self.stats.trim_requests, 1);
        for (at, n) in pieces(offset, offset + len, EFFECT_PIECE_BYTES) {
            self.trim_piece(at, n)?;
        }
        if fua {
            self.commit()?;
        }
        Ok(())
    }

    /// Trims a piece of at most `EFFECT_PIECE_BYTES`, whose segments are
    /// all built first.
    fn trim_piece(&self, offset: u64, len: u64) -> EngineResult<()> {
        let segs = self.segments(offset, len, true)?;
        if let Some(first) = segs.first() {
            let last = segs.last().expect("non-empty").block;
            let _guard = self
                .origins
                .of_key(first.block)
                .locks()
                .lock_range(first.block, last);
            self.origins
                .of_key(first.block)
                .flights()
                .touch(first.block, last);
            // Ranges to discard on the origin: whole blocks, and parts of
            // blocks that are not cached. A cached block trimmed in part
            // keeps its origin bytes, so cache and origin never disagree.
            let mut discard: Vec<(u64, u64)> = Vec::new();
            {
                let mut m = self.meta.lock();
                for seg in &segs {
                    let cached = m.table().lookup(seg.block);
                    if self.full_block(seg) {
                        if let Some((slot, _)) = cached {
                            self.append(&mut m, Record::Unmap { slot });
                        }
                    } else if cached.is_some() {
                        continue;
                    }
                    let off = seg.block * self.block_bytes + seg.in_block;
                    match discard.last_mut() {
                        Some((o, l)) if *o + *l == off => *l += seg.len(),
                        _ => discard.push((off, seg.len())),
                    }
                }
            }
            self.origins
                .of_key(first.block)
                .flights()
                .wait_origin(first.block, last);
            if self.order.older_groups_pending(self) {
                // A discard is a write of the open group: it may not reach
                // the origin before older groups (and a discard is a hint).
                bump(&self.stats.discards_held_back, discard.len() as u64);
                discard.clear();
            }
            let origin = self.origins.of_key(first.block);
            for (off, l) in discard {
                if let Err(e) = origin.device().discard(origin.local(off), l) {
                    log::debug!("origin discard failed (ignored, discard is a hint): {e}");
                }
            }
        }
        Ok(())
    }

    /// Makes every completed write durable (NBD FLUSH): a commit. Dirty
    /// data stays in the cache; `write_back_all` writes it back.
    pub fn flush(&self) -> EngineResult<()> {
        self.check_open()?;
        bump(&self.stats.flush_requests, 1);
        // Writeback in flush order: the writes acknowledged so far form a
        // group of their own.
        self.order.client_flush(self);
        self.timed_request(Op::Flush, || {
            self.commit()?;
            // A flush covers every write acknowledged before it: not so
            // while the origin may have lost some (origin/sync.rs).
            self.origins.writes_lost()
        })
    }

    /// `flush` for the clients of volume `v`. The commit is the cache's, but
    /// only volume `v`'s origin losing writes fails it: another volume's
    /// origin in trouble is for that volume's clients to see. Such an
    /// origin failing its flush fails the commit once; its writes are then
    /// its own to report (`writes_lost`), and the commit is tried again
    /// without them.
    pub fn flush_volume(&self, v: usize) -> EngineResult<()> {
        self.check_open()?;
        let origin = self.volume(v)?;
        bump(&self.stats.flush_requests, 1);
        self.order.client_flush(self);
        self.timed_request(Op::Flush, || {
            let others_lost = || self.origins.iter().any(|o| o.writes_lost().is_err());
            let committed = self.commit().or_else(|e| {
                if origin.writes_lost().is_ok() && others_lost() {
                    return self.commit();
                }
                Err(e)
            });
            committed?;
            origin.writes_lost()
        })
    }

    /// Writes back dirty blocks among `segs` (rare outside writeback modes:
    /// only after a failed writeback), then drops every cached copy in them;
    /// `origin_write` makes the drops durable before the origin changes.
    pub(crate) fn invalidate_before_origin_write(&self, segs: &[Segment]) -> EngineResult<()> {
        // In flush order, dirty blocks of closed groups go with their
        // groups, not here.
        self.order.before_foreground_write(self)?;
        for seg in segs {
            let cached = self.meta.lookup(seg.block);
            let Some((slot, dirty)) = cached else {
                continue;
            };
            if dirty {
                self.write_back_one(seg.block, slot)?;
            }
            let mut m = self.meta.lock();
            if let Some((slot, _)) = m.table().lookup(seg.block) {
                self.append(&mut m, Record::Unmap { slot });
            }
        }
        Ok(())
    }

    /// Writes `data` at `offset` to the origin, after dropping (durably)
    /// every cached copy of `segs`: the one way any mode changes the origin
    /// for a foreground write.
    pub(crate) fn write_origin_invalidating(
        &self,
        segs: &[Segment],
        data: &[u8],
        offset: u64,
    ) -> EngineResult<()> {
        self.invalidate_before_origin_write(segs)?;
        self.origin_write(data, offset)
    }
}
