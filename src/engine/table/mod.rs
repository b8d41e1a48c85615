//! The table part: which cache slot holds which origin block, and
//! everything that changes with it, under the metadata lock (`Meta`).
//!
//! `Meta`'s fields are private to this folder. Other parts read the
//! mappings through `Meta::table` (a `&Table`: lookups, sector maps,
//! counts) and change them only by appending records (`Cache::append`,
//! `slots.rs`), which the journal makes durable and replays whole or not at
//! all. Slots are allocated, evicted and filled with data here too.
//!
//! - `map.rs`: the mapping table (`Table`), changed only by records.
//! - `entries.rs`: its per-slot entries, 4 bytes each for origins below
//!   2^31 blocks.
//! - `index.rs`: origin block -> slot.
//! - `sectors.rs`: which sectors of a block hold data, and which are dirty.
//! - `free.rs`: the free slots, as a bitmap that finds adjacent runs.
//! - `groups.rs`: flush groups and the older versions kept for writeback
//!   in flush order.
//! - `pools.rs`: the free slots of a cache set's mirrored and own slots.
//! - `segments.rs`: the log placement's segments, filled in order.
//! - `releases.rs`: removed mappings not yet durable (freed slots, released
//!   blocks).
//! - `share.rs`: the volumes' shares at eviction (floors, maximums).
//! - `slots.rs`: appending records, allocating and evicting slots, storing
//!   data in new slots (`impl Engine`).

pub mod entries;
pub mod free;
pub mod groups;
pub mod index;
pub mod introspect;
pub(crate) mod lock;
pub mod map;
pub mod pools;
pub(crate) mod releases;
pub mod sectors;
pub mod segments;
pub(crate) mod share;
pub mod slots;

use std::ops::RangeInclusive;

use super::format::{entry_decode, Record, ENTRY_DIRTY};
use super::journal::crash_log::CrashLog;
use super::policy::{Policy, PolicyKind};
use map::Table;

/// State under the metadata lock. Held only for in-memory work, never I/O.
pub(crate) struct Meta {
    table: Table,
    policy: Box<dyn Policy>,
    /// Slots that are free on disk: safe to overwrite.
    free: pools::Pools,
    /// Removed mappings not yet durable: the slots they freed join `free`
    /// when the commit that carries their records completes.
    releases: releases::Releases,
    /// Records applied in memory, not yet written to the journal.
    records: Vec<Record>,
    /// Per slot: when its block last became dirty, in seconds since open
    /// (wrapping; valid while the slot is dirty). 2 bytes per slot.
    dirty_since_s: Vec<u16>,
    /// The records not yet journalled, mirrored where a process death
    /// does not lose them (the journal part's; kept here because it
    /// changes with `records`).
    crash_log: Option<CrashLog>,
    /// The log placement's segments, if on.
    log: Option<segments::Geometry>,
    /// Per slot, 1 bit: a request used the block since it was stored
    /// there (the log placement's cleaner keeps such blocks: clean.rs).
    /// Empty without the log placement, which alone reads it.
    touched: Vec<u64>,
    /// Writeback in flush order: each dirty slot's group, and the older
    /// versions kept for their groups (groups.rs). `None` otherwise.
    groups: Option<groups::Groups>,
    /// Bit `v`: volume `v` is being removed while served (`Engine::
    /// remove_volume_served`): no slot is handed out for its blocks.
    sealed: u64,
}

/// Records a commit takes to the journal, and the releases they carry.
pub(crate) struct Batch {
    pub records: Vec<Record>,
    releases: releases::Batch,
}

impl Batch {
    /// The commit frees slots when it is durable.
    pub fn frees_slots(&self) -> bool {
        !self.releases.slots.is_empty()
    }

    /// The last release this batch carries.
    pub fn releases_through(&self) -> u64 {
        self.releases.through
    }
}

