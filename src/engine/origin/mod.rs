//! The origin part: one slow device behind the cache, and what concerns
//! its blocks rather than the cache's slots.
//!
//! It owns the device and its geometry, the per-block locks every request
//! takes (`locks.rs`), the writebacks in flight to it (`flights.rs`), the
//! foreground writes its next flush must cover (`sync.rs`), the blocks a
//! lost cache left stale on it (`stale.rs`), and the foreground activity
//! that background writeback yields to. Flushes go through the methods
//! below; the data path's reads and writes (timed for admission, ordered
//! against the journal) are `io/data.rs`'s, and discards, health and close
//! the engine's, over `device()`.
//!
//! The counters it bumps are the engine's (`Stats`), handed in by the
//! caller.

pub mod address;
pub(crate) mod checks;
pub mod flights;
pub mod locks;
mod shares;
pub(crate) mod stale;
pub(crate) mod sync;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::error::{EngineError, EngineResult};
use super::modes::Mode;
use super::policy::share::{Sharing, VolumeShare};
use super::stats::{bump, Stats};
use crate::device::DeviceRef;
use crate::sync::{Mutex, Rank};
use flights::Flights;
use locks::BlockLocks;
use stale::StaleBlocks;

/// The origin part's state: one volume's slow device.
///
/// Its blocks sit at `base` in the engine's address space
/// (`address.rs`): every offset and block it is handed is an address or
/// a key there, and it turns them into the device's own offsets.
pub(crate) struct Origin {
    /// The volume's name and index.
    name: String,
    volume: usize,
    /// The address of the volume's byte 0, and its first key.
    base: u64,
    base_key: u64,
    device: DeviceRef,
    /// The volume's size: the origin's, read at open or when it grew
    /// online (`took_size`).
    bytes: AtomicU64,
    /// The cache's block size, which the origin is cut into.
    block_bytes: u64,
    /// Origin blocks that can be cached (a partial last block never is).
    blocks: AtomicU64,
    locks: BlockLocks,
    flights: Flights,
    sync: sync::OriginSync,
    /// Blocks whose only current copy was lost with the cache (`stale.rs`);
    /// `any_stale` lets requests skip the lock while there are none.
    stale: Mutex<StaleBlocks>,
    any_stale: AtomicBool,
    /// Foreground requests under way, and when the last one ended
    /// (engine ms): writeback yields to them.
    in_flight: AtomicU32,
    last_end_ms: AtomicU64,
    /// The volume's cache mode (`Mode::to_u32`), read once per request. A
    /// switch stores it before taking the metadata lock to look for dirty
    /// blocks, and a write loads it after appending its dirtying records
    /// under that lock: either the write sees the new mode or the switch
    /// sees its dirty blocks (`write_back_if_mode_changed`).
    mode: AtomicU32,
    /// Where background writeback's next watermark batch starts in this
    /// volume (a key): it sweeps the volume in address order.
    writeback_cursor: AtomicU64,
    /// Its share of the cache's slots (policy/share.rs).
    share: VolumeShare,
    /// Removed while served (`Engine::remove_volume_served`): requests are
    /// refused at the door, and the volume is left out of what the cache
    /// shows. Its place (index, keys) stays until the next open.
    retired: AtomicBool,
    /// Its device was let go (`let_go`): nothing flushes it any more.
    let_go: AtomicBool,
    /// Blocks its reads found in the cache, and those they did not: the
    /// volume's own hit ratio (`list`), beside the cache's in `Stats`.
    read_hits: AtomicU64,
    read_misses: AtomicU64,
}

impl Origin {
    /// Volume `volume`, named `name`, on `device`.
    pub(crate) fn new(volume: usize, name: String, device: DeviceRef, block_bytes: u64) -> Origin {
        let bytes = device.size_bytes();
        let base = address::base(volume);
        Origin {
            name,
            volume,
            base,
            base_key: base / block_bytes,
            device,
            bytes: AtomicU64::new(bytes),
            block_bytes,
            blocks: AtomicU64::new(bytes / block_bytes),
            locks: BlockLocks::new(),
            flights: Flights::default(),
            sync: Default::default(),
            stale: Mutex::new(Rank::StaleBlocks, StaleBlocks::default()),
            any_stale: AtomicBool::new(false),
            in_flight: AtomicU32::new(0),
            last_end_ms: AtomicU64::new(0),
            mode: AtomicU32::new(Mode::Writeback.to_u32()),
            writeback_cursor: AtomicU64::new(base / block_bytes),
            share: VolumeShare::default(),
            retired: AtomicBool::new(false),
            let_go: AtomicBool::new(false),
            read_hits: AtomicU64::new(0),
            read_misses: AtomicU64::new(0),
        }
    }

