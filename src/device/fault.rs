//! A fault-injecting in-memory device for tests.
//!
//! # Fault model
//!
//! [`FaultDevice`] models a persistent disk with a volatile write cache, the
//! contract [`BlockDevice`] documents:
//!
//! - **Durable image and unflushed writes.** The device keeps the durable
//!   image (what the media holds) and, in completion order, every write and
//!   discard completed since the last successful `flush`. Reads always see the
//!   latest data: the durable image with all completed writes applied.
//!   `flush` makes every completed write durable at once.
//! - **Power loss.** [`FaultDevice::power_loss_image`] computes what the media
//!   holds after a power loss: the durable image plus, for each unflushed
//!   write, independently and seeded-randomly one of: *dropped*, *applied
//!   whole*, or *torn* (each of its 512-byte sectors applied or not, with
//!   probability 1/2, so a torn write may also come out empty or whole). The
//!   surviving writes are applied in a random order, so a sector written twice
//!   without a flush in between can end up with either value. Sectors are
//!   atomic: a sector is always entirely old or entirely new. The result
//!   depends only on the seed and the history, never on timing. Flushed data
//!   is never lost, and nothing that was not written ever appears.
//! - **Discards** are recorded like writes of zeroes: after a power loss a
//!   discarded, unflushed sector reads either its old content or zeroes.
//! - **I/O errors.** Reads overlapping a range given to
//!   [`FaultDevice::fail_reads_in`], and writes or discards overlapping a range
//!   given to [`FaultDevice::fail_writes_in`], fail with
//!   [`DeviceError::Injected`]; a failed write or discard changes nothing.
//!   [`FaultDevice::fail_after_ops`] lets `n` more operations succeed, then
//!   fails every operation (flushes included) until
//!   [`FaultDevice::clear_faults`].
//! - **Crash (the machine dies with I/O in flight).** A [`CrashSwitch`] is
//!   shared by every device of one simulated machine (cache and origin). Once
//!   it trips, every read, write, flush and discard on every device sharing it
//!   fails with [`DeviceError::Injected`] and changes nothing, as if the
//!   worker threads still running had lost their disks. A switch armed with
//!   [`CrashSwitch::arm_after_writes`] trips exactly as the n-th further write
//!   (across all its devices) is about to be applied; the order of writes is
//!   the order in which they take the switch's lock, so concurrent writers
//!   see one global count. The restart is then built with
//!   `FaultDevice::from_image(name, dev.power_loss_image(), seed)`.
//!
//! Request validation (range, 512-byte alignment) comes before any fault, and
//! a rejected request neither counts as an operation nor consumes a write of
//! the crash switch. Only `write_at` counts towards `arm_after_writes`.

use std::sync::Arc;

use crate::sync::{Mutex, Rank};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{check_range, fnv1a64, BlockDevice, DeviceError, DeviceResult, SECTOR_BYTES};

/// Power for several [`FaultDevice`]s at once; cloning shares the switch.
#[derive(Clone, Debug)]
pub struct CrashSwitch {
    state: Arc<Mutex<SwitchState>>,
}

impl Default for CrashSwitch {
    fn default() -> Self {
        CrashSwitch {
            state: Arc::new(Mutex::new(Rank::PowerSwitch, SwitchState::default())),
        }
    }
}

/// Called once when a switch trips, with the switch's lock held.
pub type TripHook = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct SwitchState {
    tripped: bool,
    /// See `CrashSwitch::on_trip`.
    on_trip: Option<TripHook>,
    /// Writes still admitted before the one that trips the switch.
    writes_before_trip: Option<u64>,
    /// Flushes and discards count too (see `arm_after_events`).
    count_flushes: bool,
}

impl CrashSwitch {
    /// An untripped, unarmed switch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trips the switch when the `n`-th further write on any device sharing it
    /// is about to be applied: `n - 1` more writes succeed, the `n`-th and all
    /// later I/O fail. `n == 0` trips it now. Replaces an earlier arming.
    pub fn arm_after_writes(&self, n: u64) {
        let mut st = self.state.lock();
        match n.checked_sub(1) {
            Some(before) => st.writes_before_trip = Some(before),
            None => st.trip(),
        }
    }

    /// Like `arm_after_writes`, but flushes and discards count as events
    /// too, so the power can also fail just before a flush: the gap between
    /// a write and the flush that should cover it.
    pub fn arm_after_events(&self, n: u64) {
        self.arm_after_writes(n);
        self.state.lock().count_flushes = true;
    }

