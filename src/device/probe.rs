//! What a device already holds, found by its signature, as blkid and wipefs
//! find it: `create` refuses to format a device that carries one unless the
//! operator names it with `--wipe`.
//!
//! Every probe reads fixed offsets of two byte ranges, the device's first
//! [`HEAD_BYTES`] and last [`TAIL_BYTES`] (md 0.90 and 1.0 keep their
//! superblock at the end), and never panics on any input: a range that is
//! not there (a small device) is no match. Offsets are those of util-linux
//! libblkid's probers (`libblkid/src/superblocks/*.c`, `partitions/*.c`).

use super::set::label::LABEL_MAGIC;
use super::{AlignedBuf, BlockDevice, DeviceResult, SECTOR_BYTES};

/// Bytes read from the start: btrfs's superblock is at 64 KiB, a swap
/// signature at the end of the first page, up to 64 KiB pages.
pub const HEAD_BYTES: u64 = 128 << 10;
/// Bytes read from the end: md 0.90's superblock is in the last 128 KiB.
pub const TAIL_BYTES: u64 = 128 << 10;

/// The tiercache superblock's magic (engine/format/mod.rs `SUPERBLOCK_MAGIC`;
/// the device layer does not import the engine, a test checks they agree).
const TIERCACHE_MAGIC: &[u8] = b"TIERCACH";
/// md's superblock magic, little-endian (0.90 on x86, and 1.x always).
const MD_MAGIC: [u8; 4] = 0xa92b_4efc_u32.to_le_bytes();
/// bcache's superblock magic (bcache.h `BCACHE_MAGIC`), at 4096 + 24.
const BCACHE_MAGIC: [u8; 16] = [
    0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba, 0x6d, 0x81,
];

/// What a tiercache cache's superblock is called in a [`Signature`].
pub const TIERCACHE_CACHE: &str = "a tiercache cache";

/// What was found: a name for people and the byte offset of the signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub what: String,
    pub offset: u64,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (signature at byte {})", self.what, self.offset)
    }
}

/// A device's first and last bytes, addressed by device offset.
struct View<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    size_bytes: u64,
}

