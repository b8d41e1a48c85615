//! Replacement policies: which clean cache block to evict. One file per
//! policy; all share the intrusive slot list below (8 bytes per slot).

pub mod fifo;
pub mod lru;

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
}

impl PolicyKind {
    pub fn parse(s: &str) -> Option<PolicyKind> {
        match s {
            "lru" => Some(PolicyKind::Lru),
            "fifo" => Some(PolicyKind::Fifo),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
        }
    }
    pub fn to_u32(self) -> u32 {
        match self {
            PolicyKind::Lru => 0,
            PolicyKind::Fifo => 1,
        }
    }
    pub fn from_u32(v: u32) -> Option<PolicyKind> {
        match v {
            0 => Some(PolicyKind::Lru),
            1 => Some(PolicyKind::Fifo),
            _ => None,
        }
    }
    pub fn build(self, slot_count: u32) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(lru::Lru::new(slot_count)),
            PolicyKind::Fifo => Box::new(fifo::Fifo::new(slot_count)),
        }
    }
}

/// A replacement policy over cache slots. Called with the engine's metadata
/// lock held, so every method must be O(1) or bounded by its arguments.
/// Every policy keeps its slots in a `SlotList`, cold end first; a policy
/// says how accesses reorder it.
pub trait Policy: Send {
    /// The policy's slot list.
    fn list(&mut self) -> &mut SlotList;
    /// A cached block was read or written.
    fn accessed(&mut self, slot: u32);
    fn kind(&self) -> PolicyKind;

    /// A slot now holds a block: it joins at the hot end.
    fn inserted(&mut self, slot: u32) {
        let list = self.list();
        list.unlink(slot);
        list.push_hot(slot);
    }
    /// A slot no longer holds a block.
    fn removed(&mut self, slot: u32) {
        self.list().unlink(slot);
    }
    /// Up to `want` victims, coldest first, examining at most `scan_max`
    /// candidates; `verdict` decides for each.
    fn select(
        &mut self,
        want: usize,
        scan_max: usize,
        verdict: &mut dyn FnMut(u32) -> Verdict,
    ) -> Vec<u32> {
        self.list().select(want, scan_max, verdict)
    }
}

const NIL: u32 = u32::MAX;

/// A doubly linked list of slots threaded through two arrays: cold end at
/// `head`, hot end at `tail`.
pub struct SlotList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
}

impl SlotList {
    pub fn heap_bytes(&self) -> u64 {
        ((self.prev.capacity() + self.next.capacity()) * 4) as u64
    }

    pub(crate) fn new(slot_count: u32) -> Self {
        SlotList {
            prev: vec![NIL; slot_count as usize],
            next: vec![NIL; slot_count as usize],
            head: NIL,
            tail: NIL,
        }
    }

    fn linked(&self, slot: u32) -> bool {
        self.prev[slot as usize] != NIL || self.head == slot
    }

    pub(crate) fn push_hot(&mut self, slot: u32) {
        debug_assert!(!self.linked(slot));
        self.prev[slot as usize] = self.tail;
        self.next[slot as usize] = NIL;
        if self.tail != NIL {
            self.next[self.tail as usize] = slot;
        } else {
            self.head = slot;
        }
        self.tail = slot;
    }

    pub(crate) fn unlink(&mut self, slot: u32) {
        if !self.linked(slot) {
            return;
        }
        let (p, n) = (self.prev[slot as usize], self.next[slot as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.prev[slot as usize] = NIL;
        self.next[slot as usize] = NIL;
    }

    pub(crate) fn move_hot(&mut self, slot: u32) {
        if self.tail == slot {
            return;
        }
        self.unlink(slot);
        self.push_hot(slot);
    }

    pub(crate) fn select(
        &mut self,
        want: usize,
        scan_max: usize,
        verdict: &mut dyn FnMut(u32) -> Verdict,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = self.head;
        let mut scanned = 0;
        let mut rotated = Vec::new();
        while cur != NIL && out.len() < want && scanned < scan_max {
            let next = self.next[cur as usize];
            match verdict(cur) {
                Verdict::Take => {
                    self.unlink(cur);
                    out.push(cur);
                }
                Verdict::Skip => {}
                Verdict::Rotate => rotated.push(cur),
            }
            scanned += 1;
            cur = next;
        }
        for s in rotated {
            self.move_hot(s);
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
            p.inserted(s);
        }
        p.removed(3);
        let v = p.select(2, 100, &mut |s| {
            if s == 0 {
                Verdict::Rotate
            } else {
                Verdict::Take
            }
        });
        assert_eq!(v, vec![1, 2]);
        let v = p.select(10, 100, &mut |_| Verdict::Take);
        assert!(!v.contains(&3) && !v.contains(&1));
        assert_eq!(v.len(), 5); // 4,5,6,7,0
        assert!(p.select(1, 100, &mut |_| Verdict::Take).is_empty());
    }
}