    fn counts(&self, flush_or_discard: bool) -> bool {
        !flush_or_discard || self.state.lock().count_flushes
    }

    /// Trips the switch now.
    pub fn trip(&self) {
        self.state.lock().trip();
    }

    /// Runs `hook` the moment the switch trips, before any other I/O: a
    /// test saves there what else a dying process leaves behind (its crash
    /// log), exactly as of the crash.
    pub fn on_trip(&self, hook: TripHook) {
        self.state.lock().on_trip = Some(hook);
    }

    pub fn is_tripped(&self) -> bool {
        self.state.lock().tripped
    }

    /// Called by a device holding its own state lock, just before applying a
    /// write; false means the power is gone and the write must not happen.
    fn admit_write(&self) -> bool {
        let mut st = self.state.lock();
        if st.tripped {
            return false;
        }
        match st.writes_before_trip {
            Some(0) => {
                st.trip();
                st.writes_before_trip = None;
                false
            }
            Some(n) => {
                st.writes_before_trip = Some(n - 1);
                true
            }
            None => true,
        }
    }
}

impl SwitchState {
    fn trip(&mut self) {
        if !self.tripped {
            self.tripped = true;
            if let Some(hook) = &self.on_trip {
                hook();
            }
        }
    }
}

impl std::fmt::Debug for SwitchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchState")
            .field("tripped", &self.tripped)
            .field("writes_before_trip", &self.writes_before_trip)
            .field("count_flushes", &self.count_flushes)
            .finish()
    }
}

/// What an unflushed write put on the device.
#[derive(Clone, Debug)]
enum Content {
    Bytes(Vec<u8>),
    /// A discard; the device reads zeroes there until a power loss.
    Zeroes,
}

/// A write or discard completed since the last flush.
#[derive(Clone, Debug)]
struct UnflushedWrite {
    offset: u64,
    len_bytes: u64,
    content: Content,
}

impl UnflushedWrite {
    /// Applies this write's sector `sector_index` (counted from its start) to `image`.
    fn apply_sector(&self, image: &mut [u8], sector_index: usize) {
        let sector_bytes = SECTOR_BYTES as usize;
        let in_write = sector_index * sector_bytes;
        let at = self.offset as usize + in_write;
        let dst = &mut image[at..at + sector_bytes];
        match &self.content {
            Content::Bytes(data) => dst.copy_from_slice(&data[in_write..in_write + sector_bytes]),
            Content::Zeroes => dst.fill(0),
        }
    }

    fn sector_count(&self) -> usize {
        (self.len_bytes / SECTOR_BYTES) as usize
    }

    /// The bytes it covers.
    fn range(&self) -> std::ops::Range<usize> {
        self.offset as usize..(self.offset + self.len_bytes) as usize
    }

