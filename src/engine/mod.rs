//! The cache engine: a slow origin device cached on a fast cache device.
//!
//! docs/engine.md is the map: a request's life, the invariants, which part
//! owns what. The parts, each owning its state behind the methods it
//! exports (its fields are private to its folder):
//!
//! - `cache/`: the `Cache`, one per cache device or cache set, which holds
//!   the parts below and the origins it serves; its steps are `impl Cache`
//!   blocks beside the state they change (`io/`, `journal/commit.rs`,
//!   `table/slots.rs`, `writeback/`, the read path, the write routes).
//!   `Engine` is the facade over one `Cache`: the public API, each a check
//!   and a call.
//! - `table/`: the mappings, sector maps, free slots and records not yet
//!   journalled, under the metadata lock (`Meta`); slots allocated,
//!   evicted and filled (`table/slots.rs`).
//! - `journal/`: the commit protocol, checkpoints, the superblock and the
//!   crash log (records not yet journalled, kept where a killed daemon
//!   does not lose them).
//! - `writeback/`: background writeback, writes waiting for a slot,
//!   `write_back_all`; the writeback order, one file per order behind the
//!   `Order` trait (`writeback/order/`).
//! - `placement/`: where new data goes on the cache device, one file per
//!   placement behind the `Placer` trait.
//! - `admission.rs`: what may enter the cache (sequential cutoff, promotion
//!   after N misses, the guard against a cache slower than the origin).
//! - `policy/`: replacement policies (kept under the metadata lock).
//! - `io/`: the cache device, and data-path access to both devices with
//!   error accounting (`data.rs`), the journal's writes and flushes, what a
//!   failing cache device leads to (`failure.rs`).
//! - `origin/`: the origin device and its geometry, the per-block locks,
//!   writebacks in flight, the flushes its foreground writes need, the
//!   blocks a lost cache left stale, the foreground activity writeback
//!   yields to (`Origin`).
//!
//! The request path through them:
//!
//! - `request.rs`: a `Request` and what it learns (segments, plan, hits).
//! - `pipeline.rs`: the door: build, lock, resolve (mode and admission, in
//!   one place, once), look up, dispatch; the fast paths.
//! - `read.rs`: the read path. `modes/`: one file per write route.
//!   `write.rs`: trim, zeroes, flush, and what every route shares.
//!
//! And around them: `options.rs` (what a cache is created and opened
//! with), `status.rs` (what `status` reports), `format/` (the on-disk
//! format), `recovery.rs` (open, replay, the offline `check`), `observe/`
//! (latency histograms, heat map, miss-ratio curve), `async_engine.rs` (the engine as a `Volume`),
//! `table/introspect.rs` (what the cache holds), `clock.rs`, `stats.rs`,
//! `load_fuzz.rs` (loading metadata from untrusted bytes).
//!
//! Threads, locks and their order: docs/concurrency.md. Every lock has a rank
//! (`crate::sync::Rank`), checked in debug builds.

pub mod admission;
pub mod async_engine;
pub(crate) mod cache;
pub mod clock;
pub(crate) mod delivery;
pub mod error;
pub mod format;
pub mod io;
pub mod journal;
pub use journal::{commit, crash_log};
pub(crate) use table::Meta;
pub use table::{map as meta, sectors};
#[cfg(any(test, feature = "testing"))]
pub mod load_fuzz;
pub mod modes;
pub mod observe;
pub mod options;
pub mod origin;
pub mod pipeline;
pub(crate) mod placement;
pub mod policy;
pub mod read;
pub mod recovery;
pub mod request;
pub mod stats;
pub mod status;
pub mod table;
pub mod write;
pub mod writeback;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::device::{AlignedBuf, DeviceRef};
use crate::engine::cache::Cache;
use crate::volume::Dest;
pub use admission::AdmissionSettings;
pub use error::{EngineError, EngineResult};
pub use modes::Mode;
pub use options::{
    CreateOptions, OpenOptions, Placement, WritebackOrder, WritebackSettings,
    DEFAULT_CACHE_ERROR_LIMIT, MAX_AGE_SECS,
};
use origin::checks;
use policy::share::{Share, ShareChange, Sharing};
use policy::PolicyKind;
pub use request::{Fast, Request};
pub use status::{CrashLogStatus, Observations, Status, VolumeStatus};

pub use io::FailoverHook;

/// Rounds of write back and drop a volume removed while served gets before
/// the removal gives up (`Engine::drain_volume`): a block stays only while
/// a write to it that started before the removal is under way.
const DRAIN_ROUNDS: usize = 200;

pub struct Engine {
    /// The cache part (cache/): the table, the journal, the cache
    /// device's I/O, admission, placement, writeback and its order, the
    /// counters and the origins it serves.
    cache: cache::Cache,
}

impl Engine {
    /// Formats `cache` for `origin` and opens the new cache. Never writes
    /// to the origin.
    pub fn create(
        cache: DeviceRef,
        origin: DeviceRef,
        opts: &CreateOptions,
    ) -> EngineResult<Arc<Engine>> {
        Engine::create_with(cache, origin, opts, &OpenOptions::default())
    }

    /// `create`, then opened with `open` (its `allow_data_loss` is the
    /// create options').
    pub fn create_with(
        cache: DeviceRef,
        origin: DeviceRef,
        opts: &CreateOptions,
        open: &OpenOptions,
    ) -> EngineResult<Arc<Engine>> {
        let named = vec![(format::volumes::default_name(0), origin)];
        Engine::create_volumes(cache, named, opts, open)
    }

    /// Formats `cache` for several origins, each a volume with a name
    /// (`origins[i]` is volume `i`), and opens the new cache.
    pub fn create_volumes(
        cache: DeviceRef,
        origins: Vec<(String, DeviceRef)>,
        opts: &CreateOptions,
        open: &OpenOptions,
    ) -> EngineResult<Arc<Engine>> {
        recovery::format_cache(&cache, &origins, opts, &open.clock)?;
        Engine::open_volumes(
            cache,
            origins.into_iter().map(|(_, o)| o).collect(),
            &OpenOptions {
                force: false,
                allow_data_loss: opts.allow_data_loss,
                ..open.clone()
            },
        )
    }

    /// Opens an existing cache, replaying its journal after a crash.
    pub fn open(
        cache: DeviceRef,
        origin: DeviceRef,
        opts: &OpenOptions,
    ) -> EngineResult<Arc<Engine>> {
        Engine::open_volumes(cache, vec![origin], opts)
    }

