//! Admission: whether a request may bring new blocks into the cache (a
//! write to a new slot, the promotion of a read miss). Decided once per
//! request, in `Admission::decide`. While the cache is at most
//! `selective_above_pct` full (80% by default) everything is admitted:
//! free slots cost nothing to fill. Above it admission is selective:
//!
//! - **Sequential cutoff** (bcache's `sequential_cutoff`): a stream of
//!   requests that each start where the last ended, longer than the cutoff
//!   (4 MiB by default, 0 = off), goes around the cache: a disk streams
//!   fast, and a copy or a backup would displace the working set. Streams
//!   are told apart by where they will continue (a bounded table, as
//!   bcache's per-task recent-I/O hash); they are followed at any
//!   occupancy. (bcache applies the cutoff at any occupancy; a stream into
//!   free slots displaces nothing, and a data set read twice then hits.)
//!   A write goes around for the cutoff only if it is itself large
//!   (`LARGE_WRITE_BYTES`): small sequential writes cost the origin one
//!   request each if they go around, while in the cache they merge into
//!   runs that writeback sends as one request per several megabytes.
//! - **Promotion after N misses** (Open CAS's `nhit`): a read miss promotes
//!   a block only if it was missed `promote_after` times recently (counts
//!   kept in a count-min sketch with conservative update: two rows of 4-bit
//!   saturating counters, a block's count the smaller of its two, every
//!   counter halved every `slots / 4` misses; one counter per slot in all, half a
//!   byte per slot, no allocation).
//!
//! At any occupancy, the **guard**: while the cache device is clearly
//! slower than the origin (device latencies of requests up to 64 KiB, as
//! moving averages of at least 32 samples each; cache writes twice as slow
//! and 200 us slower than origin writes, for a second on end), new data
//! goes around the cache; one request in 16 is
//! still admitted to keep measuring. A cache that makes I/O slower than the
//! origin alone is a misconfiguration or a failing device; this keeps the
//! volume at origin speed meanwhile.
//!
//! Blocks already cached are always used: admission governs what enters.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use crate::sync::{Mutex, Rank};
use serde::{Deserialize, Serialize};

/// Admission settings, persisted in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionSettings {
    /// Above `selective_above_pct` occupancy, streams longer than this many
    /// bytes go around the cache (0: off).
    pub sequential_cutoff_bytes: u64,
    /// Above `selective_above_pct` occupancy, a read miss promotes a block
    /// only after this many recent misses of it (1: always).
    pub promote_after: u32,
    /// The occupancy (percent of slots in use) above which admission is
    /// selective.
    pub selective_above_pct: u32,
    /// Send new data around the cache while the cache device is slower
    /// than the origin.
    pub guard: bool,
}

/// Writes at least this large go around with a long stream; smaller ones
/// are cheaper to merge in the cache (see the module comment).
pub const LARGE_WRITE_BYTES: u64 = 1 << 20;

/// Highest `promote_after`: the counters are 4 bits.
pub const MAX_PROMOTE_AFTER: u32 = 15;

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            sequential_cutoff_bytes: 4 << 20,
            promote_after: 3,
            selective_above_pct: 80,
            guard: true,
        }
    }
}

impl AdmissionSettings {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_PROMOTE_AFTER).contains(&self.promote_after) {
            return Err(format!(
                "promote-after {} is outside 1..={MAX_PROMOTE_AFTER}",
                self.promote_after
            ));
        }
        if self.selective_above_pct > 100 {
            return Err(format!(
                "selective-above {}% is above 100%",
                self.selective_above_pct
            ));
        }
        if !self.sequential_cutoff_bytes.is_multiple_of(512) {
            return Err(format!(
                "sequential cutoff {} is not a multiple of 512 bytes",
                self.sequential_cutoff_bytes
            ));
        }
        Ok(())
    }
}

/// What the seam decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// New blocks may enter the cache.
    Admit,
    /// Read misses promote only blocks missed often enough (`hot`).
    AdmitHot,
    /// Nothing new enters: the request is part of a long sequential stream.
    Sequential,
    /// Nothing new enters: the cache device is slower than the origin.
    Guard,
    /// Nothing new enters: the cache device failed too often (io/failure.rs).
    Stopped,
}

