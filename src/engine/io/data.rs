//! Every device access of the data path: cache and origin reads and writes
//! with their error accounting, and the ordering rule every origin write
//! obeys.

use crate::device::DeviceError;
use crate::engine::admission::Dev;
use crate::engine::cache::Cache;
use crate::engine::origin::Origin;
use crate::engine::stats::bump;
use crate::engine::EngineResult;

thread_local! {
    /// Origin requests made by this thread: a request that made none was a
    /// hit (`pipeline.rs` times requests by this).
    pub(crate) static ORIGIN_REQUESTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// When a device request started (`Cache::device_timer`).
pub(crate) struct DeviceTimer {
    /// The cache set's member epoch then.
    set_epoch: u64,
    t: u64,
}

impl Cache {
    /// Times a device request of `bytes` for the admission guard, which
    /// compares small requests only (up to 64 KiB): a 1 MiB write and a
    /// 4 KiB one say nothing about each other's device. A failed request
    /// is not timed: an unreachable origin fails at once, and its
    /// microseconds would make the cache device look slower than the origin
    /// and engage the guard, sending writes around the cache to fail too.
    fn timed_device<T, E>(
        &self,
        dev: Dev,
        bytes: usize,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        crate::sync::assert_unheld(crate::sync::Rank::Meta, "device I/O");
        let timer = self.device_timer();
        let r = f();
        self.device_timed(dev, bytes, &timer, r.is_ok());
        ORIGIN_REQUESTS.with(|c| {
            if matches!(dev, Dev::OriginRead | Dev::OriginWrite) {
                c.set(c.get() + 1)
            }
        });
        r
    }

    /// A device request's start, for `device_timed` (`timed_device`'s, or
    /// that of a request ending on another thread: io/submitted.rs).
    pub(crate) fn device_timer(&self) -> DeviceTimer {
        DeviceTimer {
            set_epoch: self.cache_set_epoch(),
            t: self.clock.now_ns(),
        }
    }

    /// Records the time of a device request started at `timer` that
    /// ended now (`ok`: it succeeded), as `timed_device` says; returns it
    /// (ns).
    pub(crate) fn device_timed(
        &self,
        dev: Dev,
        bytes: usize,
        timer: &DeviceTimer,
        ok: bool,
    ) -> u64 {
        let ns = self.clock.since_ns(timer.t);
        if ok {
            self.observe.latency.device(dev as usize, ns);
        }
        // A request during which a cache-set member failed also wrote the
        // labels of the others: its time says nothing of the device's
        // speed (it engaged the admission guard in a guest test).
        if ok && bytes <= 64 << 10 && self.cache_set_epoch() == timer.set_epoch {
            self.admission.latencies.record(dev, ns);
        }
        ns
    }

    /// The cache set's member-state epoch (0 for one cache device).
    fn cache_set_epoch(&self) -> u64 {
        self.io.cache().members().map_or(0, |s| s.epoch())
    }

    pub(crate) fn cache_read(
        &self,
        slot: u32,
        in_block: u64,
        buf: &mut [u8],
    ) -> Result<(), DeviceError> {
        let at = self.regions.slot_offset(slot) + in_block;
        self.timed_device(Dev::CacheRead, buf.len(), || self.io.cache.read_at(buf, at))
            .inspect_err(|e| {
                self.note_cache_error();
                log::warn!("cache read error: {e}");
            })
    }

    pub(crate) fn cache_write(
        &self,
        slot: u32,
        in_block: u64,
        buf: &[u8],
    ) -> Result<(), DeviceError> {
        let at = self.regions.slot_offset(slot) + in_block;
        let r = self
            .timed_device(Dev::CacheWrite, buf.len(), || match &self.io.gather {
                Some(g) => g.write(&*self.io.cache, &self.stats, buf, at),
                None => self.io.cache.write_at(buf, at),
            })
            .inspect_err(|e| {
                self.note_cache_error();
                log::warn!("cache write error: {e}");
            });
        self.journal.note_completed();
        r
    }

    /// Counts a foreground request to `origin` while `f` runs (writeback
    /// yields to them); refused once its volume is removed (`Origin::
    /// foreground`).
    fn foreground<T, E: From<DeviceError>>(
        &self,
        origin: &Origin,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        origin.foreground(|| self.now_ms(), f).unwrap_or_else(|| {
            Err(E::from(DeviceError::Io {
                device: origin.device().name().into(),
                what: "an I/O to a volume removed from the cache",
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            }))
        })
    }

    /// Reads the origin at address `offset` (its volume's device at the
    /// address's offset in the volume).
    pub(crate) fn origin_read(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        bump(&self.stats.origin_reads, 1);
        let origin = self.origins.at(offset);
        let r = self.foreground(origin, || {
            self.timed_device(Dev::OriginRead, buf.len(), || {
                origin.device().read_at(buf, origin.local(offset))
            })
        });
        r.inspect_err(|e| self.origin_read_failed(e))
    }

    /// An origin read failed: counted and logged.
    pub(crate) fn origin_read_failed(&self, e: &DeviceError) {
        bump(&self.stats.origin_errors, 1);
        log::warn!("origin read error: {e}");
    }

    /// An origin write failed: counted and logged.
    pub(crate) fn origin_write_failed(&self, e: &DeviceError) {
        bump(&self.stats.origin_errors, 1);
        log::warn!("origin write error: {e}");
    }

    /// `origin_write` without the wait: for a writeback's own flight.
    /// `offset` is an address (origin/address.rs).
    pub(crate) fn origin_write_now(&self, buf: &[u8], offset: u64) -> EngineResult<()> {
        let bs = self.block_bytes;
        let blocks = offset / bs..=(offset + (buf.len() as u64).max(1) - 1) / bs;
        if self.releases_pending(blocks) {
            self.commit()?;
        }
        bump(&self.stats.origin_writes, 1);
        let origin = self.origins.at(offset);
        let r = self.timed_device(Dev::OriginWrite, buf.len(), || {
            origin.device().write_at(buf, origin.local(offset))
        });
        let r = r.inspect_err(|e| self.origin_write_failed(e));
        self.journal.note_completed();
        Ok(r?)
    }

    /// True if the mapping of some block in `blocks` was removed (unmapped,
    /// or superseded by a newer slot) in memory and that removal is not yet
    /// durable. Only those blocks matter: an origin write to other blocks
    /// cannot meet a revived old copy.
    pub(crate) fn releases_pending(&self, blocks: std::ops::RangeInclusive<u64>) -> bool {
        let durable = self.journal.releases_durable();
        self.meta.releases_pending(blocks, durable)
    }
}

impl Cache {
    /// Every origin write goes through here. A mapping removed in memory
    /// (unmapped, or superseded by a newer slot) must be durable before the
    /// origin changes: until then a crash would bring back the old clean
    /// copy over the new origin bytes.
    /// Waits first for background writebacks still writing these blocks to
    /// the origin (origin/flights.rs), so the origin sees writes in order.
    /// With writeback in flush order, a foreground write is one of the
    /// open group: every closed group reaches the origin first.
    pub(crate) fn origin_write(&self, buf: &[u8], offset: u64) -> EngineResult<()> {
        let origin = self.origins.at(offset);
        if !buf.is_empty() {
            let bs = self.block_bytes;
            self.order.before_foreground_write(self)?;
            origin
                .flights()
                .wait_origin(offset / bs, (offset + buf.len() as u64 - 1) / bs);
        }
        let epoch = origin.loss_epoch();
        self.foreground(origin, || self.origin_write_now(buf, offset))?;
        let at = origin.local(offset);
        origin.wrote(at..at + buf.len() as u64, epoch);
        Ok(())
    }
}
