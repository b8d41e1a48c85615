//! Shares at eviction (policy/share.rs says what they are): which
//! volumes' blocks an eviction passes over, and when a volume's new block
//! must replace one of its own.

use super::map::Table;
use crate::engine::policy::share::VolumeShare;

/// Each volume's cached blocks and floor, as one eviction sees them: a
/// volume holding no more than its floor keeps its blocks (they rotate, a
/// second chance, as dirty ones do) while some other volume holds more
/// than its own. Floors may add up to the whole cache: once no volume is
/// above its floor, none is kept, or a full cache would have nothing to
/// evict. Taken only when some volume has a floor, so a cache without
/// shares pays nothing per candidate.
pub(crate) struct Floors {
    /// (cached blocks, floor) by volume.
    per: Vec<(u64, u64)>,
    /// Volumes above their floor.
    above: usize,
}

impl Floors {
    /// The floors of `shares` (by volume) in `table`; `None` if no volume
    /// has one.
    pub(crate) fn of<'a>(
        table: &Table,
        shares: impl Iterator<Item = &'a VolumeShare>,
    ) -> Option<Floors> {
        let slots = table.slot_count();
        let per: Vec<(u64, u64)> = shares
            .enumerate()
            .map(|(v, s)| (table.regions.held(v), s.floor_blocks(slots)))
            .collect();
        let above = per.iter().filter(|&&(held, floor)| held > floor).count();
        (per.len() > 1 && per.iter().any(|&(_, f)| f > 0)).then_some(Floors { per, above })
    }

    /// True if volume `v` is at or below its floor while another is above
    /// its own: pass its block over.
    pub(crate) fn keeps(&self, v: usize) -> bool {
        self.above > 0 && self.per.get(v).is_some_and(|&(held, floor)| held <= floor)
    }

    /// One of volume `v`'s blocks was taken.
    pub(crate) fn took(&mut self, v: usize) {
        if let Some(p) = self.per.get_mut(v) {
            if p.0 == p.1 + 1 {
                self.above -= 1;
            }
            p.0 = p.0.saturating_sub(1);
        }
    }
}

/// True if `n` more blocks would take volume `v` (of `volumes`) past its
/// maximum share in `table`: its new blocks must replace its own.
pub(crate) fn over_max(
    table: &Table,
    volumes: usize,
    v: usize,
    share: &VolumeShare,
    n: u64,
) -> bool {
    volumes > 1 && table.regions.held(v) + n > share.max_blocks(table.slot_count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::format::Record;
    use crate::engine::origin::address::KeySpace;
    use crate::engine::policy::share::Share;

    #[test]
    fn a_volume_at_its_floor_keeps_its_blocks_and_one_at_its_maximum_replaces_its_own() {
        let keys = KeySpace::new(4096, vec![100, 100]);
        let mut t = Table::new(10, keys.clone(), 8);
        for slot in 0..6u32 {
            let block = keys.base_key((slot % 2) as usize) + u64::from(slot);
            t.apply(&Record::Map {
                slot,
                block,
                dirty: false,
            });
        }
        let shares = [VolumeShare::default(), VolumeShare::default()];
        assert!(Floors::of(&t, shares.iter()).is_none(), "no floor: no cost");
        shares[0].set(Share {
            min_permille: 300,
            max_permille: 500,
        });
        let mut f = Floors::of(&t, shares.iter()).unwrap();
        // Volume 0 holds 3 of 10 slots, its floor: kept; volume 1 is not.
        assert!(f.keeps(0) && !f.keeps(1));
        shares[0].set(Share {
            min_permille: 200,
            max_permille: 500,
        });
        let mut f2 = Floors::of(&t, shares.iter()).unwrap();
        assert!(!f2.keeps(0), "above its floor: not kept");
        f2.took(0);
        assert!(f2.keeps(0), "one taken brings it to its floor");
        // Floors that add up to the whole: once none is above, none is
        // kept.
        shares[1].set(Share {
            min_permille: 300,
            max_permille: 0,
        });
        let mut f3 = Floors::of(&t, shares.iter()).unwrap();
        assert!(!f3.keeps(0) && f3.keeps(1));
        f3.took(0);
        assert!(!f3.keeps(0) && !f3.keeps(1), "every volume at its floor");
        f.took(1);
        assert!(!f.keeps(1));
        // Its maximum is 5 of 10: 2 more fit, 3 do not.
        assert!(!over_max(&t, 2, 0, &shares[0], 2));
        assert!(over_max(&t, 2, 0, &shares[0], 3));
        assert!(
            !over_max(&t, 1, 0, &shares[0], 3),
            "a lone volume shares with nobody"
        );
    }
}