impl Decision {
    pub fn admits(self) -> bool {
        matches!(self, Decision::Admit | Decision::AdmitHot)
    }
}

/// Streams tracked at once (one bit each in `Streams::referenced`).
const STREAMS: usize = 64;

/// No entry (`Streams::head`, `Streams::link`).
const NIL: u8 = u8::MAX;

/// The streams followed: where each continues and its bytes so far,
/// replaced by CLOCK (second chance, an approximation of least recently
/// used): an entry continued since the hand last passed it is skipped
/// once. A new entry is not marked, so one-off requests (random I/O, each
/// a stream that never continues) replace each other before a stream
/// that goes on.
///
/// Every request of every volume comes through here, so finding its
/// stream is a hash of where it starts and a walk of one short chain
/// (entries chained by where they continue, `STREAMS` chains), and
/// replacing an entry a few bit operations. A client choosing its offsets
/// can put every stream on one chain: then a walk is `STREAMS` steps.
struct Streams {
    next: [u64; STREAMS],
    bytes: [u64; STREAMS],
    /// Bit i: entry i holds a stream.
    used: u64,
    /// Bit i: entry i was continued since the hand last passed it.
    referenced: u64,
    hand: u32,
    /// Each chain's first entry, and each entry's successor on its chain.
    head: [u8; STREAMS],
    link: [u8; STREAMS],
}

/// The chain of the streams that continue at `next`.
fn chain_of(next: u64) -> usize {
    (next.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % STREAMS
}

impl Streams {
    fn new() -> Streams {
        Streams {
            next: [0; STREAMS],
            bytes: [0; STREAMS],
            used: 0,
            referenced: 0,
            hand: 0,
            head: [NIL; STREAMS],
            link: [NIL; STREAMS],
        }
    }

    /// The entry of the stream that continues at `offset`, if any.
    fn continued(&self, offset: u64) -> Option<usize> {
        let mut i = self.head[chain_of(offset)];
        while i != NIL {
            if self.next[i as usize] == offset {
                return Some(i as usize);
            }
            i = self.link[i as usize];
        }
        None
    }

    /// Takes entry `i` (holding a stream) off its chain.
    fn unchain(&mut self, i: usize) {
        let c = chain_of(self.next[i]);
        let after = self.link[i];
        if self.head[c] as usize == i {
            self.head[c] = after;
            return;
        }
        let mut at = self.head[c] as usize;
        while self.link[at] as usize != i {
            debug_assert_ne!(self.link[at], NIL, "entry {i} is on its chain");
            at = self.link[at] as usize;
        }
        self.link[at] = after;
    }

    /// The entry to replace: the first from the hand not continued since
    /// the hand last passed it; the entries passed on the way lose their
    /// mark.
    fn victim(&mut self) -> usize {
        let h = self.hand;
        let free = (!self.referenced).rotate_right(h);
        let k = match free {
            // All marked: a full sweep clears them, the hand's entry goes.
            0 => {
                self.referenced = 0;
                0
            }
            f => f.trailing_zeros(),
        };
        let passed = (1u64 << k).wrapping_sub(1).rotate_left(h);
        self.referenced &= !passed;
        let i = (h + k) % STREAMS as u32;
        self.hand = (i + 1) % STREAMS as u32;
        i as usize
    }

    /// Learns a request of `len` bytes at `offset`: it extends the stream
    /// that continues there, or starts one in place of the entry CLOCK
    /// picks. Returns the stream's bytes, the request's included.
    fn extend(&mut self, offset: u64, len: u64) -> u64 {
        let i = match self.continued(offset) {
            Some(i) => {
                self.referenced |= 1 << i;
                i
            }
            None => {
                let i = self.victim();
                self.bytes[i] = 0;
                i
            }
        };
        if self.used & 1 << i != 0 {
            self.unchain(i);
        }
        self.used |= 1 << i;
        self.bytes[i] = self.bytes[i].saturating_add(len);
        self.next[i] = offset.saturating_add(len);
        let c = chain_of(self.next[i]);
        self.link[i] = self.head[c];
        self.head[c] = i as u8;
        self.bytes[i]
    }
}

/// Device latencies the guard compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dev {
    CacheRead,
    CacheWrite,
    OriginRead,
    OriginWrite,
}

