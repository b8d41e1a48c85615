//! Replacing a member: a new device takes a failed (or retiring) member's
//! place and is filled with copies of the metadata and mirrored slots from
//! a healthy member while clients keep going.
//!
//! The copy runs in chunks. A chunk is read from a healthy member and
//! written to the new one under the fence's lock, and every other write to
//! the new member takes that lock too: a client write either lands on the
//! new member after the chunk (newer bytes win), or before the chunk was
//! read, and then the healthy copy the chunk reads already holds it (a
//! write reaches the healthy members before the rebuilding one). The new
//! member is read only once it is healthy: when the copy is complete and
//! flushed and the labels say so.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{open_error, CacheSet, Label, MemberState, LABEL_BYTES};
use crate::device::{DeviceRef, DeviceResult};
use crate::sync::{Mutex, Rank};

/// Bytes copied per chunk.
const CHUNK_BYTES: u64 = 1 << 20;
const NONE: usize = usize::MAX;

/// Serializes the rebuild's chunk copies with client writes to the member
/// being rebuilt, and counts progress.
pub(crate) struct Fence {
    lock: Mutex<()>,
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
    member: AtomicUsize,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            lock: Mutex::new(Rank::Rebuild, ()),
            done_bytes: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            member: AtomicUsize::new(NONE),
        }
    }
}

impl Fence {
    /// A client write to the rebuilding member.
    pub(crate) fn write<T>(&self, f: impl FnOnce() -> T) -> T {
        let _g = self.lock.lock();
        f()
    }

    /// Bytes copied, bytes to copy, and which member (if a rebuild runs).
    pub(crate) fn progress(&self) -> (u64, u64, Option<usize>) {
        let m = self.member.load(Ordering::Acquire);
        (
            self.done_bytes.load(Ordering::Relaxed),
            self.total_bytes.load(Ordering::Relaxed),
            (m != NONE).then_some(m),
        )
    }
}

