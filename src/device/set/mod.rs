//! A cache set: several cache devices seen by the engine as one.
//!
//! The set is a [`BlockDevice`] whose address space is the engine's cache
//! layout (superblocks, journal, checkpoints, then slots). Each member
//! device starts with its label (`label.rs`, 8 KiB), then holds:
//!
//! - a copy of the metadata (every member);
//! - a copy of the *mirrored slots* `0..mirror_slots` (members 0 and 1);
//! - its *own slots*, one copy only (`stripe_slots[i]`, numbered after the
//!   mirrored slots, member 0's first).
//!
//! The engine keeps dirty data in mirrored slots only and puts clean data
//! anywhere (`engine/table/`), so dirty data and metadata survive the loss
//! of either of members 0 and 1, while clean data uses every member's
//! capacity.
//!
//! A member that fails a request (or returns no data) becomes *stale*: the
//! labels of the members left say so (written and flushed before the
//! request that failed returns), reads and writes skip it, and requests for
//! its own slots fail (they held clean copies only: the engine drops them
//! and reads the origin). `rebuild.rs` brings a replacement device in.
//! What a stale member would have said is never read again: on open, the
//! label with the highest generation among the members present names the
//! stale ones (`open.rs`). A member that keeps returning blocks that fail
//! their checksums is failed too (`health.rs`).

pub mod health;
mod helpers;
pub mod label;
pub mod open;
pub mod rebuild;
pub mod sums;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use parking_lot::RwLock;

use super::{check_range, BlockDevice, DeviceError, DeviceRef, DeviceResult};
use crate::sync::{Mutex, Rank};
pub use label::{Geometry, Label, LABEL_BYTES, MAX_MEMBERS};
pub use open::{open_paths, LeftOut};

/// A member's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Holds current copies.
    Healthy,
    /// Holds nothing the set reads: it failed, or was missing at open.
    Failed,
    /// A replacement being filled: written like a healthy member, never read.
    Rebuilding,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Healthy => "healthy",
            MemberState::Failed => "failed",
            MemberState::Rebuilding => "rebuilding",
        }
    }
    fn from_u8(v: u8) -> MemberState {
        match v {
            0 => MemberState::Healthy,
            1 => MemberState::Failed,
            _ => MemberState::Rebuilding,
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            MemberState::Healthy => 0,
            MemberState::Failed => 1,
            MemberState::Rebuilding => 2,
        }
    }
}

/// What `status` shows of a member.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct MemberStatus {
    pub index: usize,
    pub device: String,
    pub state: MemberState,
    pub bytes: u64,
    /// Mirrored slots it holds a copy of, and its own slots.
    pub mirror_slots: u64,
    pub own_slots: u64,
    pub errors: u64,
    /// Its checksum errors: blocks (and metadata pages) it returned
    /// damaged, caught by their checksum and served from the other copy,
    /// or the origin, instead.
    #[serde(default)]
    pub bad_blocks: u64,
    /// Of those, the ones within the window of the rule that fails a
    /// member (`health.rs`: 10 within 600 s by default).
    #[serde(default)]
    pub checksum_errors_recent: u32,
    /// Why it failed (a request's error, checksum errors, missing at open,
    /// named failed by another member's label); `None` while not failed.
    #[serde(default)]
    pub failure: Option<String>,
    pub reads: u64,
    pub writes: u64,
    /// While rebuilding: bytes copied of the bytes to copy.
    pub rebuild_done_bytes: u64,
    pub rebuild_total_bytes: u64,
    /// Blocks it holds (its copies of mirrored ones and its own), and of
    /// them dirty: filled in by the engine, which knows the mappings.
    #[serde(default)]
    pub used_blocks: u64,
    #[serde(default)]
    pub dirty_blocks: u64,
}

struct Member {
    /// `None`: missing (not found at open).
    dev: RwLock<Option<DeviceRef>>,
    state: AtomicU8,
    errors: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    /// Blocks it returned that failed their checksum.
    bad_blocks: AtomicU64,
    /// When its latest checksum errors happened (`health.rs`).
    checksum_window: health::ErrorWindow,
    /// The log said it holds the last copy and is kept despite its errors.
    last_copy_warned: AtomicBool,
    /// Why it failed, for `status`.
    why: parking_lot::Mutex<Option<String>>,
}

