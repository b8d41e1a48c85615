//! Replacement policies: which clean cache block to evict. One file per
//! policy; all keep their slots in lists threaded through one shared pair
//! of link arrays (`Links`, 8 bytes per slot).
//!
//! A policy sees every insertion (with the block number, so it can keep a
//! history of evicted blocks), every access of a cached block, every
//! eviction, and the removal of a slot for any other reason (a block
//! superseded by a newer slot, trimmed, or dropped after an error).

pub mod fifo;
pub mod ghost;
pub mod lru;
pub mod s3fifo;
pub mod share;

/// The policy's verdict on a candidate victim, given by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Evict it.
    Take,
    /// Not now (in use); leave it where it is.
    Skip,
    /// Not evictable (dirty); move it out of the way to the hot end.
    Rotate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    Lru,
    Fifo,
    S3Fifo,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [PolicyKind::S3Fifo, PolicyKind::Lru, PolicyKind::Fifo];

    pub fn parse(s: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|p| p.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
            PolicyKind::S3Fifo => "s3fifo",
        }
    }
    pub fn to_u32(self) -> u32 {
        match self {
            PolicyKind::Lru => 0,
            PolicyKind::Fifo => 1,
            PolicyKind::S3Fifo => 2,
        }
    }
    pub fn from_u32(v: u32) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|p| p.to_u32() == v)
    }
    pub fn build(self, slot_count: u32) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(lru::Lru::new(slot_count)),
            PolicyKind::Fifo => Box::new(fifo::Fifo::new(slot_count)),
            PolicyKind::S3Fifo => Box::new(s3fifo::S3Fifo::new(slot_count)),
        }
    }
}

impl Default for PolicyKind {
    /// S3-FIFO: scan resistant, and the fewest misses in the trace
    /// simulations of docs/benchmarks.md.
    fn default() -> Self {
        PolicyKind::S3Fifo
    }
}

/// A replacement policy over cache slots. Called with the engine's metadata
/// lock held, so every method must be O(1) or bounded by its arguments.
pub trait Policy: Send {
    fn kind(&self) -> PolicyKind;
    /// A slot now holds `block`.
    fn inserted(&mut self, slot: u32, block: u64);
    /// A cached block was read or written.
    fn accessed(&mut self, slot: u32);
    /// A slot no longer holds a block (any reason but eviction, or after
    /// `evicted`): forget it.
    fn removed(&mut self, slot: u32);
    /// The engine evicted `block` from `slot`, a victim of `select`.
    fn evicted(&mut self, _slot: u32, _block: u64) {}
    /// `block` moved from slot `old` to slot `new` (a write stored it anew):
    /// the same block, accessed now. By default: gone from `old`, inserted
    /// at `new`.
    fn moved(&mut self, old: u32, new: u32, block: u64) {
        self.removed(old);
        self.inserted(new, block);
    }
    /// The log placement's cleaner frees segments in log order, not the
    /// policy's: whether the clean block in `slot` of a segment being freed
    /// is worth keeping (copied to the cursor) rather than evicted. `None`:
    /// no opinion, the cleaner keeps blocks used since they were stored
    /// (a second chance, as CLOCK). A pure query: `log_pass` applies it.
    fn keep_in_log(&self, _slot: u32) -> Option<bool> {
        None
    }
    /// The cleaner kept (`keep`) or is evicting the block in `slot`: the
    /// policy's state moves as its own eviction pass would move it.
    fn log_pass(&mut self, _slot: u32, _block: u64, _keep: bool) {}
    /// Up to `want` victims, examining at most `scan_max` candidates;
    /// `verdict` decides for each. Victims are out of the policy's lists.
    fn select(
        &mut self,
        want: usize,
        scan_max: usize,
        verdict: &mut dyn FnMut(u32) -> Verdict,
    ) -> Vec<u32>;
    /// The cache device grew to `slot_count` slots: the new ones hold
    /// nothing yet. The order of the slots held stays as it is.
    fn grow(&mut self, slot_count: u32);
    /// Every slot the policy holds, coldest first (to rebuild another
    /// policy in the same order).
    fn order(&self) -> Vec<u32>;
    /// Heap bytes held.
    fn heap_bytes(&self) -> u64;
}

const NIL: u32 = u32::MAX;

/// The link arrays every list of a policy threads through: a slot is in at
/// most one list at a time.
pub struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
}

/// One list over `Links`: cold end at `head`, hot end at `tail`.
#[derive(Clone, Copy)]
pub struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl List {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn head(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }
}

