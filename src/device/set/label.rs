//! The member label: what each device of a cache set says about the set.
//! docs/format.md "Cache sets" describes it byte by byte.
//!
//! Two copies (pages 0 and 1 of the member); a write goes to copy
//! `generation % 2`, so a torn label write leaves the other copy whole. The
//! valid copy with the higher generation is current. Every member's label
//! carries the same set description; they differ in `member_index` only.
//! The set's state (which members hold current copies) is the one in the
//! label with the highest generation among the members present.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Most members a set may have.
pub const MAX_MEMBERS: usize = 8;
/// Bytes at the start of every member before the set's address space.
pub const LABEL_BYTES: u64 = 8192;
const LABEL_PAGE_BYTES: usize = 4096;
pub const LABEL_MAGIC: [u8; 8] = *b"TCSETMBR";
pub const LABEL_VERSION: u32 = 1;
/// Highest label generation accepted.
pub const GENERATION_MAX: u64 = 1 << 62;
/// Label flag: the mirrored slots' two copies may differ.
pub const FLAG_RESYNC: u32 = 1;

/// Where the set's virtual device puts things, fixed at create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u32,
    /// Bytes of metadata (superblocks, journal, checkpoints) before the
    /// first slot: copied to every member.
    pub meta_bytes: u64,
    /// Slots `0..mirror_slots` have a copy on members 0 and 1.
    pub mirror_slots: u64,
    /// Per member, its own slots (one copy), numbered after the mirrored
    /// ones, member 0's first.
    pub stripe_slots: Vec<u64>,
    /// Bytes each member had at create.
    pub member_bytes: Vec<u64>,
}

impl Geometry {
    pub fn slot_count(&self) -> u64 {
        self.mirror_slots + self.stripe_slots.iter().sum::<u64>()
    }

    /// The size of the virtual device: metadata, then every slot.
    pub fn virtual_bytes(&self) -> u64 {
        self.meta_bytes + self.slot_count() * self.block_bytes as u64
    }

    /// Mirrored slots member `i` holds (members 0 and 1 hold them all).
    pub fn member_mirror_slots(&self, i: usize) -> u64 {
        if i < 2 {
            self.mirror_slots
        } else {
            0
        }
    }

    /// The first virtual slot of member `i`'s own slots.
    pub fn stripe_base(&self, i: usize) -> u64 {
        self.mirror_slots + self.stripe_slots[..i].iter().sum::<u64>()
    }

    /// The bytes member `i` needs.
    pub fn member_needs_bytes(&self, i: usize) -> u64 {
        LABEL_BYTES
            + self.meta_bytes
            + (self.member_mirror_slots(i) + self.stripe_slots[i]) * self.block_bytes as u64
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct RawLabel {
    pub magic: [u8; 8],
    pub version: U32,
    pub member_index: U32,
    pub member_count: U32,
    pub block_bytes: U32,
    /// Random at create: members of different sets never mix.
    pub set_id: U64,
    pub generation: U64,
    pub meta_bytes: U64,
    pub mirror_slots: U64,
    /// Bit i: member i does not hold current copies (it failed, or its
    /// rebuild has not finished). Reads never use it.
    pub stale_mask: U32,
    /// Bit 0 (`FLAG_RESYNC`): the copies of the mirrored slots may differ
    /// (a crash cut writes between members 0 and 1); cleared once they
    /// were made equal.
    pub flags: U32,
    pub stripe_slots: [U64; MAX_MEMBERS],
    pub member_bytes: [U64; MAX_MEMBERS],
    /// Per member, how many times its place was given to a new device
    /// (`replace-cache`), modulo 2^16; 0 in labels written before.
    pub serials: [U16; MAX_MEMBERS],
    pub reserved: [u8; 44],
    pub crc: U32,
}
const _: () = assert!(std::mem::size_of::<RawLabel>() == 256);

/// A parsed, checked label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub member_index: usize,
    pub set_id: u64,
    pub generation: u64,
    pub stale_mask: u32,
    pub flags: u32,
    pub geometry: Geometry,
    /// Per member, its place's serial: a device whose label gives its own
    /// place another serial than the set's newest label is a former
    /// member, replaced since (`open.rs`).
    pub serials: [u16; MAX_MEMBERS],
}

impl Label {
    /// The serial this label gives its own member's place.
    pub fn own_serial(&self) -> u16 {
        self.serials[self.member_index]
    }

