//! The on-disk format of the cache device, parsed in this one place from
//! bytes to typed values. docs/format.md describes it byte by byte, with the
//! commit protocol.
//!
//! Layout (all offsets in bytes, every region 4096-aligned):
//! superblock copy 0 at 0, copy 1 at 4096, then the journal ring, then two
//! checkpoint areas, then the data region (aligned to the cache block size).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::admission::AdmissionSettings;
use super::modes::Mode;
use super::policy::share::{Share, Sharing};
use super::sectors::{SectorRun, SectorSet, SECTOR_BYTES};

pub const PAGE_BYTES: u64 = 4096;
/// The journal follows the two superblock copies.
pub const JOURNAL_OFFSET: u64 = 2 * PAGE_BYTES;
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"TIERCACH";
/// Format 2 added sector-granular blocks (sector maps in checkpoints, run
/// records in the journal, commit-atomic journal replay); format 3, the
/// volume table (volumes.rs). A cache of one origin named `vol0` is still
/// written as version 2 (`Superblock::seal`), which older releases read.
pub const FORMAT_VERSION: u32 = 3;
/// The version of a cache with no volume table.
pub const FORMAT_VERSION_ONE_VOLUME: u32 = 2;
/// Format 4: a cache whose device grew (`Layout::grown`): its checkpoint
/// areas follow the data region. With or without a volume table (a count
/// of 0 reads as version 2's one volume). Older releases refuse it by its
/// version rather than misread it.
pub const FORMAT_VERSION_GROWN: u32 = 4;

pub mod volumes;
pub use volumes::{VolumeEntry, VolumeTable, MAX_VOLUMES};
pub const JOURNAL_MAGIC: u32 = 0x4a43_5454; // "TTCJ" little-endian
pub const CHECKPOINT_MAGIC: u32 = 0x5043_5454; // "TTCP" little-endian

pub const MIN_BLOCK_BYTES: u32 = 4096;
pub const MAX_BLOCK_BYTES: u32 = 1 << 20;
/// True for a supported cache block size: a power of two in
/// MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES.
pub fn block_bytes_valid(bytes: u64) -> bool {
    bytes.is_power_of_two() && (MIN_BLOCK_BYTES as u64..=MAX_BLOCK_BYTES as u64).contains(&bytes)
}

/// The smallest useful cache, in blocks.
pub const MIN_SLOTS: u64 = 16;

/// Slot entry encoding (checkpoint pages and the in-memory table): 0 means
/// the slot is free; otherwise bits 0..62 hold origin block + 1 and bit 63 is
/// the dirty flag.
pub const ENTRY_FREE: u64 = 0;
pub const ENTRY_DIRTY: u64 = 1 << 63;

pub fn entry_encode(block: u64, dirty: bool) -> u64 {
    (block + 1) | if dirty { ENTRY_DIRTY } else { 0 }
}

/// (origin block, dirty) of a non-free entry.
pub fn entry_decode(entry: u64) -> Option<(u64, bool)> {
    if entry == ENTRY_FREE {
        return None;
    }
    let b = entry & !ENTRY_DIRTY;
    if b == 0 {
        return None;
    }
    Some((b - 1, entry & ENTRY_DIRTY != 0))
}

/// The superblock page: 256 bytes of fields, whose CRC covers bytes
/// 0..252, then the volume table (volumes.rs) with a CRC of its own.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct Superblock {
    pub magic: [u8; 8],
    pub version: U32,
    pub block_bytes: U32,
    /// Increases by one with every superblock write; the valid copy with the
    /// highest generation is current.
    pub generation: U64,
    pub cache_device_bytes: U64,
    pub origin_bytes: U64,
    pub origin_identity: U64,
    pub slot_count: U64,
    pub journal_offset: U64,
    pub journal_pages: U64,
    pub checkpoint_offset: [U64; 2],
    pub checkpoint_pages: U64,
    pub data_offset: U64,
    /// Which checkpoint area (0 or 1) holds the current checkpoint.
    pub checkpoint_area: U32,
    /// Cache mode, see `Mode::to_u32`.
    pub mode: U32,
    /// Generation stamped in every page of the current checkpoint.
    pub checkpoint_generation: U64,
    /// Sequence number of the first journal page to replay.
    pub journal_replay_seq: U64,
    /// 1 after a clean shutdown, 0 while open.
    pub clean_shutdown: U32,
    /// Replacement policy, see `PolicyKind`.
    pub policy: U32,
    pub writeback_high_pct: U32,
    pub writeback_low_pct: U32,
    pub writeback_max_age_secs: U32,
    pub flags: U32,
    pub created_unix_secs: U64,
    /// Cache device errors after which no new blocks are admitted (0: never).
    pub cache_error_limit: U64,
    /// Admission (engine/admission.rs): the sequential cutoff in bytes (0:
    /// off), promotion after this many misses above this occupancy, flags.
    pub sequential_cutoff_bytes: U64,
    pub promote_after: U32,
    pub selective_above_pct: U32,
    pub admission_flags: U32,
    /// Write back everything after this many seconds of an idle origin.
    pub writeback_idle_secs: U32,
    /// Writeback in flush order: the open group when the current
    /// checkpoint was taken (every dirty slot in it belongs to that group).
    pub checkpoint_open_group: U64,
    /// The name the cache is registered under (ASCII, NUL-padded; all
    /// zero: none recorded), so a cache whose registry was lost is found
    /// again by name (`tiercache import`, the unit's boot condition).
    /// Bytes that were reserved and zero: older releases ignore it.
    pub cache_name: [u8; CACHE_NAME_BYTES],
    pub reserved: [u8; 4],
    pub crc: U32,
    pub volumes: VolumeTable,
}
const _: () = assert!(std::mem::size_of::<Superblock>() == PAGE_BYTES as usize);

/// Longest cache name the superblock records; a longer registered name
/// is not recorded.
pub const CACHE_NAME_BYTES: usize = 48;

