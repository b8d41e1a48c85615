//! Origin blocks made stale by a lost cache: when the cache device (every
//! copy of it) fails while it holds dirty blocks, the origin still has
//! their old contents. They are never served as if current: reads that
//! touch one fail with an I/O error, `status` lists them as byte ranges,
//! and a later write that covers a whole block makes it current again.
//! The rest of the volume is served from the origin (the cache is failed
//! over). `--writeback-age` bounds how old the lost data can be.

use std::collections::BTreeMap;

/// Stale blocks as disjoint ranges: start block -> end block (exclusive).
#[derive(Default)]
pub(crate) struct StaleBlocks {
    ranges: BTreeMap<u64, u64>,
}

impl StaleBlocks {
    /// From sorted block numbers.
    pub(crate) fn of_blocks(blocks: &[u64]) -> StaleBlocks {
        let mut s = StaleBlocks::default();
        let mut i = 0;
        while i < blocks.len() {
            let start = blocks[i];
            let mut end = start + 1;
            i += 1;
            while i < blocks.len() && blocks[i] == end {
                end += 1;
                i += 1;
            }
            s.ranges.insert(start, end);
        }
        s
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// Some block of `first..=last` is stale.
    pub(crate) fn overlaps(&self, first: u64, last: u64) -> bool {
        self.ranges
            .range(..=last)
            .next_back()
            .is_some_and(|(_, &end)| end > first)
    }

    /// Blocks `first..=last` were written whole: current again.
    pub(crate) fn heal(&mut self, first: u64, last: u64) {
        let touched: Vec<(u64, u64)> = self
            .ranges
            .range(..=last)
            .rev()
            .take_while(|(_, &end)| end > first)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touched {
            self.ranges.remove(&s);
            if s < first {
                self.ranges.insert(s, first);
            }
            if e > last + 1 {
                self.ranges.insert(last + 1, e);
            }
        }
    }

    /// (first block, blocks) of each range, ascending.
    pub(crate) fn list(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|(&s, &e)| (s, e - s)).collect()
    }

    /// (byte offset, bytes) of each range, ascending, for blocks of `bs`.
    pub(crate) fn byte_ranges(&self, bs: u64) -> Vec<(u64, u64)> {
        self.list().iter().map(|&(b, n)| (b * bs, n * bs)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlap_and_heal() {
        let mut s = StaleBlocks::of_blocks(&[3, 4, 5, 9, 20, 21]);
        assert_eq!(s.list(), vec![(3, 3), (9, 1), (20, 2)]);
        assert!(s.overlaps(5, 8) && s.overlaps(0, 3) && s.overlaps(21, 30));
        assert!(!s.overlaps(6, 8) && !s.overlaps(10, 19) && !s.overlaps(22, 99));
        s.heal(4, 9);
        assert_eq!(s.list(), vec![(3, 1), (20, 2)]);
        s.heal(0, 100);
        assert!(s.list().is_empty());
    }
}
