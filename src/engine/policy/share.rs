//! How the volumes of one cache share its slots (docs/engine.md,
//! "Sharing").
//!
//! By default one replacement policy ranks every volume's blocks: the
//! coldest block goes, wherever it lives (`Sharing::Global`). A volume may
//! also have a guaranteed minimum share, below which its blocks are passed
//! over by eviction (a second chance, as a dirty block gets), and a
//! maximum, at which a new block of its own replaces one of its own
//! (`table/slots.rs`).
//!
//! `Sharing::Curve` sets each volume's floor from the volumes' miss-ratio
//! curves (`observe/`): the split of the cache that the curves say misses
//! the fewest reads (Tencent's OSCA, ATC'20, does this for its cloud block
//! storage cache), recomputed by the background every `REBALANCE_SECS`.
//! A volume's own minimum and maximum bound its part of the split.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Thousandths: the unit of shares.
pub const WHOLE: u16 = 1000;
/// Seconds between two splits of the cache by the curves.
pub const REBALANCE_SECS: u64 = 10;
/// The curve split cuts the cache into this many equal parts.
pub const SPLIT_UNITS: usize = 64;
/// A curve floor's headroom: one part in this many more (`split`).
const HEADROOM: usize = 8;

/// A volume's share setting, in thousandths of the cache's slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// Guaranteed: eviction passes its blocks over while it holds no more
    /// (0: no guarantee).
    pub min_permille: u16,
    /// The most it may hold (0: no limit).
    pub max_permille: u16,
}

impl Share {
    /// `Err` says what is wrong with it.
    pub fn valid(&self) -> Result<(), String> {
        if self.min_permille > WHOLE || self.max_permille > WHOLE {
            return Err(format!(
                "a share is 0 to 100% of the cache (min {}%, max {}%)",
                pct(self.min_permille),
                pct(self.max_permille)
            ));
        }
        if self.max_permille != 0 && self.min_permille > self.max_permille {
            return Err(format!(
                "a minimum share of {}% above the maximum of {}%",
                pct(self.min_permille),
                pct(self.max_permille)
            ));
        }
        Ok(())
    }

    /// The guaranteed blocks of a cache of `slots`.
    pub fn min_blocks(&self, slots: u64) -> u64 {
        slots * u64::from(self.min_permille) / u64::from(WHOLE)
    }

    /// The most blocks it may hold in a cache of `slots`.
    pub fn max_blocks(&self, slots: u64) -> u64 {
        match self.max_permille {
            0 => slots,
            m => (slots * u64::from(m) / u64::from(WHOLE)).max(1),
        }
    }
}

/// Thousandths as a percentage, for messages.
pub fn pct(permille: u16) -> f64 {
    f64::from(permille) / 10.0
}

/// How the volumes share the cache (the volume table's `sharing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// One ranking of every volume's blocks, bounded by each volume's
    /// minimum and maximum.
    #[default]
    Global,
    /// Each volume's floor set from the miss-ratio curves.
    Curve,
}

impl Sharing {
    pub const ALL: [Sharing; 2] = [Sharing::Global, Sharing::Curve];

    pub fn name(self) -> &'static str {
        match self {
            Sharing::Global => "global",
            Sharing::Curve => "curve",
        }
    }

    pub fn parse(s: &str) -> Option<Sharing> {
        Sharing::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn to_u32(self) -> u32 {
        match self {
            Sharing::Global => 0,
            Sharing::Curve => 1,
        }
    }

    pub fn from_u32(v: u32) -> Option<Sharing> {
        Sharing::ALL.into_iter().find(|k| k.to_u32() == v)
    }
}

/// A change of how the volumes share the cache, as `tiercache set-share`
/// asks for it: the sharing, and the named volume's minimum or maximum
/// (each left as it is when not given).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareChange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_permille: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_permille: Option<u16>,
}

impl ShareChange {
    /// `share` with this change's minimum and maximum where it has them.
    pub fn applied_to(&self, share: Share) -> Share {
        Share {
            min_permille: self.min_permille.unwrap_or(share.min_permille),
            max_permille: self.max_permille.unwrap_or(share.max_permille),
        }
    }
}