    /// `open` for a cache of several origins, given in its volumes' order.
    pub fn open_volumes(
        cache: DeviceRef,
        origins: Vec<DeviceRef>,
        opts: &OpenOptions,
    ) -> EngineResult<Arc<Engine>> {
        let engine = Arc::new(recovery::open(cache, origins, opts)?);
        if !opts.no_background {
            writeback::start_background(&engine);
        }
        Ok(engine)
    }

    /// Opens a cache only to look at it: recovery runs in memory and
    /// nothing is written (`recovery::open_read_only`); the engine refuses
    /// every operation but `status` and `dirty_blocks`. Give it devices
    /// opened read-only (`open_device_read_only`), so that nothing could
    /// be written even by mistake.
    pub fn open_read_only(
        cache: DeviceRef,
        origin: DeviceRef,
        opts: &OpenOptions,
    ) -> EngineResult<Arc<Engine>> {
        Engine::open_volumes_read_only(cache, vec![origin], opts)
    }

    /// `open_read_only` for a cache of several origins, in its volumes'
    /// order.
    pub fn open_volumes_read_only(
        cache: DeviceRef,
        origins: Vec<DeviceRef>,
        opts: &OpenOptions,
    ) -> EngineResult<Arc<Engine>> {
        Ok(Arc::new(recovery::open_read_only(cache, origins, opts)?))
    }

    /// The first volume's size (a cache of one origin: the volume's).
    pub fn volume_bytes(&self) -> u64 {
        self.cache.origins.first().bytes()
    }

    /// Volume `v`'s cache mode (the first volume's for no such volume).
    pub fn volume_mode(&self, v: usize) -> Mode {
        self.cache.origins.get(v).map_or(self.mode(), |o| o.mode())
    }

    /// Volume `v`'s size now (0 for no such volume).
    pub fn volume_size(&self, v: usize) -> u64 {
        self.cache.origins.get(v).map_or(0, |o| o.bytes())
    }

    /// The volumes: (name, address of byte 0, bytes), by index
    /// (origin/address.rs: a request for volume `v` adds its base to its
    /// offset).
    pub fn volumes(&self) -> Vec<(String, u64, u64)> {
        let list = self.cache.origins.iter();
        list.map(|o| (o.name().to_string(), o.base(), o.bytes()))
            .collect()
    }

    /// The index of the volume named `name`.
    pub fn volume_index(&self, name: &str) -> EngineResult<usize> {
        let mut live = self.cache.origins.live();
        live.find(|(_, o)| o.name() == name)
            .map(|(v, _)| v)
            .ok_or_else(|| {
                let all: Vec<&str> = self.cache.origins.live().map(|(_, o)| o.name()).collect();
                EngineError::NoSuchVolume(format!(
                    "no volume named '{name}' in this cache (its volumes: {})",
                    all.join(", ")
                ))
            })
    }

    /// By a volume's name, as commands give it (`--volume`): `None` is
    /// every volume (`write_back_all`), else `write_back_volume`.
    pub fn write_back_named(
        &self,
        volume: Option<&str>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        match volume {
            None => self.cache.write_back_all(progress),
            Some(name) => self
                .cache
                .write_back_volume(self.volume_index(name)?, progress),
        }
    }

    /// By a volume's name: `None` is the first volume (`warm_volume`).
    pub fn warm_named(
        &self,
        volume: Option<&str>,
        offset: u64,
        len: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        let v = volume.map_or(Ok(0), |name| self.volume_index(name))?;
        self.cache.warm_volume(v, offset, len, progress)
    }

    /// By a volume's name: `None` is every volume (`set_mode`), else
    /// `set_volume_mode`.
    pub fn set_mode_named(&self, volume: Option<&str>, mode: Mode) -> EngineResult<()> {
        match volume {
            None => self.set_mode(mode),
            Some(name) => self.set_volume_mode(self.volume_index(name)?, mode),
        }
    }

    /// By a volume's name: `None` is every volume. Returns each grown
    /// volume's name, bytes before and bytes now (`grow_volume`); a volume
    /// that did not grow is left out.
    pub fn grow_named(&self, volume: Option<&str>) -> EngineResult<Vec<(String, u64, u64)>> {
        let which: Vec<usize> = match volume {
            Some(name) => vec![self.volume_index(name)?],
            None => self.cache.origins.live().map(|(v, _)| v).collect(),
        };
        let mut grown = Vec::new();
        for v in which {
            let (was, now) = self.grow_volume(v)?;
            if now != was {
                grown.push((
                    self.cache
                        .origins
                        .get(v)
                        .map_or("", |o| o.name())
                        .to_string(),
                    was,
                    now,
                ));
            }
        }
        Ok(grown)
    }

    /// Volume `v`'s origin grew (lvextend, a longer file, `rbd resize`):
    /// reads its size again and takes a larger one online. Returns the
    /// bytes before and now (equal: it did not grow). A smaller size is
    /// refused, the volume left as it was.
    ///
    /// The origin is flushed first, so its new length is durable before
    /// the superblock records it; the table's keys, the heat map and the
    /// origin's end follow, in that order, so a request that reaches the
    /// new end finds its blocks cacheable. Until the superblock write a
    /// crash leaves the old size, and the next open is told again
    /// (`serve --origin-grew`) or `resize` run once more.
    pub fn grow_volume(&self, v: usize) -> EngineResult<(u64, u64)> {
        self.cache.check_open()?;
        let origin = self.cache.volume(v)?;
        let was = origin.bytes();
        let now = origin.device().refresh_size()?;
        origin::checks::check_growth(origin.device(), origin.name(), was, now)?;
        if now == was {
            return Ok((was, now));
        }
        origin.flush(&self.cache.stats)?;
        let blocks = now / self.cache.block_bytes;
        self.cache.update_superblock_then(
            |sb| sb.set_volume_bytes(v, now),
            || {
                self.cache.meta.grow_volume(v, blocks);
                self.cache.observe.accesses.volume_grew(v);
                origin.took_size(now);
            },
        )?;
        log::info!(
            "{}: the origin of volume {} grew from {was} to {now} bytes, taken online",
            origin.device().name(),
            origin.name()
        );
        Ok((was, now))
    }