    pub fn member_count(&self) -> usize {
        self.geometry.stripe_slots.len()
    }

    /// The page for copy `generation % 2`.
    pub fn to_page(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut stripe = [U64::new(0); MAX_MEMBERS];
        let mut bytes = [U64::new(0); MAX_MEMBERS];
        for i in 0..g.stripe_slots.len() {
            stripe[i] = U64::new(g.stripe_slots[i]);
            bytes[i] = U64::new(g.member_bytes[i]);
        }
        let mut raw = RawLabel {
            magic: LABEL_MAGIC,
            version: U32::new(LABEL_VERSION),
            member_index: U32::new(self.member_index as u32),
            member_count: U32::new(g.stripe_slots.len() as u32),
            block_bytes: U32::new(g.block_bytes),
            set_id: U64::new(self.set_id),
            generation: U64::new(self.generation),
            meta_bytes: U64::new(g.meta_bytes),
            mirror_slots: U64::new(g.mirror_slots),
            stale_mask: U32::new(self.stale_mask),
            flags: U32::new(self.flags),
            stripe_slots: stripe,
            member_bytes: bytes,
            serials: self.serials.map(U16::new),
            reserved: [0; 44],
            crc: U32::new(0),
        };
        raw.crc = U32::new(crc32c::crc32c(&raw.as_bytes()[..252]));
        let mut page = vec![0u8; LABEL_PAGE_BYTES];
        page[..256].copy_from_slice(raw.as_bytes());
        page
    }

    /// Offset of the copy this label is written to.
    pub fn copy_offset(&self) -> u64 {
        (self.generation % 2) * LABEL_PAGE_BYTES as u64
    }

    /// Parses one label copy; `Err` says why it is not a valid one.
    pub fn parse(page: &[u8]) -> Result<Label, String> {
        let (raw, _) = RawLabel::read_from_prefix(page).map_err(|_| "short label".to_string())?;
        check_envelope(&raw)?;
        let count = raw.member_count.get() as usize;
        if !(2..=MAX_MEMBERS).contains(&count) {
            return Err(format!("label names {count} members (2..={MAX_MEMBERS})"));
        }
        let index = raw.member_index.get() as usize;
        if index >= count {
            return Err(format!("member index {index} of {count} members"));
        }
        let geometry = raw_geometry(&raw, count)?;
        if raw.stale_mask.get() >> count != 0 {
            return Err("stale mask names members past the count".into());
        }
        if raw.flags.get() & !FLAG_RESYNC != 0 {
            return Err(format!("unknown label flags {:#x}", raw.flags.get()));
        }
        check_member_sizes(&geometry)?;
        Ok(Label {
            member_index: index,
            set_id: raw.set_id.get(),
            generation: raw.generation.get(),
            stale_mask: raw.stale_mask.get(),
            flags: raw.flags.get(),
            geometry,
            serials: raw.serials.map(|v| v.get()),
        })
    }

