//! A bounded history of recently evicted blocks: two generations of a Bloom
//! filter. Inserts go to the current generation; when it has taken
//! `capacity / 2` blocks the older one is cleared and becomes current, so
//! the history holds between `capacity / 2` and `capacity` of the latest
//! evictions. 8 bits per remembered block, 3 probes: about 3% false
//! positives, which only send a new block to the main queue early.

const PROBES: u32 = 3;
const BITS_PER_ENTRY: usize = 8;

pub struct Ghost {
    gens: [Vec<u64>; 2],
    current: usize,
    in_current: usize,
    per_gen: usize,
    /// Bits per generation (a multiple of 64).
    bits: u64,
}

fn hash(block: u64) -> u64 {
    // SplitMix64 finaliser: every bit of the block reaches every probe.
    let mut z = block.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Ghost {
    /// A history of about `capacity` blocks.
    pub fn new(capacity: usize) -> Ghost {
        let per_gen = (capacity / 2).max(1);
        let bits = (per_gen * BITS_PER_ENTRY).div_ceil(64).max(1) * 64;
        Ghost {
            gens: [vec![0; bits / 64], vec![0; bits / 64]],
            current: 0,
            in_current: 0,
            per_gen,
            bits: bits as u64,
        }
    }

    pub fn heap_bytes(&self) -> u64 {
        ((self.gens[0].capacity() + self.gens[1].capacity()) * 8) as u64
    }

    fn probes(&self, block: u64) -> impl Iterator<Item = usize> {
        let h = hash(block);
        let bits = self.bits;
        // Multiply-shift range reduction of three rotations of the hash.
        (0..PROBES).map(move |i| ((h.rotate_left(i * 21) as u128 * bits as u128) >> 64) as usize)
    }

    pub fn insert(&mut self, block: u64) {
        if self.in_current >= self.per_gen {
            self.current ^= 1;
            self.gens[self.current].fill(0);
            self.in_current = 0;
        }
        let probes: Vec<usize> = self.probes(block).collect();
        let g = &mut self.gens[self.current];
        for b in probes {
            g[b / 64] |= 1 << (b % 64);
        }
        self.in_current += 1;
    }

    pub fn contains(&self, block: u64) -> bool {
        self.gens
            .iter()
            .any(|g| self.probes(block).all(|b| g[b / 64] & (1 << (b % 64)) != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_recent_and_forgets_old() {
        let mut g = Ghost::new(1000);
        for b in 0..1000u64 {
            g.insert(b);
        }
        // The last half-capacity is certainly there.
        assert!((500..1000).all(|b| g.contains(b)));
        for b in 10_000..11_000u64 {
            g.insert(b);
        }
        // Two generations later the first ones are gone (bar false
        // positives), the latest are there.
        let old = (0..500).filter(|&b| g.contains(b)).count();
        assert!(old < 50, "{old} of 500 old blocks still remembered");
        assert!((10_500..11_000).all(|b| g.contains(b)));
        let strangers = (1 << 40..(1 << 40) + 10_000u64)
            .filter(|&b| g.contains(b))
            .count();
        assert!(strangers < 600, "false positives: {strangers} of 10000");
        // 500 per generation, 8 bits each, rounded up to 4032 bits.
        assert_eq!(g.heap_bytes(), 2 * 4032 / 8);
    }
}