    /// Applies the whole write to `image`.
    fn apply(&self, image: &mut [u8]) {
        let dst = &mut image[self.range()];
        match &self.content {
            Content::Bytes(data) => dst.copy_from_slice(data),
            Content::Zeroes => dst.fill(0),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Flush,
    Discard,
}

#[derive(Default)]
struct State {
    /// What the media holds.
    durable: Vec<u8>,
    /// What reads see: `durable` with every entry of `unflushed` applied in order.
    current: Vec<u8>,
    unflushed: Vec<UnflushedWrite>,
    read_fault_ranges: Vec<(u64, u64)>,
    write_fault_ranges: Vec<(u64, u64)>,
    /// Operations that still succeed before every operation fails.
    ops_before_failing: Option<u64>,
    reads: u64,
    writes: u64,
    flushes: u64,
    discards: u64,
    injected_errors: u64,
    /// A hash of every completed operation in order (see `io_digest`).
    digest: u64,
    /// `BlockDevice::loss_epoch`: moved by `lose_unflushed` and by failed
    /// flushes.
    loss_epoch: u64,
}

/// An in-memory [`BlockDevice`] that injects errors, crashes and power loss;
/// see the fault model at the top of this file.
pub struct FaultDevice {
    name: String,
    /// As of creation or the last `refresh_size` (`grow` makes the image
    /// longer first, as lvextend does under an open device).
    size_bytes: std::sync::atomic::AtomicU64,
    seed: u64,
    crash_switch: Option<CrashSwitch>,
    state: Mutex<State>,
}

fn overlaps(ranges: &[(u64, u64)], offset: u64, len: u64) -> bool {
    let end = offset.saturating_add(len);
    ranges
        .iter()
        .any(|&(start, range_len)| offset < start.saturating_add(range_len) && start < end)
}

impl FaultDevice {
    /// `BlockDevice::let_go` was called: every request fails.
    pub fn was_let_go(&self) -> bool {
        self.size_bytes() == 0
    }

    /// A zero-filled device. `size_bytes` must be a multiple of 512.
    ///
    /// # Panics
    /// If `size_bytes` is not a multiple of 512 or does not fit in memory
    /// (a test's mistake, not an operating error).
    pub fn new(name: &str, size_bytes: u64, seed: u64) -> FaultDevice {
        let len = usize::try_from(size_bytes).expect("FaultDevice size fits in memory");
        Self::from_image(name, vec![0u8; len], seed)
    }

    /// The device grows to `bytes` (a multiple of 512, not smaller than
    /// now), zeroes at its new end, durably, as an extended logical volume
    /// does. Its users see the new size after `refresh_size`.
    ///
    /// # Panics
    /// If `bytes` is smaller than the image or not a multiple of 512.
    pub fn grow(&self, bytes: u64) {
        assert!(bytes.is_multiple_of(SECTOR_BYTES), "grow to whole sectors");
        let mut st = self.state.lock();
        assert!(
            bytes as usize >= st.durable.len(),
            "a FaultDevice only grows"
        );
        st.durable.resize(bytes as usize, 0);
        st.current.resize(bytes as usize, 0);
    }

    /// A device whose durable content is `image`, e.g. a
    /// [`FaultDevice::power_loss_image`] for the restart after a crash.
    ///
    /// # Panics
    /// If the image length is not a multiple of 512.
    pub fn from_image(name: &str, image: Vec<u8>, seed: u64) -> FaultDevice {
        assert!(
            (image.len() as u64).is_multiple_of(SECTOR_BYTES),
            "FaultDevice image of {} bytes is not a whole number of sectors",
            image.len()
        );
        FaultDevice {
            name: name.to_string(),
            size_bytes: (image.len() as u64).into(),
            seed,
            crash_switch: None,
            state: Mutex::new(
                Rank::Device,
                State {
                    current: image.clone(),
                    durable: image,
                    ..State::default()
                },
            ),
        }
    }

    /// Puts the device on `switch`'s power (builder).
    pub fn with_crash_switch(mut self, switch: CrashSwitch) -> Self {
        self.crash_switch = Some(switch);
        self
    }

    pub fn crash_switch(&self) -> Option<&CrashSwitch> {
        self.crash_switch.as_ref()
    }

    /// The seed that decides the outcome of [`FaultDevice::power_loss_image`].
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Reads overlapping `[offset, offset + len)` fail from now on.
    pub fn fail_reads_in(&self, offset: u64, len: u64) {
        self.state.lock().read_fault_ranges.push((offset, len));
    }

    /// Writes and discards overlapping `[offset, offset + len)` fail from now
    /// on, changing nothing.
    pub fn fail_writes_in(&self, offset: u64, len: u64) {
        self.state.lock().write_fault_ranges.push((offset, len));
    }

    /// `n` more operations of any kind succeed; every one after them fails
    /// until [`FaultDevice::clear_faults`].
    pub fn fail_after_ops(&self, n: u64) {
        self.state.lock().ops_before_failing = Some(n);
    }

    /// Removes the error injection of this device (not a tripped crash
    /// switch: power does not come back).
    pub fn clear_faults(&self) {
        let mut st = self.state.lock();
        st.read_fault_ranges.clear();
        st.write_fault_ranges.clear();
        st.ops_before_failing = None;
    }

    /// Successful reads.
    pub fn reads(&self) -> u64 {
        self.state.lock().reads
    }

    /// Successful writes.
    pub fn writes(&self) -> u64 {
        self.state.lock().writes
    }

    /// Successful flushes.
    pub fn flushes(&self) -> u64 {
        self.state.lock().flushes
    }

    /// Successful discards.
    pub fn discards(&self) -> u64 {
        self.state.lock().discards
    }

    /// A hash of every operation completed so far, in order: kind, offset,
    /// length and the bytes read or written. Two runs of a deterministic
    /// test that end with the same digest did the same I/O, bit for bit.
    pub fn io_digest(&self) -> u64 {
        self.state.lock().digest
    }

    /// Operations failed by injection (ranges, `fail_after_ops`, crash switch).
    pub fn injected_errors(&self) -> u64 {
        self.state.lock().injected_errors
    }

    /// The device's server restarts and its volatile cache is gone: every
    /// write completed since the last flush is dropped (reads see the
    /// durable image), and `loss_epoch` moves, as an NBD origin's does when
    /// its connection is lost. Returns how many writes were dropped.
    pub fn lose_unflushed(&self) -> usize {
        let mut st = self.state.lock();
        let n = st.unflushed.len();
        let State {
            durable,
            current,
            unflushed,
            ..
        } = &mut *st;
        // Only what the unflushed writes covered differs from `durable`.
        for w in unflushed.drain(..) {
            current[w.range()].copy_from_slice(&durable[w.range()]);
        }
        st.loss_epoch += 1;
        n
    }

    /// Writes and discards completed since the last flush.
    pub fn unflushed_writes(&self) -> usize {
        self.state.lock().unflushed.len()
    }

    /// What reads see now.
    pub fn snapshot_current(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// What the media holds if no unflushed write survives.
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// The content after a power loss now, per the fault model. Depends only
    /// on the seed and the history, so the same call gives the same image.
    pub fn power_loss_image(&self) -> Vec<u8> {
        let st = self.state.lock();
        let mut image = st.durable.clone();
        for_surviving_sectors(
            self.seed,
            &st.unflushed,
            UnflushedWrite::sector_count,
            |w, i| w.apply_sector(&mut image, i),
        );
        image
    }

    /// Decides whether `op` may proceed, counting the injected failure if not.
    /// Runs under the state lock, so a write admitted by the crash switch is
    /// applied before anyone can observe the device again.
    fn admit(&self, st: &mut State, op: Op, offset: u64, len: u64) -> DeviceResult<()> {
        let switch_tripped = self.crash_switch.as_ref().is_some_and(|s| s.is_tripped());
        let range_fault = match op {
            Op::Read => overlaps(&st.read_fault_ranges, offset, len),
            Op::Write | Op::Discard => overlaps(&st.write_fault_ranges, offset, len),
            Op::Flush => false,
        };
        let fail = switch_tripped
            || st.ops_before_failing == Some(0)
            || range_fault
            // Last, so a write refused for another reason does not use up
            // one of the switch's writes.
            || (op != Op::Read
                && self
                    .crash_switch
                    .as_ref()
                    .is_some_and(|s| s.counts(op != Op::Write) && !s.admit_write()));
        if fail {
            st.injected_errors += 1;
            return Err(DeviceError::Injected {
                device: self.name.clone(),
                offset,
            });
        }
        Ok(())
    }

    /// Bookkeeping after an admitted operation has been carried out on
    /// `len` bytes at `offset` (`data`: the bytes read or written).
    fn succeeded(st: &mut State, op: Op, offset: u64, len: u64, data: &[u8]) {
        let mut entry = [0u8; 32];
        entry[..8].copy_from_slice(&(op as u64).to_le_bytes());
        entry[8..16].copy_from_slice(&offset.to_le_bytes());
        entry[16..24].copy_from_slice(&len.to_le_bytes());
        entry[24..].copy_from_slice(&data_hash(data).to_le_bytes());
        st.digest = fnv1a64(&entry) ^ st.digest.rotate_left(17);
        if let Some(n) = st.ops_before_failing.as_mut() {
            *n -= 1;
        }
        match op {
            Op::Read => st.reads += 1,
            Op::Write => st.writes += 1,
            Op::Flush => st.flushes += 1,
            Op::Discard => st.discards += 1,
        }
    }

    /// Records a completed write or discard and applies it to `current`.
    fn complete(st: &mut State, write: UnflushedWrite) {
        write.apply(&mut st.current);
        st.unflushed.push(write);
    }
}

/// A hash of the bytes of an operation, for the digest: eight bytes a
/// step. (FNV-1a a byte at a time took 63% of the crash suites' CPU: every
/// byte every fault device reads or writes goes through here.) Only
/// compared with itself, run against run (`io_digest`).
fn data_hash(data: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(K).rotate_left(29);
    // Four lanes, so that the multiplications overlap.
    let mut lanes = [K, K ^ 1, K ^ 2, K ^ data.len() as u64];
    let mut blocks = data.chunks_exact(32);
    for b in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(b.chunks_exact(8)) {
            *lane = mix(
                *lane,
                u64::from_le_bytes(w.try_into().expect("eight bytes")),
            );
        }
    }
    let mut h = lanes.iter().fold(0, |h, &l| mix(h, l));
    for &b in blocks.remainder() {
        h = mix(h, u64::from(b));
    }
    h
}

impl BlockDevice for FaultDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(std::sync::atomic::Ordering::Acquire)
    }