/// Superblock flag: the user accepted data loss (writeback on a volatile cache).
pub const SB_FLAG_ALLOW_VOLATILE_WRITEBACK: u32 = 1;
/// Superblock flag: the cache failed over after a metadata write failed, so
/// the origin may have changed under clean mappings; open drops them.
pub const SB_FLAG_DISTRUST_CLEAN: u32 = 2;
/// Superblock flag: the log placement (`Placement::Log`): new data is laid
/// down in order through 1 MiB segments of the data region.
pub const SB_FLAG_LOG_PLACEMENT: u32 = 4;
/// Superblock flag: writeback in flush order (`WritebackOrder::Flush`).
pub const SB_FLAG_FLUSH_ORDER: u32 = 8;
/// The log placement's segment size.
pub const SEGMENT_BYTES: u64 = 1 << 20;
/// Admission flag: the guard is off.
pub const ADMISSION_FLAG_NO_GUARD: u32 = 1;

impl Superblock {
    /// The registered name recorded, if any (`cache_name`).
    pub fn name(&self) -> Option<String> {
        let end = self
            .cache_name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(CACHE_NAME_BYTES);
        let name = std::str::from_utf8(&self.cache_name[..end]).ok()?;
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        (!name.is_empty() && name.chars().all(ok)).then(|| name.to_string())
    }

    /// Records `name` (none if it is longer than `CACHE_NAME_BYTES`).
    pub fn set_name(&mut self, name: &str) {
        self.cache_name = [0; CACHE_NAME_BYTES];
        if name.len() <= CACHE_NAME_BYTES {
            self.cache_name[..name.len()].copy_from_slice(name.as_bytes());
        }
    }

    /// The background writeback settings it records.
    pub fn writeback(&self) -> super::WritebackSettings {
        super::WritebackSettings {
            high_pct: self.writeback_high_pct.get(),
            low_pct: self.writeback_low_pct.get(),
            max_age_secs: self.writeback_max_age_secs.get(),
            idle_secs: self.writeback_idle_secs.get(),
        }
    }

    pub fn admission(&self) -> AdmissionSettings {
        AdmissionSettings {
            sequential_cutoff_bytes: self.sequential_cutoff_bytes.get(),
            promote_after: self.promote_after.get(),
            selective_above_pct: self.selective_above_pct.get(),
            guard: self.admission_flags.get() & ADMISSION_FLAG_NO_GUARD == 0,
        }
    }

    pub fn set_admission(&mut self, a: &AdmissionSettings) {
        self.sequential_cutoff_bytes.set(a.sequential_cutoff_bytes);
        self.promote_after.set(a.promote_after);
        self.selective_above_pct.set(a.selective_above_pct);
        self.admission_flags
            .set(if a.guard { 0 } else { ADMISSION_FLAG_NO_GUARD });
    }
}

impl Superblock {
    pub fn compute_crc(&self) -> u32 {
        crc32c::crc32c(&self.as_bytes()[..252])
    }

    /// Sets the version the layout and the volume table call for, then
    /// the CRC.
    pub fn seal(&mut self) {
        self.version.set(if self.layout().is_grown() {
            FORMAT_VERSION_GROWN
        } else if self.volumes.count.get() == 0 {
            FORMAT_VERSION_ONE_VOLUME
        } else {
            FORMAT_VERSION
        });
        self.crc = U32::new(self.compute_crc());
    }

    /// The layout as recorded (open checks it against the device:
    /// recovery.rs `validate_superblock`).
    pub fn layout(&self) -> Layout {
        Layout {
            block_bytes: self.block_bytes.get(),
            slot_count: self.slot_count.get(),
            journal_offset: self.journal_offset.get(),
            journal_pages: self.journal_pages.get(),
            checkpoint_offset: [
                self.checkpoint_offset[0].get(),
                self.checkpoint_offset[1].get(),
            ],
            checkpoint_pages: self.checkpoint_pages.get(),
            data_offset: self.data_offset.get(),
        }
    }

    /// Records `layout` (a grown one) and the device size it was made for.
    pub fn set_layout(&mut self, layout: &Layout, device_bytes: u64) {
        self.cache_device_bytes.set(device_bytes);
        self.slot_count.set(layout.slot_count);
        self.checkpoint_offset = layout.checkpoint_offset.map(U64::new);
        self.checkpoint_pages.set(layout.checkpoint_pages);
    }

    /// The 4096-byte page.
    pub fn to_page(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }

    /// Records `volumes` (volume 0's size and identity in the fields of
    /// its own, the rest in the volume table).
    pub fn set_volume_list(&mut self, volumes: &[VolumeEntry]) {
        self.origin_bytes = U64::new(volumes[0].bytes);
        self.origin_identity = U64::new(volumes[0].identity);
        self.volumes.set(volumes);
    }

    /// Volume `v`'s origin has `bytes` bytes (it grew online).
    pub fn set_volume_bytes(&mut self, v: usize, bytes: u64) {
        let mut list = self.volume_list();
        if let Some(entry) = list.get_mut(v) {
            entry.bytes = bytes;
        }
        self.set_volume_list(&list);
    }

    /// Volume `v`'s mode becomes `mode` (`None`: the cache's). A lone
    /// volume switches with the cache's mode instead (`set_mode_everywhere`:
    /// `Engine::set_volume_mode`), which keeps it at version 2.
    pub fn set_volume_mode(&mut self, v: usize, mode: Option<Mode>) {
        let mut list = self.volume_list();
        list[v].mode = mode;
        self.volumes.set(&list);
    }

    /// Every volume has the cache's mode, which becomes `mode`.
    pub fn set_mode_everywhere(&mut self, mode: Mode) {
        self.mode.set(mode.to_u32());
        let mut list = self.volume_list();
        list.iter_mut().for_each(|v| v.mode = None);
        self.volumes.set(&list);
    }

    /// Volume `v`'s share becomes `share`.
    pub fn set_volume_share(&mut self, v: usize, share: Share) {
        let mut list = self.volume_list();
        list[v].share = share;
        self.volumes.set(&list);
    }

    /// How the volumes share the cache (a lone volume: `Global`).
    pub fn sharing(&self) -> Sharing {
        Sharing::from_u32(self.volumes.sharing.get()).expect("validated")
    }

    /// The volumes share the cache as `sharing` (kept only with a volume
    /// table: a lone volume has none, and shares with nobody).
    pub fn set_sharing(&mut self, sharing: Sharing) {
        let list = self.volume_list();
        self.volumes.sharing = U32::new(sharing.to_u32());
        self.volumes.set(&list);
    }

