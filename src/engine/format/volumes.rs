//! The volume table: the origins one cache holds, in the superblock page
//! after its first 256 bytes (docs/format.md, "Volumes").
//!
//! A cache of one origin named `vol0` has no table (count 0) and is
//! written as format version 2, as before volumes existed, so a tiercache
//! from before them still opens it. Any other cache has a table and is
//! written as version 3. Volume 0's size and identity stay in the
//! superblock's own fields; its record holds its name. The superblock's
//! mode is the cache's: a volume has it unless its record names a mode of
//! its own.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::engine::modes::Mode;
use crate::engine::origin::address::MAX_VOLUME_BYTES;
use crate::engine::policy::share::{Share, Sharing};

/// Volumes one cache can hold (records that fit in the page).
pub use crate::engine::origin::address::MAX_VOLUMES;
/// Bytes of a volume name.
pub const NAME_BYTES: usize = 32;
/// The name of volume `i` when none is given.
pub fn default_name(i: usize) -> String {
    format!("vol{i}")
}

/// One volume: 64 bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct VolumeRecord {
    /// UTF-8, NUL-padded (`name_valid`).
    pub name: [u8; NAME_BYTES],
    /// The origin's size in bytes (0 in record 0: the superblock's field).
    pub bytes: U64,
    /// The origin's identity (0 in record 0: the superblock's field).
    pub identity: U64,
    /// Bit 0: the record is in use.
    pub flags: U32,
    /// The volume's cache mode (`Mode::to_u32`), or 0: the cache's (the
    /// superblock's `mode`).
    pub mode: U32,
    /// Its guaranteed share of the cache's slots, in thousandths (0: none;
    /// policy/share.rs).
    pub share_min_permille: U16,
    /// The most of the cache's slots it may hold, in thousandths (0: no
    /// limit).
    pub share_max_permille: U16,
    pub reserved: [u8; 4],
}
const _: () = assert!(std::mem::size_of::<VolumeRecord>() == 64);

/// Record flag: in use.
pub const VOLUME_IN_USE: u32 = 1;
/// Record flag (with `VOLUME_IN_USE`): removed while served (`tiercache
/// remove-origin`). It holds no blocks and its origin is let go; its keys
/// stay reserved until the next open takes the record out and moves the
/// volumes after it down one place (recovery.rs, `finish_removals`). A
/// tiercache from before it refuses the table (flags other than in use).
pub const VOLUME_REMOVED: u32 = 2;

/// The table: 3840 bytes, the superblock page's bytes 256..4096.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct VolumeTable {
    /// Records in use (0: one volume, `vol0`, and no table).
    pub count: U32,
    /// CRC32C of the table's 3840 bytes with this field zero.
    pub crc: U32,
    /// How the volumes share the cache (`Sharing::to_u32`; 0: one ranking
    /// of every volume's blocks).
    pub sharing: U32,
    pub reserved: [u8; 4],
    pub records: [VolumeRecord; MAX_VOLUMES],
    pub tail: [u8; 48],
}
const _: () = assert!(std::mem::size_of::<VolumeTable>() == 3840);

/// A volume as the cache records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    pub name: String,
    pub bytes: u64,
    pub identity: u64,
    /// A mode of its own; `None`: the cache's.
    pub mode: Option<Mode>,
    /// Its share of the cache's slots (none by default).
    pub share: Share,
    /// Removed while served: kept only until the next open
    /// (`VOLUME_REMOVED`).
    pub removed: bool,
}

/// Names are 1..=32 bytes of ASCII letters, digits, `.`, `_` and `-`, not
/// starting with `.` or `-` (they become NBD export names and file names).
pub fn name_valid(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > NAME_BYTES {
        return Err(format!(
            "volume name {name:?} must have 1 to {NAME_BYTES} characters"
        ));
    }
    if !name.chars().all(ok_char) || name.starts_with(['.', '-']) {
        return Err(format!(
            "volume name {name:?} may hold only letters, digits, '.', '_' and '-', \
             and may not start with '.' or '-'"
        ));
    }
    Ok(())
}

/// The names of a cache's volumes, in order: 1 to `MAX_VOLUMES` of them,
/// each valid (`name_valid`), no two alike.
pub fn names_valid(names: &[String]) -> Result<(), String> {
    if names.is_empty() || names.len() > MAX_VOLUMES {
        return Err(format!(
            "a cache holds 1 to {MAX_VOLUMES} origins, not {}",
            names.len()
        ));
    }
    for (i, name) in names.iter().enumerate() {
        name_valid(name)?;
        if names[..i].contains(name) {
            return Err(format!("two volumes are named '{name}'"));
        }
    }
    Ok(())
}