/// A volume's share as it runs: its setting and the curve's part of the
/// cache, read by eviction under the metadata lock (relaxed atomics: a
/// share that changes takes effect at the next eviction).
#[derive(Debug, Default)]
pub struct VolumeShare {
    min_permille: AtomicU32,
    max_permille: AtomicU32,
    /// The curve split's blocks for it (0: none).
    curve_blocks: AtomicU64,
}

impl VolumeShare {
    pub fn get(&self) -> Share {
        Share {
            min_permille: self.min_permille.load(Ordering::Relaxed) as u16,
            max_permille: self.max_permille.load(Ordering::Relaxed) as u16,
        }
    }

    pub fn set(&self, s: Share) {
        self.min_permille
            .store(u32::from(s.min_permille), Ordering::Relaxed);
        self.max_permille
            .store(u32::from(s.max_permille), Ordering::Relaxed);
    }

    /// The curve split gave it `blocks` (0: none, as under `Global`).
    pub fn set_curve_blocks(&self, blocks: u64) {
        self.curve_blocks.store(blocks, Ordering::Relaxed);
    }

    pub fn curve_blocks(&self) -> u64 {
        self.curve_blocks.load(Ordering::Relaxed)
    }

    /// Blocks it keeps whatever else is evicted, in a cache of `slots`:
    /// its minimum or its curve part, whichever is larger, never above its
    /// maximum.
    pub fn floor_blocks(&self, slots: u64) -> u64 {
        let s = self.get();
        (s.min_blocks(slots).max(self.curve_blocks())).min(s.max_blocks(slots))
    }

    pub fn max_blocks(&self, slots: u64) -> u64 {
        self.get().max_blocks(slots)
    }
}