    /// Volume `v`'s mode: its own, else the cache's.
    pub fn volume_mode(&self, v: &VolumeEntry) -> Option<Mode> {
        v.mode.or_else(|| Mode::from_u32(self.mode.get()))
    }

    /// Volume `v` was removed while served (`VOLUME_REMOVED`): it keeps its
    /// record, and its keys, until the next open; its share is dropped.
    pub fn set_volume_removed(&mut self, v: usize) {
        let mut list = self.volume_list();
        list[v].removed = true;
        list[v].share = Share::default();
        self.volumes.set(&list);
    }

    /// The superblock with the records of volumes removed while served
    /// taken out (the next open's, once the table's keys moved down:
    /// recovery.rs `finish_removals`), and which indexes they had.
    pub fn without_removed(&self) -> (Superblock, Vec<usize>) {
        let list = self.volume_list();
        let gone: Vec<usize> = (0..list.len()).filter(|&v| list[v].removed).collect();
        let mut sb = *self;
        if !gone.is_empty() {
            let live: Vec<VolumeEntry> = list.into_iter().filter(|v| !v.removed).collect();
            sb.set_volume_list(&live);
        }
        (sb, gone)
    }

    /// The volumes it records (volume 0 first), those removed while served
    /// included (`VolumeEntry::removed`).
    pub fn volume_list(&self) -> Vec<VolumeEntry> {
        self.volumes
            .volumes(self.origin_bytes.get(), self.origin_identity.get())
            .expect("a parsed superblock's volume table is valid")
    }

    /// Parses a superblock page; `Err` says why it is not a valid one.
    pub fn parse(page: &[u8]) -> Result<Superblock, String> {
        let (mut sb, _) =
            Superblock::read_from_prefix(page).map_err(|_| "short superblock".to_string())?;
        if sb.magic != SUPERBLOCK_MAGIC {
            return Err("no tiercache magic".into());
        }
        if sb.crc.get() != sb.compute_crc() {
            return Err("checksum mismatch".into());
        }
        match sb.version.get() {
            // Version 2 has no table: the rest of its page is unused and
            // no checksum covers it (a flipped bit there is harmless), so
            // it is not read at all.
            FORMAT_VERSION_ONE_VOLUME => sb.volumes = VolumeTable::new_zeroed(),
            FORMAT_VERSION if sb.volumes.count.get() > 0 => {}
            FORMAT_VERSION => return Err("format version 3 without a volume table".into()),
            FORMAT_VERSION_GROWN if !sb.layout().is_grown() => {
                return Err("format version 4 without a grown layout".into())
            }
            FORMAT_VERSION_GROWN if sb.volumes.count.get() == 0 => {
                sb.volumes = VolumeTable::new_zeroed()
            }
            FORMAT_VERSION_GROWN => {}
            1 => {
                return Err(
                    "format version 1, written by a tiercache older than sector-granular \
                     blocks; this tiercache reads versions 2 to 4: write the cache back and \
                     dissolve it with the tiercache that made it (`tiercache detach`), then \
                     create it again"
                        .into(),
                )
            }
            v => {
                return Err(format!(
                    "unsupported format version {v}: this tiercache reads versions 2 to 4 \
                     (a newer tiercache made this cache)"
                ))
            }
        }
        sb.volumes
            .volumes(sb.origin_bytes.get(), sb.origin_identity.get())?;
        Ok(sb)
    }
}

pub const JOURNAL_HEADER_BYTES: usize = 32;
pub const RECORD_BYTES: usize = 16;
pub const RECORDS_PER_PAGE: usize = (PAGE_BYTES as usize - JOURNAL_HEADER_BYTES) / RECORD_BYTES;

/// Header of a journal page. The CRC covers the whole page with the crc
/// field taken as zero.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct JournalHeader {
    pub magic: U32,
    pub crc: U32,
    pub seq: U64,
    /// Sequence number of the first page of the commit this page belongs to.
    pub commit_first_seq: U64,
    pub record_count: U32,
    /// Pages in the commit this page belongs to: replay applies a commit
    /// only when all of them are intact.
    pub commit_pages: U32,
}
const _: () = assert!(std::mem::size_of::<JournalHeader>() == JOURNAL_HEADER_BYTES);

/// One metadata change, 16 bytes on disk.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct RawRecord {
    pub slot: U32,
    pub kind: U32,
    pub block: U64,
}
const _: () = assert!(std::mem::size_of::<RawRecord>() == RECORD_BYTES);

/// A metadata change, as applied by both the running engine and recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// `slot` now holds all of origin `block`; any other slot holding
    /// `block` is freed.
    Map { slot: u32, block: u64, dirty: bool },
    /// `slot` now holds only sectors `run` of origin `block` (dirty or
    /// clean); any other slot holding `block` is freed.
    MapRun {
        slot: u32,
        block: u64,
        run: SectorRun,
        dirty: bool,
    },
    /// Sectors `run` of `slot` (which holds `block`) now hold data: dirty,
    /// or, for `dirty: false`, those that held none now hold clean data
    /// (sectors that were valid keep their state).
    AddRun {
        slot: u32,
        block: u64,
        run: SectorRun,
        dirty: bool,
    },
    /// `slot`'s block has been written back: it is clean.
    Clean { slot: u32 },
    /// `slot` is free.
    Unmap { slot: u32 },
    /// Writeback in flush order: a client flush closed the open group;
    /// `group` is the new open one (table/groups.rs).
    Close { group: u64 },
    /// Writeback in flush order: `group` is on the origin and flushed;
    /// the older versions kept for it are freed.
    Done { group: u64 },
}

const KIND_MAP_CLEAN: u32 = 1;
const KIND_MAP_DIRTY: u32 = 2;
const KIND_CLEAN: u32 = 3;
const KIND_UNMAP: u32 = 4;
const KIND_MAP_RUN_CLEAN: u32 = 5;
const KIND_MAP_RUN_DIRTY: u32 = 6;
const KIND_ADD_RUN_CLEAN: u32 = 7;
const KIND_ADD_RUN_DIRTY: u32 = 8;
const KIND_GROUP_CLOSE: u32 = 9;
const KIND_GROUP_DONE: u32 = 10;

/// Run records carry the run in the kind word: bits 8..20 the first
/// sector, bits 20..32 the sector count minus one.
fn kind_with_run(kind: u32, run: SectorRun) -> u32 {
    kind | (run.first as u32) << 8 | (run.count as u32 - 1) << 20
}