impl VolumeTable {
    pub fn compute_crc(&self) -> u32 {
        let mut t = *self;
        t.crc = U32::new(0);
        crc32c::crc32c(t.as_bytes())
    }

    /// Fills the table for `volumes` (volume 0's size and identity are the
    /// superblock's, so its record keeps only the name), or empties it for
    /// a lone `vol0`.
    /// The table's `sharing` is kept (a lone volume shares with nobody).
    pub fn set(&mut self, volumes: &[VolumeEntry]) {
        let sharing = self.sharing;
        *self = VolumeTable::new_zeroed();
        let lone_default = volumes.len() == 1
            && volumes[0].name == default_name(0)
            && volumes[0].mode.is_none()
            && volumes[0].share == Share::default()
            && !volumes[0].removed;
        if lone_default {
            return;
        }
        self.count = U32::new(volumes.len() as u32);
        self.sharing = sharing;
        for (i, (r, v)) in self.records.iter_mut().zip(volumes).enumerate() {
            r.name[..v.name.len()].copy_from_slice(v.name.as_bytes());
            if i > 0 {
                r.bytes = U64::new(v.bytes);
                r.identity = U64::new(v.identity);
            }
            r.flags = U32::new(VOLUME_IN_USE | if v.removed { VOLUME_REMOVED } else { 0 });
            r.mode = U32::new(v.mode.map_or(0, Mode::to_u32));
            r.share_min_permille = U16::new(v.share.min_permille);
            r.share_max_permille = U16::new(v.share.max_permille);
        }
        self.crc = U32::new(self.compute_crc());
    }

