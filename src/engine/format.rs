//! The on-disk format of the cache device, parsed in this one place from
//! bytes to typed values. docs/format.md describes it byte by byte, with the
//! commit protocol.
//!
//! Layout (all offsets in bytes, every region 4096-aligned):
//! superblock copy 0 at 0, copy 1 at 4096, then the journal ring, then two
//! checkpoint areas, then the data region (aligned to the cache block size).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub const PAGE_BYTES: u64 = 4096;
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"TIERCACH";
pub const FORMAT_VERSION: u32 = 1;
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

/// The superblock: 256 bytes at the start of a 4096-byte page; the rest of
/// the page is zero. The CRC covers bytes 0..252.
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
    pub reserved: [u8; 84],
    pub crc: U32,
}
const _: () = assert!(std::mem::size_of::<Superblock>() == 256);

/// Superblock flag: the user accepted data loss (writeback on a volatile cache).
pub const SB_FLAG_ALLOW_VOLATILE_WRITEBACK: u32 = 1;
/// Superblock flag: the cache was bypassed after a metadata write failed, so
/// the origin may have changed under clean mappings; open drops them.
pub const SB_FLAG_DISTRUST_CLEAN: u32 = 2;

impl Superblock {
    pub fn compute_crc(&self) -> u32 {
        crc32c::crc32c(&self.as_bytes()[..252])
    }

    pub fn seal(&mut self) {
        self.crc = U32::new(self.compute_crc());
    }

    /// Serialises into a zero-padded 4096-byte page.
    pub fn to_page(&self) -> Vec<u8> {
        let mut page = vec![0u8; PAGE_BYTES as usize];
        page[..256].copy_from_slice(self.as_bytes());
        page
    }

    /// Parses a superblock page; `Err` says why it is not a valid one.
    pub fn parse(page: &[u8]) -> Result<Superblock, String> {
        let (sb, _) =
            Superblock::read_from_prefix(page).map_err(|_| "short superblock".to_string())?;
        if sb.magic != SUPERBLOCK_MAGIC {
            return Err("no tiercache magic".into());
        }
        if sb.crc.get() != sb.compute_crc() {
            return Err("checksum mismatch".into());
        }
        if sb.version.get() != FORMAT_VERSION {
            return Err(format!("unsupported format version {}", sb.version.get()));
        }
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
    pub reserved: U32,
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
    /// `slot` now holds origin `block`; any other slot holding `block` is freed.
    Map { slot: u32, block: u64, dirty: bool },
    /// `slot`'s block has been written back: it is clean.
    Clean { slot: u32 },
    /// `slot` is free.
    Unmap { slot: u32 },
}

const KIND_MAP_CLEAN: u32 = 1;
const KIND_MAP_DIRTY: u32 = 2;
const KIND_CLEAN: u32 = 3;
const KIND_UNMAP: u32 = 4;

impl Record {
    pub fn to_raw(self) -> RawRecord {
        let (slot, kind, block) = match self {
            Record::Map { slot, block, dirty } => (
                slot,
                if dirty {
                    KIND_MAP_DIRTY
                } else {
                    KIND_MAP_CLEAN
                },
                block,
            ),
            Record::Clean { slot } => (slot, KIND_CLEAN, 0),
            Record::Unmap { slot } => (slot, KIND_UNMAP, 0),
        };
        RawRecord {
            slot: U32::new(slot),
            kind: U32::new(kind),
            block: U64::new(block),
        }
    }

    pub fn from_raw(raw: &RawRecord) -> Result<Record, String> {
        let slot = raw.slot.get();
        let block = raw.block.get();
        match raw.kind.get() {
            KIND_MAP_CLEAN => Ok(Record::Map {
                slot,
                block,
                dirty: false,
            }),
            KIND_MAP_DIRTY => Ok(Record::Map {
                slot,
                block,
                dirty: true,
            }),
            KIND_CLEAN => Ok(Record::Clean { slot }),
            KIND_UNMAP => Ok(Record::Unmap { slot }),
            k => Err(format!("unknown record kind {k}")),
        }
    }
}

/// Builds a sealed journal page.
pub fn journal_page(seq: u64, commit_first_seq: u64, records: &[Record]) -> Vec<u8> {
    assert!(records.len() <= RECORDS_PER_PAGE);
    let mut page = vec![0u8; PAGE_BYTES as usize];
    let hdr = JournalHeader {
        magic: U32::new(JOURNAL_MAGIC),
        crc: U32::new(0),
        seq: U64::new(seq),
        commit_first_seq: U64::new(commit_first_seq),
        record_count: U32::new(records.len() as u32),
        reserved: U32::new(0),
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
        records,
    })
}