    fn refresh_size(&self) -> DeviceResult<u64> {
        let now = self.state.lock().durable.len() as u64;
        (self.size_bytes).store(now, std::sync::atomic::Ordering::Release);
        Ok(now)
    }

    /// Requests fail from now on, as past the end (`was_let_go`).
    fn let_go(&self) -> DeviceResult<()> {
        (self.size_bytes).store(0, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        let mut st = self.state.lock();
        self.admit(&mut st, Op::Read, offset, buf.len() as u64)?;
        let at = offset as usize;
        buf.copy_from_slice(&st.current[at..at + buf.len()]);
        Self::succeeded(&mut st, Op::Read, offset, buf.len() as u64, buf);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        let mut st = self.state.lock();
        self.admit(&mut st, Op::Write, offset, buf.len() as u64)?;
        if !buf.is_empty() {
            let write = UnflushedWrite {
                offset,
                len_bytes: buf.len() as u64,
                content: Content::Bytes(buf.to_vec()),
            };
            Self::complete(&mut st, write);
        }
        Self::succeeded(&mut st, Op::Write, offset, buf.len() as u64, buf);
        Ok(())
    }

    fn flush(&self) -> DeviceResult<()> {
        let mut st = self.state.lock();
        if let Err(e) = self.admit(&mut st, Op::Flush, 0, 0) {
            st.loss_epoch += 1;
            return Err(e);
        }
        // `current` is `durable` with the unflushed writes applied in
        // order: applying them to `durable` makes the two equal, copying
        // only what they cover (not the whole image at every flush).
        let State {
            durable, unflushed, ..
        } = &mut *st;
        for w in unflushed.drain(..) {
            w.apply(durable);
        }
        Self::succeeded(&mut st, Op::Flush, 0, 0, &[]);
        Ok(())
    }

    /// Stands for a flash device in the tests.
    fn discard_helps(&self) -> bool {
        true
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        let mut st = self.state.lock();
        self.admit(&mut st, Op::Discard, offset, len)?;
        if len > 0 {
            let write = UnflushedWrite {
                offset,
                len_bytes: len,
                content: Content::Zeroes,
            };
            Self::complete(&mut st, write);
        }
        Self::succeeded(&mut st, Op::Discard, offset, len, &[]);
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn loss_epoch(&self) -> u64 {
        self.state.lock().loss_epoch
    }

    /// Derived from the name, so the device rebuilt with `from_image` after a
    /// crash is recognised as the same disk.
    fn identity(&self) -> u64 {
        fnv1a64(format!("fault\0{}", self.name).as_bytes())
    }
}

/// The seeded power-loss model shared by `FaultDevice` and the write
/// recorder: each unflushed write, in order, is lost, kept whole, or kept
/// sector by sector at random (one RNG seeded with `seed`); the survivors
/// land in a shuffled order. Calls `apply(write, sector index)` for every
/// surviving sector, in landing order. The same seed and writes always give
/// the same calls.
pub(crate) fn for_surviving_sectors<T>(
    seed: u64,
    unflushed: &[T],
    sector_count: impl Fn(&T) -> usize,
    mut apply: impl FnMut(&T, usize),
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut survivors: Vec<(&T, Vec<bool>)> = Vec::new();
    for write in unflushed {
        let sectors = sector_count(write);
        let applied = match rng.gen_range(0..3u8) {
            0 => continue,
            1 => vec![true; sectors],
            _ => (0..sectors).map(|_| rng.gen_bool(0.5)).collect(),
        };
        survivors.push((write, applied));
    }
    survivors.shuffle(&mut rng);
    for (write, applied) in survivors {
        for (i, _) in applied.iter().enumerate().filter(|(_, &on)| on) {
            apply(write, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECTOR: usize = SECTOR_BYTES as usize;

    fn filled(len: usize, byte: u8) -> Vec<u8> {
        vec![byte; len]
    }

    #[test]
    fn the_data_hash_sees_every_bit_and_the_length() {
        let base: Vec<u8> = (0..4099u32).map(|i| (i * 7) as u8).collect();
        let h = data_hash(&base);
        for at in [0, 1, 7, 8, 4095, 4096, 4098] {
            for bit in [0, 3, 7] {
                let mut b = base.clone();
                b[at] ^= 1 << bit;
                assert_ne!(data_hash(&b), h, "byte {at} bit {bit}");
            }
        }
        assert_ne!(data_hash(&[0; 8]), data_hash(&[0; 9]));
        assert_ne!(data_hash(&[]), data_hash(&[0]));
    }

    fn read(dev: &FaultDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn reads_see_latest_and_flush_makes_durable() {
        let dev = FaultDevice::new("d", 64 << 10, 1);
        assert!(!dev.is_volatile());
        dev.write_at(&filled(4096, 7), 4096).unwrap();
        assert_eq!(read(&dev, 4096, 4096), filled(4096, 7));
        assert_eq!(dev.snapshot_current()[4096..8192], filled(4096, 7)[..]);
        assert_eq!(dev.durable_image()[4096..8192], filled(4096, 0)[..]);
        assert_eq!(dev.unflushed_writes(), 1);
        dev.flush().unwrap();
        assert_eq!(dev.unflushed_writes(), 0);
        assert_eq!(dev.durable_image(), dev.snapshot_current());
        assert_eq!(dev.power_loss_image(), dev.snapshot_current());
        assert_eq!((dev.reads(), dev.writes(), dev.flushes()), (1, 1, 1));
        assert!(matches!(
            dev.write_at(&filled(512, 1), 64 << 10),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&filled(100, 1), 0),
            Err(DeviceError::Unaligned { .. })
        ));
        assert_eq!(dev.writes(), 1);
    }

    #[test]
    fn flushed_data_always_survives_power_loss() {
        for seed in 0..300 {
            let dev = FaultDevice::new("d", 64 << 10, seed);
            dev.write_at(&filled(8192, 1), 0).unwrap();
            dev.write_at(&filled(4096, 2), 16384).unwrap();
            dev.flush().unwrap();
            // Unflushed: one write elsewhere, one over flushed data.
            dev.write_at(&filled(8192, 3), 32768).unwrap();
            dev.write_at(&filled(4096, 4), 16384).unwrap();
            let image = dev.power_loss_image();
            assert_eq!(image[..8192], filled(8192, 1)[..], "seed {seed}");
            for sector in image[16384..20480].chunks(SECTOR) {
                assert!(
                    sector == filled(SECTOR, 2) || sector == filled(SECTOR, 4),
                    "seed {seed}: a flushed sector was lost"
                );
            }
            // Nothing that was never written appears.
            assert!(image[8192..16384].iter().all(|&b| b == 0), "seed {seed}");
            assert!(image[40960..].iter().all(|&b| b == 0), "seed {seed}");
        }
    }

    #[test]
    fn unflushed_writes_are_dropped_kept_or_torn() {
        let old = filled(64 << 10, 0xAA);
        let (mut dropped, mut kept, mut torn) = (0, 0, 0);
        for seed in 0..300 {
            let dev = FaultDevice::from_image("d", old.clone(), seed);
            dev.write_at(&filled(8 * SECTOR, 0x55), 8192).unwrap();
            let image = dev.power_loss_image();
            let region = &image[8192..8192 + 8 * SECTOR];
            let mut new_sectors = 0;
            for sector in region.chunks(SECTOR) {
                if sector == filled(SECTOR, 0x55) {
                    new_sectors += 1;
                } else {
                    assert_eq!(sector, filled(SECTOR, 0xAA), "seed {seed}: sector mixed");
                }
            }
            match new_sectors {
                0 => dropped += 1,
                8 => kept += 1,
                _ => torn += 1,
            }
            assert_eq!(image[..8192], old[..8192], "seed {seed}");
            assert_eq!(image[12288..], old[12288..], "seed {seed}");
        }
        assert!(
            dropped > 0 && kept > 0 && torn > 0,
            "dropped {dropped} kept {kept} torn {torn}"
        );
    }

    #[test]
    fn overlapping_unflushed_writes_may_end_in_any_order() {
        let mut seen = [false; 3];
        for seed in 0..300 {
            let dev = FaultDevice::new("d", 4096, seed);
            dev.write_at(&filled(SECTOR, 1), 0).unwrap();
            dev.write_at(&filled(SECTOR, 2), 0).unwrap();
            let value = dev.power_loss_image()[0];
            assert!(value <= 2, "seed {seed}: {value}");
            seen[value as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }

    #[test]
    fn power_loss_is_deterministic_per_seed() {
        let history = |seed: u64| {
            let dev = FaultDevice::new("d", 64 << 10, seed);
            for i in 0..20u64 {
                dev.write_at(&filled(4 * SECTOR, i as u8 + 1), (i * 3 % 30) * 2048)
                    .unwrap();
                if i == 9 {
                    dev.flush().unwrap();
                }
            }
            dev.discard(0, 4096).unwrap();
            dev
        };
        let mut distinct = std::collections::HashSet::new();
        for seed in 0..20 {
            let a = history(seed);
            let b = history(seed);
            let image = a.power_loss_image();
            assert_eq!(image, a.power_loss_image(), "seed {seed}");
            assert_eq!(image, b.power_loss_image(), "seed {seed}");
            distinct.insert(image);
        }
        assert!(distinct.len() > 1, "the seed changes nothing");
    }

    #[test]
    fn discard_reads_zeroes_and_may_be_lost() {
        let mut outcomes = [false; 2];
        for seed in 0..100 {
            let dev = FaultDevice::from_image("d", filled(8192, 9), seed);
            dev.discard(0, 512).unwrap();
            assert_eq!(read(&dev, 0, 512), filled(512, 0));
            let first = dev.power_loss_image()[0];
            assert!(first == 0 || first == 9, "seed {seed}");
            outcomes[usize::from(first == 9)] = true;
        }
        assert_eq!(outcomes, [true, true]);
    }

    #[test]
    fn restart_from_power_loss_image() {
        let dev = FaultDevice::new("cache", 16 << 10, 5);
        dev.write_at(&filled(4096, 3), 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&filled(4096, 4), 4096).unwrap();
        let image = dev.power_loss_image();
        let restarted = FaultDevice::from_image("cache", image.clone(), 6);
        assert_eq!(restarted.identity(), dev.identity());
        assert_ne!(
            restarted.identity(),
            FaultDevice::new("origin", 512, 0).identity()
        );
        assert_eq!(read(&restarted, 0, 16 << 10), image);
        assert_eq!(restarted.power_loss_image(), image);
    }

    #[test]
    fn injected_range_errors() {
        let dev = FaultDevice::new("d", 64 << 10, 0);
        dev.write_at(&filled(16384, 1), 0).unwrap();
        dev.fail_reads_in(4096, 4096);
        dev.fail_writes_in(12288, 512);

        assert_eq!(read(&dev, 0, 4096), filled(4096, 1));
        assert_eq!(read(&dev, 8192, 4096), filled(4096, 1));
        let mut buf = vec![0u8; 1024];
        let err = dev.read_at(&mut buf, 4096 - 512).unwrap_err();
        assert!(matches!(err, DeviceError::Injected { offset: 3584, .. }));
        assert!(dev.read_at(&mut buf, 8192 - 512).is_err());
        // Writes to a read-failing range still work.
        dev.write_at(&filled(4096, 2), 4096).unwrap();

        assert!(dev.write_at(&filled(4096, 3), 12288).is_err());
        assert!(dev.write_at(&filled(512, 3), 12800 - 512).is_err());
        assert!(dev.discard(12288, 4096).is_err());
        assert_eq!(dev.snapshot_current()[12288..16384], filled(4096, 1)[..]);
        dev.write_at(&filled(512, 3), 12800).unwrap();
        assert_eq!(dev.injected_errors(), 5);
        assert_eq!((dev.reads(), dev.writes()), (2, 3));

        dev.clear_faults();
        dev.read_at(&mut buf, 4096 - 512).unwrap();
        dev.write_at(&filled(4096, 3), 12288).unwrap();
        assert_eq!(dev.injected_errors(), 5);
    }

    #[test]
    fn fail_after_ops_counts_every_kind() {
        let dev = FaultDevice::new("d", 64 << 10, 0);
        dev.fail_after_ops(4);
        dev.write_at(&filled(512, 1), 0).unwrap();
        read(&dev, 0, 512);
        dev.flush().unwrap();
        // A rejected request is not an operation.
        assert!(dev.write_at(&filled(512, 1), 1 << 20).is_err());
        dev.discard(512, 512).unwrap();

        assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
        assert!(dev.write_at(&filled(512, 2), 0).is_err());
        assert!(dev.flush().is_err());
        assert!(dev.discard(0, 512).is_err());
        assert_eq!(dev.snapshot_current()[0], 1);
        assert_eq!(dev.injected_errors(), 4);
        assert_eq!(
            (dev.reads(), dev.writes(), dev.flushes(), dev.discards()),
            (1, 1, 1, 1)
        );

        dev.clear_faults();
        dev.write_at(&filled(512, 2), 0).unwrap();
        dev.flush().unwrap();
    }

    #[test]
    fn shared_crash_switch_trips_at_the_nth_write() {
        let switch = CrashSwitch::new();
        let cache = FaultDevice::new("cache", 64 << 10, 1).with_crash_switch(switch.clone());
        let origin = FaultDevice::new("origin", 64 << 10, 2).with_crash_switch(switch.clone());
        switch.arm_after_writes(3);
        cache.write_at(&filled(512, 1), 0).unwrap();
        // Reads, flushes and discards do not count.
        read(&origin, 0, 512);
        origin.flush().unwrap();
        cache.discard(4096, 512).unwrap();
        origin.write_at(&filled(512, 2), 0).unwrap();
        assert!(!switch.is_tripped());

        let err = cache.write_at(&filled(512, 3), 512).unwrap_err();
        assert!(matches!(err, DeviceError::Injected { .. }));
        assert!(switch.is_tripped());
        assert!(cache.write_at(&filled(512, 4), 1024).is_err());
        assert!(origin.write_at(&filled(512, 4), 1024).is_err());
        assert!(origin.read_at(&mut [0u8; 512], 0).is_err());
        assert!(cache.flush().is_err());
        assert!(origin.discard(0, 512).is_err());
        // clear_faults does not bring the power back.
        cache.clear_faults();
        assert!(cache.read_at(&mut [0u8; 512], 0).is_err());

        let mut expect = vec![0u8; 64 << 10];
        expect[..512].fill(1);
        assert_eq!(cache.snapshot_current(), expect);
        expect[..512].fill(2);
        assert_eq!(origin.snapshot_current(), expect);
        assert_eq!(cache.writes() + origin.writes(), 2);
        assert_eq!(cache.injected_errors(), 4);
        assert_eq!(origin.injected_errors(), 3);
        // The refused writes are not among the unflushed ones either.
        for dev in [&cache, &origin] {
            assert_eq!(
                dev.unflushed_writes(),
                1 + usize::from(dev.name() == "cache")
            );
            assert!(dev.power_loss_image()[512..1536].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn crash_switch_trip_and_arm_zero() {
        let switch = CrashSwitch::new();
        let dev = FaultDevice::new("d", 4096, 0).with_crash_switch(switch.clone());
        assert!(dev.crash_switch().is_some());
        dev.write_at(&filled(512, 1), 0).unwrap();
        switch.arm_after_writes(0);
        assert!(switch.is_tripped());
        assert!(dev.write_at(&filled(512, 2), 0).is_err());

        let switch = CrashSwitch::new();
        let dev = FaultDevice::new("d", 4096, 0).with_crash_switch(switch.clone());
        switch.trip();
        assert!(dev.flush().is_err());
        assert_eq!(dev.flushes(), 0);
    }

    #[test]
    fn crash_switch_counts_concurrent_writers_exactly() {
        const THREADS: u64 = 4;
        const WRITES_PER_THREAD: u64 = 50;
        for n in [1u64, 7, 60, 150, 200] {
            let switch = CrashSwitch::new();
            let devs = [
                Arc::new(FaultDevice::new("a", 1 << 20, 0).with_crash_switch(switch.clone())),
                Arc::new(FaultDevice::new("b", 1 << 20, 0).with_crash_switch(switch.clone())),
            ];
            switch.arm_after_writes(n);
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let devs = devs.clone();
                    std::thread::spawn(move || {
                        let mut failed_after = false;
                        for i in 0..WRITES_PER_THREAD {
                            let dev = &devs[(i % 2) as usize];
                            let offset = (t * WRITES_PER_THREAD + i) * SECTOR_BYTES;
                            match dev.write_at(&filled(SECTOR, 0xEE), offset) {
                                Ok(()) => assert!(!failed_after, "a write succeeded after a crash"),
                                Err(_) => failed_after = true,
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let total = THREADS * WRITES_PER_THREAD;
            let applied = devs.iter().map(|d| d.writes()).sum::<u64>();
            assert_eq!(applied, (n - 1).min(total), "n {n}");
            assert_eq!(switch.is_tripped(), n <= total, "n {n}");
            let written_sectors: usize = devs
                .iter()
                .map(|d| {
                    d.snapshot_current()
                        .chunks(SECTOR)
                        .filter(|s| s[0] == 0xEE)
                        .count()
                })
                .sum();
            assert_eq!(written_sectors as u64, applied, "n {n}");
        }
    }
}
