//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP'23): a small FIFO queue (10% of the slots) that new blocks enter,
//! a main FIFO queue, and a ghost history of blocks evicted from the small
//! queue. A block accessed again while in the small queue moves to the main
//! queue; one that is not is evicted early, so a scan passes through the
//! small queue without displacing the main queue's working set. A block
//! that comes back while the ghost history still remembers it enters the
//! main queue directly. In the main queue a block's access count (0..=3)
//! buys it another round at the hot end, as in CLOCK.
//!
//! Memory: the shared links (8 bytes per slot), one state byte per slot and
//! the ghost history (about 1 byte per slot).

use super::ghost::Ghost;
use super::{Links, List, Policy, PolicyKind, Verdict};

/// State byte: bits 0..2 the access count, bit 7 set in the main queue.
const FREQ_MASK: u8 = 0b11;
const IN_MAIN: u8 = 0x80;

pub struct S3Fifo {
    links: Links,
    small: List,
    main: List,
    state: Vec<u8>,
    ghost: Ghost,
    /// The small queue's target length: 10% of the slots.
    small_target: usize,
}

impl S3Fifo {
    pub fn new(slot_count: u32) -> Self {
        S3Fifo {
            links: Links::new(slot_count),
            small: List::default(),
            main: List::default(),
            state: vec![0; slot_count as usize],
            // The ghost remembers about as many blocks as the main queue holds.
            ghost: Ghost::new(slot_count as usize * 9 / 10),
            small_target: (slot_count as usize / 10).max(1),
        }
    }

    fn freq(&self, slot: u32) -> u8 {
        self.state[slot as usize] & FREQ_MASK
    }

    fn in_main(&self, slot: u32) -> bool {
        self.state[slot as usize] & IN_MAIN != 0
    }

    fn unlink(&mut self, slot: u32) {
        if self.in_main(slot) {
            self.links.unlink(&mut self.main, slot);
        } else {
            self.links.unlink(&mut self.small, slot);
        }
    }

    /// Moves a slot to the main queue's hot end with its access count.
    fn move_to_main(&mut self, slot: u32, freq: u8) {
        self.unlink(slot);
        self.state[slot as usize] = IN_MAIN | freq;
        self.links.push_hot(&mut self.main, slot);
    }
}