impl Record {
    pub fn slot(&self) -> u32 {
        match *self {
            Record::Map { slot, .. }
            | Record::MapRun { slot, .. }
            | Record::AddRun { slot, .. }
            | Record::Clean { slot }
            | Record::Unmap { slot } => slot,
            Record::Close { .. } | Record::Done { .. } => 0,
        }
    }

    /// A flush group's record (names no slot).
    pub fn is_group(&self) -> bool {
        matches!(self, Record::Close { .. } | Record::Done { .. })
    }

    pub fn to_raw(self) -> RawRecord {
        let pick = |dirty: bool, clean_kind: u32, dirty_kind: u32| {
            if dirty {
                dirty_kind
            } else {
                clean_kind
            }
        };
        let (slot, kind, block) = match self {
            Record::Map { slot, block, dirty } => {
                (slot, pick(dirty, KIND_MAP_CLEAN, KIND_MAP_DIRTY), block)
            }
            Record::MapRun {
                slot,
                block,
                run,
                dirty,
            } => (
                slot,
                kind_with_run(pick(dirty, KIND_MAP_RUN_CLEAN, KIND_MAP_RUN_DIRTY), run),
                block,
            ),
            Record::AddRun {
                slot,
                block,
                run,
                dirty,
            } => (
                slot,
                kind_with_run(pick(dirty, KIND_ADD_RUN_CLEAN, KIND_ADD_RUN_DIRTY), run),
                block,
            ),
            Record::Clean { slot } => (slot, KIND_CLEAN, 0),
            Record::Unmap { slot } => (slot, KIND_UNMAP, 0),
            Record::Close { group } => (0, KIND_GROUP_CLOSE, group),
            Record::Done { group } => (0, KIND_GROUP_DONE, group),
        };
        RawRecord {
            slot: U32::new(slot),
            kind: U32::new(kind),
            block: U64::new(block),
        }
    }

    /// Decodes a record; whether it fits the table (slot and block in
    /// range, run within the block) is checked by `Table::validate`.
    pub fn from_raw(raw: &RawRecord) -> Result<Record, String> {
        let slot = raw.slot.get();
        let block = raw.block.get();
        let word = raw.kind.get();
        let run = SectorRun {
            first: ((word >> 8) & 0xfff) as u16,
            count: ((word >> 20) & 0xfff) as u16 + 1,
        };
        let plain = |r: Record| {
            if word >> 8 != 0 {
                Err(format!("record kind word {word:#x}: stray bits"))
            } else {
                Ok(r)
            }
        };
        match word & 0xff {
            KIND_MAP_CLEAN | KIND_MAP_DIRTY => plain(Record::Map {
                slot,
                block,
                dirty: word & 0xff == KIND_MAP_DIRTY,
            }),
            KIND_CLEAN => plain(Record::Clean { slot }),
            KIND_UNMAP => plain(Record::Unmap { slot }),
            KIND_MAP_RUN_CLEAN | KIND_MAP_RUN_DIRTY => Ok(Record::MapRun {
                slot,
                block,
                run,
                dirty: word & 0xff == KIND_MAP_RUN_DIRTY,
            }),
            KIND_ADD_RUN_CLEAN | KIND_ADD_RUN_DIRTY => Ok(Record::AddRun {
                slot,
                block,
                run,
                dirty: word & 0xff == KIND_ADD_RUN_DIRTY,
            }),
            KIND_GROUP_CLOSE | KIND_GROUP_DONE if slot != 0 => {
                Err(format!("group record names slot {slot}"))
            }
            KIND_GROUP_CLOSE => plain(Record::Close { group: block }),
            KIND_GROUP_DONE => plain(Record::Done { group: block }),
            k => Err(format!("unknown record kind {k}")),
        }
    }
}

/// Builds a sealed journal page of a commit of `commit_pages` pages.
pub fn journal_page(
    seq: u64,
    commit_first_seq: u64,
    commit_pages: u32,
    records: &[Record],
) -> Vec<u8> {
    assert!(records.len() <= RECORDS_PER_PAGE);
    let mut page = vec![0u8; PAGE_BYTES as usize];
    let hdr = JournalHeader {
        magic: U32::new(JOURNAL_MAGIC),
        crc: U32::new(0),
        seq: U64::new(seq),
        commit_first_seq: U64::new(commit_first_seq),
        record_count: U32::new(records.len() as u32),
        commit_pages: U32::new(commit_pages),
    };
    page[..JOURNAL_HEADER_BYTES].copy_from_slice(hdr.as_bytes());
    for (i, r) in records.iter().enumerate() {
        let at = JOURNAL_HEADER_BYTES + i * RECORD_BYTES;
        page[at..at + RECORD_BYTES].copy_from_slice(r.to_raw().as_bytes());
    }
    let crc = crc32c::crc32c(&page);
    page[4..8].copy_from_slice(&crc.to_le_bytes());
    page
}

/// A journal page that passed its checks.
pub struct ParsedJournalPage {
    pub seq: u64,
    pub commit_first_seq: u64,
    pub commit_pages: u32,
    pub records: Vec<Record>,
}

/// Parses a journal page; `Err` says why it is not a valid page.
pub fn parse_journal_page(page: &[u8]) -> Result<ParsedJournalPage, String> {
    let (hdr, _) = JournalHeader::read_from_prefix(page).map_err(|_| "short page".to_string())?;
    if hdr.magic.get() != JOURNAL_MAGIC {
        return Err("no journal magic".into());
    }
    let mut copy = page.to_vec();
    copy[4..8].fill(0);
    if crc32c::crc32c(&copy) != hdr.crc.get() {
        return Err("checksum mismatch".into());
    }
    let n = hdr.record_count.get() as usize;
    if n > RECORDS_PER_PAGE {
        return Err(format!("record count {n} too large"));
    }
    let mut records = Vec::with_capacity(n);
    for i in 0..n {
        let at = JOURNAL_HEADER_BYTES + i * RECORD_BYTES;
        let (raw, _) =
            RawRecord::read_from_prefix(&page[at..]).map_err(|_| "short record".to_string())?;
        records.push(Record::from_raw(&raw)?);
    }
    Ok(ParsedJournalPage {
        seq: hdr.seq.get(),
        commit_first_seq: hdr.commit_first_seq.get(),
        commit_pages: hdr.commit_pages.get(),
        records,
    })
}