    /// The volumes it records, volume 0 from `origin_bytes` and
    /// `origin_identity` (the superblock's fields); `Err` says what is
    /// wrong with it.
    pub fn volumes(
        &self,
        origin_bytes: u64,
        origin_identity: u64,
    ) -> Result<Vec<VolumeEntry>, String> {
        let count = self.count.get() as usize;
        let first = VolumeEntry {
            name: default_name(0),
            bytes: origin_bytes,
            identity: origin_identity,
            mode: None,
            share: Share::default(),
            removed: false,
        };
        if count == 0 {
            return Ok(vec![first]);
        }
        if self.crc.get() != self.compute_crc() {
            return Err("volume table checksum mismatch".into());
        }
        if count > MAX_VOLUMES {
            return Err(format!(
                "volume table claims {count} volumes (at most {MAX_VOLUMES})"
            ));
        }
        if Sharing::from_u32(self.sharing.get()).is_none() || self.reserved != [0; 4] {
            return Err(format!(
                "volume table: unknown sharing {} or reserved bytes set",
                self.sharing.get()
            ));
        }
        let mut out: Vec<VolumeEntry> = Vec::with_capacity(count);
        for (i, r) in self.records.iter().enumerate() {
            let used = matches!(r.flags.get(), f if f == VOLUME_IN_USE || f == VOLUME_IN_USE | VOLUME_REMOVED);
            if i >= count {
                if r.as_bytes().iter().any(|&b| b != 0) {
                    return Err(format!("volume record {i} is past the count and not zero"));
                }
                continue;
            }
            if !used {
                return Err(format!("volume record {i} is not marked in use"));
            }
            let v = record_entry(i, r, &first)?;
            if out.iter().any(|o| o.name == v.name) {
                return Err(format!("two volumes are named {:?}", v.name));
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// Record `i` as a volume (record 0 takes `first`'s size and identity).
fn record_entry(i: usize, r: &VolumeRecord, first: &VolumeEntry) -> Result<VolumeEntry, String> {
    let len = r.name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
    if r.name[len..].iter().any(|&b| b != 0) {
        return Err(format!("volume record {i}: bytes after its name's end"));
    }
    let name = std::str::from_utf8(&r.name[..len])
        .map_err(|_| format!("volume record {i}: its name is not UTF-8"))?
        .to_string();
    name_valid(&name).map_err(|e| format!("volume record {i}: {e}"))?;
    if r.reserved.iter().any(|&b| b != 0) {
        return Err(format!("volume record {i}: reserved bytes set"));
    }
    let (bytes, identity) = if i == 0 {
        if r.bytes.get() != 0 || r.identity.get() != 0 {
            return Err("volume record 0 holds a size or identity (the superblock's)".into());
        }
        (first.bytes, first.identity)
    } else {
        (r.bytes.get(), r.identity.get())
    };
    if i > 0 && (bytes == 0 || bytes > MAX_VOLUME_BYTES) {
        return Err(format!(
            "volume record {i} has {bytes} bytes (1 to {MAX_VOLUME_BYTES})"
        ));
    }
    let mode = match r.mode.get() {
        0 => None,
        m => Some(Mode::from_u32(m).ok_or(format!("volume record {i}: unknown mode {m}"))?),
    };
    let share = Share {
        min_permille: r.share_min_permille.get(),
        max_permille: r.share_max_permille.get(),
    };
    share
        .valid()
        .map_err(|e| format!("volume record {i}: {e}"))?;
    Ok(VolumeEntry {
        name,
        bytes,
        identity,
        mode,
        share,
        removed: r.flags.get() & VOLUME_REMOVED != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vols(names: &[&str]) -> Vec<VolumeEntry> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| VolumeEntry {
                name: n.to_string(),
                bytes: 1 << (20 + i),
                identity: 100 + i as u64,
                mode: (i == 1).then_some(Mode::Writethrough),
                share: Share {
                    min_permille: (i == 2) as u16 * 250,
                    max_permille: (i == 1) as u16 * 500,
                },
                removed: false,
            })
            .collect()
    }

    #[test]
    fn a_lone_vol0_has_no_table() {
        let mut t = VolumeTable::new_zeroed();
        t.set(&vols(&["vol0"]));
        assert!(t.as_bytes().iter().all(|&b| b == 0));
        assert_eq!(t.volumes(1 << 20, 100).unwrap(), vols(&["vol0"]));
    }

    #[test]
    fn round_trip_and_damage() {
        let v = vols(&["db", "logs", "vol2"]);
        let mut t = VolumeTable::new_zeroed();
        t.set(&v);
        assert_eq!(t.count.get(), 3);
        assert_eq!(t.records[0].bytes.get(), 0);
        assert_eq!(t.volumes(1 << 20, 100).unwrap(), v);
        // Every single flipped byte is caught.
        for at in 0..std::mem::size_of::<VolumeTable>() {
            let mut bad = t;
            bad.as_mut_bytes()[at] ^= 0x10;
            assert!(bad.volumes(1 << 20, 100).is_err(), "byte {at}");
        }
        // A well-sealed table that breaks the rules is refused too.
        let mut dup = t;
        dup.records[1].name = dup.records[0].name;
        dup.crc = U32::new(dup.compute_crc());
        assert!(dup
            .volumes(1 << 20, 100)
            .unwrap_err()
            .contains("two volumes"));
        // A size past a volume's address space would put its blocks under
        // the next volume's keys.
        let mut huge = t;
        huge.records[2].bytes = U64::new(MAX_VOLUME_BYTES + 4096);
        huge.crc = U32::new(huge.compute_crc());
        let e = huge.volumes(1 << 20, 100).unwrap_err();
        assert!(e.contains("record 2 has"), "{e}");
    }

    #[test]
    fn a_version_2_page_ignores_its_unused_bytes_and_version_3_checks_them() {
        use crate::engine::format::{Superblock, SUPERBLOCK_MAGIC};
        let mut sb = Superblock::new_zeroed();
        sb.magic = SUPERBLOCK_MAGIC;
        sb.seal();
        assert_eq!(sb.version.get(), 2);
        let mut page = sb.to_page();
        page[256] = 1;
        page[300] = 0xff;
        let back = Superblock::parse(&page).unwrap();
        assert!(back.volumes.as_bytes().iter().all(|&b| b == 0));
        assert_eq!(back.volume_list().len(), 1);

        sb.set_volume_list(&vols(&["a", "b"]));
        sb.seal();
        assert_eq!(sb.version.get(), 3);
        assert_eq!(
            Superblock::parse(&sb.to_page())
                .unwrap()
                .volume_list()
                .len(),
            2
        );
        let mut page = sb.to_page();
        page[300] ^= 1;
        assert!(Superblock::parse(&page)
            .unwrap_err()
            .contains("volume table"));
    }

    #[test]
    fn names() {
        for ok in ["vol0", "db.1", "a_b-c", &"x".repeat(32)] {
            name_valid(ok).unwrap();
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", &"x".repeat(33)] {
            assert!(name_valid(bad).is_err(), "{bad:?}");
        }
    }
}
