//! The curve split of the cache between the volumes (`Sharing::Curve`,
//! policy/share.rs): from each volume's miss-ratio curve (`observe/`),
//! the floors that miss the fewest reads, recomputed by the background.

use std::sync::atomic::Ordering;

use super::Origins;
use crate::engine::observe::Observe;
use crate::engine::policy::share::{split, Sharing, REBALANCE_SECS, SPLIT_UNITS, WHOLE};

impl Origins {
    /// Under `Sharing::Curve`, every `REBALANCE_SECS` of engine time
    /// (`now_s`), sets each volume's curve floor from the curves `observe`
    /// keeps, in a cache of `slots`. Returns true if it split the cache.
    pub(crate) fn rebalance_if_due(&self, observe: &Observe, slots: u64, now_s: u64) -> bool {
        if self.sharing() != Sharing::Curve || self.len() < 2 {
            return false;
        }
        let last = self.rebalanced_s.load(Ordering::Relaxed);
        if last != 0 && now_s < last + REBALANCE_SECS {
            return false;
        }
        self.rebalanced_s.store(now_s.max(1), Ordering::Relaxed);
        self.rebalance(observe, slots)
    }

    /// Sets the curve floors now (false if the curves or the minimums
    /// leave no split: each volume keeps what it had).
    pub(crate) fn rebalance(&self, observe: &Observe, slots: u64) -> bool {
        let sizes: Vec<u64> = (0..=SPLIT_UNITS as u64)
            .map(|k| slots * k / SPLIT_UNITS as u64)
            .collect();
        let mut misses = Vec::with_capacity(self.len());
        let mut bounds = Vec::with_capacity(self.len());
        for (v, o) in self.iter().enumerate() {
            let Some((reads, hits)) = observe.volume_curve(v, &sizes) else {
                return false;
            };
            misses.push(hits.iter().map(|h| reads as f64 * (1.0 - h)).collect());
            let s = o.share().get();
            let parts = |permille: u16| usize::from(permille) * SPLIT_UNITS / usize::from(WHOLE);
            let hi = match s.max_permille {
                0 => SPLIT_UNITS,
                m => parts(m),
            };
            let lo = (usize::from(s.min_permille) * SPLIT_UNITS).div_ceil(usize::from(WHOLE));
            bounds.push((lo.min(hi), hi));
        }
        let Some(parts) = split(&misses, &bounds) else {
            return false;
        };
        for (o, k) in self.iter().zip(parts) {
            o.share().set_curve_blocks(sizes[k]);
        }
        true
    }

    /// The volumes share the cache as `sharing` from now on; leaving the
    /// curve split drops its floors.
    pub(crate) fn share_as(&self, sharing: Sharing, observe: &Observe, slots: u64) {
        self.set_sharing(sharing);
        match sharing {
            Sharing::Curve => {
                self.rebalance(observe, slots);
            }
            Sharing::Global => self.iter().for_each(|o| o.share().set_curve_blocks(0)),
        }
    }
}