/// The split of `SPLIT_UNITS` parts that misses the fewest reads: `misses[v][k]`
/// is volume `v`'s expected misses with `k` parts (k = 0..=SPLIT_UNITS,
/// not increasing in k), `bounds[v]` the fewest and most parts it may
/// have. Exact over the grid (dynamic programming, O(volumes x units^2)):
/// curves are not convex, so a greedy split by marginal gain can stop at a
/// cliff's foot. Returns each volume's parts, the fewest that miss as few
/// (parts that save nothing are left out); `None` if the bounds cannot be
/// met (their minimums exceed the whole).
pub fn split(misses: &[Vec<f64>], bounds: &[(usize, usize)]) -> Option<Vec<usize>> {
    let units = SPLIT_UNITS;
    // best[i][u]: the fewest misses of volumes 0..i with u parts among
    // them; pick[i][u]: volume i-1's parts in it.
    let mut best = vec![vec![f64::INFINITY; units + 1]; misses.len() + 1];
    let mut pick = vec![vec![0usize; units + 1]; misses.len() + 1];
    best[0][0] = 0.0;
    for (i, (curve, &(lo, hi))) in misses.iter().zip(bounds).enumerate() {
        for u in 0..=units {
            for k in lo..=hi.min(u) {
                let prior = best[i][u - k];
                let cost = prior + curve.get(k).copied().unwrap_or(0.0);
                if prior.is_finite() && cost < best[i + 1][u] {
                    best[i + 1][u] = cost;
                    pick[i + 1][u] = k;
                }
            }
        }
    }
    // Every part given out (misses never rise with parts); if the maxima
    // cannot take them all, as many as they can.
    let last = &best[misses.len()];
    let mut u = (0..=units).rev().find(|&u| last[u].is_finite())?;
    let mut out = vec![0; misses.len()];
    for i in (0..misses.len()).rev() {
        out[i] = pick[i + 1][u];
        u -= out[i];
    }
    // Parts that save a volume nothing are not its floor: they stay with
    // the one ranking, so a volume whose reads change finds room before
    // the next split.
    for (k, (curve, &(lo, _))) in out.iter_mut().zip(misses.iter().zip(bounds)) {
        let at = |k: usize| curve.get(k).copied().unwrap_or(0.0);
        while *k > lo && at(*k - 1) <= at(*k) {
            *k -= 1;
        }
    }
    // A sampled curve puts a working set's cliff a few percent early or
    // late (SHARDS samples ~1 block in 10 here): a floor just short of
    // the set would leave the volume thrashing at the edge. Each floor
    // gets up to an eighth more from the parts nobody needs.
    let mut spare = units - out.iter().sum::<usize>();
    for (k, &(_, hi)) in out.iter_mut().zip(bounds) {
        let more = k.div_ceil(HEADROOM).min(hi.saturating_sub(*k)).min(spare);
        *k += more;
        spare -= more;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Misses of a volume of `reads` reads whose working set of `set`
    /// parts hits entirely once it fits (a cliff), else not at all.
    fn cliff(reads: f64, set: usize) -> Vec<f64> {
        (0..=SPLIT_UNITS)
            .map(|k| if k >= set { 0.0 } else { reads })
            .collect()
    }

    /// Misses falling evenly to nothing at `set` parts.
    fn slope(reads: f64, set: usize) -> Vec<f64> {
        (0..=SPLIT_UNITS)
            .map(|k| reads * (1.0 - (k as f64 / set as f64).min(1.0)))
            .collect()
    }

    #[test]
    fn the_split_fits_the_working_set_that_pays_and_gives_the_rest_away() {
        let all = (0, SPLIT_UNITS);
        // A cliff at 40 parts worth 1000 reads beats a slope worth 800.
        let s = split(&[cliff(1000.0, 40), slope(800.0, 64)], &[all, all]).unwrap();
        assert_eq!(s, vec![40, 24]);
        // A greedy split would never climb the cliff: each part alone
        // saves nothing until the 40th.
        assert_eq!(s.iter().sum::<usize>(), SPLIT_UNITS);
        // Bounds hold: a maximum of 30 parts for the cliff leaves it out.
        let s = split(&[cliff(1000.0, 40), slope(800.0, 64)], &[(0, 30), all]).unwrap();
        assert_eq!(s[1], SPLIT_UNITS - s[0]);
        assert!(s[0] <= 30);
        // A guaranteed minimum is met even where it saves nothing.
        let s = split(&[cliff(0.0, 1), slope(800.0, 64)], &[(16, 64), all]).unwrap();
        assert_eq!(s, vec![16, 48]);
        // Minimums past the whole cannot be met.
        assert!(split(&[cliff(1.0, 1), cliff(1.0, 1)], &[(40, 64), (40, 64)]).is_none());
        // Maxima short of the whole give out what they can.
        let s = split(&[slope(10.0, 64), slope(10.0, 64)], &[(0, 10), (0, 20)]).unwrap();
        assert_eq!(s, vec![10, 20]);
        // Parts that save nothing are given to nobody, but for an eighth
        // more as headroom.
        let s = split(&[cliff(1000.0, 20), cliff(0.0, 1)], &[all, all]).unwrap();
        assert_eq!(s, vec![23, 0]);
        let s = split(&[cliff(1000.0, 20), cliff(0.0, 1)], &[(0, 21), all]).unwrap();
        assert_eq!(s, vec![21, 0], "headroom stays under the maximum");
    }

    #[test]
    fn shares_are_checked_and_bound_the_floor() {
        assert!(Share {
            min_permille: 600,
            max_permille: 500
        }
        .valid()
        .is_err());
        assert!(Share {
            min_permille: 1001,
            max_permille: 0
        }
        .valid()
        .is_err());
        let v = VolumeShare::default();
        assert_eq!((v.floor_blocks(1000), v.max_blocks(1000)), (0, 1000));
        v.set(Share {
            min_permille: 100,
            max_permille: 500,
        });
        assert_eq!((v.floor_blocks(1000), v.max_blocks(1000)), (100, 500));
        v.set_curve_blocks(300);
        assert_eq!(v.floor_blocks(1000), 300);
        v.set_curve_blocks(900);
        assert_eq!(v.floor_blocks(1000), 500, "never above the maximum");
        for k in Sharing::ALL {
            assert_eq!(Sharing::parse(k.name()), Some(k));
            assert_eq!(Sharing::from_u32(k.to_u32()), Some(k));
        }
    }
}