impl Links {
    pub fn new(slot_count: u32) -> Links {
        Links {
            prev: vec![NIL; slot_count as usize],
            next: vec![NIL; slot_count as usize],
        }
    }

    pub fn heap_bytes(&self) -> u64 {
        ((self.prev.capacity() + self.next.capacity()) * 4) as u64
    }

    /// Links for `slot_count` slots, the new ones in no list.
    pub fn grow(&mut self, slot_count: u32) {
        self.prev.resize(slot_count as usize, NIL);
        self.next.resize(slot_count as usize, NIL);
    }

    /// True if `slot` is in `list` (given that it is in some list or none,
    /// and the caller knows which).
    fn first_or_linked(&self, list: &List, slot: u32) -> bool {
        self.prev[slot as usize] != NIL || list.head == slot
    }

    pub fn push_hot(&mut self, list: &mut List, slot: u32) {
        debug_assert!(!self.first_or_linked(list, slot));
        self.prev[slot as usize] = list.tail;
        self.next[slot as usize] = NIL;
        if list.tail != NIL {
            self.next[list.tail as usize] = slot;
        } else {
            list.head = slot;
        }
        list.tail = slot;
        list.len += 1;
    }

    /// Unlinks `slot` from `list`, if it is there.
    pub fn unlink(&mut self, list: &mut List, slot: u32) -> bool {
        if !self.first_or_linked(list, slot) {
            return false;
        }
        let (p, n) = (self.prev[slot as usize], self.next[slot as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            list.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            list.tail = p;
        }
        self.prev[slot as usize] = NIL;
        self.next[slot as usize] = NIL;
        list.len -= 1;
        true
    }

    pub fn move_hot(&mut self, list: &mut List, slot: u32) {
        if list.tail == slot {
            return;
        }
        self.unlink(list, slot);
        self.push_hot(list, slot);
    }

    pub fn next_of(&self, slot: u32) -> Option<u32> {
        let n = self.next[slot as usize];
        (n != NIL).then_some(n)
    }

    /// The slots of `list`, coldest first.
    pub fn iter<'a>(&'a self, list: &List) -> impl Iterator<Item = u32> + 'a {
        let mut cur = list.head;
        std::iter::from_fn(move || {
            let s = (cur != NIL).then_some(cur)?;
            cur = self.next[s as usize];
            Some(s)
        })
    }

    /// Up to `want` victims from the cold end of `list`: the common select
    /// of LRU and FIFO (rotated slots go to the hot end).
    pub fn select(
        &mut self,
        list: &mut List,
        want: usize,
        scan_max: usize,
        verdict: &mut dyn FnMut(u32) -> Verdict,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = list.head;
        let mut scanned = 0;
        let mut rotated = Vec::new();
        while cur != NIL && out.len() < want && scanned < scan_max {
            let next = self.next[cur as usize];
            match verdict(cur) {
                Verdict::Take => {
                    self.unlink(list, cur);
                    out.push(cur);
                }
                Verdict::Skip => {}
                Verdict::Rotate => rotated.push(cur),
            }
            scanned += 1;
            cur = next;
        }
        for s in rotated {
            self.move_hot(list, s);
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Shared checks every policy must pass.
    pub(crate) fn policy_basics(mut p: Box<dyn Policy>) {
        for s in 0..8 {
            p.inserted(s, 100 + s as u64);
        }
        p.removed(3);
        let v = p.select(2, 100, &mut |s| {
            if s == 0 {
                Verdict::Rotate
            } else {
                Verdict::Take
            }
        });
        assert_eq!(v.len(), 2);
        assert!(!v.contains(&0) && !v.contains(&3), "{v:?}");
        for &s in &v {
            p.evicted(s, 100 + s as u64);
        }
        let rest = p.select(10, 100, &mut |_| Verdict::Take);
        assert_eq!(rest.len(), 5, "{rest:?}");
        assert!(!rest.contains(&3) && v.iter().all(|s| !rest.contains(s)));
        assert!(p.select(1, 100, &mut |_| Verdict::Take).is_empty());
        assert!(p.order().is_empty());
        // Skipped slots stay; a scan bound is honoured.
        for s in 0..8 {
            p.inserted(s, 200 + s as u64);
        }
        assert!(p.select(3, 100, &mut |_| Verdict::Skip).is_empty());
        assert_eq!(p.select(8, 2, &mut |_| Verdict::Take).len(), 2);
        assert_eq!(p.order().len(), 6);
    }
}