    /// The current label of a member from its two copies' bytes.
    pub fn current(copies: [&[u8]; 2]) -> Result<Label, String> {
        match (Label::parse(copies[0]), Label::parse(copies[1])) {
            (Ok(a), Ok(b)) => Ok(if a.generation >= b.generation { a } else { b }),
            (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
            (Err(e), Err(_)) => Err(e),
        }
    }
}

/// The label's magic, checksum, generation and version.
fn check_envelope(raw: &RawLabel) -> Result<(), String> {
    if raw.magic != LABEL_MAGIC {
        return Err("no cache-set label".into());
    }
    if raw.crc.get() != crc32c::crc32c(&raw.as_bytes()[..252]) {
        return Err("label checksum mismatch".into());
    }
    // A generation counts label writes: one near 2^64 is damage, and
    // overflowed the next (a degraded open panicked; found by
    // fuzz/fuzz_targets/set_label.rs), as the journal's (recovery.rs,
    // SEQ_MAX).
    if raw.generation.get() > GENERATION_MAX {
        return Err(format!(
            "label generation {} is implausible",
            raw.generation.get()
        ));
    }
    if raw.version.get() != LABEL_VERSION {
        return Err(format!("unsupported label version {}", raw.version.get()));
    }
    Ok(())
}

/// The set's geometry as the label states it, checked: block and
/// metadata sizes, slot counts that fit (members' sizes: `check_member_sizes`).
fn raw_geometry(raw: &RawLabel, count: usize) -> Result<Geometry, String> {
    let bs = raw.block_bytes.get();
    if !bs.is_power_of_two() || !(4096..=1 << 20).contains(&bs) {
        return Err(format!(
            "block size {bs} is not a power of two in 4 KiB..1 MiB"
        ));
    }
    let meta = raw.meta_bytes.get();
    if meta == 0 || !meta.is_multiple_of(bs as u64) || meta > 1 << 50 {
        return Err(format!(
            "metadata size {meta} is not a multiple of the block size"
        ));
    }
    let slots: Vec<u64> = raw.stripe_slots[..count].iter().map(|v| v.get()).collect();
    let mirror = raw.mirror_slots.get();
    let total = slots
        .iter()
        .try_fold(mirror, |a, &s| a.checked_add(s))
        .filter(|&t| t <= u32::MAX as u64)
        .ok_or("slot counts overflow")?;
    if total == 0 {
        return Err("a set without slots".into());
    }
    let geometry = Geometry {
        block_bytes: bs,
        meta_bytes: meta,
        mirror_slots: mirror,
        stripe_slots: slots,
        member_bytes: raw.member_bytes[..count].iter().map(|v| v.get()).collect(),
    };
    Ok(geometry)
}

/// Every member is big enough for the slots the label gives it.
fn check_member_sizes(geometry: &Geometry) -> Result<(), String> {
    for i in 0..geometry.member_bytes.len() {
        if geometry.member_needs_bytes(i) > geometry.member_bytes[i] {
            return Err(format!("member {i} is too small for its slots"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label() -> Label {
        Label {
            member_index: 1,
            set_id: 0x1234,
            generation: 7,
            stale_mask: 0b01,
            flags: FLAG_RESYNC,
            geometry: Geometry {
                block_bytes: 4096,
                meta_bytes: 4096 * 300,
                mirror_slots: 100,
                stripe_slots: vec![50, 60],
                member_bytes: vec![4096 * 500, 4096 * 500],
            },
            serials: [3, 9, 0, 0, 0, 0, 0, 0],
        }
    }

    #[test]
    fn a_label_round_trips_and_damage_is_refused() {
        let l = label();
        let page = l.to_page();
        assert_eq!(Label::parse(&page).unwrap(), l);
        for byte in [0usize, 12, 40, 100, 251, 253] {
            let mut bad = page.clone();
            bad[byte] ^= 0x10;
            assert!(
                Label::parse(&bad).is_err(),
                "byte {byte} flipped was accepted"
            );
        }
        let zero = vec![0u8; 4096];
        assert_eq!(Label::current([&zero, &page]).unwrap(), l);
        let mut newer = l.clone();
        newer.generation = 8;
        assert_eq!(
            Label::current([&newer.to_page(), &page])
                .unwrap()
                .generation,
            8
        );
    }

    #[test]
    fn a_member_too_small_for_its_slots_is_refused() {
        let mut l = label();
        l.geometry.member_bytes[0] = 4096;
        assert!(Label::parse(&l.to_page())
            .unwrap_err()
            .contains("too small"));
    }
}
