//! The body of the cache-set label fuzz target
//! (fuzz/fuzz_targets/set_label.rs), here so tests/fuzz_parsers.rs runs the
//! same code in CI. A label is read from a device at every open: bytes a
//! damaged (or foreign) device chooses.
//!
//! Input: a flags byte, then the first 256 bytes (the label's size) of
//! copy 0 and of copy 1, zero-padded to their 4 KiB pages. Flags: bit 0 and
//! bit 1 recompute the checksum of copy 0 and of copy 1 when they carry the
//! label magic, so mutations reach the checks behind it; bit 2 opens a set
//! of members bearing the current label (each its own index), sized as the
//! label says; bit 3 makes member 0 a sector smaller than its label says
//! (open must refuse it); bit 4 leaves the last member out, bit 5 opens
//! with `allow_missing`.
//!
//! [`set_label`] asserts what the set relies on of a parsed label (counts
//! and sizes within bounds), that a label round-trips through its page,
//! that the current copy is the valid one of the higher generation, and
//! that an open set holds its members to their labels' sizes.

use std::sync::Arc;

use super::set::label::{Label, RawLabel, GENERATION_MAX, LABEL_MAGIC};
use super::set::{CacheSet, LABEL_BYTES, MAX_MEMBERS};
use super::{BlockDevice, DeviceRef, DeviceResult};

const PAGE_BYTES: usize = 4096;
const RAW_BYTES: usize = std::mem::size_of::<RawLabel>();
/// The harness opens sets of at most this many slots (the set keeps 4
/// bytes of checksum per slot, for the slots the devices can hold).
const SET_SLOTS_MAX: u64 = 1 << 20;

/// A device of any claimed size that keeps its label area only: reads
/// beyond it return zeroes, writes beyond it are dropped.
struct LabelDevice {
    name: String,
    size_bytes: u64,
    label: parking_lot::Mutex<Vec<u8>>,
}

impl LabelDevice {
    fn new(name: String, size_bytes: u64) -> LabelDevice {
        LabelDevice {
            name,
            size_bytes,
            label: parking_lot::Mutex::new(vec![0; LABEL_BYTES as usize]),
        }
    }
}