impl CacheSet {
    /// Which member `dev_name` is (by its device name).
    pub fn member_named(&self, dev_name: &str) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.dev().is_some_and(|d| d.name() == dev_name))
    }

    /// Replaces member `i` with `new` and copies the metadata and mirrored
    /// slots onto it; returns once it is healthy. A healthy member `i` is
    /// failed first (a planned replacement). `progress` sees bytes copied
    /// and bytes to copy after every chunk.
    pub fn replace(
        &self,
        i: usize,
        new: DeviceRef,
        mut progress: impl FnMut(u64, u64),
    ) -> DeviceResult<()> {
        if i >= self.members.len() {
            return Err(open_error(&self.name, format!("no member {i}")));
        }
        let need = self.geometry.member_needs_bytes(i);
        if new.size_bytes() < need {
            return Err(open_error(
                new.name(),
                format!(
                    "member {i} needs {need} bytes; the device has {}",
                    new.size_bytes()
                ),
            ));
        }
        if self.member_named(new.name()).is_some()
            && self.members[i].dev().map(|d| d.name().to_string()) != Some(new.name().into())
        {
            return Err(open_error(new.name(), "already a member of this set"));
        }
        if self.members[i].state() == MemberState::Healthy {
            self.fail_member(i, "replaced by the operator");
        }
        if self
            .rebuild
            .member
            .compare_exchange(NONE, i, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(open_error(&self.name, "a rebuild is already running"));
        }
        let r = self.rebuild_onto(i, new, &mut progress);
        self.rebuild.member.store(NONE, Ordering::Release);
        r
    }

    /// `new` takes member `i`'s place, rebuilding: its label says it is
    /// stale until the copy is done. The place gets a new serial: from the
    /// first label that carries it on, the device it replaces is a former
    /// member, never taken for a current one (`open.rs`).
    fn take_place(&self, i: usize, new: &DeviceRef) -> DeviceResult<()> {
        let mut st = self.state.lock();
        st.serials[i] = st.serials[i].wrapping_add(1);
        let l = Label {
            member_index: i,
            set_id: self.set_id,
            generation: st.generation,
            stale_mask: st.stale_mask,
            flags: st.flags,
            geometry: self.geometry.clone(),
            serials: st.serials,
        };
        new.write_at(&vec![0u8; LABEL_BYTES as usize], 0)?;
        new.write_at(&l.to_page(), l.copy_offset())?;
        new.flush()?;
        *self.members[i].dev.write() = Some(new.clone());
        self.members[i].reset_health();
        self.members[i].set_state(MemberState::Rebuilding);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn rebuild_onto(
        &self,
        i: usize,
        new: DeviceRef,
        progress: &mut impl FnMut(u64, u64),
    ) -> DeviceResult<()> {
        self.take_place(i, &new)?;
        let bs = self.geometry.block_bytes as u64;
        let total = self.geometry.meta_bytes + self.geometry.member_mirror_slots(i) * bs;
        self.rebuild.total_bytes.store(total, Ordering::Relaxed);
        self.rebuild.done_bytes.store(0, Ordering::Relaxed);
        let mut buf = crate::device::AlignedBuf::zeroed(CHUNK_BYTES as usize);
        let mut done = 0;
        while done < total {
            // A chunk stays within the metadata or the mirrored slots,
            // which have different copies to read from.
            let meta = self.geometry.meta_bytes;
            let region_end = if done < meta { meta } else { total };
            let n = (region_end - done).min(CHUNK_BYTES);
            let at = LABEL_BYTES + done;
            let chunk = &mut buf[..n as usize];
            let copied = {
                let _g = self.rebuild.lock.lock();
                // Member `i` is rebuilding, so never read: a healthy copy
                // of the same range answers.
                let target = if at >= LABEL_BYTES + self.geometry.meta_bytes {
                    super::Target::Mirror
                } else {
                    super::Target::Meta
                };
                self.read_copy(chunk, target, at)
                    .and_then(|_| new.write_at(chunk, at))
            };
            if let Err(e) = copied {
                self.fail_member(i, &format!("rebuild failed: {e}"));
                return Err(e);
            }
            done += n;
            self.rebuild.done_bytes.store(done, Ordering::Relaxed);
            progress(done, total);
        }
        if let Err(e) = new.flush() {
            self.fail_member(i, &format!("rebuild flush failed: {e}"));
            return Err(e);
        }
        self.mark_healthy(i)
    }

    /// The mirrored slots' copies may differ (the engine opened the cache
    /// after an unclean shutdown: a crash may have cut a write between
    /// members 0 and 1): from now until `resync` finishes, reads of them go
    /// to one copy only, and the labels say so (a restart before the end
    /// resyncs again).
    pub fn begin_resync(&self) {
        if self.members[..2]
            .iter()
            .any(|m| m.state() != MemberState::Healthy)
        {
            return; // One copy: nothing to make equal.
        }
        self.resyncing.store(true, Ordering::Release);
        self.set_flags(|f| f | super::label::FLAG_RESYNC);
    }

    /// Stops a running resync at its next chunk (the cache is closing).
    pub fn stop_resync(&self) {
        self.resync_stop.store(true, Ordering::Release);
    }

    /// A resync is pending (`begin_resync`, or a label that says so).
    pub fn resync_pending(&self) -> bool {
        self.resyncing.load(Ordering::Acquire)
    }

    /// Makes member 1's copy of the mirrored slots equal to member 0's,
    /// chunk by chunk behind the fence while clients keep going (as a
    /// rebuild does), then lets reads use both copies again.
    pub fn resync(&self, mut progress: impl FnMut(u64, u64)) -> DeviceResult<()> {
        if !self.resync_pending() {
            return Ok(());
        }
        let bs = self.geometry.block_bytes as u64;
        let start = LABEL_BYTES + self.geometry.meta_bytes;
        let total = self.geometry.mirror_slots * bs;
        let mut buf = crate::device::AlignedBuf::zeroed(CHUNK_BYTES as usize);
        let mut done = 0;
        while done < total {
            if self.resync_stop.load(Ordering::Acquire) {
                // The cache is closing: the labels still ask for a resync,
                // which the next open runs.
                return Ok(());
            }
            if self.members[..2]
                .iter()
                .any(|m| m.state() != MemberState::Healthy)
            {
                break; // A copy was lost meanwhile: one copy is what is read.
            }
            let n = (total - done).min(CHUNK_BYTES);
            let at = start + done;
            let chunk = &mut buf[..n as usize];
            let (Some(from), Some(to)) = (self.members[0].dev(), self.members[1].dev()) else {
                break;
            };
            let copied = {
                let _g = self.rebuild.lock.lock();
                match from.read_at(chunk, at) {
                    Err(e) => Err((0, e)),
                    Ok(()) => to.write_at(chunk, at).map_err(|e| (1, e)),
                }
            };
            if let Err((i, e)) = copied {
                self.member_error(i, "resync", e);
                break;
            }
            done += n;
            progress(done, total);
        }
        if let Some(to) = self.members[1].dev() {
            if let Err(e) = to.flush() {
                self.member_error(1, "resync flush", e);
            }
        }
        self.resyncing.store(false, Ordering::Release);
        self.set_flags(|f| f & !super::label::FLAG_RESYNC);
        log::info!("{}: mirrored copies resynchronised", self.name);
        Ok(())
    }

    /// Changes the label flags on every healthy member.
    fn set_flags(&self, f: impl FnOnce(u32) -> u32) {
        let mut st = self.state.lock();
        st.flags = f(st.flags);
        st.generation += 1;
        let mut failed = Vec::new();
        for j in 0..self.members.len() {
            if self.members[j].state() == MemberState::Healthy {
                if let Err(e) = self.write_label(j, &st) {
                    failed.push((j, e));
                }
            }
        }
        drop(st);
        for (j, e) in failed {
            self.fail_member(j, &format!("its label could not be written: {e}"));
        }
    }

    /// The copy is complete and durable: the labels say member `i` is current.
    fn mark_healthy(&self, i: usize) -> DeviceResult<()> {
        let mut st = self.state.lock();
        st.stale_mask &= !(1 << i);
        st.generation += 1;
        self.members[i].set_state(MemberState::Healthy);
        let mut failed = Vec::new();
        for j in 0..self.members.len() {
            if self.members[j].state() != MemberState::Healthy {
                continue;
            }
            if let Err(e) = self.write_label(j, &st) {
                failed.push((j, e));
            }
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        drop(st);
        let Some((_, first)) = failed.first() else {
            log::info!("{}: member {i} rebuilt; the set is whole", self.name);
            return Ok(());
        };
        let e = open_error(&self.name, format!("a label could not be written: {first}"));
        for (j, why) in &failed {
            self.fail_member(*j, &format!("its label could not be written: {why}"));
        }
        Err(e)
    }
}