impl Meta {
    /// The state of an opened cache: the loaded table, the policy ordered
    /// from it (slot order), its free slots.
    pub(crate) fn new(table: Table, policy: PolicyKind, log: Option<segments::Geometry>) -> Meta {
        let mut policy = policy.build(table.slot_count() as u32);
        for slot in 0..table.slot_count() as u32 {
            if let Some((block, _)) = table.slot_block(slot) {
                policy.inserted(slot, block);
            }
        }
        let free = new_pools(&table, log);
        let dirty_since_s = vec![0u16; table.slot_count() as usize];
        let touched = match log {
            Some(_) => vec![0u64; (table.slot_count() as usize).div_ceil(64)],
            None => Vec::new(),
        };
        Meta {
            table,
            policy,
            free,
            releases: Default::default(),
            records: Vec::new(),
            dirty_since_s,
            crash_log: None,
            log,
            touched,
            groups: None,
            sealed: 0,
        }
    }

    /// The cache device grew to `slot_count` slots, and the superblock
    /// that says so is durable (`Engine::grow_cache`): every per-slot
    /// structure takes the new slots, free; the policy keeps its order.
    pub(crate) fn grow_slots(&mut self, slot_count: u64) {
        self.table.grow_slots(slot_count);
        self.policy.grow(slot_count as u32);
        self.dirty_since_s.resize(slot_count as usize, 0);
        if self.log.is_some() {
            self.touched.resize((slot_count as usize).div_ceil(64), 0);
        }
        if let Some(g) = self.groups.as_mut() {
            g.grow_slots(slot_count);
        }
        self.free.grow(slot_count as u32, self.log);
        if let Some(log) = self.crash_log.as_mut() {
            log.slots_grew(slot_count);
        }
    }

    /// Volume `v` is being removed: no slot for its blocks from now on
    /// (`alloc_slots` finds none, so a write goes around the cache and a
    /// read is not promoted).
    pub(crate) fn seal_volume(&mut self, v: usize) {
        self.sealed |= 1 << v;
    }

    /// Volume `v`'s removal was given up: its blocks may take slots again.
    pub(crate) fn unseal_volume(&mut self, v: usize) {
        self.sealed &= !(1 << v);
    }

    /// `key`'s volume is being removed (`seal_volume`).
    pub(crate) fn sealed(&self, key: u64) -> bool {
        self.sealed != 0 && self.sealed & (1 << self.table.keys().split(key).0) != 0
    }

    /// Writeback in flush order: the groups as loaded (recovery.rs). The
    /// slots their shadows hold leave the free slots.
    pub(crate) fn keep_groups(&mut self, groups: groups::Groups) {
        for slot in groups.shadow_slots() {
            self.free.remove(slot);
        }
        self.groups = Some(groups);
    }

    /// The flush groups, with writeback in flush order.
    pub(crate) fn groups(&self) -> Option<&groups::Groups> {
        self.groups.as_ref()
    }

    /// The shadow of `block` in group `g` was written to the origin.
    pub(crate) fn shadow_written(&mut self, g: u64, block: u64) {
        if let Some(gr) = self.groups.as_mut() {
            gr.shadow_written(g, block);
        }
    }

    /// True unless `slot` holds dirty data of a closed group, which must
    /// reach the origin as it is: a write then goes to a new slot and the
    /// old one stays as a shadow (groups.rs).
    pub(crate) fn may_overwrite(&self, slot: u32) -> bool {
        let Some(g) = self.groups.as_ref() else {
            return true;
        };
        !matches!(self.table.slot_block(slot), Some((_, true))) || g.group_of(slot) >= g.open()
    }

    /// Writeback in flush order: `slot` must stay where it is until its
    /// group is on the origin: it holds dirty data of a closed group, or
    /// an older version kept for one (a shadow). The log placement's
    /// cleaner neither moves nor evicts such a slot, and does not choose
    /// a segment holding one (writeback/clean.rs).
    pub(crate) fn pinned(&self, slot: u32) -> bool {
        self.groups
            .as_ref()
            .is_some_and(|g| g.is_shadow(slot) || !self.may_overwrite(slot))
    }

    /// The checkpoint of the table as it is now (with the open flush
    /// group: commit.rs takes one only while no closed group is pending).
    pub(crate) fn snapshot(&self) -> crate::engine::format::CheckpointData {
        let mut data = self.table.snapshot();
        data.open_group = self.groups.as_ref().map_or(0, |g| g.open());
        data
    }