/// A metadata page that is intact by its own checksum: a superblock, a
/// journal page or a checkpoint page (which one, and whether it belongs
/// where it was read, the reader checks). A cache set reads another
/// member's copy of a page that is not (device/set/).
pub fn meta_page_intact(page: &[u8]) -> bool {
    if page.len() != PAGE_BYTES as usize {
        return false;
    }
    if Superblock::parse(page).is_ok() {
        return true;
    }
    let magic = u32::from_le_bytes(page[0..4].try_into().expect("4 bytes"));
    if magic != JOURNAL_MAGIC && magic != CHECKPOINT_MAGIC {
        return false;
    }
    let crc = u32::from_le_bytes(page[4..8].try_into().expect("4 bytes"));
    let mut copy = page.to_vec();
    copy[4..8].fill(0);
    crc32c::crc32c(&copy) == crc
}

pub const CHECKPOINT_HEADER_BYTES: usize = 24;
pub const CHECKPOINT_PAYLOAD_BYTES: usize = PAGE_BYTES as usize - CHECKPOINT_HEADER_BYTES;
pub const ENTRIES_PER_CHECKPOINT_PAGE: usize = CHECKPOINT_PAYLOAD_BYTES / 8;

/// Header of a checkpoint page; the CRC covers the page with crc as zero.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct CheckpointHeader {
    pub magic: U32,
    pub crc: U32,
    pub generation: U64,
    pub page_index: U64,
}
const _: () = assert!(std::mem::size_of::<CheckpointHeader>() == CHECKPOINT_HEADER_BYTES);

/// Sectors in a cache block of `block_bytes`.
pub fn sectors_per_block(block_bytes: u32) -> usize {
    (block_bytes as u64 / SECTOR_BYTES) as usize
}

/// Bytes of one sector bitmap of a block in a checkpoint.
pub fn map_set_bytes(block_bytes: u32) -> usize {
    sectors_per_block(block_bytes).div_ceil(8)
}

/// Slots whose two sector bitmaps (valid, then dirty) fit a checkpoint page.
pub fn maps_per_checkpoint_page(block_bytes: u32) -> usize {
    CHECKPOINT_PAYLOAD_BYTES / (2 * map_set_bytes(block_bytes))
}

/// A slot's valid and dirty sectors, for a slot that is not whole.
pub type PartialEntry = (u32, SectorSet, SectorSet);

/// What a checkpoint holds: every slot entry, and the sector maps of the
/// slots that are not whole (ascending by slot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointData {
    pub entries: Vec<u64>,
    pub partial: Vec<PartialEntry>,
    /// Writeback in flush order: the open group (superblock
    /// `checkpoint_open_group`); 0 otherwise.
    pub open_group: u64,
}

/// The (valid, dirty) sectors an entry means for a whole slot.
pub fn whole_sets(entry: u64, sectors: usize) -> (SectorSet, SectorSet) {
    match entry_decode(entry) {
        None => (SectorSet::empty(sectors), SectorSet::empty(sectors)),
        Some((_, dirty)) => (
            SectorSet::full(sectors),
            if dirty {
                SectorSet::full(sectors)
            } else {
                SectorSet::empty(sectors)
            },
        ),
    }
}

/// Seals a checkpoint page around `payload` (at most a page's payload).
pub fn checkpoint_page_with(generation: u64, page_index: u64, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= CHECKPOINT_PAYLOAD_BYTES);
    let mut page = vec![0u8; PAGE_BYTES as usize];
    let hdr = CheckpointHeader {
        magic: U32::new(CHECKPOINT_MAGIC),
        crc: U32::new(0),
        generation: U64::new(generation),
        page_index: U64::new(page_index),
    };
    page[..CHECKPOINT_HEADER_BYTES].copy_from_slice(hdr.as_bytes());
    page[CHECKPOINT_HEADER_BYTES..CHECKPOINT_HEADER_BYTES + payload.len()].copy_from_slice(payload);
    let crc = crc32c::crc32c(&page);
    page[4..8].copy_from_slice(&crc.to_le_bytes());
    page
}

/// Page `page_index` of the checkpoint of `data` for `layout`: entry pages
/// first, then sector-map pages.
pub fn checkpoint_page(
    layout: &Layout,
    generation: u64,
    page_index: u64,
    data: &CheckpointData,
) -> Vec<u8> {
    let mut payload = vec![0u8; CHECKPOINT_PAYLOAD_BYTES];
    let entry_pages = layout.entry_pages();
    if page_index < entry_pages {
        let lo = (page_index as usize * ENTRIES_PER_CHECKPOINT_PAGE).min(data.entries.len());
        let hi = (lo + ENTRIES_PER_CHECKPOINT_PAGE).min(data.entries.len());
        for (i, e) in data.entries[lo..hi].iter().enumerate() {
            payload[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
    } else {
        let bs = layout.block_bytes;
        let (set_bytes, per_page) = (map_set_bytes(bs), maps_per_checkpoint_page(bs));
        let sectors = sectors_per_block(bs);
        let lo = ((page_index - entry_pages) as usize * per_page).min(data.entries.len());
        let hi = (lo + per_page).min(data.entries.len());
        let mut partial = data.partial[data.partial.partition_point(|p| (p.0 as usize) < lo)..]
            .iter()
            .peekable();
        for slot in lo..hi {
            let (valid, dirty) = match partial.peek() {
                Some(&&(s, v, d)) if s as usize == slot => {
                    partial.next();
                    (v, d)
                }
                _ => whole_sets(data.entries[slot], sectors),
            };
            let at = (slot - lo) * 2 * set_bytes;
            valid.to_bytes(&mut payload[at..at + set_bytes]);
            dirty.to_bytes(&mut payload[at + set_bytes..at + 2 * set_bytes]);
        }
    }
    checkpoint_page_with(generation, page_index, &payload)
}

/// Checks a checkpoint page (magic, CRC, generation and index) and returns
/// its payload.
pub fn parse_checkpoint_page(
    page: &[u8],
    generation: u64,
    page_index: u64,
) -> Result<&[u8], String> {
    let (hdr, _) =
        CheckpointHeader::read_from_prefix(page).map_err(|_| "short page".to_string())?;
    if hdr.magic.get() != CHECKPOINT_MAGIC {
        return Err("no checkpoint magic".into());
    }
    let mut copy = page.to_vec();
    copy[4..8].fill(0);
    if crc32c::crc32c(&copy) != hdr.crc.get() {
        return Err("checksum mismatch".into());
    }
    if hdr.generation.get() != generation {
        return Err(format!(
            "generation {} where {} was expected",
            hdr.generation.get(),
            generation
        ));
    }
    if hdr.page_index.get() != page_index {
        return Err(format!(
            "page index {} where {} was expected",
            hdr.page_index.get(),
            page_index
        ));
    }
    Ok(&page[CHECKPOINT_HEADER_BYTES..])
}

/// The slot entries of an entry page's payload.
pub fn decode_entries(payload: &[u8]) -> impl Iterator<Item = u64> + '_ {
    payload[..ENTRIES_PER_CHECKPOINT_PAGE * 8]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
}

/// The (valid, dirty) sector maps of a map page's payload, one pair per
/// slot of the page (`Err` for bits past the block's last sector).
pub fn decode_maps(
    payload: &[u8],
    block_bytes: u32,
) -> impl Iterator<Item = Result<(SectorSet, SectorSet), String>> + '_ {
    let set_bytes = map_set_bytes(block_bytes);
    let sectors = sectors_per_block(block_bytes);
    payload
        .chunks_exact(2 * set_bytes)
        .take(maps_per_checkpoint_page(block_bytes))
        .map(move |pair| {
            let v = SectorSet::from_bytes(sectors, &pair[..set_bytes]);
            let d = SectorSet::from_bytes(sectors, &pair[set_bytes..]);
            v.zip(d)
                .ok_or_else(|| "sector map with bits past the block".to_string())
        })
}