    /// Gives the retired volume's device back (`BlockDevice::let_go`),
    /// after `quiesce` and a flush: flushes of every origin pass it over
    /// from now on.
    pub(crate) fn let_go(&self) -> EngineResult<()> {
        self.let_go.store(true, Ordering::Release);
        Ok(self.device.let_go()?)
    }

    /// The volume is being removed: false if it was already (another
    /// removal has it).
    pub(crate) fn retire(&self) -> bool {
        let was = self
            .retired
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst);
        was.is_ok()
    }

    /// The removal did not happen: the volume serves again.
    pub(crate) fn unretire(&self) {
        self.retired.store(false, Ordering::SeqCst);
    }

    /// Removed while served: requests are refused. (`SeqCst`: two
    /// removals each set their flag and then count the volumes left.)
    pub(crate) fn retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// Its share of the cache's slots.
    /// A read of this volume found `hits` blocks in the cache and missed
    /// `misses`.
    pub(crate) fn count_reads(&self, hits: u64, misses: u64) {
        if hits > 0 {
            bump(&self.read_hits, hits);
        }
        if misses > 0 {
            bump(&self.read_misses, misses);
        }
    }

    /// (hits, misses) of the volume's reads since the cache opened.
    pub(crate) fn reads(&self) -> (u64, u64) {
        (
            self.read_hits.load(Ordering::Relaxed),
            self.read_misses.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn share(&self) -> &VolumeShare {
        &self.share
    }

    pub(crate) fn device(&self) -> &DeviceRef {
        &self.device
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The address of the volume's byte 0.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// The device offset of address `addr` (one of this volume's).
    pub(crate) fn local(&self, addr: u64) -> u64 {
        debug_assert_eq!(address::volume_of(addr), self.volume);
        addr - self.base
    }

    /// Where background writeback's next batch starts (a key).
    pub(crate) fn writeback_cursor(&self) -> u64 {
        self.writeback_cursor.load(Ordering::Relaxed)
    }

    /// A batch ended at `key`: the next one starts after it.
    pub(crate) fn writeback_went_to(&self, key: u64) {
        self.writeback_cursor.store(key + 1, Ordering::Relaxed);
    }

    /// True if `key` is one of this volume's blocks that can be cached.
    pub(crate) fn cacheable(&self, key: u64) -> bool {
        key >= self.base_key && key - self.base_key < self.blocks()
    }

    /// The volume's cache mode.
    pub(crate) fn mode(&self) -> Mode {
        Mode::from_u32(self.mode.load(Ordering::SeqCst)).expect("only modes are stored")
    }

    /// Sets the volume's mode in memory; returns the old one.
    pub(crate) fn swap_mode(&self, mode: Mode) -> Mode {
        Mode::from_u32(self.mode.swap(mode.to_u32(), Ordering::SeqCst))
            .expect("only modes are stored")
    }

    /// The volume's size in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// The origin grew online to `bytes` (`Engine::grow_volume`, after the
    /// table's keys): requests may reach the new end from now on.
    pub(crate) fn took_size(&self, bytes: u64) {
        self.blocks
            .store(bytes / self.block_bytes, Ordering::Release);
        self.bytes.store(bytes, Ordering::Release);
    }

    /// The block size the origin is cut into (the cache's).
    pub(crate) fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Whole blocks, the ones that can be cached.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    /// The first and last block `len > 0` bytes at `offset` touch.
    pub(crate) fn block_span(&self, offset: u64, len: u64) -> (u64, u64) {
        (
            offset / self.block_bytes,
            (offset + len - 1) / self.block_bytes,
        )
    }

    pub(crate) fn locks(&self) -> &BlockLocks {
        &self.locks
    }

    pub(crate) fn flights(&self) -> &Flights {
        &self.flights
    }

    /// True while the device says it cannot be reached (an NBD server
    /// down: its device fails requests at once and reconnects by itself,
    /// device/nbd/link.rs). Background writeback waits meanwhile.
    pub(crate) fn unreachable(&self) -> bool {
        !self.device.is_reachable()
    }

    /// The device's loss epoch (`BlockDevice::loss_epoch`).
    pub(crate) fn loss_epoch(&self) -> u64 {
        self.device.loss_epoch()
    }

    /// Flushes the device (errors counted).
    pub(crate) fn flush(&self, stats: &Stats) -> EngineResult<()> {
        crate::sync::assert_unheld(Rank::Meta, "an origin flush");
        bump(&stats.origin_flushes, 1);
        self.device.flush().inspect_err(|_| {
            bump(&stats.origin_errors, 1);
            bump(&stats.origin_flush_losses, 1);
        })?;
        Ok(())
    }

    /// An origin flush that also fails if the origin may have lost writes
    /// sent since its loss epoch read `epoch` (a reconnect, a failed flush
    /// meanwhile). What it made durable may be called so only after this
    /// succeeds.
    pub(crate) fn flush_since(&self, stats: &Stats, epoch: u64) -> EngineResult<()> {
        self.flush(stats)?;
        if self.loss_epoch() != epoch {
            bump(&stats.origin_flush_losses, 1);
            return Err(EngineError::OriginWritesLost(
                "the origin was reconnected or failed a flush while writeback wrote to it: \
                 the blocks stay dirty and are written again"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A foreground write of `range` succeeded; `epoch` was read before it
    /// was sent (`sync.rs`).
    pub(crate) fn wrote(&self, range: Range<u64>, epoch: u64) {
        self.sync.wrote(range, epoch);
    }

    /// Makes the foreground writes that ended so far durable (a commit's
    /// first step): a flush only if there are some, so a commit in
    /// writeback needs the origin only when clients wrote to it.
    pub(crate) fn flush_foreground(&self, stats: &Stats) -> EngineResult<()> {
        self.sync
            .flush_pending(|since| self.flush_since(stats, since))
    }

    /// Fails while foreground writes a failed flush covered are not written
    /// again (a client's FLUSH and FUA report it).
    pub(crate) fn writes_lost(&self) -> EngineResult<()> {
        self.sync.check_lost()
    }

    /// Runs a foreground request's origin I/O `f`, counted so that
    /// writeback yields to it and a removal waits for it (`quiesce`);
    /// `now_ms` stamps its end. `None`, and `f` not run, once the volume
    /// is removed: counted first and the flag read after, against the
    /// removal's flag set first and the count read after (all `SeqCst`),
    /// either this sees the flag or the removal sees the count.
    pub(crate) fn foreground<T>(
        &self,
        now_ms: impl Fn() -> u64,
        f: impl FnOnce() -> T,
    ) -> Option<T> {
        let r = self.begin_foreground().then(f);
        self.end_foreground(now_ms());
        r
    }

    /// A foreground I/O to the origin starts (ended by `end_foreground`,
    /// whatever this returns): false if the volume is retired (the I/O
    /// must not be made).
    pub(crate) fn begin_foreground(&self) -> bool {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        !self.retired.load(Ordering::SeqCst)
    }

    /// A foreground I/O `begin_foreground` started is over, at `now_ms`.
    pub(crate) fn end_foreground(&self, now_ms: u64) {
        self.last_end_ms.store(now_ms, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits (up to `limit`) until no foreground I/O to the origin is under
    /// way, the volume being retired: none starts after (`foreground`).
    /// False if some was still under way at the limit (a frozen origin).
    pub(crate) fn quiesce(&self, limit: std::time::Duration) -> bool {
        crate::sync::poll_until(limit, || self.in_flight.load(Ordering::SeqCst) == 0)
    }

    /// Milliseconds from the end of the last foreground request to `now_ms`
    /// (0 while one is under way).
    pub(crate) fn quiet_ms(&self, now_ms: u64) -> u64 {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return 0;
        }
        now_ms.saturating_sub(self.last_end_ms.load(Ordering::Acquire))
    }

    /// The cache was lost holding the dirty blocks `lost` (sorted keys, the
    /// volume's): from now on their data exists nowhere, and reads of them
    /// fail. Returns the device's byte ranges they cover.
    pub(crate) fn set_stale(&self, lost: &[u64]) -> Vec<(u64, u64)> {
        let stale = StaleBlocks::of_blocks(lost);
        let ranges = self.local_ranges(&stale);
        *self.stale.lock() = stale;
        self.any_stale.store(!lost.is_empty(), Ordering::Release);
        ranges
    }

    /// Fails a read that touches a stale block.
    pub(crate) fn refuse_stale(&self, offset: u64, len: u64) -> EngineResult<()> {
        if len == 0 || !self.any_stale.load(Ordering::Acquire) {
            return Ok(());
        }
        let (first, last) = self.block_span(offset, len);
        if self.stale.lock().overlaps(first, last) {
            return Err(EngineError::StaleData(format!(
                "{offset}+{len} holds data that was lost with the cache device; the origin has \
                 only older contents (`tiercache status` lists the stale ranges)"
            )));
        }
        Ok(())
    }

    /// A write of `offset..offset+len` reached the device (the caller
    /// says so only for writes that went there): the whole blocks it
    /// covers are current again.
    pub(crate) fn heal_stale(&self, offset: u64, len: u64) {
        if len == 0 || !self.any_stale.load(Ordering::Acquire) {
            return;
        }
        let first = offset.div_ceil(self.block_bytes);
        let end = (offset + len) / self.block_bytes;
        if first < end {
            self.stale.lock().heal(first, end - 1);
        }
    }

    /// The stale ranges (device byte offset, bytes) and how many blocks.
    pub(crate) fn stale_ranges(&self) -> (Vec<(u64, u64)>, u64) {
        let s = self.stale.lock();
        (self.local_ranges(&s), s.blocks())
    }

    /// Ranges (device byte offset, bytes) and blocks `dirty` (sorted keys,
    /// the volume's) would leave stale if the cache were lost now.
    pub(crate) fn would_be_stale(&self, dirty: &[u64]) -> (Vec<(u64, u64)>, u64) {
        let s = StaleBlocks::of_blocks(dirty);
        (self.local_ranges(&s), s.blocks())
    }

    fn local_ranges(&self, s: &StaleBlocks) -> Vec<(u64, u64)> {
        let ranges = s.byte_ranges(self.block_bytes);
        ranges
            .into_iter()
            .map(|(at, n)| (at - self.base, n))
            .collect()
    }
}

/// Every volume's origin, by volume index, and the keys they have.
///
/// Append-only (`push`: `Engine::add_volume` adds one while requests run):
/// a slot per volume the cache can hold, each set once, so a reference to
/// an origin stays good and a request takes no lock to find its origin.
pub(crate) struct Origins {
    list: Box<[OnceLock<Box<Origin>>]>,
    /// Volumes set in `list` (the first `len` slots).
    len: AtomicUsize,
    keys: address::KeySpace,
    /// How they share the cache (`Sharing::to_u32`), and when the curve
    /// split last ran (engine seconds; 0: never). `shares.rs`.
    sharing: AtomicU32,
    rebalanced_s: AtomicU64,
}

impl Origins {
    /// Volume `i` on `devices[i]`, with its name; their keys are `keys`
    /// (the table's: one key space, shared, grows for both).
    pub(crate) fn new(
        devices: Vec<(String, DeviceRef)>,
        block_bytes: u64,
        keys: address::KeySpace,
    ) -> Origins {
        let list: Box<[OnceLock<Box<Origin>>]> =
            (0..address::MAX_VOLUMES).map(|_| OnceLock::new()).collect();
        let mut sizes = Vec::with_capacity(devices.len());
        for (i, (name, d)) in devices.into_iter().enumerate() {
            let o = Origin::new(i, name, d, block_bytes);
            sizes.push(o.blocks());
            assert!(list[i].set(Box::new(o)).is_ok(), "set once");
        }
        debug_assert_eq!(keys, address::KeySpace::new(block_bytes, sizes.clone()));
        Origins {
            len: AtomicUsize::new(sizes.len()),
            keys,
            list,
            sharing: AtomicU32::new(Sharing::Global.to_u32()),
            rebalanced_s: AtomicU64::new(0),
        }
    }

    /// How the volumes share the cache.
    pub(crate) fn sharing(&self) -> Sharing {
        Sharing::from_u32(self.sharing.load(Ordering::Relaxed)).expect("only kinds are stored")
    }

    pub(crate) fn set_sharing(&self, sharing: Sharing) {
        self.sharing.store(sharing.to_u32(), Ordering::Relaxed);
    }

    /// Volume `origin.volume` from now on, the one after the last (its
    /// keys already in the key space: `Engine::add_volume`).
    pub(crate) fn push(&self, origin: Origin) {
        let v = self.len();
        assert_eq!(origin.volume, v, "volumes are added in order");
        assert!(self.list[v].set(Box::new(origin)).is_ok(), "set once");
        self.len.store(v + 1, Ordering::Release);
    }

    /// True if some volume's mode keeps dirty data.
    pub(crate) fn any_holds_dirty(&self) -> bool {
        self.iter().any(|o| o.mode().holds_dirty())
    }

    /// The origin of address `addr` (a request's, checked at the door).
    pub(crate) fn at(&self, addr: u64) -> &Origin {
        self.get(address::volume_of(addr))
            .expect("a volume's address")
    }

    /// The origin of block key `key` (the table's, checked at load).
    pub(crate) fn of_key(&self, key: u64) -> &Origin {
        self.get(self.keys.split(key).0).expect("a volume's key")
    }

    pub(crate) fn get(&self, volume: usize) -> Option<&Origin> {
        self.list.get(volume)?.get().map(|o| &**o)
    }

    /// Volume 0's.
    pub(crate) fn first(&self) -> &Origin {
        self.get(0).expect("a cache has a volume")
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Origin> {
        self.list[..self.len()]
            .iter()
            .filter_map(|o| o.get().map(|o| &**o))
    }

    /// The volumes not removed while served (`Origin::retired`), with
    /// their indexes: what the cache shows and commands may name.
    pub(crate) fn live(&self) -> impl Iterator<Item = (usize, &Origin)> {
        self.iter().enumerate().filter(|(_, o)| !o.retired())
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// The keys the table may hold.
    pub(crate) fn key_space(&self) -> &address::KeySpace {
        &self.keys
    }

    /// `f` on every origin, every one tried: the first error.
    fn each(&self, f: impl Fn(usize, &Origin) -> EngineResult<()>) -> EngineResult<()> {
        let held = self
            .iter()
            .enumerate()
            .filter(|(_, o)| !o.let_go.load(Ordering::Acquire));
        let results: Vec<_> = held.map(|(i, o)| f(i, o)).collect();
        results.into_iter().collect()
    }

    /// `flush_foreground` on every origin.
    pub(crate) fn flush_foreground(&self, stats: &Stats) -> EngineResult<()> {
        self.each(|_, o| o.flush_foreground(stats))
    }

    /// Flushes every origin.
    pub(crate) fn flush(&self, stats: &Stats) -> EngineResult<()> {
        self.each(|_, o| o.flush(stats))
    }

    /// Every origin's loss epoch, for `flush_since`.
    pub(crate) fn loss_epochs(&self) -> Vec<u64> {
        self.iter().map(|o| o.loss_epoch()).collect()
    }

    /// `Origin::flush_since` on every origin, with the epochs
    /// `loss_epochs` read.
    pub(crate) fn flush_since(&self, stats: &Stats, epochs: &[u64]) -> EngineResult<()> {
        self.each(|i, o| o.flush_since(stats, epochs[i]))
    }

    /// Fails while some origin's foreground writes a failed flush covered
    /// are not written again.
    pub(crate) fn writes_lost(&self) -> EngineResult<()> {
        self.iter().try_for_each(|o| o.writes_lost())
    }

    /// Splits sorted keys by volume: (origin, its keys).
    pub(crate) fn split<'a>(
        &'a self,
        keys: &'a [u64],
    ) -> impl Iterator<Item = (&'a Origin, &'a [u64])> {
        self.iter().enumerate().map(move |(v, o)| {
            let from = keys.partition_point(|&k| k < self.keys.base_key(v));
            let to = keys.partition_point(|&k| k < self.keys.base_key(v + 1));
            (o, &keys[from..to])
        })
    }
}