    /// What the cache has of `block`'s sectors `run` (`Table::cached`), not
    /// writable in place where the slot's data must stay as it is for its
    /// flush group.
    pub(crate) fn cached(&self, block: u64, run: sectors::SectorRun) -> Option<map::Cached> {
        let mut c = self.table.cached(block, run)?;
        c.writable &= self.may_overwrite(c.slot);
        Some(c)
    }

    /// The log placement's segment geometry, if on.
    pub(crate) fn log(&self) -> Option<segments::Geometry> {
        self.log
    }

    /// A request used `slot`'s block since it was stored there.
    pub(crate) fn touched(&self, slot: u32) -> bool {
        self.touched
            .get(slot as usize / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    /// The log placement's cleaner: whether the clean block in `slot` is
    /// worth keeping: the policy's word, or else used since it was stored.
    pub(crate) fn keep_in_log(&self, slot: u32) -> bool {
        self.policy
            .keep_in_log(slot)
            .unwrap_or_else(|| self.touched(slot))
    }

    /// The cleaner kept or is evicting `slot`'s block: the policy learns it.
    pub(crate) fn log_pass(&mut self, slot: u32, block: u64, keep: bool) {
        self.policy.log_pass(slot, block, keep);
    }

    /// (Nothing to keep without the log placement.)
    pub(super) fn set_touched(&mut self, slot: u32, on: bool) {
        let Some(w) = self.touched.get_mut(slot as usize / 64) else {
            return;
        };
        if on {
            *w |= 1 << (slot % 64);
        } else {
            *w &= !(1 << (slot % 64));
        }
    }

    /// The free slots (pools, segments).
    pub(crate) fn pools(&self) -> &pools::Pools {
        &self.free
    }

    /// Starts emptying `segment` of the pool for data this dirty (clean.rs).
    pub(crate) fn begin_cleaning(&mut self, dirty: bool, segment: std::ops::Range<u32>) {
        self.free.begin_cleaning(dirty, segment)
    }

    /// Gives up emptying the pool's segment being emptied.
    pub(crate) fn end_cleaning(&mut self, dirty: bool) {
        self.free.end_cleaning(dirty)
    }

    /// Segments waiting for their discard (clean.rs).
    pub(crate) fn take_trims(&mut self) -> Vec<std::ops::Range<u32>> {
        self.free.take_trims()
    }

    /// A segment's discard is done: its slots are free again.
    pub(crate) fn trim_done(&mut self, segment: std::ops::Range<u32>) {
        self.free.trim_done(segment)
    }

    /// Volume `v` grew to `blocks` blocks online (`Table::grow_volume`).
    pub(crate) fn grow_volume(&mut self, v: usize, blocks: u64) {
        self.table.grow_volume(v, blocks)
    }

    /// A volume of `blocks` blocks was added online (`Table::add_volume`).
    pub(crate) fn add_volume(&mut self, blocks: u64) -> usize {
        self.table.add_volume(blocks)
    }

    /// The mappings, to read.
    pub(crate) fn table(&self) -> &Table {
        &self.table
    }

    /// Heap bytes held by the metadata (capacities, not lengths).
    pub fn heap_bytes(&mut self) -> u64 {
        fn cap<T>(v: &Vec<T>) -> u64 {
            (v.capacity() * std::mem::size_of::<T>()) as u64
        }
        self.table.heap_bytes()
            + self.policy.heap_bytes()
            + self.free.heap_bytes()
            + self.releases.heap_bytes()
            + cap(&self.records)
            + cap(&self.dirty_since_s)
            + cap(&self.touched)
            + self.groups.as_ref().map_or(0, |g| g.heap_bytes())
    }

    /// A request reached a cached slot: the policy learns it.
    pub(crate) fn accessed(&mut self, slot: u32) {
        self.set_touched(slot, true);
        self.policy.accessed(slot);
    }

    pub(crate) fn policy_kind(&self) -> PolicyKind {
        self.policy.kind()
    }

    /// Switches the replacement policy; the new one starts from the old
    /// one's order.
    pub(crate) fn set_policy(&mut self, kind: PolicyKind) {
        if self.policy.kind() == kind {
            return;
        }
        let mut p = kind.build(self.table.slot_count() as u32);
        for slot in self.policy.order() {
            if let Some((block, _)) = self.table.slot_block(slot) {
                p.inserted(slot, block);
            }
        }
        self.policy = p;
    }

    /// Slots free on disk now that may take dirty data: writes wait for
    /// them and the background keeps a reserve of them (on a cache set,
    /// the mirrored slots; clean data also takes the others).
    pub(crate) fn free_slots(&self) -> usize {
        self.free.dirty_capable()
    }

    /// Slots of `range` (within one pool) not free on disk.
    pub(crate) fn used_in(&self, range: std::ops::Range<u32>) -> u64 {
        self.free.used_in(range)
    }

    /// The cache was given up (io/failure.rs): nothing it holds is served
    /// again, and no record is written any more.
    pub(crate) fn forget_all(&mut self) {
        self.table = self.table.emptied();
        self.policy = self.policy.kind().build(self.table.slot_count() as u32);
        self.free = new_pools(&self.table, self.log);
        self.records.clear();
        self.releases = Default::default();
    }

    /// Slots freed by records not yet durable (free after the next commit).
    pub(crate) fn waiting_slots(&self) -> usize {
        self.releases.waiting_slots()
    }

    /// Records or releases wait for a commit.
    pub(crate) fn commit_waiting(&self) -> bool {
        !self.records.is_empty() || self.releases.waiting_slots() > 0
    }

    /// Some block in `blocks` lost its mapping by a record not yet durable
    /// (`durable`: the last release a commit made durable).
    pub(crate) fn releases_pending(&self, blocks: RangeInclusive<u64>, durable: u64) -> bool {
        self.releases.pending_in(blocks, durable)
    }

    /// A commit begins: it takes the records buffered so far.
    pub(crate) fn take_batch(&mut self) -> Batch {
        Batch {
            records: std::mem::take(&mut self.records),
            releases: self.releases.take(),
        }
    }

    /// The commit of `batch` is durable: the slots it freed are free.
    pub(crate) fn batch_durable(&mut self, batch: Batch) {
        let through = batch.releases.through;
        self.free.extend(batch.releases.slots);
        self.releases.forget_durable(through);
    }

    /// The commit of `batch` failed: its records and releases wait for
    /// the next one, ahead of those appended since.
    pub(crate) fn batch_failed(&mut self, batch: Batch) {
        let later = std::mem::replace(&mut self.records, batch.records);
        self.records.extend(later);
        self.releases.restore(batch.releases);
    }

    pub(crate) fn crash_log(&mut self) -> Option<&mut CrashLog> {
        self.crash_log.as_mut()
    }

    pub(crate) fn crash_log_ref(&self) -> Option<&CrashLog> {
        self.crash_log.as_ref()
    }

    pub(crate) fn set_crash_log(&mut self, log: CrashLog) {
        self.crash_log = Some(log);
    }

    /// Takes the crash log out (to remove or drop it after the lock).
    pub(crate) fn take_crash_log(&mut self) -> Option<CrashLog> {
        self.crash_log.take()
    }

    /// Blocks dirty for at least `max_age_s` seconds at `now_s`, scanning
    /// slots from `from` on, wrapping, until `want` are found or every
    /// slot was seen. Returns them and the slot to go on from, or `None`
    /// for that if the scan saw every slot.
    pub(crate) fn aged_dirty(
        &self,
        from: u32,
        want: usize,
        now_s: u16,
        max_age_s: u16,
    ) -> (Vec<u64>, Option<u32>) {
        let n = self.table.entries.len();
        let mut v = Vec::new();
        let mut s = from as usize % n.max(1);
        for _ in 0..n {
            let e = self.table.entries.get(s);
            if e & ENTRY_DIRTY != 0 && now_s.wrapping_sub(self.dirty_since_s[s]) >= max_age_s {
                if let Some((b, _)) = entry_decode(e) {
                    v.push(b);
                }
            }
            s = if s + 1 == n { 0 } else { s + 1 };
            if v.len() >= want {
                return (v, Some(s as u32));
            }
        }
        (v, None)
    }
}

/// The free slots of `table`, with the log placement's segments if on.
fn new_pools(table: &Table, log: Option<segments::Geometry>) -> pools::Pools {
    let mut free = pools::Pools::new(table.slot_count(), table.dirty_slots());
    free.extend(table.free_slots());
    if let Some(g) = log {
        free.enable_log(g);
    }
    free
}
