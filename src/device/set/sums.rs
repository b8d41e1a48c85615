//! Checksums of the blocks in a set's slots, so that a member returning
//! damaged data (bit rot, a misdirected write, a device that lies) is
//! caught, and the block served from a copy that checks out instead.
//!
//! Per slot: the CRC32C of the block as last written whole, or 0 when
//! unknown (never written whole since open, written in part, or
//! discarded). In memory only (4 bytes per slot): after a restart a block
//! is checked again once it is written whole. A read that covers a whole
//! block with a known sum checks it; on a mismatch the other copy (a
//! mirrored slot) is read and checked, served, and written over the bad
//! one; a block with no good copy is a read error, which the engine
//! handles as for any cache read error (a clean block comes from the
//! origin; the metadata's own checksums guard the metadata). Each damaged
//! block or page is a checksum error of the member that returned it
//! (`health.rs`), and a member with too many is failed.

use std::sync::atomic::{AtomicU32, Ordering};

use super::health::Found;
use super::{CacheSet, Geometry, Piece, Target};
use crate::device::{DeviceError, DeviceResult};

pub(crate) struct Sums {
    crcs: Vec<AtomicU32>,
}

/// The slots a request at virtual `offset` of `len` bytes touches: each
/// with whether the request covers it whole, and where in the request.
fn slots_of(g: &Geometry, offset: u64, len: u64) -> impl Iterator<Item = (usize, Option<usize>)> {
    let bs = g.block_bytes as u64;
    let end = offset + len;
    let start = offset.max(g.meta_bytes);
    let first = if start >= end {
        1
    } else {
        (start - g.meta_bytes) / bs
    };
    let last = if start >= end {
        0
    } else {
        (end - 1 - g.meta_bytes) / bs + 1
    };
    let meta = g.meta_bytes;
    (first..last).map(move |slot| {
        let lo = meta + slot * bs;
        let whole = lo >= offset && lo + bs <= end;
        (slot as usize, whole.then(|| (lo - offset) as usize))
    })
}