/// Moving averages (weight 1/16) of device request latencies, in ns.
#[derive(Default)]
pub struct Latencies {
    ewma_ns: [AtomicU64; 4],
    samples: [AtomicU64; 4],
}

/// Samples of a device's latency before the guard trusts its average: the
/// first sample sets it, and one request that waited for a CPU (or a disk
/// spinning up) must not send new data around the cache.
const GUARD_MIN_SAMPLES: u64 = 32;

impl Latencies {
    pub fn record(&self, dev: Dev, ns: u64) {
        let a = &self.ewma_ns[dev as usize];
        let old = a.load(Ordering::Relaxed);
        // Racy updates lose a sample at worst.
        let new = if old == 0 {
            ns
        } else {
            old - old / 16 + ns / 16
        };
        a.store(new.max(1), Ordering::Relaxed);
        self.samples[dev as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The average once it rests on `GUARD_MIN_SAMPLES` samples.
    fn settled(&self, dev: Dev) -> Option<u64> {
        (self.samples[dev as usize].load(Ordering::Relaxed) >= GUARD_MIN_SAMPLES)
            .then(|| self.get(dev))
            .flatten()
    }

    /// The average, or None before any sample.
    pub fn get(&self, dev: Dev) -> Option<u64> {
        let v = self.ewma_ns[dev as usize].load(Ordering::Relaxed);
        (v != 0).then_some(v)
    }
}

pub struct Admission {
    settings: Mutex<AdmissionSettings>,
    streams: Mutex<Streams>,
    /// 4-bit miss counters, two per byte.
    counts: Vec<AtomicU8>,
    /// Misses since the counters were last halved.
    misses: AtomicU64,
    halve_every: u64,
    pub latencies: Latencies,
    guard_engaged: AtomicBool,
    probe: AtomicU64,
    /// Milliseconds of `clock` when the cache device was first seen
    /// slower in the current stretch (0: it is not).
    slow_since_ms: AtomicU64,
    /// How long the cache device must stay slower before the guard engages.
    engage_after_ms: u64,
    clock: super::clock::Clock,
}

/// The guard engages only once the cache device has stayed slower than the
/// origin this long: a failing or overloaded device stays so for seconds,
/// while a burst of requests that waited for a CPU ends in milliseconds.
const GUARD_ENGAGE_AFTER_MS: u64 = 1000;

impl Admission {
    pub fn new(settings: AdmissionSettings, slot_count: u64) -> Admission {
        // Two rows of slots / 2 counters, two counters per byte.
        let counters = (slot_count as usize).max(128) / 2 * 2;
        Admission {
            settings: Mutex::new(Rank::Admission, settings),
            streams: Mutex::new(Rank::Admission, Streams::new()),
            counts: (0..counters / 2).map(|_| AtomicU8::new(0)).collect(),
            misses: AtomicU64::new(0),
            halve_every: (counters / 4) as u64,
            latencies: Latencies::default(),
            guard_engaged: AtomicBool::new(false),
            probe: AtomicU64::new(0),
            slow_since_ms: AtomicU64::new(0),
            engage_after_ms: GUARD_ENGAGE_AFTER_MS,
            clock: super::clock::Clock::real(),
        }
    }

    /// The same, reading time from `clock` (the engine's).
    pub fn with_clock(mut self, clock: super::clock::Clock) -> Admission {
        self.clock = clock;
        self
    }

    /// The same, with the guard engaging after `ms` of a slower cache
    /// device.
    #[cfg(test)]
    pub fn with_guard_delay(mut self, ms: u64) -> Admission {
        self.engage_after_ms = ms;
        self
    }

    pub fn settings(&self) -> AdmissionSettings {
        *self.settings.lock()
    }

    pub fn set_settings(&self, s: AdmissionSettings) {
        *self.settings.lock() = s;
    }

    pub fn heap_bytes(&self) -> u64 {
        self.counts.len() as u64
    }

    pub fn guard_engaged(&self) -> bool {
        self.guard_engaged.load(Ordering::Relaxed)
    }

    /// The decision for a request of `len` bytes at `offset` (`write`: a
    /// write), on a cache `used_pct` full; the stream table learns the
    /// request (it extends the stream that ends at `offset`, or replaces
    /// one). Called once per client request: a second call for the same
    /// request would find no stream ending at `offset` and start a new one.
    /// (The guard keeps its own measurement state.)
    pub fn decide_and_record(
        &self,
        offset: u64,
        len: u64,
        write: bool,
        used_pct: impl FnOnce() -> u64,
    ) -> Decision {
        let s = self.settings();
        let stream_bytes = self.streams.lock().extend(offset, len);
        let long_stream = s.sequential_cutoff_bytes > 0
            && stream_bytes > s.sequential_cutoff_bytes
            && (!write || len >= LARGE_WRITE_BYTES);
        if s.guard && self.guard_says_around() {
            return Decision::Guard;
        }
        if (long_stream || s.promote_after > 1) && used_pct() > s.selective_above_pct as u64 {
            if long_stream {
                return Decision::Sequential;
            }
            return Decision::AdmitHot;
        }
        Decision::Admit
    }

    /// True while new data should go around: the cache device writes more
    /// slowly than the origin (both measured), except for one request in
    /// 16, which keeps the measurement going.
    fn guard_says_around(&self) -> bool {
        let l = &self.latencies;
        let (Some(cache), Some(origin)) = (l.settled(Dev::CacheWrite), l.settled(Dev::OriginWrite))
        else {
            return false;
        };
        // Engage when cache writes take clearly longer (twice as long and
        // 200 us more), release when they are back near the origin's: two
        // fast devices of similar speed never trip it.
        let engaged = self.guard_engaged.load(Ordering::Relaxed);
        let slower = cache > origin * 2 + 200_000;
        if !slower {
            self.slow_since_ms.store(0, Ordering::Relaxed);
        }
        let now = if engaged {
            cache > origin * 3 / 2 + 100_000
        } else {
            slower && self.slow_for_long_enough()
        };
        if now != engaged {
            self.guard_engaged.store(now, Ordering::Relaxed);
            log::warn!(
                "admission guard {}: cache device writes take {} us, origin writes {} us",
                if now { "engaged" } else { "released" },
                cache / 1000,
                origin / 1000
            );
        }
        now && !self
            .probe
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(16)
    }

    /// Called while the cache device looks slower: true once it has for
    /// `engage_after_ms`. A stretch ends when a check finds it not slower.
    fn slow_for_long_enough(&self) -> bool {
        // +1: 0 means "not slow".
        let now_ms = self.clock.now_ms() + 1;
        let since = match self.slow_since_ms.load(Ordering::Relaxed) {
            0 => {
                self.slow_since_ms.store(now_ms, Ordering::Relaxed);
                now_ms
            }
            t => t,
        };
        // Another thread may have stored a `since` read after this
        // thread's `now_ms` (a panic on the subtraction's underflow in a
        // guest test, when a failing cache-set member made writes slow).
        now_ms.saturating_sub(since) >= self.engage_after_ms
    }

    /// (byte, bit shift) of `block`'s counter in `row` (0 or 1).
    fn counter(&self, block: u64, row: usize) -> (usize, u32) {
        const SEEDS: [u64; 2] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F];
        // SplitMix64's finaliser: every bit of the block reaches every bit.
        let mut h = block ^ SEEDS[row];
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
        let per_row = self.counts.len(); // counters per row: two per byte, half the bytes
        let i = row * per_row + ((h as u128 * per_row as u128) >> 64) as usize;
        (i / 2, (i % 2) as u32 * 4)
    }

    /// Counts a miss of `block`; returns its recent miss count (the smaller
    /// of its two counters). Conservative update: a counter already above
    /// the new count (others' misses in it) is left alone, which keeps the
    /// overcount of a sketch low.
    pub fn missed(&self, block: u64) -> u32 {
        let at = [self.counter(block, 0), self.counter(block, 1)];
        let get = |(byte, shift): (usize, u32)| {
            (self.counts[byte].load(Ordering::Relaxed) >> shift) & 0xf
        };
        let seen = (get(at[0]).min(get(at[1])) + 1).min(15);
        for (byte, shift) in at {
            // Racing updates may lose a count: harmless for a heuristic.
            let _ = self.counts[byte].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let n = (v >> shift) & 0xf;
                (n < seen).then_some((v & !(0xf << shift)) | (seen << shift))
            });
        }
        if self.misses.fetch_add(1, Ordering::Relaxed) + 1 >= self.halve_every {
            self.misses.store(0, Ordering::Relaxed);
            // Age: halve every counter, so counts reflect recent misses.
            for c in &self.counts {
                let v = c.load(Ordering::Relaxed);
                c.store((v >> 1) & 0x77, Ordering::Relaxed);
            }
        }
        seen as u32
    }

    /// True if a block missed `count` times may be promoted under `d`.
    pub fn promotes(&self, d: Decision, count: u32) -> bool {
        match d {
            Decision::Admit => true,
            Decision::AdmitHot => count >= self.settings().promote_after,
            Decision::Sequential | Decision::Guard | Decision::Stopped => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adm(cutoff: u64) -> Admission {
        Admission::new(
            AdmissionSettings {
                sequential_cutoff_bytes: cutoff,
                promote_after: 1,
                ..Default::default()
            },
            1000,
        )
    }

    #[test]
    fn a_long_stream_goes_around_and_random_io_does_not() {
        let a = adm(1 << 20);
        for k in 0..16u64 {
            assert_eq!(
                a.decide_and_record(k * 65536, 65536, false, || 90),
                Decision::Admit,
                "{k}"
            );
        }
        assert_eq!(
            a.decide_and_record(16 * 65536, 65536, false, || 90),
            Decision::Sequential
        );
        // Another stream interleaved is tracked apart.
        assert_eq!(
            a.decide_and_record(1 << 30, 4096, false, || 90),
            Decision::Admit
        );
        assert_eq!(
            a.decide_and_record(17 * 65536, 65536, false, || 90),
            Decision::Sequential
        );
        // Into an emptier cache the stream is admitted, and still followed.
        assert_eq!(
            a.decide_and_record(18 * 65536, 65536, false, || 50),
            Decision::Admit
        );
        assert_eq!(
            a.decide_and_record(19 * 65536, 65536, false, || 90),
            Decision::Sequential
        );
        // Random 4K requests never add up.
        for k in 0..1000u64 {
            let off = (k * 7919 % 5000) * 8192;
            assert_ne!(
                a.decide_and_record(off, 4096, false, || 90),
                Decision::Sequential
            );
        }
        assert_eq!(
            adm(0).decide_and_record(0, 1 << 30, false, || 90),
            Decision::Admit,
            "0 = off"
        );
        // Writes: small ones stay in the stream's cache, large ones go.
        let a = adm(1 << 20);
        for k in 0..40u64 {
            assert_eq!(
                a.decide_and_record(k * 65536, 65536, true, || 90),
                Decision::Admit
            );
        }
        let big = 1u64 << 20;
        let mut last = Decision::Admit;
        for k in 0..4u64 {
            last = a.decide_and_record((1 << 32) + k * big, big, true, || 90);
        }
        assert_eq!(last, Decision::Sequential);
    }

    #[test]
    fn streams_in_use_outlive_random_requests_and_idle_ones_go() {
        let mut t = Streams::new();
        // A stream that continues every 32 requests, among random ones
        // (each a stream of its own that never continues).
        let (mut at, mut x) = (1u64 << 40, 0x1234_5678u64);
        for k in 0..5_000u64 {
            if k % 32 == 0 {
                let before = k / 32 * 4096;
                assert_eq!(t.extend(at, 4096), before + 4096, "request {k}");
                at += 4096;
            } else {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                assert_eq!(t.extend((x >> 20) << 12, 4096), 4096);
            }
        }
        // A stream left alone for a table's worth of new ones is replaced.
        let idle = 1u64 << 50;
        t.extend(idle, 4096);
        for k in 0..2 * STREAMS as u64 {
            t.extend((k + 1) << 30, 512);
        }
        assert_eq!(t.continued(idle + 4096), None);
        assert_eq!(t.extend(idle + 4096, 4096), 4096, "a new stream");
    }

    #[test]
    fn misses_count_up_and_age() {
        let a = Admission::new(AdmissionSettings::default(), 1000);
        assert_eq!(
            a.decide_and_record(0, 4096, false, || 90),
            Decision::AdmitHot
        );
        assert_eq!(a.decide_and_record(0, 4096, false, || 50), Decision::Admit);
        assert_eq!(a.missed(7), 1);
        assert!(!a.promotes(Decision::AdmitHot, 1));
        a.missed(7);
        assert!(a.promotes(Decision::AdmitHot, a.missed(7)));
        // Saturates at 15 and halves with time.
        for _ in 0..30 {
            a.missed(9);
        }
        assert_eq!(a.missed(9), 15);
        for b in 0..2000u64 {
            a.missed(1_000_000 + b * 3);
        }
        assert!(a.missed(9) < 15);
    }

    #[test]
    fn the_sketch_rarely_counts_others_misses() {
        let a = Admission::new(AdmissionSettings::default(), 1024);
        for b in 0..600u64 {
            a.missed(b * 2);
        }
        for k in 0..40u64 {
            a.missed(10_000 + 7 * k);
        }
        let early = (0..40u64).filter(|k| a.missed(10_000 + 7 * k) >= 3).count();
        assert!(early <= 4, "{early} of 40 blocks missed twice count 3");
    }

    #[test]
    fn the_guard_follows_device_latencies() {
        let a = adm(0).with_guard_delay(0);
        // One slow first sample is not enough to go on.
        a.latencies.record(Dev::OriginWrite, 5_000_000);
        a.latencies.record(Dev::CacheWrite, 50_000_000);
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        assert!(!a.guard_engaged());
        for _ in 0..GUARD_MIN_SAMPLES {
            a.latencies.record(Dev::OriginWrite, 5_000_000);
            a.latencies.record(Dev::CacheWrite, 20_000);
        }
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        for _ in 0..200 {
            a.latencies.record(Dev::CacheWrite, 50_000_000);
        }
        let around = (0..160)
            .filter(|_| a.decide_and_record(0, 4096, false, || 0) == Decision::Guard)
            .count();
        assert_eq!(around, 150, "15 of 16 requests go around");
        assert!(a.guard_engaged());
        for _ in 0..200 {
            a.latencies.record(Dev::CacheWrite, 10_000);
        }
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        assert!(!a.guard_engaged());
    }

    /// A cache device slower for a moment (requests that waited for a CPU)
    /// does not engage the guard; slower for the whole delay, it does.
    #[test]
    fn the_guard_waits_for_a_lasting_slowdown() {
        let a = adm(0).with_guard_delay(60);
        for _ in 0..GUARD_MIN_SAMPLES {
            a.latencies.record(Dev::OriginWrite, 20_000);
            a.latencies.record(Dev::CacheWrite, 20_000);
        }
        let slow = |a: &Admission| {
            for _ in 0..GUARD_MIN_SAMPLES {
                a.latencies.record(Dev::CacheWrite, 5_000_000);
            }
        };
        let fast = |a: &Admission| {
            for _ in 0..4 * GUARD_MIN_SAMPLES {
                a.latencies.record(Dev::CacheWrite, 20_000);
            }
        };
        // Slow, fast again within the delay, slow again: never engaged.
        slow(&a);
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        std::thread::sleep(std::time::Duration::from_millis(40));
        fast(&a);
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        slow(&a);
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        std::thread::sleep(std::time::Duration::from_millis(40));
        assert_eq!(a.decide_and_record(0, 4096, false, || 0), Decision::Admit);
        assert!(!a.guard_engaged());
        // Slow for longer than the delay: engaged (one request in 16 is
        // still admitted, to keep measuring).
        std::thread::sleep(std::time::Duration::from_millis(40));
        let around = (0..16)
            .filter(|_| a.decide_and_record(0, 4096, false, || 0) == Decision::Guard)
            .count();
        assert!(a.guard_engaged());
        assert_eq!(around, 15);
    }

    #[test]
    fn settings_are_checked() {
        let ok = AdmissionSettings::default();
        assert!(ok.validate().is_ok());
        for bad in [
            AdmissionSettings {
                promote_after: 0,
                ..ok
            },
            AdmissionSettings {
                promote_after: 16,
                ..ok
            },
            AdmissionSettings {
                selective_above_pct: 101,
                ..ok
            },
            AdmissionSettings {
                sequential_cutoff_bytes: 1000,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
