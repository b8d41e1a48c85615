//! Slots that are free on disk, as a bitmap (1 bit per slot), so that a
//! store of several blocks can find slots next to each other: a multi-block
//! hit is then one cache device read per run of adjacent slots, not one per
//! block. Single slots come from the lowest free slot (filling holes);
//! runs come next-fit from where the last run ended, so holes do not push
//! long runs apart.
//!
//! With the log placement (`segments.rs`), slots come from a cursor
//! through whole segments instead, in order; the bitmap search is the
//! fallback when no segment is whole.

/// Words scanned per run search before giving up on adjacency (2^18 slots):
/// a bound on the time a store spends under the metadata lock (a fully
/// fragmented bitmap costs up to 64 steps per word, ~0.3 ms in all).
const RUN_SCAN_WORDS: usize = 1 << 12;

use std::ops::Range;

use super::segments::{Freed, Geometry, Segments};

pub struct FreeSlots {
    /// The first slot this bitmap covers (a pool's slots: `pools.rs`).
    base: u32,
    /// How many slots it covers.
    slots: u32,
    /// Bit `i % 64` of word `i / 64` is set when slot `base + i` is free.
    /// Bits past the last slot are never set.
    words: Vec<u64>,
    count: usize,
    /// Every word below this one is zero.
    low_word: usize,
    /// Where the next run search starts.
    next_word: usize,
    /// The log placement's segments, if on.
    log: Option<Segments>,
}

impl FreeSlots {
    /// No slot free.
    #[cfg(test)]
    pub fn new(slot_count: u64) -> FreeSlots {
        FreeSlots::covering(0..slot_count as u32)
    }

    /// No slot free, covering the slots of `range`.
    pub fn covering(range: std::ops::Range<u32>) -> FreeSlots {
        FreeSlots {
            base: range.start,
            slots: range.len() as u32,
            words: vec![0; (range.len()).div_ceil(64)],
            count: 0,
            low_word: 0,
            next_word: 0,
            log: None,
        }
    }

    /// Turns the log placement on (after the free slots are in).
    pub fn enable_log(&mut self, g: Geometry) {
        let segs = Segments::new(g, self.base..self.base + self.slots, |r| self.count_in(r));
        self.log = Some(segs);
    }

    /// Covers slots up to `end` (the cache device grew): the new ones are
    /// free. With the log placement, those past the last segment form
    /// whole segments; those that complete the last one join it as
    /// freed slots (or wait with it for its discard: `Segments::grow`).
    pub fn grow(&mut self, end: u32) {
        let from = self.base + self.slots;
        if end <= from {
            return;
        }
        self.slots = end - self.base;
        self.words.resize((self.slots as usize).div_ceil(64), 0);
        let (gap, held) = match self.log.as_mut() {
            Some(log) => log.grow(self.slots),
            None => (from..from, false),
        };
        for s in gap.end..end {
            self.set((s - self.base) as usize);
        }
        if !held {
            gap.for_each(|s| self.insert(s));
        }
    }

    /// Sets the bit of a slot not free before.
    fn set(&mut self, s: usize) {
        self.words[s / 64] |= 1 << (s % 64);
        self.count += 1;
        self.low_word = self.low_word.min(s / 64);
    }

    /// How many slots this bitmap covers (free or not).
    pub fn slot_count(&self) -> u32 {
        self.slots
    }