impl Sums {
    pub(crate) fn new(slots: u64) -> Sums {
        Sums {
            crcs: (0..slots).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// A write of `buf` at virtual `offset`: blocks written whole get
    /// their sum, blocks written in part lose theirs.
    pub(crate) fn note_write(&self, g: &Geometry, buf: &[u8], offset: u64) {
        let bs = g.block_bytes as usize;
        for (slot, whole) in slots_of(g, offset, buf.len() as u64) {
            let crc = whole.map_or(0, |at| crc32c::crc32c(&buf[at..at + bs]));
            self.crcs[slot].store(crc, Ordering::Release);
        }
    }

    /// A discard: the blocks' contents are unknown now.
    pub(crate) fn forget(&self, g: &Geometry, offset: u64, len: u64) {
        for (slot, _) in slots_of(g, offset, len) {
            self.crcs[slot].store(0, Ordering::Release);
        }
    }

    fn expected(&self, slot: usize) -> Option<u32> {
        Some(self.crcs[slot].load(Ordering::Acquire)).filter(|&c| c != 0)
    }
}

/// Says whether a 4 KiB metadata page is intact by its own checksum (the
/// engine's `format::meta_page_intact`).
pub use crate::device::members::MetaCheck;

const PAGE: usize = 4096;

impl CacheSet {
    /// Metadata pages read from now on are checked with `check`; a page
    /// that fails is read from the other members, and one that passes
    /// there is served and written over the bad copy.
    pub fn set_meta_check(&self, check: MetaCheck) {
        let _ = self.meta_check.set(check);
    }

    /// Reads metadata pages `range` (virtual offsets, page aligned) from
    /// every healthy member and writes an intact copy over each damaged
    /// one; returns how many pages were repaired. The engine runs it at
    /// open over the superblocks and the journal: a copy damaged where
    /// nothing reads it would otherwise wait, unseen, for the day it is
    /// the only one left. (Checkpoint areas are rewritten in turn.) After
    /// a `clean` shutdown the copies were equal, so a damaged one counts
    /// against its member from here on (`health.rs`).
    pub fn scrub_meta(&self, range: std::ops::Range<u64>, clean: bool) -> u64 {
        let Some(check) = self.meta_check.get() else {
            return 0;
        };
        if clean {
            self.count_meta_damage();
        }
        let mut repaired = 0;
        let mut pages: Vec<crate::device::AlignedBuf> = (0..self.members.len())
            .map(|_| crate::device::AlignedBuf::zeroed(PAGE))
            .collect();
        let mut at = range.start;
        while at < range.end {
            let member_at = super::LABEL_BYTES + at;
            let mut ok = vec![false; self.members.len()];
            for (j, m) in self.members.iter().enumerate() {
                if let Some(dev) = m.healthy_dev() {
                    ok[j] = match dev.read_at(&mut pages[j], member_at) {
                        Ok(()) => check(&pages[j]),
                        Err(e) => {
                            self.member_error(j, "scrub read", e);
                            false
                        }
                    };
                }
            }
            if let Some(good) = ok.iter().position(|&o| o) {
                let copy = pages[good].to_vec();
                for j in (0..self.members.len()).filter(|&j| !ok[j]) {
                    if self.members[j].healthy_dev().is_none() {
                        continue;
                    }
                    repaired += self.overwrite(j, &copy, member_at) as u64;
                    self.checksum_error(j, Found::Meta);
                }
            }
            at += PAGE as u64;
        }
        if repaired > 0 {
            log::warn!("{}: repaired {repaired} damaged metadata pages", self.name);
        }
        repaired
    }

    /// Checks the metadata pages of `buf`, read from member `from` at
    /// member offset `at` (page aligned).
    pub(super) fn verify_meta(&self, buf: &mut [u8], at: u64, from: usize) {
        let Some(check) = self.meta_check.get() else {
            return;
        };
        if !at.is_multiple_of(PAGE as u64) {
            return;
        }
        for (k, page) in buf.chunks_exact_mut(PAGE).enumerate() {
            if check(page) {
                continue;
            }
            let page_at = at + (k * PAGE) as u64;
            // A page never written is not intact anywhere: it stays.
            let others = (0..self.members.len()).filter(|&j| j != from);
            if let Some(j) = self.intact_copy(page, others, page_at, check, |_| {}) {
                log::warn!(
                    "{}: member {from}'s metadata page at {page_at} is damaged; using member {j}'s",
                    self.name
                );
                self.overwrite(from, page, page_at);
                self.checksum_error(from, Found::Meta);
            }
        }
    }

    /// Checks the whole blocks of `buf`, read from member `from` for piece
    /// `p` at virtual offset `virt`; replaces a damaged one with a good
    /// copy, or fails.
    pub(super) fn verify(
        &self,
        buf: &mut [u8],
        virt: u64,
        p: &Piece,
        from: usize,
    ) -> DeviceResult<()> {
        let bs = self.geometry.block_bytes as usize;
        for (slot, whole) in slots_of(&self.geometry, virt, buf.len() as u64) {
            let (Some(at), Some(want)) = (whole, self.sums.expected(slot)) else {
                continue;
            };
            let block = &mut buf[at..at + bs];
            if crc32c::crc32c(block) == want {
                continue;
            }
            log::warn!(
                "{}: member {from} returned slot {slot} damaged (checksum mismatch)",
                self.name
            );
            let member_at = p.member_offset + at as u64;
            let served = self.good_copy(block, p.target, member_at, from, want, slot);
            // After the repair: the rule may fail the member now.
            self.checksum_error(from, Found::Data);
            served?;
        }
        Ok(())
    }

    /// Fills `block` from a copy other than `bad`'s that checks out, and
    /// writes it over the bad copy (best effort).
    fn good_copy(
        &self,
        block: &mut [u8],
        target: Target,
        at: u64,
        bad: usize,
        want: u32,
        slot: usize,
    ) -> DeviceResult<()> {
        let others = self.copies(target).filter(|&j| j != bad);
        let matches = |b: &[u8]| crc32c::crc32c(b) == want;
        let count_bad = |j: usize| self.checksum_error(j, Found::Data);
        let Some(j) = self.intact_copy(block, others, at, &matches, count_bad) else {
            return Err(DeviceError::Io {
                device: self.name.clone(),
                what: "read",
                source: std::io::Error::other(format!(
                    "slot {slot}: no copy matches its checksum (damaged data on the cache device)"
                )),
            });
        };
        if self.overwrite(bad, block, at) {
            log::warn!(
                "{}: slot {slot} repaired on member {bad} from member {j}",
                self.name
            );
        }
        Ok(())
    }

    /// Reads the copies at member offset `at` of the healthy members
    /// among `members` until one passes `check`, and puts it in `into`;
    /// returns that member. `failed` hears of each copy that did not pass;
    /// a member whose read fails is failed.
    fn intact_copy(
        &self,
        into: &mut [u8],
        members: impl Iterator<Item = usize>,
        at: u64,
        check: &dyn Fn(&[u8]) -> bool,
        failed: impl Fn(usize),
    ) -> Option<usize> {
        let mut tmp = crate::device::AlignedBuf::zeroed(into.len());
        for j in members {
            let Some(dev) = self.members[j].healthy_dev() else {
                continue;
            };
            match dev.read_at(&mut tmp, at) {
                Ok(()) if check(&tmp) => {
                    into.copy_from_slice(&tmp);
                    return Some(j);
                }
                Ok(()) => failed(j),
                Err(e) => {
                    self.member_error(j, "read", e);
                }
            }
        }
        None
    }

    /// Writes a good copy over member `j`'s damaged one (best effort: a
    /// member that fails the write is failed). True if it was written.
    fn overwrite(&self, j: usize, good: &[u8], at: u64) -> bool {
        let Some(dev) = self.members[j].dev() else {
            return false;
        };
        match dev.write_at(good, at) {
            Ok(()) => true,
            Err(e) => {
                self.member_error(j, "repair write", e);
                false
            }
        }
    }
}