pub const CHECKPOINT_HEADER_BYTES: usize = 24;
pub const ENTRIES_PER_CHECKPOINT_PAGE: usize = (PAGE_BYTES as usize - CHECKPOINT_HEADER_BYTES) / 8;

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

/// Builds a sealed checkpoint page holding `entries` (at most one page's worth).
pub fn checkpoint_page(generation: u64, page_index: u64, entries: &[u64]) -> Vec<u8> {
    assert!(entries.len() <= ENTRIES_PER_CHECKPOINT_PAGE);
    let mut page = vec![0u8; PAGE_BYTES as usize];
    let hdr = CheckpointHeader {
        magic: U32::new(CHECKPOINT_MAGIC),
        crc: U32::new(0),
        generation: U64::new(generation),
        page_index: U64::new(page_index),
    };
    page[..CHECKPOINT_HEADER_BYTES].copy_from_slice(hdr.as_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = CHECKPOINT_HEADER_BYTES + i * 8;
        page[at..at + 8].copy_from_slice(&e.to_le_bytes());
    }
    let crc = crc32c::crc32c(&page);
    page[4..8].copy_from_slice(&crc.to_le_bytes());
    page
}

/// Parses a checkpoint page, checking magic, CRC, generation and index.
pub fn parse_checkpoint_page(
    page: &[u8],
    generation: u64,
    page_index: u64,
) -> Result<Vec<u64>, String> {
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
    Ok(page[CHECKPOINT_HEADER_BYTES..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect())
}

/// Where everything lives on a cache device of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_bytes: u32,
    pub slot_count: u64,
    pub journal_offset: u64,
    pub journal_pages: u64,
    pub checkpoint_offset: [u64; 2],
    pub checkpoint_pages: u64,
    pub data_offset: u64,
}

impl Layout {
    fn with_slots(block_bytes: u32, slot_count: u64) -> Layout {
        let journal_pages = (slot_count / 128).clamp(256, 65536);
        let checkpoint_pages = slot_count.div_ceil(ENTRIES_PER_CHECKPOINT_PAGE as u64);
        let journal_offset = 2 * PAGE_BYTES;
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

    pub fn end_bytes(&self) -> u64 {
        self.data_offset + self.slot_count * self.block_bytes as u64
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

    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.data_offset + slot as u64 * self.block_bytes as u64
    }

    pub fn journal_page_offset(&self, seq: u64) -> u64 {
        self.journal_offset + (seq % self.journal_pages) * PAGE_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ];
        let page = journal_page(42, 41, &recs);
        let p = parse_journal_page(&page).unwrap();
        assert_eq!((p.seq, p.commit_first_seq), (42, 41));
        assert_eq!(p.records, recs);
        for i in [0usize, 5, 100, 4095] {
            let mut bad = page.clone();
            bad[i] ^= 0x10;
            assert!(parse_journal_page(&bad).is_err(), "flip at {i} undetected");
        }
    }

    #[test]
    fn checkpoint_round_trip() {
        let entries: Vec<u64> = (0..ENTRIES_PER_CHECKPOINT_PAGE as u64)
            .map(|i| entry_encode(i * 3, i % 2 == 0))
            .collect();
        let page = checkpoint_page(9, 2, &entries);
        assert_eq!(parse_checkpoint_page(&page, 9, 2).unwrap(), entries);
        assert!(parse_checkpoint_page(&page, 8, 2).is_err());
        assert!(parse_checkpoint_page(&page, 9, 3).is_err());
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
}