impl Member {
    fn new(dev: Option<DeviceRef>, state: MemberState) -> Member {
        Member {
            dev: RwLock::new(dev),
            state: AtomicU8::new(state.to_u8()),
            errors: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            bad_blocks: AtomicU64::new(0),
            checksum_window: health::ErrorWindow::default(),
            last_copy_warned: AtomicBool::new(false),
            why: parking_lot::Mutex::new(None),
        }
    }
    fn state(&self) -> MemberState {
        MemberState::from_u8(self.state.load(Ordering::Acquire))
    }
    fn set_state(&self, s: MemberState) {
        self.state.store(s.to_u8(), Ordering::Release)
    }
    fn dev(&self) -> Option<DeviceRef> {
        self.dev.read().clone()
    }
    /// A new device takes the member's place: the old one's checksum
    /// errors are not held against it.
    fn reset_health(&self) {
        self.bad_blocks.store(0, Ordering::Relaxed);
        self.checksum_window.clear();
        self.last_copy_warned.store(false, Ordering::Relaxed);
    }
    /// The device, if the member holds current copies.
    fn healthy_dev(&self) -> Option<DeviceRef> {
        (self.state() == MemberState::Healthy)
            .then(|| self.dev())
            .flatten()
    }
}

/// The set's own persistent state, under its lock (`Rank::CacheSet`):
/// taken only to change a member's state, never on the data path.
struct SetState {
    generation: u64,
    stale_mask: u32,
    /// Label flags (`label::FLAG_RESYNC`).
    flags: u32,
    /// Each member place's serial (`Label::serials`).
    serials: [u16; MAX_MEMBERS],
}

/// Where a piece of a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// Metadata: a copy on every member.
    Meta,
    /// A mirrored slot: a copy on members 0 and 1.
    Mirror,
    /// A member's own slot.
    Own(usize),
}

struct Piece {
    buf: Range<usize>,
    target: Target,
    member_offset: u64,
}

pub struct CacheSet {
    name: String,
    set_id: u64,
    geometry: Geometry,
    members: Vec<Member>,
    state: Mutex<SetState>,
    /// Changes whenever a member's state does: the engine compares it to
    /// learn of failures (`engine/io/failure.rs`).
    epoch: AtomicU64,
    /// Rotates reads of mirrored slots over their copies.
    next_copy: AtomicUsize,
    /// The mirrored slots' copies may differ (`rebuild.rs`, resync): their
    /// reads go to one copy, the lowest healthy member's.
    resyncing: std::sync::atomic::AtomicBool,
    resync_stop: std::sync::atomic::AtomicBool,
    rebuild: rebuild::Fence,
    sums: sums::Sums,
    meta_check: std::sync::OnceLock<sums::MetaCheck>,
    /// When a member is failed for its checksum errors (`health.rs`).
    rule: health::Rule,
    /// Copies written one after the other on the caller's thread
    /// (`write_copies_in_turn`).
    in_turn: std::sync::atomic::AtomicBool,
}

