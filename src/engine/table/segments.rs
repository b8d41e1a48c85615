//! The log placement's segments: a pool's slots cut into runs of 1 MiB of
//! the cache device (bcache's buckets), so that new data is laid down in
//! order whatever the client's offsets. A segment is *whole* when every
//! slot in it is free on disk; new slots come from a cursor through one
//! whole segment at a time (`FreeSlots::take`), and the background frees
//! whole segments ahead of it (writeback/clean.rs).
//!
//! A segment that becomes whole again is discarded on the cache device
//! before it is handed out: its slots leave the free bitmap (*trimming*)
//! until the discard is done, so no new data can land in it meanwhile.
//! This module is bookkeeping only; `free.rs` calls it whenever a bit of
//! its bitmap changes.

use std::ops::Range;

/// Segments a pool is cut into at least (segments shrink to get there).
const MIN_SEGMENTS: u64 = 16;

/// Where segments fall: `slots` per segment, the first starting at the
/// slot whose number plus `phase` is a multiple of `slots` (the engine
/// puts segment starts on 1 MiB boundaries of the cache device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub slots: u32,
    pub phase: u32,
}

impl Geometry {
    /// Segments of `segment_bytes` over slots of `block_bytes` whose slot 0
    /// starts `data_offset` bytes into the device; smaller (a power of two
    /// dividing the full size) where `pool_slots` would not hold 16 of them,
    /// so that a small cache still has segments to fill and to empty.
    pub fn new(
        segment_bytes: u64,
        block_bytes: u64,
        data_offset: u64,
        pool_slots: u64,
    ) -> Geometry {
        let full = (segment_bytes / block_bytes).max(1);
        let mut slots = full;
        while slots > 1 && pool_slots / slots < MIN_SEGMENTS {
            slots /= 2;
        }
        let phase = (data_offset / block_bytes) % slots;
        Geometry {
            slots: slots as u32,
            phase: phase as u32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Some slot holds data (or is being written).
    Used,
    /// Every slot free, in the bitmap.
    Whole,
    /// Every slot free, out of the bitmap until its discard is done.
    Trimming,
    /// Being emptied by the cleaner: its free slots are held out of the
    /// bitmap (`Segments::cleaning`), so no write takes them before the
    /// segment is whole.
    Cleaning,
}

pub struct Segments {
    seg: u32,
    /// The pool's first slot and slot count.
    base: u32,
    len: u32,
    /// Slots of the first segment that lie before the pool.
    lead: u32,
    state: Vec<State>,
    /// Discarded, and no slot taken since.
    trimmed: Vec<bool>,
    whole: usize,
    /// The open segment and the next slot to try in it.
    open: Option<(usize, u32)>,
    /// Segments waiting for their discard.
    to_trim: Vec<usize>,
    trimming: usize,
    /// Slots handed out outside the cursor (no whole segment was free).
    pub scattered: u64,
    /// The segment being emptied and its free slots, held out of the bitmap.
    cleaning: Option<(usize, Vec<u32>)>,
}

/// What `free.rs` must do after a slot was freed.
pub enum Freed {
    Nothing,
    /// The slot's segment is being emptied: take the slot out of the
    /// bitmap again (it is held until the segment is whole).
    Hold,
    /// The segment `range` became whole and is queued for its discard:
    /// take its slots out of the bitmap.
    Trim(Range<u32>),
}

impl Segments {
    /// Segments over the pool's slots `pool`; `free(r)` counts the free
    /// slots of `r` now. Segments free now count as discarded already.
    pub fn new(g: Geometry, pool: Range<u32>, free: impl Fn(Range<u32>) -> u64) -> Segments {
        let lead = (pool.start + g.phase) % g.slots;
        let len = pool.len() as u32;
        let count = (len + lead).div_ceil(g.slots) as usize;
        let mut s = Segments {
            seg: g.slots,
            base: pool.start,
            len,
            lead,
            state: vec![State::Used; count],
            trimmed: vec![false; count],
            whole: 0,
            open: None,
            to_trim: Vec::new(),
            trimming: 0,
            scattered: 0,
            cleaning: None,
        };
        for i in 0..count {
            let r = s.range(i);
            if free(r.clone()) == r.len() as u64 {
                s.state[i] = State::Whole;
                s.trimmed[i] = true;
                s.whole += 1;
            }
        }
        s
    }

    pub fn count(&self) -> usize {
        self.state.len()
    }

    /// The pool grew to `len` slots (the cache device grew). The slots
    /// past the last segment's full extent form new segments, whole
    /// (the caller puts their slots in the bitmap). Returns the new slots
    /// that fall in the last old segment, which the caller frees one by
    /// one, and whether that segment is being discarded: then they stay
    /// out of the bitmap, counted as trimming, and `trim_done` puts them
    /// in with the rest.
    pub fn grow(&mut self, len: u32) -> (Range<u32>, bool) {
        let count = self.count();
        let old_end = self.base + self.len;
        let extent_end = self.base + (count as u32 * self.seg).saturating_sub(self.lead);
        self.len = len;
        let gap = old_end..extent_end.clamp(old_end, self.base + len);
        let trimming = count > 0 && self.state[count - 1] == State::Trimming;
        if trimming {
            self.trimming += gap.len();
        }
        let new_count = (len + self.lead).div_ceil(self.seg) as usize;
        for _ in count..new_count {
            self.state.push(State::Whole);
            self.trimmed.push(true);
            self.whole += 1;
        }
        (gap, trimming)
    }

    /// The segment holding `slot`.
    pub fn index(&self, slot: u32) -> usize {
        ((slot - self.base + self.lead) / self.seg) as usize
    }

    /// The slots of segment `i`.
    pub fn range(&self, i: usize) -> Range<u32> {
        let start = (i as u32 * self.seg).saturating_sub(self.lead);
        let end = ((i as u32 + 1) * self.seg - self.lead).min(self.len);
        self.base + start..self.base + end
    }

    /// Whole segments, in the bitmap.
    pub fn whole(&self) -> usize {
        self.whole
    }

    /// Slots out of the bitmap while their segment is trimmed.
    pub fn trimming_slots(&self) -> usize {
        self.trimming
    }

    /// Slots of `r` out of the bitmap while their segment is trimmed or
    /// being emptied.
    pub fn trimming_in(&self, r: Range<u32>) -> u64 {
        let held = self.cleaning.as_ref().map_or(0, |(_, h)| {
            h.iter().filter(|s| r.contains(s)).count() as u64
        });
        if self.trimming == 0 || r.is_empty() {
            return held;
        }
        (self.index(r.start)..=self.index(r.end - 1))
            .filter(|&i| self.state[i] == State::Trimming)
            .map(|i| {
                let s = self.range(i);
                (s.end.min(r.end).saturating_sub(s.start.max(r.start))) as u64
            })
            .sum::<u64>()
            + held
    }

    /// The segment being emptied, if any.
    pub fn cleaning(&self) -> Option<Range<u32>> {
        self.cleaning.as_ref().map(|(i, _)| self.range(*i))
    }

    /// Segment `i` (in use) is to be emptied: its free slots (`free`,
    /// which the caller takes out of the bitmap) are held from now on.
    pub fn begin_cleaning(&mut self, i: usize, free: Vec<u32>) {
        assert!(self.cleaning.is_none(), "one segment is emptied at a time");
        assert_eq!(self.state[i], State::Used);
        self.state[i] = State::Cleaning;
        self.cleaning = Some((i, Vec::new()));
        for s in free {
            let _ = self.freed(s, false);
        }
    }

    /// The cleaner gave up on the segment being emptied: it is in use
    /// again, and its held slots (returned) go back to the bitmap.
    pub fn end_cleaning(&mut self) -> Vec<u32> {
        let Some((i, held)) = self.cleaning.take() else {
            return Vec::new();
        };
        self.state[i] = State::Used;
        held
    }

    /// A slot of segment `i` left the bitmap.
    pub fn taken(&mut self, slot: u32) {
        let i = self.index(slot);
        if self.state[i] == State::Whole {
            self.state[i] = State::Used;
            self.whole -= 1;
        }
        self.trimmed[i] = false;
    }

    /// A slot joined the bitmap; `all_free` says whether its segment's
    /// slots are now all in the bitmap.
    pub fn freed(&mut self, slot: u32, all_free: bool) -> Freed {
        let i = self.index(slot);
        if let Some((c, held)) = self.cleaning.as_mut() {
            if *c == i {
                held.push(slot);
                if held.len() == self.range(i).len() {
                    // Emptied: discarded next, then whole.
                    self.cleaning = None;
                    self.state[i] = State::Trimming;
                    self.trimming += self.range(i).len();
                    self.to_trim.push(i);
                }
                return Freed::Hold;
            }
        }
        if !all_free || self.state[i] != State::Used {
            return Freed::Nothing;
        }
        if self.trimmed[i] {
            self.state[i] = State::Whole;
            self.whole += 1;
            return Freed::Nothing;
        }
        self.state[i] = State::Trimming;
        let r = self.range(i);
        self.trimming += r.len();
        self.to_trim.push(i);
        Freed::Trim(r)
    }

    /// The segments waiting for their discard (they stay out of the bitmap
    /// until `trim_done`).
    pub fn take_trims(&mut self) -> Vec<Range<u32>> {
        let v = std::mem::take(&mut self.to_trim);
        v.into_iter().map(|i| self.range(i)).collect()
    }

    /// The discard of the segment starting at `slot` is done: its slots
    /// go back to the bitmap (the caller inserts them), and it counts as
    /// whole once they are all in.
    pub fn trim_done(&mut self, slot: u32) -> Range<u32> {
        let i = self.index(slot);
        assert_eq!(self.state[i], State::Trimming, "segment {i} not trimming");
        let r = self.range(i);
        self.trimming -= r.len();
        self.state[i] = State::Used;
        self.trimmed[i] = true;
        r
    }

    /// The next slot to try at the cursor, opening the next whole segment
    /// (in slot order, wrapping) when the open one is used up; `None` if no
    /// whole segment is left. The caller takes it if it is free and calls
    /// `taken`.
    pub fn cursor(&mut self) -> Option<u32> {
        if let Some((i, next)) = self.open {
            if next < self.range(i).end {
                self.open = Some((i, next + 1));
                return Some(next);
            }
        }
        if self.whole == 0 {
            self.open = None;
            return None;
        }
        let n = self.count();
        let from = self.open.map_or(0, |(i, _)| i + 1);
        let i = (0..n)
            .map(|k| (from + k) % n)
            .find(|&i| self.state[i] == State::Whole)
            .expect("a whole segment is counted");
        let r = self.range(i);
        self.open = Some((i, r.start + 1));
        Some(r.start)
    }

    /// Up to `max` segments to free next, oldest first: in slot order from
    /// the one after the open segment, wrapping, those in use.
    pub fn candidates(&self, max: usize) -> Vec<Range<u32>> {
        let n = self.count();
        let open = self.open.map(|(i, _)| i);
        let from = open.map_or(0, |i| i + 1);
        (0..n)
            .map(|k| (from + k) % n)
            .filter(|&i| Some(i) != open && self.state[i] == State::Used)
            .take(max)
            .map(|i| self.range(i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_start_on_device_boundaries() {
        // 4 slots per segment; slot 0 is 1 slot past a boundary.
        let g = Geometry::new(4 * 4096, 4096, 4096 * 5, 1000);
        assert_eq!(g, Geometry { slots: 4, phase: 1 });
        // A small pool: smaller segments, still on boundaries.
        let small = Geometry::new(1 << 20, 4096, 4096 * 5, 100);
        assert_eq!(small, Geometry { slots: 4, phase: 1 });
        let s = Segments::new(g, 0..10, |_| 0);
        assert_eq!(s.count(), 3);
        assert_eq!(s.range(0), 0..3);
        assert_eq!(s.range(1), 3..7);
        assert_eq!(s.range(2), 7..10);
        assert_eq!(s.index(3), 1);
        // A pool starting mid-segment.
        let s = Segments::new(g, 5..13, |_| 0);
        assert_eq!((s.range(0), s.range(1), s.range(2)), (5..7, 7..11, 11..13));
    }

    #[test]
    fn freed_segments_are_trimmed_once_then_whole() {
        let g = Geometry { slots: 4, phase: 0 };
        let mut s = Segments::new(g, 0..8, |r| if r.start == 0 { 4 } else { 0 });
        assert_eq!(s.whole(), 1);
        assert_eq!(s.cursor(), Some(0));
        s.taken(0);
        assert_eq!(s.whole(), 0);
        assert!(matches!(s.freed(0, true), Freed::Trim(r) if r == (0..4)));
        assert_eq!(s.trimming_slots(), 4);
        assert_eq!(s.trimming_in(2..6), 2);
        assert_eq!(s.take_trims(), vec![0..4]);
        assert_eq!(s.trim_done(0), 0..4);
        // Back in the bitmap: whole, and not trimmed again.
        assert!(matches!(s.freed(3, true), Freed::Nothing));
        assert_eq!(s.whole(), 1);
        assert_eq!(s.candidates(5), vec![4..8]);
    }
}