impl BlockDevice for LabelDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        super::check_range(self, offset, buf.len() as u64)?;
        buf.fill(0);
        let label = self.label.lock();
        for (i, b) in buf.iter_mut().enumerate() {
            match label.get(offset as usize + i) {
                Some(v) if offset < LABEL_BYTES => *b = *v,
                _ => break,
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        super::check_range(self, offset, buf.len() as u64)?;
        let mut label = self.label.lock();
        for (i, &b) in buf.iter().enumerate() {
            match label.get_mut(offset as usize + i) {
                Some(v) if offset < LABEL_BYTES => *v = b,
                _ => break,
            }
        }
        Ok(())
    }
    fn flush(&self) -> DeviceResult<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// Copy `c` of the input, resealed if its flag asks.
fn copy_page(data: &[u8], c: usize, flags: u8) -> Vec<u8> {
    let mut page = vec![0u8; PAGE_BYTES];
    let from = (c * RAW_BYTES).min(data.len());
    let bytes = &data[from..(from + RAW_BYTES).min(data.len())];
    page[..bytes.len()].copy_from_slice(bytes);
    if flags & (1 << c) != 0 && page[..8] == LABEL_MAGIC {
        let crc = crc32c::crc32c(&page[..RAW_BYTES - 4]);
        page[RAW_BYTES - 4..RAW_BYTES].copy_from_slice(&crc.to_le_bytes());
    }
    page
}

/// What the set relies on of a label `parse` accepted.
fn check_label(l: &Label) {
    let g = &l.geometry;
    let n = l.member_count();
    assert!((2..=MAX_MEMBERS).contains(&n), "{n} members");
    assert!(l.member_index < n);
    assert_eq!(g.member_bytes.len(), n);
    assert!(g.block_bytes.is_power_of_two() && (4096..=1 << 20).contains(&g.block_bytes));
    assert!(g.meta_bytes > 0 && g.meta_bytes.is_multiple_of(u64::from(g.block_bytes)));
    assert!(g.slot_count() > 0 && g.slot_count() <= u64::from(u32::MAX));
    assert_eq!(l.stale_mask >> n, 0);
    assert!(
        l.generation <= GENERATION_MAX,
        "generation {}",
        l.generation
    );
    for i in 0..n {
        assert!(g.member_needs_bytes(i) <= g.member_bytes[i], "member {i}");
        assert!(g.stripe_base(i) + g.stripe_slots[i] <= g.slot_count());
    }
    let back = Label::parse(&l.to_page()).expect("a label's own page parses");
    assert_eq!(&back, l, "round trip");
}

/// Parses both copies, picks the current one, and opens a set of it if
/// the flags ask. See the module doc.
pub fn set_label(data: &[u8]) {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let pages = [copy_page(data, 0, flags), copy_page(data, 1, flags)];
    let parsed = [Label::parse(&pages[0]), Label::parse(&pages[1])];
    for l in parsed.iter().flatten() {
        check_label(l);
    }
    let current = Label::current([&pages[0], &pages[1]]);
    let want = match (&parsed[0], &parsed[1]) {
        (Ok(a), Ok(b)) if b.generation > a.generation => Some(b),
        (Ok(a), _) => Some(a),
        (Err(_), b) => b.as_ref().ok(),
    };
    assert_eq!(current.as_ref().ok(), want, "the current copy");
    if let Ok(l) = current {
        if flags & 4 != 0 {
            open_set(&l, flags);
        }
    }
}

/// Opens a set whose members carry `l` (each its own index).
fn open_set(l: &Label, flags: u8) {
    let g = &l.geometry;
    let too_small = flags & 8 != 0;
    if g.slot_count() > SET_SLOTS_MAX && !too_small {
        return;
    }
    let n = l.member_count();
    let present = if flags & 16 != 0 { n - 1 } else { n };
    let mut devs: Vec<DeviceRef> = Vec::new();
    for i in 0..present {
        let mut size = g.member_needs_bytes(i);
        if i == 0 && too_small {
            size -= 512;
        }
        let d = LabelDevice::new(format!("m{i}"), size);
        let mut mine = l.clone();
        mine.member_index = i;
        d.write_at(&mine.to_page(), mine.copy_offset())
            .expect("the label fits");
        devs.push(Arc::new(d));
    }
    let sizes: Vec<u64> = devs.iter().map(|d| d.size_bytes()).collect();
    let Ok(set) = CacheSet::open(devs, flags & 32 != 0) else {
        return;
    };
    for (i, size) in sizes.into_iter().enumerate() {
        assert!(
            size >= g.member_needs_bytes(i),
            "member {i} of {size} bytes accepted for a label that gives it {}",
            g.member_needs_bytes(i)
        );
    }
    assert_eq!(set.geometry(), g);
    assert_eq!(set.members().len(), n);
    let mut meta = vec![0u8; PAGE_BYTES];
    set.read_at(&mut meta, 0).expect("metadata reads");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::set::Geometry;

    #[test]
    fn a_label_opens_and_a_short_member_is_refused() {
        let l = Label {
            member_index: 0,
            set_id: 9,
            generation: 3,
            stale_mask: 0,
            flags: 0,
            geometry: Geometry {
                block_bytes: 4096,
                meta_bytes: 4096 * 4,
                mirror_slots: 8,
                stripe_slots: vec![2, 2],
                member_bytes: vec![1 << 20, 1 << 20],
            },
            serials: [0; MAX_MEMBERS],
        };
        let page = l.to_page();
        // A member smaller than its label says is refused, with the sizes.
        let short = LabelDevice::new("short".into(), l.geometry.member_needs_bytes(0) - 512);
        short.write_at(&page, l.copy_offset()).unwrap();
        let other = LabelDevice::new("other".into(), 1 << 20);
        let mut one = l.clone();
        one.member_index = 1;
        other.write_at(&one.to_page(), one.copy_offset()).unwrap();
        let Err(e) = CacheSet::open(vec![Arc::new(short), Arc::new(other)], false) else {
            panic!("a short member opened");
        };
        assert!(
            e.to_string().contains("its label gives it 65536 bytes"),
            "{e}"
        );
        // A generation near 2^64 is damage (a degraded open overflowed it).
        let mut old = l.clone();
        old.generation = u64::MAX;
        let e = Label::parse(&old.to_page()).unwrap_err();
        assert!(e.contains("implausible"), "{e}");
        for flags in [4u8, 4 | 8, 4 | 16 | 32] {
            let mut input = vec![flags];
            input.extend_from_slice(&page[..RAW_BYTES]);
            set_label(&input);
        }
    }
}
