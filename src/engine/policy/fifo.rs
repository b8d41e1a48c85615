//! First in, first out: eviction in insertion order; accesses change nothing.

use super::{Links, List, Policy, PolicyKind, Verdict};

pub struct Fifo {
    links: Links,
    list: List,
}

impl Fifo {
    pub fn new(slot_count: u32) -> Self {
        Fifo {
            links: Links::new(slot_count),
            list: List::default(),
        }
    }
}

impl Policy for Fifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fifo
    }
    fn inserted(&mut self, slot: u32, _block: u64) {
        self.links.unlink(&mut self.list, slot);
        self.links.push_hot(&mut self.list, slot);
    }
    fn grow(&mut self, slot_count: u32) {
        self.links.grow(slot_count);
    }
    fn accessed(&mut self, _slot: u32) {}
    fn removed(&mut self, slot: u32) {
        self.links.unlink(&mut self.list, slot);
    }
    fn select(
        &mut self,
        want: usize,
        scan_max: usize,
        verdict: &mut dyn FnMut(u32) -> Verdict,
    ) -> Vec<u32> {
        self.links.select(&mut self.list, want, scan_max, verdict)
    }
    fn order(&self) -> Vec<u32> {
        self.links.iter(&self.list).collect()
    }
    fn heap_bytes(&self) -> u64 {
        self.links.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        super::super::tests::policy_basics(Box::new(Fifo::new(8)));
    }

    #[test]
    fn access_does_not_protect() {
        let mut p = Fifo::new(4);
        for s in 0..4 {
            p.inserted(s, s as u64);
        }
        p.accessed(0);
        assert_eq!(p.select(1, 10, &mut |_| Verdict::Take), vec![0]);
    }
}
