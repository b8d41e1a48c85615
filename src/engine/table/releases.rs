//! Releases: mappings removed in memory (an `unmap`, or a `map` that
//! supersedes another slot) whose records are not yet durable.
//!
//! Two rules hang on them (docs/format.md, "Commit protocol"):
//! - a slot freed by a release is written again only once the release is
//!   durable: until the commit that carries it completes it waits here,
//!   not in the free slots;
//! - an origin write to a block released since the last commit commits
//!   first: otherwise a crash could revive the old clean copy over origin
//!   bytes that have changed since.
//!
//! Releases are numbered in the order they are appended; a commit that
//! swaps out the records up to release n makes releases up to n durable
//! (`CommitState::releases_durable`). Held under the metadata lock.

use std::collections::HashMap;
use std::ops::RangeInclusive;

#[derive(Default)]
pub(crate) struct Releases {
    /// Slots freed by releases not yet durable.
    slots: Vec<u32>,
    /// Releases appended since open: the number of the latest.
    appended: u64,
    /// Per released block, the number of its latest release. Entries a
    /// completed commit made durable are dropped then.
    blocks: HashMap<u64, u64>,
}

/// What a commit takes: the slots it will free, and the number of the last
/// release it covers.
pub(crate) struct Batch {
    pub slots: Vec<u32>,
    pub through: u64,
}

impl Releases {
    /// A record freed `slot` (it becomes reusable once the record is durable).
    pub fn free_slot(&mut self, slot: u32) {
        self.slots.push(slot);
    }

    /// A record removed `block`'s mapping.
    pub fn release_block(&mut self, block: u64) {
        self.appended += 1;
        self.blocks.insert(block, self.appended);
    }

    /// Slots waiting for a commit.
    pub fn waiting_slots(&self) -> usize {
        self.slots.len()
    }

    /// Taken when a commit swaps out the buffered records.
    pub fn take(&mut self) -> Batch {
        Batch {
            slots: std::mem::take(&mut self.slots),
            through: self.appended,
        }
    }

    /// The commit of `batch` failed: its slots wait for the next one.
    pub fn restore(&mut self, batch: Batch) {
        self.slots.extend(batch.slots);
    }

    /// The commit of releases up to `through` completed: forgets blocks
    /// whose latest release it covered.
    pub fn forget_durable(&mut self, through: u64) {
        self.blocks.retain(|_, n| *n > through);
        if self.blocks.capacity() > 4096 && self.blocks.len() < self.blocks.capacity() / 4 {
            self.blocks.shrink_to_fit();
        }
    }

    /// True if a block in `blocks` was released after release `durable`.
    pub fn pending_in(&self, blocks: RangeInclusive<u64>, durable: u64) -> bool {
        if self.blocks.len() as u64 <= blocks.end() - blocks.start() {
            self.blocks
                .iter()
                .any(|(b, &n)| n > durable && blocks.contains(b))
        } else {
            blocks
                .into_iter()
                .any(|b| self.blocks.get(&b).is_some_and(|&n| n > durable))
        }
    }

    pub fn heap_bytes(&self) -> u64 {
        (self.slots.capacity() * 4 + self.blocks.capacity() * 17) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_pending_until_a_commit_covers_it() {
        let mut r = Releases::default();
        r.release_block(10);
        r.free_slot(3);
        let batch = r.take();
        assert_eq!(batch.slots, vec![3]);
        r.release_block(20);
        // The commit covering release 1 completed; release 2 came later.
        r.forget_durable(batch.through);
        assert!(!r.pending_in(5..=15, batch.through));
        assert!(r.pending_in(15..=25, batch.through));
        // Both search directions (few releases, or a short range).
        assert!(r.pending_in(20..=20, batch.through));
        assert!(!r.pending_in(0..=1_000_000, 2));
    }

    #[test]
    fn a_failed_commit_gives_its_slots_back() {
        let mut r = Releases::default();
        r.free_slot(1);
        r.free_slot(2);
        let batch = r.take();
        assert_eq!(r.waiting_slots(), 0);
        r.restore(batch);
        assert_eq!(r.waiting_slots(), 2);
    }
}