    pub fn log(&self) -> Option<&Segments> {
        self.log.as_ref()
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn heap_bytes(&self) -> u64 {
        (self.words.capacity() * 8) as u64
    }

    pub fn contains(&self, slot: u32) -> bool {
        let Some(s) = slot.checked_sub(self.base) else {
            return false;
        };
        let s = s as usize;
        self.words
            .get(s / 64)
            .is_some_and(|w| w & (1 << (s % 64)) != 0)
    }

    /// Marks `slot` free. Freeing a free slot is a bug. With the log
    /// placement, a segment this makes whole may leave the bitmap for its
    /// discard (`take_trims`).
    pub fn insert(&mut self, slot: u32) {
        let s = (slot - self.base) as usize;
        let w = &mut self.words[s / 64];
        assert!(*w & (1 << (s % 64)) == 0, "slot {slot} freed twice");
        *w |= 1 << (s % 64);
        self.count += 1;
        self.low_word = self.low_word.min(s / 64);
        let Some(log) = self.log.as_ref() else {
            return;
        };
        let seg = log.range(log.index(slot));
        let all_free = self.count_in(seg.clone()) == seg.len() as u64;
        let log = self.log.as_mut().expect("on");
        match log.freed(slot, all_free) {
            Freed::Nothing => {}
            Freed::Hold => self.clear(s),
            Freed::Trim(r) => {
                for t in r {
                    self.clear((t - self.base) as usize);
                }
            }
        }
    }

    /// Starts emptying segment `segment` (log placement): its free slots
    /// leave the bitmap and are held until the whole segment is free.
    pub fn begin_cleaning(&mut self, segment: Range<u32>) {
        let i = self
            .log
            .as_ref()
            .expect("log placement")
            .index(segment.start);
        let free: Vec<u32> = segment.filter(|&t| self.contains(t)).collect();
        for &t in &free {
            self.clear((t - self.base) as usize);
        }
        self.log.as_mut().expect("on").begin_cleaning(i, free);
    }

    /// Gives up emptying the segment being emptied: its held slots, for
    /// the caller to insert again.
    pub fn end_cleaning(&mut self) -> Vec<u32> {
        self.log
            .as_mut()
            .map(|l| l.end_cleaning())
            .unwrap_or_default()
    }

    /// Clears the bit of free slot `base + s`.
    fn clear(&mut self, s: usize) {
        self.words[s / 64] &= !(1 << (s % 64));
        self.count -= 1;
    }

    /// A slot left the bitmap to hold data.
    fn handed_out(&mut self, slot: u32) {
        if let Some(log) = self.log.as_mut() {
            log.taken(slot);
        }
    }

    /// Segments waiting for their discard (their slots are out of the
    /// bitmap until `trim_done`).
    pub fn take_trims(&mut self) -> Vec<Range<u32>> {
        self.log
            .as_mut()
            .map(|l| l.take_trims())
            .unwrap_or_default()
    }

    /// The discard of the segment starting at `slot` is done: its slots,
    /// for the caller to insert again.
    pub fn trim_done(&mut self, slot: u32) -> Range<u32> {
        self.log.as_mut().expect("log placement").trim_done(slot)
    }

    /// Slots of `range` out of the bitmap for a discard.
    pub fn trimming_in(&self, range: Range<u32>) -> u64 {
        self.log.as_ref().map_or(0, |l| l.trimming_in(range))
    }

    pub fn extend(&mut self, slots: impl IntoIterator<Item = u32>) {
        for s in slots {
            self.insert(s);
        }
    }

    /// The lowest free slot, taken.
    pub fn pop(&mut self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        while self.words[self.low_word] == 0 {
            self.low_word += 1;
        }
        let s = self.low_word * 64 + self.words[self.low_word].trailing_zeros() as usize;
        self.clear(s);
        let slot = self.base + s as u32;
        self.handed_out(slot);
        Some(slot)
    }

    /// Free slots within `range` (which must lie in this bitmap's slots).
    pub fn count_in(&self, range: std::ops::Range<u32>) -> u64 {
        let (lo, hi) = (
            (range.start - self.base) as usize,
            (range.end - self.base) as usize,
        );
        let mut n = 0u64;
        let mut i = lo;
        while i < hi {
            let (w, bit) = (i / 64, i % 64);
            let take = (64 - bit).min(hi - i);
            let mask = if take == 64 {
                !0u64
            } else {
                ((1u64 << take) - 1) << bit
            };
            n += (self.words[w] & mask).count_ones() as u64;
            i += take;
        }
        n
    }

    /// Takes `slot` if it is free; true if it was.
    pub fn remove(&mut self, slot: u32) -> bool {
        if !self.contains(slot) {
            return false;
        }
        self.clear((slot - self.base) as usize);
        self.handed_out(slot);
        true
    }

    /// Up to `n` free slots, taken. With the log placement, from the
    /// cursor through whole segments, in order; otherwise (and when no
    /// segment is whole), ascending: `n` adjacent slots if a run that long
    /// is found within the scan bound, else the lowest ones.
    pub fn take(&mut self, n: usize) -> Vec<u32> {
        let n = n.min(self.count);
        let mut v = Vec::with_capacity(n);
        if self.log.is_some() {
            while v.len() < n {
                let Some(slot) = self.log.as_mut().and_then(|l| l.cursor()) else {
                    break;
                };
                let s = (slot - self.base) as usize;
                if self.words[s / 64] & (1 << (s % 64)) != 0 {
                    self.clear(s);
                    self.handed_out(slot);
                    v.push(slot);
                }
            }
            if v.len() == n {
                return v;
            }
            if let Some(log) = self.log.as_mut() {
                log.scattered += (n - v.len()) as u64;
            }
        }
        let n = n - v.len();
        if n > 1 {
            if let Some(start) = self.find_run(n) {
                for s in start..start + n {
                    self.clear(s);
                    self.handed_out(self.base + s as u32);
                }
                self.next_word = (start + n) / 64;
                v.extend((start..start + n).map(|s| self.base + s as u32));
                return v;
            }
        }
        v.extend((0..n).map_while(|_| self.pop()));
        v
    }

    /// The first slot of `n` adjacent free slots, searching from
    /// `next_word` to the end and then from the lowest free word.
    fn find_run(&self, n: usize) -> Option<usize> {
        let end = self.words.len();
        let from = self.next_word.min(end);
        let mut budget = RUN_SCAN_WORDS;
        for (lo, hi) in [(from, end), (self.low_word, from)] {
            let hi = hi.min(lo + budget);
            if lo >= hi {
                continue;
            }
            budget -= hi - lo;
            if let Some(s) = self.find_run_in(n, lo, hi) {
                return Some(s);
            }
        }
        None
    }

    /// A run of `n` free slots that starts in words `[lo, hi)`.
    fn find_run_in(&self, n: usize, lo: usize, hi: usize) -> Option<usize> {
        let mut run_start = 0;
        let mut run_len = 0;
        for i in lo..self.words.len() {
            let w = self.words[i];
            if i >= hi && run_len == 0 {
                return None;
            }
            if w == !0 {
                if run_len == 0 {
                    run_start = i * 64;
                }
                run_len += 64;
                if run_len >= n {
                    return Some(run_start);
                }
                continue;
            }
            // Walk the word's runs of ones, lowest bit first.
            let mut b = 0u32;
            while b < 64 {
                let rest = w >> b;
                if rest == 0 {
                    run_len = 0;
                    break;
                }
                let zeros = rest.trailing_zeros();
                if zeros > 0 {
                    run_len = 0;
                    b += zeros;
                    continue;
                }
                if i >= hi && run_len == 0 {
                    return None;
                }
                let ones = rest.trailing_ones();
                if run_len == 0 {
                    run_start = i * 64 + b as usize;
                }
                run_len += ones as usize;
                if run_len >= n {
                    return Some(run_start);
                }
                b += ones;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(slot_count: u64, free: impl IntoIterator<Item = u32>) -> FreeSlots {
        let mut f = FreeSlots::new(slot_count);
        f.extend(free);
        f
    }

    #[test]
    fn pop_hands_out_the_lowest_first() {
        let mut f = with(200, [150, 3, 70, 64]);
        assert_eq!(f.len(), 4);
        assert_eq!(f.pop(), Some(3));
        assert_eq!(f.pop(), Some(64));
        f.insert(1);
        assert_eq!(f.pop(), Some(1));
        assert_eq!(f.pop(), Some(70));
        assert_eq!(f.pop(), Some(150));
        assert_eq!(f.pop(), None);
        assert!(f.is_empty());
    }

    #[test]
    fn take_prefers_a_run_over_holes() {
        // Holes at 0, 2, 4, ..., 98; a run of 100 free slots from 130.
        let mut f = with(300, (0..50).map(|k| 2 * k).chain(130..230));
        assert_eq!(f.take(100), (130..230).collect::<Vec<u32>>());
        assert_eq!(f.len(), 50);
        // No run of 3 is left: the lowest slots instead.
        assert_eq!(f.take(3), vec![0, 2, 4]);
        // A run of two is never found either; single slots fill holes.
        assert_eq!(f.pop(), Some(6));
    }

    #[test]
    fn runs_cross_words_and_searches_wrap() {
        let mut f = with(256, (60..70).chain(200..256));
        assert_eq!(f.take(10), (60..70).collect::<Vec<u32>>());
        // The next search starts past the last run and finds one at 200.
        assert_eq!(f.take(50), (200..250).collect::<Vec<u32>>());
        f.extend(10..20);
        // From word 3 to the end there are 6 free slots: wrap to the start.
        assert_eq!(f.take(8), (10..18).collect::<Vec<u32>>());
        assert_eq!(f.take(100).len(), 8);
        assert!(f.is_empty());
        assert_eq!(f.take(4), Vec::<u32>::new());
    }

    #[test]
    fn a_run_at_the_very_end_is_found() {
        let mut f = with(130, [0].into_iter().chain(120..130));
        assert_eq!(f.take(10), (120..130).collect::<Vec<u32>>());
        assert!(f.contains(0) && !f.contains(125));
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn double_free_is_a_bug() {
        let mut f = with(10, [4]);
        f.insert(4);
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    #[test]
    fn the_cursor_fills_whole_segments_in_order_and_freed_ones_are_trimmed() {
        let mut f = FreeSlots::new(16);
        f.extend(0..16);
        f.enable_log(Geometry { slots: 4, phase: 0 });
        assert_eq!(f.take(3), vec![0, 1, 2]);
        assert_eq!(f.take(3), vec![3, 4, 5]);
        // Slots 0..4 come back: segment 0 is discarded before reuse.
        f.extend([1, 0, 3]);
        assert!(f.take_trims().is_empty());
        f.insert(2);
        assert_eq!(f.take_trims(), vec![0..4]);
        assert_eq!(f.len(), 16 - 2 - 4);
        assert_eq!(f.trimming_in(0..16), 4);
        // The cursor goes on in order, around to segment 0 once trimmed.
        assert_eq!(f.take(10), vec![6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(f.trim_done(0), 0..4);
        f.extend(0..4);
        assert!(f.take_trims().is_empty(), "trimmed once");
        assert_eq!(f.take(2), vec![0, 1]);
    }

    #[test]
    fn growing_completes_the_last_segment_and_adds_whole_ones() {
        // Segments of 4 over 14 slots: the last one, 12..14, is short.
        let mut f = FreeSlots::new(14);
        f.extend(0..14);
        f.enable_log(Geometry { slots: 4, phase: 0 });
        assert_eq!(f.take(13).len(), 13);
        f.grow(22);
        // 13 was free; 14 and 15 complete segment 3; 16..22 are new.
        assert_eq!(f.len(), 1 + 2 + 6);
        assert_eq!(f.log().unwrap().count(), 6);
        assert_eq!(f.log().unwrap().whole(), 2);
        f.insert(12);
        assert_eq!(f.take_trims(), vec![12..16]);
        assert_eq!(f.trim_done(12), 12..16);
        f.extend(12..16);
        assert_eq!(f.len(), 4 + 6);

        // The last segment waiting for its discard when the pool grows:
        // the slots that complete it wait with it, then join the bitmap.
        let mut f = FreeSlots::new(14);
        f.extend(0..14);
        f.enable_log(Geometry { slots: 4, phase: 0 });
        assert_eq!(f.take(14).len(), 14);
        f.extend([12, 13]);
        f.grow(22);
        assert_eq!(f.len(), 6, "14 and 15 wait with 12 and 13");
        assert_eq!(f.trimming_in(0..22), 4);
        assert_eq!(f.take_trims(), vec![12..16]);
        assert_eq!(f.trim_done(12), 12..16);
        f.extend(12..16);
        assert_eq!(f.len(), 10);
        assert_eq!(f.trimming_in(0..22), 0);
    }

    #[test]
    fn growing_without_segments_frees_the_new_slots() {
        let mut f = FreeSlots::new(10);
        f.insert(3);
        f.grow(70);
        assert_eq!(f.len(), 61);
        assert!(f.contains(69) && !f.contains(4));
        assert_eq!(f.take(2), vec![10, 11]);
    }
}