    /// Takes a cache device that grew (a longer file, a grown partition or
    /// logical volume: `tiercache resize --cache`) while requests run.
    /// It is measured again; one that shrank is refused (its last slots
    /// may hold the only copy of dirty data). The new slots and the
    /// checkpoint areas, which move past them, go in with one checkpoint
    /// (`checkpoint_grown`); then the curves' size and the shares' floors
    /// follow. A cache set does not grow (`replace-cache` swaps its
    /// members). Returns the slots before and after.
    pub fn grow_cache(&self) -> EngineResult<(u64, u64)> {
        self.cache.check_open()?;
        let cache = self.cache.io.cache().clone();
        let refuse = |why: String| Err(EngineError::Config(why));
        if cache.members().is_some() || self.cache.failed_over() {
            return refuse(match self.cache.failed_over() {
                true => "the cache failed over to its origin: it cannot grow until reopened".into(),
                false => "a cache set does not grow: replace its members with larger ones \
                          (`tiercache replace-cache`), one at a time"
                    .into(),
            });
        }
        let recorded = self.cache.journal.superblock().cache_device_bytes.get();
        let now = cache.refresh_size()?;
        let slots = self.cache.observe.slot_count();
        if now < recorded {
            return refuse(format!(
                "{}: the cache device shrank from {recorded} to {now} bytes. A cache never \
                 shrinks (its last blocks may hold the only copy of written data): give the \
                 device its size back and run `tiercache resize --cache` again (blocks past \
                 the end fail until then); for a smaller cache, detach and create it again",
                cache.name()
            ));
        }
        if now == recorded {
            return Ok((slots, slots));
        }
        let (was, grown) = self.checkpoint_grown_after_groups(now)?;
        if grown == was {
            return Ok((was, grown));
        }
        self.cache.observe.slots_grew(grown);
        (self.cache.origins).share_as(self.cache.origins.sharing(), &self.cache.observe, grown);
        log::info!(
            "{}: the cache device grew from {recorded} to {now} bytes: {was} -> {grown} blocks, \
             taken online",
            cache.name()
        );
        Ok((was, grown))
    }

    /// `checkpoint_grown`, after writing back the flush groups waiting for
    /// the origin (writeback in flush order: a checkpoint keeps none), as
    /// `close` does; groups that close meanwhile are written back too, a
    /// few times over before the grow is refused.
    fn checkpoint_grown_after_groups(&self, device_bytes: u64) -> EngineResult<(u64, u64)> {
        for _ in 0..3 {
            self.cache.order.write_back_closed(&self.cache)?;
            if let Some(grown) = self.cache.checkpoint_grown(device_bytes)? {
                return Ok(grown);
            }
        }
        Err(EngineError::Config(
            "writeback in flush order keeps closing groups faster than they reach the origin, \
             and a checkpoint cannot keep them: run `tiercache flush`, then resize again"
                .into(),
        ))
    }

    /// Adds `origin` as volume `name` while requests run (`tiercache
    /// add-origin` of a served cache), in `mode` or else the cache's;
    /// returns its index. It is checked as a new cache's volumes are
    /// (`checks::add_volumes`: a valid, new name; one block to 4 PiB; not
    /// a device the cache has). The superblock records it first, then the
    /// table's keys, the access counts and curves, and last the origin:
    /// nothing can name the volume before it is whole, and no request
    /// reaches it before the caller serves it. A crash after the superblock
    /// write leaves the cache with a volume its registry lacks, which
    /// every open refuses, naming `add-origin`; run again, it finishes.
    pub fn add_volume(
        &self,
        name: &str,
        origin: DeviceRef,
        mode: Option<Mode>,
    ) -> EngineResult<usize> {
        self.cache.check_open()?;
        let blocks = origin.size_bytes() / self.cache.block_bytes;
        let device = origin.clone();
        // The cache's mode, read from the superblock under the commit lock.
        let cache_mode = std::cell::Cell::new(Mode::Writeback);
        let v = self.cache.update_superblock_checked(
            |sb| {
                cache_mode.set(Mode::from_u32(sb.mode.get()).expect("a valid superblock"));
                let devices: Vec<DeviceRef> = (self.cache.origins.iter())
                    .map(|o| o.device().clone())
                    .chain([device])
                    .collect();
                checks::add_volumes(*sb, &devices, &[name.to_string()])
            },
            || {
                let v = self.cache.meta.add_volume(blocks);
                self.cache.observe.accesses.volume_added(v);
                self.cache.observe.volumes_now(v + 1);
                let o = origin::Origin::new(v, name.to_string(), origin, self.cache.block_bytes);
                o.swap_mode(cache_mode.get());
                o.share().set(Share::default());
                self.cache.origins.push(o);
                v
            },
        )?;
        log::info!("volume {name} added online as volume {v}");
        if let Some(mode) = mode {
            self.set_volume_mode(v, mode)?;
        }
        Ok(v)
    }

    /// Takes volume `v` out of the cache (`tiercache remove-origin`): its
    /// dirty blocks are written back (in flush order, every volume's) and
    /// its blocks dropped, then one checkpoint without it becomes current
    /// with the superblock's volume list (`checkpoint_without_volume`): the
    /// volumes after it move down one place. Its origin holds all its data.
    /// Refused for the only volume (`detach` takes a cache apart) and for a
    /// volume with stale ranges (its origin lacks data a lost cache held).
    /// The engine is closed after, whatever the outcome; the next open is
    /// given the origins left.
    pub fn remove_volume(&self, v: usize, progress: &mut dyn FnMut(u64, u64)) -> EngineResult<()> {
        self.cache.check_open()?;
        let origin = self.cache.volume(v)?;
        self.removable(origin)?;
        self.cache.write_back_volume(v, progress)?;
        self.cache.order.check_written_back(&self.cache)?;
        self.cache.drop_volume_blocks(v)?;
        writeback::stop_background(self);
        self.shut();
        let removed = self.cache.checkpoint_without_volume(v);
        if removed.is_ok() {
            self.remove_crash_log();
        }
        self.close_origin();
        removed
    }

    /// Takes volume `v` out while the other volumes are served (`tiercache
    /// remove-origin` of a served cache). Its requests are refused from
    /// now on; its dirty blocks are written back and its blocks dropped
    /// (`drop_volume_blocks_served`, round after round until none is
    /// left: a write that was under way finishes, or goes around the
    /// cache); the drops are committed; then the superblock marks its
    /// record removed. The volume keeps its place (index, keys) until the
    /// next open takes the record out and moves the volumes after it down
    /// (recovery.rs, `finish_removals`). Last, its origin is flushed and
    /// let go (`BlockDevice::let_go`): it stands alone with all its data.
    /// A crash before the superblock write leaves the volume in the cache,
    /// its data on its origin; after it, removed. Refused as
    /// `remove_volume` is, and where the writeback order keeps the
    /// volumes' writes together.
    pub fn remove_volume_served(
        &self,
        v: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        self.cache.check_open()?;
        let origin = self.cache.volume(v)?;
        self.removable(origin)?;
        self.cache.order.removes_served()?;
        self.claim_removal(origin)?;
        if let Err(e) = self.drain_volume(v, progress) {
            self.cache.meta.unseal_volume(v);
            origin.unretire();
            return Err(e);
        }
        self.cache.update_superblock_checked(
            |sb| match sb.volume_list().get(v) {
                Some(e) if !e.removed => {
                    let mut next = *sb;
                    next.set_volume_removed(v);
                    Ok(next)
                }
                _ => Err(self.cache.no_volume(v)),
            },
            || origin.share().set(Share::default()),
        )?;
        let slots = self.cache.observe.slot_count();
        (self.cache.origins).share_as(self.cache.origins.sharing(), &self.cache.observe, slots);
        self.let_origin_go(origin)
    }