impl View<'_> {
    /// `len` bytes at device offset `at`, if the head or the tail holds them.
    fn get(&self, at: u64, len: usize) -> Option<&[u8]> {
        let end = at.checked_add(len as u64)?;
        if end > self.size_bytes {
            return None;
        }
        if end <= self.head.len() as u64 {
            return self.head.get(at as usize..end as usize);
        }
        let tail_start = self.size_bytes.checked_sub(self.tail.len() as u64)?;
        let from = at.checked_sub(tail_start)?;
        self.tail
            .get(from as usize..(from as usize).checked_add(len)?)
    }

    fn has(&self, at: u64, magic: &[u8]) -> bool {
        self.get(at, magic.len()) == Some(magic)
    }

    fn u16_le(&self, at: u64) -> Option<u16> {
        let b = self.get(at, 2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32_le(&self, at: u64) -> Option<u32> {
        let b = self.get(at, 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Signatures that are a magic at a fixed offset.
const FIXED: [(&str, u64, &[u8]); 9] = [
    (TIERCACHE_CACHE, 0, TIERCACHE_MAGIC),
    (TIERCACHE_CACHE, 4096, TIERCACHE_MAGIC),
    ("a tiercache cache-set member", 0, &LABEL_MAGIC),
    ("a tiercache cache-set member", 4096, &LABEL_MAGIC),
    ("an XFS filesystem", 0, b"XFSB"),
    ("a btrfs filesystem", 65536 + 64, b"_BHRfS_M"),
    ("a LUKS encrypted volume", 0, b"LUKS\xba\xbe"),
    ("a bcache device", 4096 + 24, &BCACHE_MAGIC),
    ("an NTFS filesystem", 3, b"NTFS    "),
];

/// Every known signature in a device's first bytes `head` and last bytes
/// `tail` (the device is `size_bytes` long; either slice may be shorter
/// than its constant, or empty). The same bytes always give the same
/// answer; no input makes it panic.
pub fn probe(head: &[u8], tail: &[u8], size_bytes: u64) -> Vec<Signature> {
    let v = View {
        head,
        tail,
        size_bytes,
    };
    let mut found: Vec<Signature> = FIXED
        .iter()
        .filter(|(_, at, magic)| v.has(*at, magic))
        .map(|&(what, offset, _)| Signature {
            what: what.into(),
            offset,
        })
        .collect();
    let probers: [fn(&View) -> Option<Signature>; 7] =
        [ext, swap, lvm2, md, vfat, partitions, gpt_backup];
    found.extend(probers.iter().filter_map(|p| p(&v)));
    // One tiercache cache shows at both superblock copies: once is enough.
    found.dedup_by(|a, b| a.what == b.what);
    found
}

/// Erases what `found` names on `dev`, as `wipefs` does: the 512-byte
/// sector holding each signature is zeroed (no magic here crosses a
/// sector), then the device is flushed. Formatting overwrites the first
/// megabyte anyway; this also reaches the signatures at the end (md 1.0
/// and 0.90, the GPT backup header), which other tools would still find.
pub fn erase(dev: &dyn BlockDevice, found: &[Signature]) -> DeviceResult<()> {
    let zero = AlignedBuf::zeroed(SECTOR_BYTES as usize);
    for s in found {
        dev.write_at(&zero, s.offset / SECTOR_BYTES * SECTOR_BYTES)?;
    }
    dev.flush()
}

/// Reads `dev`'s first and last bytes and probes them.
pub fn probe_device(dev: &dyn BlockDevice) -> DeviceResult<Vec<Signature>> {
    let size = dev.size_bytes();
    let head_bytes = size.min(HEAD_BYTES);
    let mut head = AlignedBuf::zeroed(head_bytes as usize);
    dev.read_at(&mut head, 0)?;
    // The tail starts on a sector: the device size is a multiple of 512.
    let tail_bytes = size.min(TAIL_BYTES) / SECTOR_BYTES * SECTOR_BYTES;
    let mut tail = AlignedBuf::zeroed(tail_bytes as usize);
    dev.read_at(&mut tail, size - tail_bytes)?;
    Ok(probe(&head, &tail, size))
}

/// ext2, ext3 or ext4: the superblock at 1024, magic 0xEF53 at its byte
/// 56; the feature words (compat 92, incompat 96, ro_compat 100) tell
/// which.
fn ext(v: &View) -> Option<Signature> {
    const SB: u64 = 1024;
    if v.u16_le(SB + 56)? != 0xEF53 {
        return None;
    }
    let compat = v.u32_le(SB + 92)?;
    let incompat = v.u32_le(SB + 96)?;
    let ro_compat = v.u32_le(SB + 100)?;
    // EXTENTS | 64BIT | FLEX_BG | ..., and HUGE_FILE | GDT_CSUM | DIR_NLINK |
    // EXTRA_ISIZE | METADATA_CSUM: what ext3 never has.
    let what = if incompat & !0x0000_0006 != 0 || ro_compat & 0x0000_0478 != 0 {
        "an ext4 filesystem"
    } else if compat & 0x0004 != 0 {
        "an ext3 filesystem"
    } else {
        "an ext2 filesystem"
    };
    Some(Signature {
        what: what.into(),
        offset: SB + 56,
    })
}

/// Linux swap: "SWAPSPACE2" (or the old "SWAP-SPACE") in the last 10 bytes
/// of the first page, for every page size Linux has.
fn swap(v: &View) -> Option<Signature> {
    [4096u64, 8192, 16384, 65536].iter().find_map(|page| {
        let at = page - 10;
        (v.has(at, b"SWAPSPACE2") || v.has(at, b"SWAP-SPACE")).then(|| Signature {
            what: "Linux swap space".into(),
            offset: at,
        })
    })
}

/// An LVM2 physical volume: the label "LABELONE" in one of the first four
/// sectors, type "LVM2 001" at its byte 24.
fn lvm2(v: &View) -> Option<Signature> {
    (0..4u64).find_map(|sector| {
        let at = sector * 512;
        (v.has(at, b"LABELONE") && v.has(at + 24, b"LVM2 001")).then(|| Signature {
            what: "an LVM2 physical volume".into(),
            offset: at,
        })
    })
}

/// An md RAID member: superblock 1.1 at 0, 1.2 at 4 KiB, 1.0 at 8 KiB
/// before the end (4 KiB aligned), 0.90 in the last 64 KiB-aligned 64 KiB.
fn md(v: &View) -> Option<Signature> {
    let sectors = v.size_bytes / 512;
    let end_1_0 = sectors.checked_sub(16).map(|s| (s & !7) * 512);
    let end_0_90 = (sectors & !127).checked_sub(128).map(|s| s * 512);
    let places = [
        ("1.1", Some(0)),
        ("1.2", Some(4096)),
        ("1.0", end_1_0),
        ("0.90", end_0_90),
    ];
    places.iter().find_map(|&(version, at)| {
        let at = at?;
        v.has(at, &MD_MAGIC).then(|| Signature {
            what: format!("an md RAID member (superblock {version})"),
            offset: at,
        })
    })
}

/// A FAT filesystem: a boot sector ending 0x55AA with "FAT" where FAT12/16
/// (byte 54) or FAT32 (byte 82) name their type.
fn vfat(v: &View) -> Option<Signature> {
    if !v.has(510, &[0x55, 0xAA]) {
        return None;
    }
    [54u64, 82].iter().find_map(|&at| {
        v.has(at, b"FAT").then(|| Signature {
            what: "a FAT filesystem".into(),
            offset: at,
        })
    })
}

/// A GPT's backup header, in the last LBA (512 or 4096-byte sectors):
/// found even when the primary is gone, as tools that repair a GPT do.
fn gpt_backup(v: &View) -> Option<Signature> {
    [512u64, 4096].iter().find_map(|&lba| {
        let at = v.size_bytes.checked_sub(lba)?;
        v.has(at, b"EFI PART").then(|| Signature {
            what: "a GPT partition table (backup header)".into(),
            offset: at,
        })
    })
}

/// A partition table: GPT ("EFI PART" in its header at LBA 1, for 512 and
/// 4096-byte sectors), else an MBR (0x55AA at 510 and a used entry with a
/// valid boot flag).
fn partitions(v: &View) -> Option<Signature> {
    if let Some(at) = [512u64, 4096]
        .into_iter()
        .find(|&at| v.has(at, b"EFI PART"))
    {
        return Some(Signature {
            what: "a GPT partition table".into(),
            offset: at,
        });
    }
    if !v.has(510, &[0x55, 0xAA]) || vfat(v).is_some() || v.has(3, b"NTFS    ") {
        return None;
    }
    let used = (0..4u64).any(|i| {
        let e = 446 + 16 * i;
        let (Some(boot), Some(kind), Some(sectors)) =
            (v.get(e, 1), v.get(e + 4, 1), v.u32_le(e + 12))
        else {
            return false;
        };
        matches!(boot[0], 0x00 | 0x80) && kind[0] != 0 && sectors != 0
    });
    used.then(|| Signature {
        what: "an MBR partition table".into(),
        offset: 510,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const SIZE: u64 = 1 << 20;

    /// A blank device of SIZE with `bytes` at `at`.
    fn with(at: u64, bytes: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; SIZE as usize];
        d[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
        d
    }

    fn found(dev: &[u8]) -> Vec<String> {
        let size = dev.len() as u64;
        let head = &dev[..size.min(HEAD_BYTES) as usize];
        let tail = &dev[(size - size.min(TAIL_BYTES)) as usize..];
        probe(head, tail, size)
            .into_iter()
            .map(|s| s.what)
            .collect()
    }

    #[test]
    fn each_signature_is_found_where_it_lives() {
        let ext4 = {
            let mut d = with(1024 + 56, &0xEF53u16.to_le_bytes());
            d[1024 + 96..1024 + 100].copy_from_slice(&0x2C2u32.to_le_bytes());
            d
        };
        let ext3 = {
            let mut d = with(1024 + 56, &0xEF53u16.to_le_bytes());
            d[1024 + 92] = 4;
            d
        };
        let lvm = {
            let mut d = with(512, b"LABELONE");
            d[512 + 24..512 + 32].copy_from_slice(b"LVM2 001");
            d
        };
        let mbr = {
            let mut d = with(510, &[0x55, 0xAA]);
            d[446 + 4] = 0x83;
            d[446 + 12] = 8;
            d
        };
        let md_end = ((SIZE / 512 - 16) & !7) * 512;
        let md_090 = (((SIZE / 512) & !127) - 128) * 512;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (ext4, "an ext4 filesystem"),
            (ext3, "an ext3 filesystem"),
            (
                with(1024 + 56, &0xEF53u16.to_le_bytes()),
                "an ext2 filesystem",
            ),
            (with(0, b"XFSB"), "an XFS filesystem"),
            (with(65536 + 64, b"_BHRfS_M"), "a btrfs filesystem"),
            (with(4086, b"SWAPSPACE2"), "Linux swap space"),
            (with(65526, b"SWAPSPACE2"), "Linux swap space"),
            (lvm, "an LVM2 physical volume"),
            (with(4096, &MD_MAGIC), "an md RAID member (superblock 1.2)"),
            (
                with(md_end, &MD_MAGIC),
                "an md RAID member (superblock 1.0)",
            ),
            (
                with(md_090, &MD_MAGIC),
                "an md RAID member (superblock 0.90)",
            ),
            (with(0, b"LUKS\xba\xbe\0\x02"), "a LUKS encrypted volume"),
            (with(512, b"EFI PART"), "a GPT partition table"),
            (
                with(SIZE - 512, b"EFI PART"),
                "a GPT partition table (backup header)",
            ),
            (mbr, "an MBR partition table"),
            (with(4096 + 24, &BCACHE_MAGIC), "a bcache device"),
            (with(4096, b"TIERCACH"), "a tiercache cache"),
            (with(0, b"TCSETMBR"), "a tiercache cache-set member"),
        ];
        for (dev, what) in cases {
            assert_eq!(found(&dev), vec![what.to_string()], "{what}");
        }
        assert!(found(&vec![0u8; SIZE as usize]).is_empty());
        // A boot sector alone is not a partition table.
        assert!(found(&with(510, &[0x55, 0xAA])).is_empty());
    }

    #[test]
    fn our_magics_are_the_formats() {
        assert_eq!(TIERCACHE_MAGIC, &crate::engine::format::SUPERBLOCK_MAGIC);
    }

    #[test]
    fn small_devices_and_short_slices_are_no_match() {
        for size in [0u64, 1, 511, 512, 1080, 4096, 70000] {
            let dev = vec![0xFFu8; size as usize];
            assert!(found(&dev).is_empty(), "{size}");
        }
        // Slices that claim more device than they hold, or less.
        assert!(probe(&[], &[], u64::MAX).is_empty());
        assert!(probe(&[1; 10], &[2; 10], 5).is_empty());
    }

    /// Random bytes at random sizes, and random bytes with real magics
    /// planted, in random head and tail lengths: never a panic.
    #[test]
    fn random_bytes_never_panic() {
        let seed = rand::random::<u64>();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let magics: [&[u8]; 6] = [
            b"EFI PART",
            b"LABELONE",
            &MD_MAGIC,
            b"SWAPSPACE2",
            b"\x53\xEF",
            b"TIERCACH",
        ];
        for round in 0..500 {
            let head_len = rng.gen_range(0..=HEAD_BYTES as usize + 100);
            let tail_len = rng.gen_range(0..=TAIL_BYTES as usize + 100);
            let mut head = vec![0u8; head_len];
            let mut tail = vec![0u8; tail_len];
            rng.fill(&mut head[..]);
            rng.fill(&mut tail[..]);
            if round % 2 == 0 && head_len > 16 {
                let m = magics[rng.gen_range(0..magics.len())];
                let at = rng.gen_range(0..head_len.saturating_sub(m.len()).max(1));
                let end = (at + m.len()).min(head_len);
                head[at..end].copy_from_slice(&m[..end - at]);
            }
            let size = match rng.gen_range(0..4) {
                0 => rng.gen(),
                1 => (head_len + tail_len) as u64,
                2 => rng.gen_range(0..=head_len as u64),
                _ => u64::MAX - rng.gen_range(0..1000),
            };
            let _ = std::panic::catch_unwind(|| probe(&head, &tail, size))
                .unwrap_or_else(|_| panic!("probe panicked: seed {seed} round {round}"));
        }
    }
}