impl Policy for S3Fifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::S3Fifo
    }

    fn inserted(&mut self, slot: u32, block: u64) {
        self.unlink(slot);
        if self.ghost.contains(block) {
            self.state[slot as usize] = IN_MAIN;
            self.links.push_hot(&mut self.main, slot);
        } else {
            self.state[slot as usize] = 0;
            self.links.push_hot(&mut self.small, slot);
        }
    }

    fn grow(&mut self, slot_count: u32) {
        self.links.grow(slot_count);
        self.state.resize(slot_count as usize, 0);
        self.small_target = (slot_count as usize / 10).max(1);
        // The ghost history keeps its size (and what it remembers) until
        // the next open sizes it for the slots then.
    }
    fn accessed(&mut self, slot: u32) {
        let s = &mut self.state[slot as usize];
        if *s & FREQ_MASK < FREQ_MASK {
            *s += 1;
        }
    }

    fn removed(&mut self, slot: u32) {
        self.unlink(slot);
        self.state[slot as usize] = 0;
    }

    fn moved(&mut self, old: u32, new: u32, _block: u64) {
        // The block keeps its queue and its count: a hot block rewritten
        // must not start over in the small queue. (The write that moved
        // it counted its access already; so does a move by the log
        // placement's cleaner, which is no access at all.)
        let state = self.state[old as usize];
        self.removed(old);
        self.unlink(new);
        self.state[new as usize] = state;
        if state & IN_MAIN != 0 {
            self.links.push_hot(&mut self.main, new);
        } else {
            self.links.push_hot(&mut self.small, new);
        }
    }

    /// In log order a block is kept while its access count lasts: each
    /// pass of the cleaner spends one, as a pass over the main queue does,
    /// and a block accessed while small joins the main queue. So a block
    /// used often outlives a few turns of the log without another access,
    /// and one a scan brought in and nobody used again goes at the first.
    fn keep_in_log(&self, slot: u32) -> Option<bool> {
        Some(self.freq(slot) > 0)
    }

    fn log_pass(&mut self, slot: u32, block: u64, keep: bool) {
        match (keep, self.in_main(slot)) {
            (true, false) => self.move_to_main(slot, self.freq(slot)),
            (true, true) => self.state[slot as usize] -= 1,
            // Leaving through the small queue: remembered, as `evicted`.
            (false, false) => self.ghost.insert(block),
            (false, true) => {}
        }
    }

    fn evicted(&mut self, slot: u32, block: u64) {
        // Only blocks that left through the small queue are remembered:
        // the ones that had no second access there.
        if !self.in_main(slot) {
            self.ghost.insert(block);
        }
        self.state[slot as usize] = 0;
    }

    fn select(
        &mut self,
        want: usize,
        scan_max: usize,
        verdict: &mut dyn FnMut(u32) -> Verdict,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        // `scan_max` bounds the candidates judged; moves between the queues
        // (a kept block, a count spent) cost a step each, bounded apart, so
        // a queue full of accessed blocks does not use up the budget before
        // any victim is judged (a short selection would leave a promotion
        // without a slot).
        let (mut scanned, mut steps) = (0, 0);
        while out.len() < want && scanned < scan_max && steps < 8 * scan_max {
            steps += 1;
            let from_small = self.small.len() >= self.small_target || self.main.is_empty();
            let head = if from_small {
                self.small.head()
            } else {
                self.main.head()
            };
            let Some(slot) = head else { break };
            let freq = self.freq(slot);
            if from_small {
                if freq > 0 {
                    // Accessed again while small: a keeper, with its count.
                    self.move_to_main(slot, freq);
                    continue;
                }
            } else if freq > 0 {
                self.state[slot as usize] -= 1;
                self.links.move_hot(&mut self.main, slot);
                continue;
            }
            scanned += 1;
            match verdict(slot) {
                Verdict::Take => {
                    self.unlink(slot);
                    out.push(slot);
                }
                // Busy or dirty: out of the way, to the main queue's hot end
                // (a dirty block was written, so it is in use).
                Verdict::Skip | Verdict::Rotate => self.move_to_main(slot, freq),
            }
        }
        out
    }

    fn order(&self) -> Vec<u32> {
        // The small queue is the colder: it is evicted first.
        self.links
            .iter(&self.small)
            .chain(self.links.iter(&self.main))
            .collect()
    }

    fn heap_bytes(&self) -> u64 {
        self.links.heap_bytes() + self.state.capacity() as u64 + self.ghost.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        super::super::tests::policy_basics(Box::new(S3Fifo::new(8)));
    }

    #[test]
    fn a_scan_does_not_displace_the_working_set() {
        let n = 100u32;
        let mut p = S3Fifo::new(n);
        let mut slot_block = vec![u64::MAX; n as usize];
        let mut free: Vec<u32> = (0..n).rev().collect();
        let evict = |p: &mut S3Fifo, slot_block: &mut Vec<u64>, free: &mut Vec<u32>| {
            let v = p.select(1, 1000, &mut |_| Verdict::Take);
            for s in v {
                p.evicted(s, slot_block[s as usize]);
                free.push(s);
            }
        };
        // A working set of 50 blocks, each accessed twice.
        let mut hot = Vec::new();
        for b in 0..50u64 {
            let s = free.pop().unwrap();
            slot_block[s as usize] = b;
            p.inserted(s, b);
            p.accessed(s);
            hot.push(s);
        }
        // A scan of 1000 blocks seen once each.
        for b in 1000..2000u64 {
            if free.is_empty() {
                evict(&mut p, &mut slot_block, &mut free);
            }
            let s = free.pop().unwrap();
            slot_block[s as usize] = b;
            p.inserted(s, b);
        }
        let kept = hot.iter().filter(|&&s| slot_block[s as usize] < 50).count();
        assert_eq!(kept, 50, "the scan evicted the working set");
    }

    #[test]
    fn a_rewritten_block_keeps_its_place() {
        let mut p = S3Fifo::new(20);
        p.inserted(0, 7);
        p.accessed(0);
        // Moved to main by an eviction round that takes someone else.
        for s in 1..20 {
            p.inserted(s, 100 + s as u64);
        }
        let v = p.select(1, 100, &mut |_| Verdict::Take);
        assert!(p.in_main(0) && !v.contains(&0));
        // The write that rewrites it counts its access, then moves it.
        p.accessed(0);
        p.moved(0, v[0], 7);
        assert!(p.in_main(v[0]), "the rewritten block left the main queue");
        assert_eq!(p.freq(v[0]), 2);
    }

    #[test]
    fn in_log_order_an_access_count_lasts_a_pass_each() {
        let mut p = S3Fifo::new(20);
        p.inserted(0, 7);
        p.inserted(1, 8);
        p.accessed(0);
        p.accessed(0);
        // A scan's block, never used again: let go, and remembered.
        assert_eq!(p.keep_in_log(1), Some(false));
        p.log_pass(1, 8, false);
        p.removed(1);
        p.inserted(1, 8);
        assert!(p.in_main(1), "the ghost did not remember it");
        // Used twice while small: joins the main queue with its count, then
        // each pass spends one.
        assert_eq!(p.keep_in_log(0), Some(true));
        p.log_pass(0, 7, true);
        assert!(p.in_main(0) && p.freq(0) == 2);
        p.moved(0, 5, 7);
        for left in [1, 0] {
            assert_eq!(p.keep_in_log(5), Some(true));
            p.log_pass(5, 7, true);
            assert_eq!(p.freq(5), left);
        }
        assert_eq!(p.keep_in_log(5), Some(false));
    }

    #[test]
    fn a_ghost_hit_enters_the_main_queue() {
        let mut p = S3Fifo::new(20);
        for s in 0..20 {
            p.inserted(s, s as u64);
        }
        let v = p.select(1, 100, &mut |_| Verdict::Take);
        assert_eq!(v, vec![0]);
        p.evicted(0, 0);
        p.inserted(0, 0);
        assert!(p.in_main(0));
        p.inserted(5, 999);
        assert!(!p.in_main(5));
    }
}