/// What of a layout never moves once a cache is made (a grown cache keeps
/// them: `Layout::grown`): the block size, the journal and where the data
/// region starts. What does move, the slot count and the checkpoint areas,
/// is the superblock's to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regions {
    pub block_bytes: u32,
    pub journal_offset: u64,
    pub journal_pages: u64,
    pub data_offset: u64,
}

impl Regions {
    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.data_offset + slot as u64 * self.block_bytes as u64
    }

    pub fn journal_page_offset(&self, seq: u64) -> u64 {
        self.journal_offset + (seq % self.journal_pages) * PAGE_BYTES
    }
}

/// Pages of one checkpoint area for `slot_count` slots: entry pages, then
/// sector-map pages.
fn checkpoint_pages(block_bytes: u32, slot_count: u64) -> u64 {
    slot_count.div_ceil(ENTRIES_PER_CHECKPOINT_PAGE as u64)
        + slot_count.div_ceil(maps_per_checkpoint_page(block_bytes) as u64)
}

/// The most slots a cache may have: slot numbers are `u32`, and
/// `u32::MAX` marks "none" in the policy's links.
pub const MAX_SLOTS: u64 = u32::MAX as u64 - 1;

/// Where everything lives on a cache device of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_bytes: u32,
    pub slot_count: u64,
    pub journal_offset: u64,
    pub journal_pages: u64,
    pub checkpoint_offset: [u64; 2],
    /// Pages per checkpoint area: entry pages, then sector-map pages.
    pub checkpoint_pages: u64,
    pub data_offset: u64,
}

impl Layout {
    fn with_slots(block_bytes: u32, slot_count: u64) -> Layout {
        let journal_pages = (slot_count / 128).clamp(256, 65536);
        let checkpoint_pages = checkpoint_pages(block_bytes, slot_count);
        let journal_offset = JOURNAL_OFFSET;
        let cp0 = journal_offset + journal_pages * PAGE_BYTES;
        let cp1 = cp0 + checkpoint_pages * PAGE_BYTES;
        let meta_end = cp1 + checkpoint_pages * PAGE_BYTES;
        let data_offset = meta_end.div_ceil(block_bytes as u64) * block_bytes as u64;
        Layout {
            block_bytes,
            slot_count,
            journal_offset,
            journal_pages,
            checkpoint_offset: [cp0, cp1],
            checkpoint_pages,
            data_offset,
        }
    }

    /// Checkpoint pages that hold slot entries (the rest hold sector maps).
    pub fn entry_pages(&self) -> u64 {
        self.slot_count.div_ceil(ENTRIES_PER_CHECKPOINT_PAGE as u64)
    }

    /// Where the last region ends: the data region, or in a grown layout
    /// the second checkpoint area.
    pub fn end_bytes(&self) -> u64 {
        let data_end = self.data_offset + self.slot_count * self.block_bytes as u64;
        data_end.max(self.checkpoint_offset[1] + self.checkpoint_pages * PAGE_BYTES)
    }

    /// The layout of a cache grown to `device_bytes` (`Engine::grow_cache`):
    /// the superblocks, the journal and the data region's start stay where
    /// `base` has them; the data region takes the most slots for which two
    /// checkpoint areas still fit after it, and the areas move there (the
    /// areas before the data region are left unused). `None` when the
    /// device cannot hold `base`'s slots that way. Grown again, a grown
    /// layout of the same device is itself (open checks a recorded one so).
    pub fn grown(base: &Layout, device_bytes: u64) -> Option<Layout> {
        let bs = base.block_bytes as u64;
        let with = |slots: u64| Layout::with_grown_slots(base, slots);
        let fits = |slots: u64| with(slots).end_bytes() <= device_bytes;
        let room = device_bytes.checked_sub(base.data_offset)? / bs;
        let (mut lo, mut hi) = (base.slot_count, room.min(MAX_SLOTS) + 1);
        if lo >= hi || !fits(lo) {
            return None;
        }
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(with(lo))
    }

    /// `base` grown to `slot_count` slots, its checkpoint areas after them
    /// (`grown`).
    pub fn with_grown_slots(base: &Layout, slot_count: u64) -> Layout {
        let checkpoint_pages = checkpoint_pages(base.block_bytes, slot_count);
        let data_end = base.data_offset + slot_count * base.block_bytes as u64;
        let cp0 = data_end.next_multiple_of(PAGE_BYTES);
        Layout {
            slot_count,
            checkpoint_offset: [cp0, cp0 + checkpoint_pages * PAGE_BYTES],
            checkpoint_pages,
            ..*base
        }
    }

