//! Per-block locks: operations on the same cache block are serialised;
//! operations on different blocks never wait on each other (a shard's
//! condition variable may wake a waiter spuriously, which then re-checks).
//! The block locks a thread holds have the outermost engine rank,
//! `Rank::Blocks` (crate::sync): taken before any other engine lock, in
//! ascending block order.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::OnceLock;
use std::thread::ThreadId;

use crate::sync::{self, Condvar, Mutex, Rank};

const SHARDS: usize = 64;

thread_local! {
    /// This thread's id, looked up once (`thread::current` clones a handle).
    static ME: ThreadId = std::thread::current().id();
}

fn me() -> ThreadId {
    ME.with(|id| *id)
}

/// Per shard, the locked blocks and the thread holding each.
type Shard = (Mutex<HashMap<u64, ThreadId, BlockHash>>, Condvar);

/// Hashes the block numbers of a shard's map: SplitMix64's finaliser of
/// the block XORed with a key drawn once a process (from std's random
/// hasher keys). std's SipHash cost more than the rest of a lock and its
/// unlock together, on every block of every request. A client chooses the
/// blocks it locks but cannot learn the key, and a map holds only the
/// blocks of requests in flight, which the front ends bound.
#[derive(Clone, Copy)]
struct BlockHash(u64);

impl BlockHash {
    fn new() -> BlockHash {
        static KEY: OnceLock<u64> = OnceLock::new();
        BlockHash(*KEY.get_or_init(|| RandomState::new().hash_one(0x5eed_u64)))
    }
}

impl BuildHasher for BlockHash {
    type Hasher = BlockHasher;
    fn build_hasher(&self) -> BlockHasher {
        BlockHasher(self.0)
    }
}

struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn write_u64(&mut self, v: u64) {
        let mut h = self.0 ^ v;
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = h ^ (h >> 31);
    }

    /// Only `u64` keys are hashed; bytes go through `write_u64` in words.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub struct BlockLocks {
    shards: Vec<Shard>,
}

impl Default for BlockLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl BlockLocks {
    pub fn new() -> Self {
        BlockLocks {
            shards: (0..SHARDS)
                .map(|_| {
                    let map = HashMap::with_hasher(BlockHash::new());
                    (Mutex::new(Rank::BlockShard, map), Condvar::new())
                })
                .collect(),
        }
    }

    fn shard(&self, block: u64) -> &Shard {
        &self.shards[(block.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS]
    }

    pub fn lock(&self, block: u64) {
        sync::acquired(Rank::Blocks, false);
        let (m, cv) = self.shard(block);
        let mut held = m.lock();
        #[cfg(feature = "lockstat")]
        if held.contains_key(&block) {
            let t = std::time::Instant::now();
            while held.contains_key(&block) {
                cv.wait(&mut held);
            }
            crate::lockstat::waited(Rank::Blocks, t);
        }
        while held.contains_key(&block) {
            cv.wait(&mut held);
        }
        held.insert(block, me());
        #[cfg(feature = "lockstat")]
        crate::lockstat::taken(Rank::Blocks);
    }

    pub fn try_lock(&self, block: u64) -> bool {
        let (m, _) = self.shard(block);
        let taken = match m.lock().entry(block) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(me());
                true
            }
        };
        if taken {
            sync::acquired(Rank::Blocks, true);
            #[cfg(feature = "lockstat")]
            crate::lockstat::taken(Rank::Blocks);
        }
        taken
    }

    pub fn unlock(&self, block: u64) {
        self.remove(block);
        sync::released(Rank::Blocks);
    }

    /// Lets `block` go, waking its waiters.
    fn remove(&self, block: u64) {
        let (m, cv) = self.shard(block);
        let removed = m.lock().remove(&block).is_some();
        assert!(removed, "unlock of block {block} that is not locked");
        cv.notify_all();
    }

    /// Unlocks blocks `first..=last` that `BlockRangeGuard::hand_off`
    /// handed to a request going on elsewhere, on any thread.
    pub fn unlock_handed(&self, first: u64, last: u64) {
        for b in first..=last {
            self.remove(b);
        }
    }

    /// Unlocks blocks `first..=last` (a range `BlockRangeGuard::keep` kept).
    pub fn unlock_range(&self, first: u64, last: u64) {
        for b in first..=last {
            self.unlock(b);
        }
    }

    /// True if this thread holds `block`'s lock.
    pub fn held_here(&self, block: u64) -> bool {
        let (m, _) = self.shard(block);
        m.lock().get(&block) == Some(&me())
    }

    /// Locks blocks `first..=last` if none is held, without waiting.
    pub fn try_lock_range(&self, first: u64, last: u64) -> Option<BlockRangeGuard<'_>> {
        for b in first..=last {
            if !self.try_lock(b) {
                for held in first..b {
                    self.unlock(held);
                }
                return None;
            }
        }
        Some(BlockRangeGuard {
            locks: self,
            first,
            last,
        })
    }

    /// Locks blocks `first..=last` in ascending order (so two range locks
    /// never deadlock) and returns a guard that unlocks them.
    pub fn lock_range(&self, first: u64, last: u64) -> BlockRangeGuard<'_> {
        for b in first..=last {
            self.lock(b);
        }
        BlockRangeGuard {
            locks: self,
            first,
            last,
        }
    }
}

pub struct BlockRangeGuard<'a> {
    locks: &'a BlockLocks,
    first: u64,
    last: u64,
}

impl BlockRangeGuard<'_> {
    /// Keeps the blocks locked past the guard, for a request that goes on
    /// after this call returns (engine/io/direct.rs); `unlock_range` lets
    /// them go, on the same thread.
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl BlockRangeGuard<'_> {
    /// Keeps the blocks locked for a request that ends on another thread
    /// (an origin's completion: engine/io/submitted.rs): this thread no
    /// longer counts them as held; `unlock_handed` lets them go.
    pub fn hand_off(self) {
        for _ in self.first..=self.last {
            sync::released(Rank::Blocks);
        }
        std::mem::forget(self);
    }
}

impl Drop for BlockRangeGuard<'_> {
    fn drop(&mut self) {
        self.locks.unlock_range(self.first, self.last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_knows_its_holder() {
        let l = Arc::new(BlockLocks::new());
        let _g = l.lock_range(3, 4);
        assert!(l.held_here(3) && l.held_here(4) && !l.held_here(5));
        let l2 = l.clone();
        let other = std::thread::spawn(move || l2.held_here(3)).join().unwrap();
        assert!(!other, "another thread does not hold it");
    }

    #[test]
    fn exclusion() {
        let l = Arc::new(BlockLocks::new());
        let g = l.lock_range(5, 9);
        assert!(!l.try_lock(7));
        assert!(l.try_lock(10));
        l.unlock(10);
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let _g = l2.lock_range(9, 12);
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!t.is_finished());
        drop(g);
        t.join().unwrap();
    }
}
