//! Least recently used: every access moves a slot to the hot end.

use super::{Policy, PolicyKind, SlotList};

pub struct Lru {
    list: SlotList,
}

impl Lru {
    pub fn new(slot_count: u32) -> Self {
        Lru {
            list: SlotList::new(slot_count),
        }
    }
}

impl Policy for Lru {
    fn list(&mut self) -> &mut SlotList {
        &mut self.list
    }
    fn accessed(&mut self, slot: u32) {
        self.list.move_hot(slot);
    }
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }
}

#[cfg(test)]
mod tests {
    use super::super::Verdict;
    use super::*;

    #[test]
    fn basics() {
        super::super::tests::policy_basics(Box::new(Lru::new(8)));
    }

    #[test]
    fn access_protects() {
        let mut p = Lru::new(4);
        for s in 0..4 {
            p.inserted(s);
        }
        p.accessed(0);
        assert_eq!(p.select(1, 10, &mut |_| Verdict::Take), vec![1]);
    }
}