    /// The last step of `remove_volume_served`: once no request's I/O to
    /// the origin is under way (none starts now: `Origin::foreground`),
    /// it is flushed and let go. Against a frozen origin the removal
    /// stands and the device stays open until the daemon stops.
    fn let_origin_go(&self, origin: &origin::Origin) -> EngineResult<()> {
        let name = origin.device().name();
        if !origin.quiesce(std::time::Duration::from_secs(30)) {
            return Err(EngineError::Config(format!(
                "volume {} is removed, but I/O to its origin {name} is still under way after \
                 30 s (is it frozen?): the origin is let go when the daemon stops",
                origin.name()
            )));
        }
        origin.flush(&self.cache.stats)?;
        origin.let_go()?;
        log::info!(
            "{name}: volume {} removed while served; its origin stands alone",
            origin.name()
        );
        Ok(())
    }

    /// Writes volume `v` back and drops its blocks until none is left
    /// (`remove_volume_served`), then commits the drops.
    fn drain_volume(&self, v: usize, progress: &mut dyn FnMut(u64, u64)) -> EngineResult<()> {
        let name = || {
            self.cache
                .origins
                .get(v)
                .map_or("?", |o| o.name())
                .to_string()
        };
        for _ in 0..DRAIN_ROUNDS {
            self.cache.write_back_volume(v, progress)?;
            if self.cache.drop_volume_blocks_served(v)? == 0 {
                return self.cache.commit();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(EngineError::Config(format!(
            "volume {} kept busy blocks through {DRAIN_ROUNDS} rounds of write back; nothing \
             was removed: try again",
            name()
        )))
    }

    /// Why volume `origin` cannot be taken out: it is the cache's only
    /// one left, or its origin lacks data a lost cache held.
    fn removable(&self, origin: &origin::Origin) -> EngineResult<()> {
        if origin.retired() {
            return Err(Self::removing_already(origin));
        }
        if self.cache.origins.live().count() == 1 {
            return Err(Self::only_volume(origin));
        }
        let (stale, blocks) = origin.stale_ranges();
        if !stale.is_empty() {
            return Err(EngineError::Config(format!(
                "volume {} has {blocks} stale blocks in {} ranges: its origin lacks data a lost \
                 cache held, and removing the volume would lift the guard on them",
                origin.name(),
                stale.len()
            )));
        }
        Ok(())
    }

    /// Marks volume `origin` retired for a removal while served, and
    /// checks again once it is: two removals at once (a control
    /// connection each) may take neither the same volume twice nor every
    /// volume. Each sets its flag first and counts the volumes left after
    /// (`SeqCst`), so of two that would leave none, one sees the other.
    fn claim_removal(&self, origin: &origin::Origin) -> EngineResult<()> {
        if !origin.retire() {
            return Err(Self::removing_already(origin));
        }
        if self.cache.origins.live().next().is_none() {
            origin.unretire();
            return Err(Self::only_volume(origin));
        }
        Ok(())
    }

    fn removing_already(origin: &origin::Origin) -> EngineError {
        EngineError::Config(format!("volume {} is being removed already", origin.name()))
    }

    fn only_volume(origin: &origin::Origin) -> EngineError {
        EngineError::Config(format!(
            "volume {} is the cache's only one: `tiercache detach` takes the cache apart",
            origin.name()
        ))
    }

    /// Which bytes of `[offset, offset + len)` (an address) the cache holds
    /// and which of those are dirty, as extents (`table/introspect.rs`).
    pub fn cache_state(&self, offset: u64, len: u64) -> Vec<crate::volume::Extent> {
        match self.cache.origins.get(origin::address::volume_of(offset)) {
            Some(o) => self.cache.meta.cache_state(o, offset, len),
            None => vec![crate::volume::Extent {
                len: len.max(1),
                flags: 0,
            }],
        }
    }

    pub fn block_bytes(&self) -> u32 {
        self.cache.block_bytes as u32
    }

    /// Volume 0's mode (of a cache of one origin: the cache's).
    pub fn mode(&self) -> Mode {
        self.cache.origins.first().mode()
    }

    /// Puts back the modes `swap_mode` returned.
    pub(crate) fn restore_modes(&self, old: Vec<Mode>) {
        for (o, mode) in self.cache.origins.iter().zip(old) {
            o.swap_mode(mode);
        }
    }

    pub fn cache_device(&self) -> &DeviceRef {
        self.cache.io.cache()
    }

    /// The first volume's origin.
    pub fn origin_device(&self) -> &DeviceRef {
        self.cache.origins.first().device()
    }

    pub fn status(&self) -> Status {
        let cache = &self.cache;
        let stopped = cache.io.admission_stopped();
        let limit = cache.io.cache_error_limit();
        let writeback = self.cache.writeback.settings();
        let stale = cache.stale_ranges();
        let stale_blocks = stale.iter().map(|(_, n)| n).sum();
        // Before the metadata lock: a device's health takes its own lock.
        let health = cache.origins.iter().map(|o| o.device().health()).collect();
        let set = cache.io.cache().members();
        let mut members = set.map(|s| s.member_statuses()).unwrap_or_default();
        let mut m = cache.meta.lock();
        // Under the metadata lock, as the counts below: an eviction counts
        // its demotion under it, so used blocks and demotions agree (a
        // snapshot taken before the lock raced the background's evictions
        // after a restart: engine_model's warm-restart check failed once).
        let stats = cache.stats.snapshot();
        let errors = stats.cache_errors;
        let dirty = m.table().dirty_count();
        let volumes = self.volume_statuses(m.table().regions.totals(), stale, health);
        if let Some(set) = set {
            member_usage(&m, set, &mut members, dirty);
        }
        let metadata_bytes =
            m.heap_bytes() + cache.admission.heap_bytes() + cache.observe.heap_bytes();
        Status {
            metadata_bytes,
            partial_blocks: m.table().partial_count() as u64,
            crash_log: m.crash_log_ref().map(|l| CrashLogStatus {
                path: l.path().display().to_string(),
                records_pending: l.len(),
                capacity_records: l.capacity(),
            }),
            admission_settings: cache.admission.settings(),
            mrc: cache.observe.mrc(),
            guard_engaged: cache.admission.guard_engaged(),
            state: ["running", "closed"][usize::from(self.cache.closed.load(Ordering::Acquire))]
                .into(),
            mode: self.mode(),
            policy: m.policy_kind().name().into(),
            placement: cache.placement.setting(),
            writeback_order: self.cache.order.setting(),
            flush_groups: m.groups().map(|g| g.counts()),
            free_segments: m.pools().all_segments().map(|s| s.whole() as u64).sum(),
            scattered_slots: m.pools().all_segments().map(|s| s.scattered).sum(),
            block_bytes: cache.block_bytes as u32,
            volume_bytes: volumes[0].bytes,
            origin: volumes[0].origin.clone(),
            origin_health: volumes[0].origin_health.clone(),
            cache: cache.io.cache().name().into(),
            cache_blocks_total: m.table().slot_count(),
            cache_blocks_used: m.table().used(),
            cache_blocks_dirty: m.table().dirty_count(),
            writeback,
            admitting: !stopped,
            admission: self.admission_line(stopped, errors, limit, stale_blocks),
            cache_error_limit: limit,
            cache_members: members,
            stale_ranges: volumes[0].stale_ranges.clone(),
            stale_blocks,
            volumes,
            sharing: cache.origins.sharing(),
            cache_set_state: set.map(|s| s.state_name().to_string()),
            // On one cache device every dirty block has one copy: 0.
            dirty_at_risk: dirty * u64::from(set.is_some_and(|s| s.degraded())),
            stats,
        }
    }

    /// Each volume's status, from its (cached, dirty) blocks, its stale
    /// (ranges, blocks) and its origin's health, all by volume.
    fn volume_statuses(
        &self,
        counts: Vec<(u64, u64)>,
        stale: Vec<(Vec<(u64, u64)>, u64)>,
        health: Vec<Option<crate::device::DeviceHealth>>,
    ) -> Vec<VolumeStatus> {
        let each = self.cache.origins.iter().zip(counts).zip(stale).zip(health);
        // A volume removed while served is shown no more.
        let each = (each.enumerate()).filter(|(_, (((o, _), _), _))| !o.retired());
        each.map(
            |(v, (((o, (used, dirty)), (ranges, blocks)), origin_health))| VolumeStatus {
                name: o.name().to_string(),
                origin: o.device().name().into(),
                bytes: o.bytes(),
                mode: o.mode(),
                origin_health,
                cache_blocks_used: used,
                cache_blocks_dirty: dirty,
                stale_ranges: ranges,
                stale_blocks: blocks,
                share: o.share().get(),
                share_floor_blocks: o.share().floor_blocks(self.cache.observe.slot_count()),
                mrc: self.cache.observe.volume_mrc(v),
                read_hits: o.reads().0,
                read_misses: o.reads().1,
            },
        )
        .collect()
    }

    /// What `status` says under "admission": a cache given up, a stop
    /// with dirty data at stake, a failover, a stop, or admitting.
    fn admission_line(&self, stopped: bool, errors: u64, limit: u64, stale_blocks: u64) -> String {
        if stale_blocks > 0 && self.cache.failed_over() {
            format!(
                "failed over: the cache device was given up holding dirty data; \
                 {stale_blocks} blocks of the origin are stale (their data was lost) and \
                 reads of them fail; the rest of the volume is served from the origin"
            )
        } else if stale_blocks > 0 {
            format!(
                "stopped: the cache device failed {errors} times (limit {limit}) and holds \
                 the only copy of {stale_blocks} dirty blocks: those origin ranges are stale \
                 (status lists them) until it answers again and they are written back"
            )
        } else if self.cache.failed_over() {
            format!(
                "failed over: the cache device failed {errors} times and its metadata \
                 could not be written; all I/O goes to the origin until the cache \
                 is reopened"
            )
        } else if stopped {
            format!(
                "stopped: the cache device failed {errors} times (limit {limit}); \
                 cached blocks are still served and written back, no new ones are \
                 admitted until the cache is reopened"
            )
        } else if limit == 0 {
            "admitting (no cache error limit)".into()
        } else {
            format!("admitting ({errors} of {limit} cache errors)")
        }
    }

    /// Every volume's heat map, the latency histograms and the miss-ratio
    /// curve, for the metrics endpoint and the dashboard. Holds the
    /// metadata lock only to copy each heat map's 2 x 1024 counters.
    pub fn observations(&self) -> Observations {
        Observations {
            heats: (self.cache.origins.live())
                .map(|(v, _)| self.heat_map(v))
                .collect(),
            latency: self.cache.observe.latency.snapshot(),
            mrc: self.cache.observe.mrc(),
        }
    }

    /// Volume `v`'s heat map (empty for no such volume).
    pub fn heat_map(&self, v: usize) -> observe::heat::HeatMap {
        let (cached, dirty) = self.cache.meta.regions(v);
        let blocks = self.cache.origins.get(v).map_or(0, |o| o.blocks());
        observe::heat::HeatMap {
            region_blocks: blocks.max(1).div_ceil(observe::heat::REGIONS as u64),
            block_bytes: self.cache.block_bytes as u32,
            cached,
            dirty,
            accesses: self.cache.observe.accesses.snapshot(v),
        }
    }

    pub fn dirty_blocks(&self) -> u64 {
        self.cache.meta.dirty_count()
    }

    /// Makes every completed write and every applied record durable
    /// (journal/commit.rs).
    pub fn commit(&self) -> EngineResult<()> {
        self.cache.commit()
    }

    /// Commits, then writes a checkpoint of the whole table, emptying the
    /// journal (journal/commit.rs).
    pub fn checkpoint(&self) -> EngineResult<()> {
        self.cache.checkpoint()
    }

    /// Changes the cache error limit (0: never stop admitting); persisted
    /// in the superblock (io/failure.rs).
    pub fn set_cache_error_limit(&self, limit: u64) -> EngineResult<()> {
        self.cache.set_cache_error_limit(limit)
    }

    /// Sets the function called when the cache fails over to the origin
    /// (io/failure.rs).
    pub fn on_failover(&self, hook: FailoverHook) {
        self.cache.on_failover(hook)
    }

    /// False once the cache error limit was reached or the cache failed
    /// over.
    pub fn admitting(&self) -> bool {
        self.cache.admitting()
    }

    /// True once the cache failed over to the origin.
    pub fn failed_over(&self) -> bool {
        self.cache.failed_over()
    }

    /// Replaces member `member` of the cache set with `new` and rebuilds
    /// its copies online; `progress` gets bytes copied and bytes to copy
    /// (io/failure.rs).
    pub fn replace_cache_member(
        &self,
        member: usize,
        new: DeviceRef,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        self.cache.check_open()?;
        self.cache.replace_member(member, new, progress)
    }

    /// The operator's word that the cache device is gone for good: its
    /// dirty blocks are lost, their origin ranges become stale, the cache
    /// fails over to the origin. Returns how many blocks were lost
    /// (io/failure.rs).
    pub fn give_up_cache(&self) -> EngineResult<u64> {
        self.cache.check_open()?;
        self.cache.give_up()
    }

    /// Reads `len` bytes at `offset`.
    /// (`Cache::read`, pipeline.rs)
    pub fn read(&self, offset: u64, len: u64) -> EngineResult<AlignedBuf> {
        self.cache.read(offset, len)
    }

    /// Reads `dest.len()` bytes at `offset` into the reader's buffer, given
    /// back to `reply` as soon as it is filled (before the read's
    /// promotion is stored). (`Cache::read_into`, pipeline.rs)
    pub fn read_into(&self, offset: u64, dest: Dest, reply: impl FnOnce(Dest, EngineResult<()>)) {
        self.cache.read_into(offset, dest, reply)
    }

    /// Copies a range into the cache (NBD_CMD_CACHE); returns nothing.
    /// (`Cache::prefetch`, pipeline.rs)
    pub fn prefetch(&self, offset: u64, len: u64) -> EngineResult<()> {
        self.cache.prefetch(offset, len)
    }

    /// `warm` of `len` bytes at `offset` of volume `v`.
    /// (`Cache::warm_volume`, pipeline.rs)
    pub fn warm_volume(
        &self,
        v: usize,
        offset: u64,
        len: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        self.cache.warm_volume(v, offset, len, progress)
    }

    /// Promotes `len` bytes at `offset` into the cache ahead of use (see
    /// `ReadKind::Warm`), in requests of `WARM_CHUNK_BYTES` so that block
    /// locks are held briefly; `progress` gets (bytes done, bytes to do).
    /// (`Cache::warm`, pipeline.rs)
    pub fn warm(
        &self,
        offset: u64,
        len: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        self.cache.warm(offset, len, progress)
    }

    /// The read, done on the caller's thread, if every block it touches is
    /// unlocked and holds the requested sectors: one cache device read per
    /// run of adjacent slots, never an origin read or a wait for another
    /// request.
    /// (`Cache::try_read_hits`, pipeline.rs)
    pub fn try_read_hits(&self, offset: u64, len: u64) -> Fast<AlignedBuf> {
        self.cache.try_read_hits(offset, len)
    }

    /// Writes `data` at `offset`; with `fua`, durable on return.
    /// (`Cache::write`, pipeline.rs)
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> EngineResult<()> {
        self.cache.write(offset, data, fua)
    }

    /// Finishes a write a fast path handed on (`try_write_cached`), or
    /// starts one; `data` is the request's.
    /// (`Cache::write_request`, pipeline.rs)
    pub fn write_request(&self, req: Request, data: &[u8]) -> EngineResult<()> {
        self.cache.write_request(req, data)
    }

    /// The write, done on the caller's thread, if it goes into the cache,
    /// every block it touches is unlocked, and it needs no origin I/O and no
    /// commit: segments that are all dirty or empty sectors of adjacent
    /// slots are written in place with one cache write; whole blocks, and
    /// parts of blocks not cached, otherwise go to new slots while free
    /// slots are plentiful and admission lets them in (the background keeps
    /// a reserve, so no eviction or commit is needed).
    /// (`Cache::try_write_cached`, pipeline.rs)
    pub fn try_write_cached(&self, offset: u64, data: &[u8], fua: bool) -> Fast<()> {
        self.cache.try_write_cached(offset, data, fua)
    }

    /// Writes zeroes over a range.
    /// (`Cache::write_zeroes`, write.rs)
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.cache.write_zeroes(offset, len, fua)
    }

    /// Discards a range: cached copies of whole blocks in it are dropped
    /// (dirty ones too: their contents no longer matter) and the origin is
    /// told.
    /// (`Cache::trim`, write.rs)
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> EngineResult<()> {
        self.cache.trim(offset, len, fua)
    }

    /// Makes every completed write durable (NBD FLUSH): a commit.
    /// (`Cache::flush`, write.rs)
    pub fn flush(&self) -> EngineResult<()> {
        self.cache.flush()
    }

    /// `flush` for the clients of volume `v`.
    /// (`Cache::flush_volume`, write.rs)
    pub fn flush_volume(&self, v: usize) -> EngineResult<()> {
        self.cache.flush_volume(v)
    }

    /// One round of background work: the curve split of the cache when
    /// due (origin/shares.rs), writeback batches until nothing is due (at
    /// most 64), the free-slot reserve, a commit when one is due, and
    /// giving back the crash log's durable pages.
    /// (`Cache::background_tick`, writeback/run.rs)
    pub fn background_tick(&self) {
        self.cache.background_tick()
    }

    /// One batch of background writeback: keeps the free-slot reserve,
    /// then writes back what the watermarks, ages and idle time call for
    /// now, as the writeback order takes it (`Order::background_step`).
    /// (`Cache::writeback_step`, writeback/run.rs)
    pub fn writeback_step(&self) -> EngineResult<usize> {
        self.cache.writeback_step()
    }

    /// Writes back every block dirty when it is called (and, when the mode
    /// holds no dirty data, until none is left), then commits.
    /// (`Cache::write_back_all`, writeback/run.rs)
    pub fn write_back_all(&self, progress: &mut dyn FnMut(u64, u64)) -> EngineResult<()> {
        self.cache.write_back_all(progress)
    }

    /// `write_back_all` for volume `v` alone (`Engine::volume_index` finds
    /// it by name): the other volumes' dirty blocks stay.
    /// (`Cache::write_back_volume`, writeback/run.rs)
    pub fn write_back_volume(
        &self,
        v: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> EngineResult<()> {
        self.cache.write_back_volume(v, progress)
    }

    /// Gives the pages of crash-log records that commits made durable back
    /// to the system (writeback/run.rs).
    pub fn trim_crash_log(&self) {
        self.cache.trim_crash_log()
    }

    /// Finishes a read a fast path handed on (`try_read`), or starts one
    /// (pipeline.rs).
    pub fn read_request(&self, req: Request) -> EngineResult<AlignedBuf> {
        self.cache.read_request(req)
    }

    /// Switches the cache mode on a live cache, for every volume (none
    /// keeps a mode of its own). Leaving a mode that holds dirty data
    /// writes all of it back first; if that fails the old modes stay.
    pub fn set_mode(&self, mode: Mode) -> EngineResult<()> {
        self.switch_mode(None, mode)
    }

    /// Switches volume `v`'s mode; the others keep theirs. Leaving a mode
    /// that holds dirty data writes that volume's back first.
    pub fn set_volume_mode(&self, v: usize, mode: Mode) -> EngineResult<()> {
        self.cache.volume(v)?;
        match self.cache.origins.len() {
            1 => self.switch_mode(None, mode),
            _ => self.switch_mode(Some(v), mode),
        }
    }

    /// Volume `v`'s share of the cache's slots becomes `share`
    /// (policy/share.rs), recorded in the superblock first. Refused for a
    /// lone volume and where the volumes' minimums would add up past the
    /// whole cache.
    pub fn set_share(&self, v: usize, share: Share) -> EngineResult<()> {
        self.cache.check_open()?;
        let origin = self.cache.volume(v)?;
        share.valid().map_err(EngineError::Config)?;
        if self.cache.origins.len() < 2 {
            return Err(EngineError::Config(
                "a cache of one volume shares with nobody: shares need several origins".into(),
            ));
        }
        let slots = self.cache.observe.slot_count();
        // The others' minimums as recorded, under the commit lock: two
        // changes at once cannot both pass.
        self.cache.update_superblock_checked(
            |sb| {
                let list = sb.volume_list();
                let others: u32 = (list.iter().enumerate())
                    .filter(|&(i, _)| i != v)
                    .map(|(_, e)| u32::from(e.share.min_permille))
                    .sum();
                if others + u32::from(share.min_permille) > u32::from(policy::share::WHOLE) {
                    return Err(EngineError::Config(format!(
                        "the other volumes are guaranteed {}% of the cache: {}% more would \
                         pass the whole",
                        f64::from(others) / 10.0,
                        policy::share::pct(share.min_permille)
                    )));
                }
                let mut next = *sb;
                next.set_volume_share(v, share);
                Ok(next)
            },
            || {
                origin.share().set(share);
                self.cache.origins.share_as(
                    self.cache.origins.sharing(),
                    &self.cache.observe,
                    slots,
                );
            },
        )
    }

    /// The volumes share the cache as `sharing` from now on (recorded in
    /// the superblock first). Refused for a lone volume.
    pub fn set_sharing(&self, sharing: Sharing) -> EngineResult<()> {
        self.cache.check_open()?;
        if self.cache.origins.len() < 2 {
            return Err(EngineError::Config(
                "a cache of one volume shares with nobody: sharing needs several origins".into(),
            ));
        }
        let slots = self.cache.observe.slot_count();
        self.cache.update_superblock_then(
            |sb| sb.set_sharing(sharing),
            || {
                self.cache
                    .origins
                    .share_as(sharing, &self.cache.observe, slots)
            },
        )
    }

    /// `set_sharing` and `set_share` as `change` asks (the sharing
    /// first); a minimum or maximum needs a volume.
    pub fn change_share(&self, change: &ShareChange) -> EngineResult<()> {
        let limits = change.min_permille.is_some() || change.max_permille.is_some();
        if limits && change.volume.is_none() {
            return Err(EngineError::Config(
                "a minimum or maximum share is a volume's: name it (--volume)".into(),
            ));
        }
        if let Some(sharing) = change.sharing {
            self.set_sharing(sharing)?;
        }
        if let Some(name) = change.volume.as_deref() {
            let v = self.volume_index(name)?;
            let share =
                change.applied_to(self.cache.origins.get(v).expect("indexed").share().get());
            self.set_share(v, share)?;
        }
        Ok(())
    }

    /// `set_mode` (`v` `None`) or `set_volume_mode`.
    fn switch_mode(&self, v: Option<usize>, mode: Mode) -> EngineResult<()> {
        self.cache.check_open()?;
        if self.cache.failed_over() {
            return Err(EngineError::Config(
                "the cache failed over to the origin after a cache device failure; reopen it (restart the daemon) first".into(),
            ));
        }
        if mode.holds_dirty() && self.cache.io.cache().is_volatile() && !self.allow_data_loss() {
            return Err(EngineError::VolatileWriteback {
                device: self.cache.io.cache().name().into(),
                mode: mode.name().into(),
            });
        }
        let on_disk = |sb: &mut format::Superblock| match v {
            None => sb.set_mode_everywhere(mode),
            Some(v) => sb.set_volume_mode(v, Some(mode)),
        };
        let targets: Vec<&origin::Origin> = match v {
            None => self.cache.origins.iter().collect(),
            Some(v) => self.cache.origins.get(v).into_iter().collect(),
        };
        // An error leaves the old modes, in memory and on disk.
        if mode.holds_dirty() {
            // On disk first: memory must never hold dirty blocks under a
            // mode that a restart would open without them in mind.
            let swap = || {
                targets.iter().for_each(|o| {
                    o.swap_mode(mode);
                })
            };
            return self.cache.update_superblock_then(on_disk, swap);
        }
        // In memory first, so that no new dirty block appears while the
        // write back writes back the ones there are.
        let old: Vec<Mode> = targets.iter().map(|o| o.swap_mode(mode)).collect();
        let written = match v {
            None => self.cache.write_back_all(&mut |_, _| {}),
            Some(v) => self.cache.write_back_volume(v, &mut |_, _| {}),
        };
        let persisted = written.and_then(|()| self.cache.update_superblock(on_disk));
        if persisted.is_err() {
            targets.iter().zip(old).for_each(|(o, m)| {
                o.swap_mode(m);
            });
        }
        persisted
    }

    /// Changes the admission settings; persisted in the superblock.
    pub fn set_admission(&self, a: AdmissionSettings) -> EngineResult<()> {
        a.validate().map_err(EngineError::Config)?;
        // On disk first: an error leaves the old settings in force.
        self.cache.update_superblock_then(
            |sb| sb.set_admission(&a),
            || self.cache.admission.set_settings(a),
        )
    }

    /// Switches the replacement policy on a live cache; persisted in the
    /// superblock. The new policy starts from the old one's order.
    pub fn set_policy(&self, kind: PolicyKind) -> EngineResult<()> {
        self.cache.check_open()?;
        self.cache.update_superblock_then(
            |sb| sb.policy.set(kind.to_u32()),
            || self.cache.meta.set_policy(kind),
        )
    }

    /// Records the name the cache is registered under in its superblock
    /// (`Superblock::cache_name`), if it is not recorded already.
    pub fn record_name(&self, name: &str) -> EngineResult<()> {
        self.cache.check_open()?;
        if self.recorded_name().as_deref() == Some(name) {
            return Ok(());
        }
        self.cache
            .update_superblock_then(|sb| sb.set_name(name), || ())
    }

    /// The registered name the superblock records.
    pub fn recorded_name(&self) -> Option<String> {
        self.cache.recorded_name()
    }

    /// Changes the writeback watermarks and age; persisted in the superblock.
    pub fn set_writeback(&self, w: WritebackSettings) -> EngineResult<()> {
        w.validate().map_err(EngineError::Config)?;
        // On disk first: an error leaves the old settings in force.
        self.cache.update_superblock_then(
            |sb| {
                sb.writeback_high_pct.set(w.high_pct);
                sb.writeback_low_pct.set(w.low_pct);
                sb.writeback_max_age_secs.set(w.max_age_secs);
                sb.writeback_idle_secs.set(w.idle_secs);
            },
            || self.cache.writeback.set_settings(w),
        )
    }

    pub(crate) fn allow_data_loss(&self) -> bool {
        self.cache.journal.allow_data_loss()
    }

    /// Clean shutdown: stops background work, commits, writes a checkpoint
    /// and marks the cache clean, so it opens warm without replay; then
    /// closes the origin (`BlockDevice::close`).
    pub fn close(&self) -> EngineResult<()> {
        // SeqCst: a deferred promotion either sees `closed` or is waited
        // for (cache/deferred.rs).
        if self.cache.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.wait_deferred();
        let result = self.close_cache();
        self.close_origin();
        result
    }

    fn close_cache(&self) -> EngineResult<()> {
        writeback::stop_background(self);
        self.cache.stop_resync();
        if self.cache.failed_over() {
            // Everything is on the origin; commit() flushes it. The cache
            // metadata cannot be written (see io/failure.rs).
            return self.cache.commit();
        }
        // In flush order a checkpoint keeps no closed group (commit.rs):
        // write them back first. If the origin cannot take them, the
        // checkpoint waits and the journal keeps their order for the next
        // open.
        if let Err(e) = self.cache.order.write_back_closed(&self.cache) {
            log::warn!("closing: the closed flush groups could not be written back: {e}");
        }
        // The checkpoint commits everything first (commit_locked).
        match self.cache.checkpoint_now(true) {
            Err(e) if self.cache.fail_over_after_commit_error(&e) => {
                self.cache.origins.flush_foreground(&self.cache.stats)
            }
            Ok(()) => {
                self.remove_crash_log();
                Ok(())
            }
            r => r,
        }
    }

    /// No request starts from now on (`closed`), and the promotions of
    /// reads already answered are done.
    fn shut(&self) {
        self.cache.closed.store(true, Ordering::SeqCst);
        self.wait_deferred();
    }

    /// Waits for the promotions of reads already answered, once `closed`
    /// is set (SeqCst: cache/deferred.rs), so none stores after what comes.
    fn wait_deferred(&self) {
        if !self.cache.deferred.wait_idle() {
            log::warn!(
                "closing: promotions of {} bytes still wait for the cache device",
                self.cache.deferred.bytes()
            );
        }
    }

    /// Nothing more goes to the origins (the engine is closed or detached).
    fn close_origin(&self) {
        for o in self.cache.origins.iter() {
            if let Err(e) = o.device().close() {
                log::warn!("closing the origin of {}: {e}", o.name());
            }
        }
    }

    /// Everything is durable and nothing more will be written: the crash
    /// log has nothing to add.
    pub(crate) fn remove_crash_log(&self) {
        // Taken out under the lock, removed (unlink, munmap) after it.
        let log = self.cache.meta.take_crash_log();
        if let Some(log) = log {
            log.remove();
        }
    }

    #[cfg(any(test, feature = "testing"))]
    /// The crash log's bytes as they stand, copied under the metadata lock
    /// (so no record is half appended): what a process killed now leaves.
    /// For crash tests; `None` without a log.
    pub fn crash_log_image(&self) -> Option<Vec<u8>> {
        self.cache.meta.crash_log_image()
    }

    #[cfg(any(test, feature = "testing"))]
    /// Stops all background work without committing anything, as if the
    /// process died here: for in-process crash tests, where a dropped
    /// engine's background thread must not keep writing to devices that a
    /// new engine has opened.
    pub fn abandon(&self) {
        self.shut();
        writeback::stop_background(self);
        // The dead process's log stays as it was, unlocked for the next.
        let log = self.cache.meta.take_crash_log();
        drop(log);
    }

    /// Writes back all dirty data, then dissolves the cache: afterwards the
    /// origin alone holds all data and the cache device holds no cache.
    pub fn detach(&self) -> EngineResult<()> {
        self.cache.check_open()?;
        let old = self.cache.swap_mode(Mode::Passthrough);
        if let Err(e) = self.cache.write_back_all(&mut |_, _| {}) {
            self.restore_modes(old);
            return Err(e);
        }
        self.shut();
        writeback::stop_background(self);
        self.cache.stop_resync();
        if self.dirty_blocks() != 0 {
            return Err(EngineError::Config(
                "dirty data appeared during detach".into(),
            ));
        }
        let result = recovery::wipe(self);
        self.close_origin();
        result
    }

    /// Weak handle for the background thread.
    pub(crate) fn weak(self: &Arc<Self>) -> Weak<Engine> {
        Arc::downgrade(self)
    }
}

/// A cache set's members' used and dirty blocks, from the table: members
/// 0 and 1 hold every mirrored slot, hence every dirty block; the others
/// only their own slots.
fn member_usage(
    m: &Meta,
    set: &dyn crate::device::members::Members,
    members: &mut [crate::device::members::MemberStatus],
    dirty: u64,
) {
    let mirrored = m.used_in(0..set.mirror_slots() as u32);
    for (i, member) in members.iter_mut().enumerate() {
        let copies = member.mirror_slots > 0;
        member.used_blocks = m.used_in(set.own_slots(i)) + if copies { mirrored } else { 0 };
        member.dirty_blocks = if copies { dirty } else { 0 };
    }
}

impl Cache {
    /// Volume `v`'s origin, or the refusal of an index the cache does not
    /// have.
    pub(crate) fn volume(&self, v: usize) -> EngineResult<&origin::Origin> {
        self.origins.get(v).ok_or_else(|| self.no_volume(v))
    }

    /// The refusal of a volume index the cache does not have.
    fn no_volume(&self, v: usize) -> EngineError {
        EngineError::NoSuchVolume(format!(
            "no volume {v} in this cache (it has {})",
            self.origins.len()
        ))
    }

    /// Sets every volume's mode in memory; returns the old ones, by volume.
    pub(crate) fn swap_mode(&self, mode: Mode) -> Vec<Mode> {
        self.origins.iter().map(|o| o.swap_mode(mode)).collect()
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}

impl Cache {
    pub(crate) fn check_open(&self) -> EngineResult<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(EngineError::ShutDown)
        } else {
            Ok(())
        }
    }
}