    /// The checkpoint areas follow the data region (`grown`).
    pub fn is_grown(&self) -> bool {
        self.data_offset > 0 && self.checkpoint_offset[0] >= self.data_offset
    }

    /// The layout with the most slots that fits in `device_bytes`, or an
    /// error saying how large the device would have to be.
    pub fn compute(device_bytes: u64, block_bytes: u32) -> Result<Layout, String> {
        let min = Layout::with_slots(block_bytes, MIN_SLOTS);
        if min.end_bytes() > device_bytes {
            return Err(format!(
                "cache device of {device_bytes} bytes is too small: {} bytes are needed for metadata and {MIN_SLOTS} blocks of {block_bytes} bytes",
                min.end_bytes()
            ));
        }
        // Binary search the largest slot count that fits.
        let (mut lo, mut hi) = (MIN_SLOTS, device_bytes / block_bytes as u64 + 1);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if Layout::with_slots(block_bytes, mid).end_bytes() <= device_bytes {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Layout::with_slots(block_bytes, lo))
    }

    /// The smallest device, in whole 4 KiB pages, whose layout holds at
    /// least `slots` blocks of `block_bytes` (`compute` of it gives them).
    pub fn device_bytes_for(block_bytes: u32, slots: u64) -> u64 {
        Layout::with_slots(block_bytes, slots.max(MIN_SLOTS))
            .end_bytes()
            .next_multiple_of(PAGE_BYTES)
    }

    /// Where a cache set over members of `member_bytes` puts things
    /// (device/set/): the metadata of the whole set on every member, then
    /// `mirror_pct` percent of the smaller of members 0 and 1's slot space
    /// as mirrored slots (a copy on each of the two), then each member's
    /// own slots in the rest.
    pub fn set_geometry(
        member_bytes: &[u64],
        block_bytes: u32,
        mirror_pct: u32,
    ) -> Result<crate::device::set::Geometry, String> {
        use crate::device::set::{Geometry, LABEL_BYTES, MAX_MEMBERS};
        let n = member_bytes.len();
        if !(2..=MAX_MEMBERS).contains(&n) {
            return Err(format!(
                "a cache set has 2 to {MAX_MEMBERS} devices, not {n}"
            ));
        }
        if !(1..=100).contains(&mirror_pct) {
            return Err(format!("mirror share {mirror_pct}% is not within 1..100%"));
        }
        let bs = block_bytes as u64;
        let usable: Vec<u64> = member_bytes
            .iter()
            .map(|b| b.saturating_sub(LABEL_BYTES))
            .collect();
        // Metadata sized for every slot the members could hold (an upper
        // bound), so whatever the split, it fits.
        let bound = usable
            .iter()
            .map(|u| u / bs)
            .sum::<u64>()
            .min(u32::MAX as u64);
        let meta = Layout::with_slots(block_bytes, bound.max(MIN_SLOTS)).data_offset;
        let avail: Vec<u64> = usable.iter().map(|u| u.saturating_sub(meta) / bs).collect();
        let pair = avail[0].min(avail[1]);
        let mirror = pair * mirror_pct as u64 / 100;
        if mirror < MIN_SLOTS {
            return Err(format!(
                "cache devices too small: {} bytes for metadata and {MIN_SLOTS} mirrored blocks of {block_bytes} bytes",
                LABEL_BYTES + meta + MIN_SLOTS * bs
            ));
        }
        let stripe_slots: Vec<u64> = (0..n)
            .map(|i| avail[i] - if i < 2 { mirror } else { 0 })
            .collect();
        let slots = mirror + stripe_slots.iter().sum::<u64>();
        let g = Geometry {
            block_bytes,
            // The metadata of the slots there are, at most `meta`.
            meta_bytes: Layout::with_slots(block_bytes, slots).data_offset,
            mirror_slots: mirror,
            stripe_slots,
            member_bytes: member_bytes.to_vec(),
        };
        debug_assert_eq!(
            Layout::compute(g.virtual_bytes(), block_bytes).map(|l| l.slot_count),
            Ok(slots)
        );
        Ok(g)
    }