/// Errors of opening or formatting a set.
fn open_error(spec: &str, reason: impl Into<String>) -> DeviceError {
    DeviceError::Open {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

/// A label's sizes are claims: the set allocates for its slots (a
/// checksum each) only what its devices hold. Without this check a 16 KiB
/// device whose label claims 2^32 slots opened, allocating 16 GiB (the
/// invariant of fuzz/fuzz_targets/set_label.rs).
fn check_member_size(d: &DeviceRef, l: &Label) -> DeviceResult<()> {
    let needs = l.geometry.member_needs_bytes(l.member_index);
    if d.size_bytes() < needs {
        let why = format!(
            "its label gives it {needs} bytes of the set; it has {}",
            d.size_bytes()
        );
        return Err(open_error(d.name(), why));
    }
    Ok(())
}

fn set_name(devs: &[Option<DeviceRef>]) -> String {
    let names: Vec<String> = devs
        .iter()
        .map(|d| {
            d.as_ref()
                .map_or("(missing)".to_string(), |d| d.name().to_string())
        })
        .collect();
    format!("set[{}]", names.join(","))
}

impl CacheSet {
    /// Writes fresh labels on `devs` (member i = `devs[i]`) for `geometry`.
    /// The caller has checked that the devices hold nothing to keep.
    pub fn format(devs: Vec<DeviceRef>, geometry: Geometry, set_id: u64) -> DeviceResult<CacheSet> {
        let n = devs.len();
        let name = set_name(&devs.iter().cloned().map(Some).collect::<Vec<_>>());
        if !(2..=MAX_MEMBERS).contains(&n) || geometry.stripe_slots.len() != n {
            return Err(open_error(
                &name,
                format!("a set has 2..={MAX_MEMBERS} members"),
            ));
        }
        for (i, d) in devs.iter().enumerate() {
            if d.size_bytes() < geometry.member_needs_bytes(i) {
                return Err(open_error(
                    d.name(),
                    format!(
                        "member {i} needs {} bytes and has {}",
                        geometry.member_needs_bytes(i),
                        d.size_bytes()
                    ),
                ));
            }
        }
        for (i, d) in devs.iter().enumerate() {
            // Both copies: an older set's copy must not outrank this one.
            for generation in [0, 1] {
                let l = Label {
                    member_index: i,
                    set_id,
                    generation,
                    stale_mask: 0,
                    flags: 0,
                    geometry: geometry.clone(),
                    serials: [0; MAX_MEMBERS],
                };
                d.write_at(&l.to_page(), l.copy_offset())?;
            }
            d.flush()?;
        }
        Ok(CacheSet::assemble(
            name,
            set_id,
            geometry,
            devs.into_iter()
                .map(|d| (Some(d), MemberState::Healthy))
                .collect(),
            SetState {
                generation: 1,
                stale_mask: 0,
                flags: 0,
                serials: [0; MAX_MEMBERS],
            },
        ))
    }

    fn assemble(
        name: String,
        set_id: u64,
        geometry: Geometry,
        members: Vec<(Option<DeviceRef>, MemberState)>,
        state: SetState,
    ) -> CacheSet {
        let resync = state.flags & label::FLAG_RESYNC != 0;
        CacheSet {
            name,
            set_id,
            members: members
                .into_iter()
                .map(|(d, s)| Member::new(d, s))
                .collect(),
            state: Mutex::new(Rank::CacheSet, state),
            epoch: AtomicU64::new(0),
            next_copy: AtomicUsize::new(0),
            resyncing: std::sync::atomic::AtomicBool::new(resync),
            resync_stop: std::sync::atomic::AtomicBool::new(false),
            rebuild: rebuild::Fence::default(),
            sums: sums::Sums::new(geometry.slot_count()),
            meta_check: std::sync::OnceLock::new(),
            rule: health::Rule::default(),
            in_turn: std::sync::atomic::AtomicBool::new(false),
            geometry,
        }
    }

    /// Writes a mirrored block's copies one after the other on the
    /// caller's thread instead of at once: for a deterministic simulation
    /// (tests/cache_set_crash.rs), where a copy written on a helper thread
    /// races with the other copy's failure, and so with what the test
    /// counts from it.
    pub fn write_copies_in_turn(&self) {
        self.in_turn.store(true, Ordering::Relaxed);
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Slots below this may hold dirty data (they have two copies).
    pub fn mirror_slots(&self) -> u64 {
        self.geometry.mirror_slots
    }

    /// Changes with every change of a member's state.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The slots the set cannot hold now: the own slots of members that
    /// are not healthy.
    pub fn unusable_slots(&self) -> Vec<Range<u32>> {
        (0..self.members.len())
            .filter(|&i| self.members[i].state() != MemberState::Healthy)
            .map(|i| self.own_slots(i))
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// Member `i`'s own slots.
    pub fn own_slots(&self, i: usize) -> Range<u32> {
        let base = self.geometry.stripe_base(i) as u32;
        base..base + self.geometry.stripe_slots[i] as u32
    }

    /// "whole", "degraded" (mirrored data on one copy) or "rebuilding".
    pub fn state_name(&self) -> &'static str {
        if self.rebuild.progress().2.is_some() {
            "rebuilding"
        } else if self.degraded() {
            "degraded"
        } else {
            "whole"
        }
    }

    /// Mirrored data has one current copy left.
    pub fn degraded(&self) -> bool {
        (0..2).any(|i| self.members[i].state() != MemberState::Healthy)
    }

    pub fn members(&self) -> Vec<MemberStatus> {
        let (done, total, rebuilding) = self.rebuild.progress();
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| MemberStatus {
                index: i,
                device: m.dev().map_or("(missing)".into(), |d| d.name().to_string()),
                state: m.state(),
                bytes: self.geometry.member_bytes[i],
                mirror_slots: self.geometry.member_mirror_slots(i),
                own_slots: self.geometry.stripe_slots[i],
                errors: m.errors.load(Ordering::Relaxed),
                bad_blocks: m.bad_blocks.load(Ordering::Relaxed),
                checksum_errors_recent: self.recent_checksum_errors(i),
                failure: (m.state() == MemberState::Failed)
                    .then(|| m.why.lock().clone())
                    .flatten(),
                reads: m.reads.load(Ordering::Relaxed),
                writes: m.writes.load(Ordering::Relaxed),
                rebuild_done_bytes: if rebuilding == Some(i) { done } else { 0 },
                rebuild_total_bytes: if rebuilding == Some(i) { total } else { 0 },
                used_blocks: 0,
                dirty_blocks: 0,
            })
            .collect()
    }

    /// Marks member `i` failed: the other members' labels say so (written
    /// and flushed) before this returns. A member whose label write fails
    /// is failed too.
    pub fn fail_member(&self, i: usize, why: &str) {
        let mut st = self.state.lock();
        let mut todo = vec![(i, why.to_string())];
        while let Some((i, why)) = todo.pop() {
            if st.stale_mask & (1 << i) != 0 && self.members[i].state() == MemberState::Failed {
                continue;
            }
            log::error!("{}: member {i} failed ({why}); serving degraded", self.name);
            *self.members[i].why.lock() = Some(why.clone());
            self.members[i].set_state(MemberState::Failed);
            st.stale_mask |= 1 << i;
            st.generation += 1;
            self.epoch.fetch_add(1, Ordering::AcqRel);
            for j in 0..self.members.len() {
                if self.members[j].state() == MemberState::Failed {
                    continue;
                }
                if let Err(e) = self.write_label(j, &st) {
                    todo.push((j, format!("its label could not be written: {e}")));
                }
            }
        }
    }

    fn write_label(&self, j: usize, st: &SetState) -> DeviceResult<()> {
        let dev = self.members[j]
            .dev()
            .ok_or_else(|| open_error(&self.name, "missing member"))?;
        let l = Label {
            member_index: j,
            set_id: self.set_id,
            generation: st.generation,
            stale_mask: st.stale_mask,
            flags: st.flags,
            geometry: self.geometry.clone(),
            serials: st.serials,
        };
        dev.write_at(&l.to_page(), l.copy_offset())?;
        dev.flush()
    }

    /// Splits a request at the boundaries of metadata, mirrored slots and
    /// members' own slots.
    fn pieces(&self, offset: u64, len: usize) -> Vec<Piece> {
        let g = &self.geometry;
        let bs = g.block_bytes as u64;
        let mirror_end = g.meta_bytes + g.mirror_slots * bs;
        let mut out = Vec::with_capacity(1);
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let (target, end, member_offset) = if at < g.meta_bytes {
                (Target::Meta, g.meta_bytes, LABEL_BYTES + at)
            } else if at < mirror_end {
                (Target::Mirror, mirror_end, LABEL_BYTES + at)
            } else {
                let slot = (at - g.meta_bytes) / bs;
                let i = (0..g.stripe_slots.len())
                    .rfind(|&i| g.stripe_base(i) <= slot && g.stripe_slots[i] > 0)
                    .unwrap_or(0);
                let base = g.stripe_base(i);
                let end = g.meta_bytes + (base + g.stripe_slots[i]) * bs;
                let within = at - g.meta_bytes - base * bs;
                let member_offset =
                    LABEL_BYTES + g.meta_bytes + g.member_mirror_slots(i) * bs + within;
                (Target::Own(i), end, member_offset)
            };
            let n = ((end - at) as usize).min(len - done);
            out.push(Piece {
                buf: done..done + n,
                target,
                member_offset,
            });
            done += n;
        }
        out
    }

    /// The members holding a copy of `target`.
    fn copies(&self, target: Target) -> Range<usize> {
        match target {
            Target::Meta => 0..self.members.len(),
            Target::Mirror => 0..2,
            Target::Own(i) => i..i + 1,
        }
    }

    /// Member `i` failed a request (`what`): counted, logged, the member
    /// failed. Returns the error.
    fn member_error(&self, i: usize, what: &str, e: DeviceError) -> DeviceError {
        log::warn!("{}: member {i} {what} error: {e}", self.name);
        self.members[i].errors.fetch_add(1, Ordering::Relaxed);
        self.fail_member(i, &e.to_string());
        e
    }

    /// The error of a request no healthy member could take.
    fn no_healthy(&self, what: &'static str) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            what,
            source: std::io::Error::other("no healthy member holds this range"),
        }
    }

    /// The outcome of a request made of one request per member (`results`:
    /// member, result): each failure fails its member; it succeeded if a
    /// member that took it is still healthy once every failure was handled
    /// (a member whose request succeeded may have failed since: its label
    /// could not be written).
    fn settle(
        &self,
        what: &'static str,
        results: impl IntoIterator<Item = (usize, DeviceResult<()>)>,
    ) -> DeviceResult<()> {
        let mut done = Vec::with_capacity(self.members.len());
        let mut last = None;
        for (i, r) in results {
            match r {
                Ok(()) => done.push(i),
                Err(e) => last = Some(self.member_error(i, what, e)),
            }
        }
        if done
            .iter()
            .any(|&i| self.members[i].state() == MemberState::Healthy)
        {
            return Ok(());
        }
        Err(last.unwrap_or_else(|| self.no_healthy(what)))
    }

    fn read_piece(&self, buf: &mut [u8], p: &Piece, virt: u64) -> DeviceResult<()> {
        let i = self.read_copy(buf, p.target, p.member_offset)?;
        if p.target == Target::Meta {
            self.verify_meta(buf, p.member_offset, i);
            return Ok(());
        }
        self.verify(buf, virt, p, i)
    }

    /// Reads a copy of `target` at member offset `at`; returns the member
    /// that answered.
    fn read_copy(&self, buf: &mut [u8], target: Target, at: u64) -> DeviceResult<usize> {
        let copies = self.copies(target);
        let n = copies.len();
        // Hits on mirrored slots alternate between the copies, once they
        // are known to be equal.
        let first = if target == Target::Mirror && !self.resyncing.load(Ordering::Acquire) {
            self.next_copy.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let mut last = None;
        for k in 0..n {
            let i = copies.start + (first + k) % n;
            let m = &self.members[i];
            let Some(dev) = m.healthy_dev() else { continue };
            m.reads.fetch_add(1, Ordering::Relaxed);
            match dev.read_at(buf, at) {
                Ok(()) => return Ok(i),
                Err(e) => last = Some(self.member_error(i, "read", e)),
            }
        }
        Err(last.unwrap_or_else(|| self.no_healthy("read")))
    }

    fn write_piece(&self, buf: &[u8], target: Target, at: u64) -> DeviceResult<()> {
        let copies: Vec<(usize, DeviceRef, bool)> = self
            .copies(target)
            .filter_map(|i| {
                let m = &self.members[i];
                let state = m.state();
                if state == MemberState::Failed {
                    return None;
                }
                // A copy being filled (a rebuild, or member 1 in a resync)
                // is written under the fence, after the copies it is filled
                // from.
                let fenced = state == MemberState::Rebuilding
                    || (target == Target::Mirror
                        && i == 1
                        && self.resyncing.load(Ordering::Acquire));
                m.dev().map(|d| (i, d, fenced))
            })
            .collect();
        let write = |(i, dev, fenced): &(usize, DeviceRef, bool)| {
            self.members[*i].writes.fetch_add(1, Ordering::Relaxed);
            let r = if *fenced {
                self.rebuild.write(|| dev.write_at(buf, at))
            } else {
                dev.write_at(buf, at)
            };
            (*i, r)
        };
        // Two unfenced copies are written at once: a mirrored write then
        // costs about one device write's time, not two. Two files (or
        // block devices) take both in one submission; other devices, the
        // second on a helper thread.
        let results: Vec<(usize, DeviceResult<()>)> = match copies.as_slice() {
            [a, b] if !a.2 && !b.2 && !self.in_turn.load(Ordering::Relaxed) => {
                for (i, _, _) in [a, b] {
                    self.members[*i].writes.fetch_add(1, Ordering::Relaxed);
                }
                let pair = match (a.1.as_file(), b.1.as_file()) {
                    (Some(fa), Some(fb)) => fa.write_pair(fb, buf, at),
                    _ => None,
                };
                let (ra, rb) = pair.unwrap_or_else(|| {
                    helpers::write_beside(|| a.1.write_at(buf, at), &b.1, buf, at)
                });
                vec![(a.0, ra), (b.0, rb)]
            }
            _ => copies.iter().map(write).collect(),
        };
        self.settle("write", results)
    }
}

impl BlockDevice for CacheSet {
    fn size_bytes(&self) -> u64 {
        self.geometry.virtual_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        for p in self.pieces(offset, buf.len()) {
            let virt = offset + p.buf.start as u64;
            self.read_piece(&mut buf[p.buf.clone()], &p, virt)?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.sums.note_write(&self.geometry, buf, offset);
        for p in self.pieces(offset, buf.len()) {
            self.write_piece(&buf[p.buf], p.target, p.member_offset)?;
        }
        Ok(())
    }

    /// Flushes every member written to; succeeds if a healthy one did (a
    /// member that fails its flush is failed).
    fn flush(&self) -> DeviceResult<()> {
        let results: Vec<(usize, DeviceResult<()>)> = (0..self.members.len())
            .filter(|&i| self.members[i].state() != MemberState::Failed)
            .filter_map(|i| self.members[i].dev().map(|d| (i, d.flush())))
            .collect();
        self.settle("flush", results)
    }

    fn discard_helps(&self) -> bool {
        self.members
            .iter()
            .any(|m| m.dev().is_some_and(|d| d.discard_helps()))
    }

    /// Best effort on every copy: a discard that fails changes nothing the
    /// set relies on.
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        self.sums.forget(&self.geometry, offset, len);
        for p in self.pieces(offset, len as usize) {
            for i in self.copies(p.target) {
                if let Some(dev) = self.members[i].healthy_dev() {
                    let r = dev.discard(p.member_offset, p.buf.len() as u64);
                    if let Err(e) = r {
                        log::warn!("{}: member {i} discard error: {e}", self.name);
                    }
                }
            }
        }
        Ok(())
    }

    fn is_volatile(&self) -> bool {
        self.members
            .iter()
            .any(|m| m.dev().is_some_and(|d| d.is_volatile()))
    }

    fn reads_in_parallel(&self) -> bool {
        (self.members.iter()).all(|m| m.dev().is_none_or(|d| d.reads_in_parallel()))
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn identity(&self) -> u64 {
        self.set_id
    }

    fn members(&self) -> Option<&dyn crate::device::members::Members> {
        Some(self)
    }
}

impl crate::device::members::Members for CacheSet {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn set_name(&self) -> &str {
        &self.name
    }
    fn epoch(&self) -> u64 {
        CacheSet::epoch(self)
    }
    fn mirror_slots(&self) -> u64 {
        CacheSet::mirror_slots(self)
    }
    fn unusable_slots(&self) -> Vec<Range<u32>> {
        CacheSet::unusable_slots(self)
    }
    fn own_slots(&self, i: usize) -> Range<u32> {
        CacheSet::own_slots(self, i)
    }
    fn member_statuses(&self) -> Vec<MemberStatus> {
        CacheSet::members(self)
    }
    fn state_name(&self) -> &'static str {
        CacheSet::state_name(self)
    }
    fn degraded(&self) -> bool {
        CacheSet::degraded(self)
    }
    fn meta_bytes(&self) -> u64 {
        self.geometry().meta_bytes
    }
    fn set_meta_check(&self, check: crate::device::members::MetaCheck) {
        CacheSet::set_meta_check(self, check)
    }
    fn scrub_meta(&self, range: Range<u64>, clean: bool) -> u64 {
        CacheSet::scrub_meta(self, range, clean)
    }
    fn count_meta_damage(&self) {
        CacheSet::count_meta_damage(self)
    }
    fn begin_resync(&self) {
        CacheSet::begin_resync(self)
    }
    fn resync_pending(&self) -> bool {
        CacheSet::resync_pending(self)
    }
    fn resync(&self, progress: &mut dyn FnMut(u64, u64)) -> DeviceResult<()> {
        CacheSet::resync(self, progress)
    }
    fn stop_resync(&self) {
        CacheSet::stop_resync(self)
    }
    fn replace(
        &self,
        i: usize,
        new: DeviceRef,
        progress: &mut dyn FnMut(u64, u64),
    ) -> DeviceResult<()> {
        CacheSet::replace(self, i, new, progress)
    }
}
