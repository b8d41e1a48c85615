//! First in, first out: eviction in insertion order; accesses change nothing.

use super::{Policy, PolicyKind, SlotList};

pub struct Fifo {
    list: SlotList,
}

impl Fifo {
    pub fn new(slot_count: u32) -> Self {
        Fifo {
            list: SlotList::new(slot_count),
        }
    }
}

impl Policy for Fifo {
    fn list(&mut self) -> &mut SlotList {
        &mut self.list
    }
    fn accessed(&mut self, _slot: u32) {}
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fifo
    }
}

#[cfg(test)]
mod tests {
    use super::super::Verdict;
    use super::*;

    #[test]
    fn basics() {
        super::super::tests::policy_basics(Box::new(Fifo::new(8)));
    }

    #[test]
    fn access_does_not_protect() {
        let mut p = Fifo::new(4);
        for s in 0..4 {
            p.inserted(s);
        }
        p.accessed(0);
        assert_eq!(p.select(1, 10, &mut |_| Verdict::Take), vec![0]);
    }
}