    pub fn regions(&self) -> Regions {
        Regions {
            block_bytes: self.block_bytes,
            journal_offset: self.journal_offset,
            journal_pages: self.journal_pages,
            data_offset: self.data_offset,
        }
    }

    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.regions().slot_offset(slot)
    }

    pub fn journal_page_offset(&self, seq: u64) -> u64 {
        self.regions().journal_page_offset(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set's virtual device is a layout with exactly the set's slots, and
    /// every member holds its part.
    #[test]
    fn set_geometry_fits_its_members() {
        for bytes in [
            vec![64u64 << 20, 64 << 20],
            vec![64 << 20, 100 << 20, 30 << 20],
            vec![1 << 30, 1 << 30],
        ] {
            for pct in [10u32, 50, 100] {
                let g = Layout::set_geometry(&bytes, 4096, pct).unwrap();
                let l = Layout::compute(g.virtual_bytes(), 4096).unwrap();
                assert_eq!(l.slot_count, g.slot_count());
                assert_eq!(l.data_offset, g.meta_bytes);
                for (i, &b) in bytes.iter().enumerate() {
                    assert!(g.member_needs_bytes(i) <= b, "{bytes:?} {pct}% member {i}");
                }
                // Clean data gets more than one device's worth.
                assert!(g.slot_count() * 4096 > bytes[0] * 9 / 10 || pct == 100);
            }
        }
        assert!(Layout::set_geometry(&[1 << 20, 1 << 20], 4096, 50).is_err());
        assert!(Layout::set_geometry(&[64 << 20], 4096, 50).is_err());
    }

    /// `device_bytes_for` is the smallest whole-page size `compute` gives
    /// the slots for, as the binary search the tests and benches ran.
    #[test]
    fn device_bytes_for_is_the_smallest_that_holds_the_slots() {
        for bs in [512u32, 4096, 65536] {
            for slots in [1u64, 16, 100, 1000, 4097, 65_536, 300_000] {
                let (mut lo, mut hi) = (1u64 << 16, 1u64 << 40);
                while lo + 4096 < hi {
                    let mid = (lo + (hi - lo) / 2) / 4096 * 4096;
                    match Layout::compute(mid, bs) {
                        Ok(l) if l.slot_count >= slots => hi = mid,
                        _ => lo = mid,
                    }
                }
                assert_eq!(
                    Layout::device_bytes_for(bs, slots),
                    hi,
                    "{bs} B, {slots} slots"
                );
            }
        }
    }

    #[test]
    fn journal_round_trip_and_corruption() {
        let recs = vec![
            Record::Map {
                slot: 3,
                block: 99,
                dirty: true,
            },
            Record::Clean { slot: 3 },
            Record::Unmap { slot: 7 },
            Record::Map {
                slot: 1,
                block: 0,
                dirty: false,
            },
            Record::MapRun {
                slot: 5,
                block: 1 << 40,
                run: SectorRun::new(3, 1),
                dirty: true,
            },
            Record::AddRun {
                slot: 5,
                block: 1 << 40,
                run: SectorRun::new(2047, 1),
                dirty: false,
            },
            Record::AddRun {
                slot: 6,
                block: 2,
                run: SectorRun::new(0, 2048),
                dirty: true,
            },
        ];
        let page = journal_page(42, 41, 2, &recs);
        let p = parse_journal_page(&page).unwrap();
        assert_eq!((p.seq, p.commit_first_seq, p.commit_pages), (42, 41, 2));
        assert_eq!(p.records, recs);
        for i in [0usize, 5, 28, 100, 4095] {
            let mut bad = page.clone();
            bad[i] ^= 0x10;
            assert!(parse_journal_page(&bad).is_err(), "flip at {i} undetected");
        }
    }

    #[test]
    fn record_kinds_reject_stray_bits() {
        let mut raw = Record::Clean { slot: 1 }.to_raw();
        raw.kind.set(raw.kind.get() | 1 << 9);
        assert!(Record::from_raw(&raw).is_err());
        raw.kind.set(99);
        assert!(Record::from_raw(&raw).is_err());
    }

    #[test]
    fn checkpoint_round_trip() {
        for bs in [4096u32, 65536, 1 << 20] {
            let layout = Layout::with_slots(bs, 1500);
            let sectors = sectors_per_block(bs);
            let entries: Vec<u64> = (0..1500u64)
                .map(|i| {
                    if i % 5 == 4 {
                        ENTRY_FREE
                    } else {
                        entry_encode(i * 3, i % 2 == 0)
                    }
                })
                .collect();
            let partial: Vec<PartialEntry> = [2u32, 3, 600, 1499]
                .iter()
                .map(|&s| {
                    let v = SectorSet::of_run(sectors, SectorRun::new(1, sectors - 1));
                    let d = if s % 2 == 0 {
                        SectorSet::of_run(sectors, SectorRun::new(sectors - 1, 1))
                    } else {
                        SectorSet::empty(sectors)
                    };
                    (s, v, d)
                })
                .collect();
            let data = CheckpointData {
                entries,
                partial,
                open_group: 0,
            };
            let mut entries_back = Vec::new();
            let mut maps_back = Vec::new();
            for k in 0..layout.checkpoint_pages {
                let page = checkpoint_page(&layout, 9, k, &data);
                let payload = parse_checkpoint_page(&page, 9, k).unwrap();
                if k < layout.entry_pages() {
                    entries_back.extend(decode_entries(payload));
                } else {
                    maps_back.extend(decode_maps(payload, bs).map(Result::unwrap));
                }
                assert!(parse_checkpoint_page(&page, 8, k).is_err());
                assert!(parse_checkpoint_page(&page, 9, k + 1).is_err());
            }
            assert_eq!(&entries_back[..1500], &data.entries[..]);
            for (slot, e) in data.entries.iter().enumerate() {
                let want = data
                    .partial
                    .iter()
                    .find(|p| p.0 as usize == slot)
                    .map_or_else(|| whole_sets(*e, sectors), |p| (p.1, p.2));
                assert_eq!(maps_back[slot], want, "bs {bs} slot {slot}");
            }
        }
    }

    #[test]
    fn entries() {
        assert_eq!(entry_decode(entry_encode(0, false)), Some((0, false)));
        assert_eq!(entry_decode(entry_encode(77, true)), Some((77, true)));
        assert_eq!(entry_decode(ENTRY_FREE), None);
        assert_eq!(entry_decode(ENTRY_DIRTY), None);
    }

    #[test]
    fn layout_fits() {
        for dev in [1u64 << 20, 64 << 20, 1 << 30, 10 << 30] {
            for bs in [4096u32, 65536, 1 << 20] {
                match Layout::compute(dev, bs) {
                    Ok(l) => {
                        assert!(l.end_bytes() <= dev);
                        assert!(Layout::with_slots(bs, l.slot_count + 1).end_bytes() > dev);
                        assert_eq!(l.data_offset % bs as u64, 0);
                    }
                    Err(e) => assert!(e.contains("too small")),
                }
            }
        }
        assert!(Layout::compute(64 << 10, 4096).is_err());
    }

    #[test]
    fn a_grown_layout_fits_keeps_its_regions_and_is_its_own_growth() {
        for bs in [4096u32, 65536] {
            let base = Layout::compute(8 << 20, bs).unwrap();
            for dev in [(8 << 20) + 4096, 9 << 20, 64 << 20, 1 << 30] {
                let Some(g) = Layout::grown(&base, dev) else {
                    assert!(dev < (9 << 20), "{dev} bytes grow nothing");
                    continue;
                };
                assert!(g.is_grown() && !base.is_grown());
                assert_eq!(g.regions(), base.regions());
                assert!(g.slot_count >= base.slot_count);
                assert!(g.end_bytes() <= dev);
                let data_end = g.data_offset + g.slot_count * bs as u64;
                assert!(g.checkpoint_offset[0] >= data_end);
                assert_eq!(g.checkpoint_offset[0] % PAGE_BYTES, 0);
                assert!(Layout::with_grown_slots(&base, g.slot_count + 1).end_bytes() > dev);
                assert_eq!(Layout::grown(&g, dev), Some(g), "grown again, the same");
                let mut s = Superblock::new_zeroed();
                s.set_layout(&g, dev);
                assert_eq!(s.slot_count.get(), g.slot_count);
            }
        }
    }
}
