//! Loading cache metadata from untrusted bytes: the harness shared by the
//! `metadata_load` fuzz target (fuzz/fuzz_targets/metadata_load.rs) and the
//! seeded mutation test in tests/reliability_metadata.rs.
//!
//! The input describes the metadata of a small cache device (16 blocks of
//! 4 KiB, [`DEVICE_BYTES`]) compactly, so a fuzzer can mutate it:
//!
//! - byte 0: flags. Bits 0, 1, 2: recompute the CRC of every superblock copy,
//!   checkpoint page and journal page that carries its magic, so mutations
//!   reach the checks behind the checksums; bit 3: after a successful open,
//!   also write, close and reopen.
//! - then pieces, each `placement: u16 LE, len: u16 LE, len bytes` (cut
//!   short at the end of the input). A piece fills the start of one 4096-byte
//!   metadata page (the rest stays zero): placement 0 and 1 are the
//!   superblock copies, 2 and 3 checkpoint area 0 (its entry page and its
//!   sector-map page), 4 and 5 checkpoint area 1, 6 + k journal ring slot
//!   k; placements wrap around.
//!
//! [`exercise`] loads the image with `check` and `Engine::open` and, when the
//! metadata is accepted, uses the volume. It must never panic, hang or
//! allocate more than the device size; it asserts that `check` and `open`
//! agree, and that what open accepts survives a clean shutdown unchanged.

use std::sync::Arc;

use super::format::{
    Layout, Superblock, CHECKPOINT_MAGIC, JOURNAL_MAGIC, PAGE_BYTES, SUPERBLOCK_MAGIC,
};
use super::recovery::check;
use super::{Engine, OpenOptions};
use crate::device::fault::FaultDevice;
use crate::device::DeviceRef;

/// Size of the cache device the input is placed on: 16 slots of 4096 bytes
/// (2 superblock pages, 256 journal pages, 2 checkpoint areas of 2 pages).
pub const DEVICE_BYTES: u64 = 1_138_688;
pub const BLOCK_BYTES: u32 = 4096;
/// Largest origin the harness allocates; larger recorded sizes get a small
/// origin (and open refuses the size mismatch).
const ORIGIN_BYTES_MAX: u64 = 1 << 20;
const ORIGIN_BYTES_DEFAULT: u64 = 256 << 10;

pub const FLAG_RESEAL_SUPERBLOCKS: u8 = 1;
pub const FLAG_RESEAL_CHECKPOINTS: u8 = 2;
pub const FLAG_RESEAL_JOURNAL: u8 = 4;
pub const FLAG_USE_VOLUME: u8 = 8;

/// The layout of the harness's cache device.
pub fn layout() -> Layout {
    Layout::compute(DEVICE_BYTES, BLOCK_BYTES).expect("the harness device fits a cache")
}

/// Byte offset of each placement, in placement order.
fn page_offsets(layout: &Layout) -> Vec<u64> {
    let mut v = vec![0, PAGE_BYTES];
    for area in layout.checkpoint_offset {
        v.extend((0..layout.checkpoint_pages).map(|p| area + p * PAGE_BYTES));
    }
    v.extend((0..layout.journal_pages).map(|k| layout.journal_offset + k * PAGE_BYTES));
    v
}

/// Builds the cache device image an input describes.
pub fn image_from_input(data: &[u8]) -> Vec<u8> {
    let layout = layout();
    let offsets = page_offsets(&layout);
    let mut image = vec![0u8; DEVICE_BYTES as usize];
    let Some((&flags, mut rest)) = data.split_first() else {
        return image;
    };
    while rest.len() >= 4 {
        let placement = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let len = (u16::from_le_bytes([rest[2], rest[3]]) as usize).min(PAGE_BYTES as usize);
        rest = &rest[4..];
        let n = len.min(rest.len());
        let at = offsets[placement % offsets.len()] as usize;
        image[at..at + n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
    reseal(&mut image, &offsets, flags);
    image
}

/// Recomputes the checksums the flags ask for.
fn reseal(image: &mut [u8], offsets: &[u64], flags: u8) {
    for (placement, &off) in offsets.iter().enumerate() {
        let page = &mut image[off as usize..(off + PAGE_BYTES) as usize];
        let magic32 = u32::from_le_bytes(page[..4].try_into().expect("4 bytes"));
        if placement < 2 {
            if flags & FLAG_RESEAL_SUPERBLOCKS != 0 && page[..8] == SUPERBLOCK_MAGIC {
                let crc = crc32c::crc32c(&page[..252]);
                page[252..256].copy_from_slice(&crc.to_le_bytes());
            }
            continue;
        }
        let want = if magic32 == CHECKPOINT_MAGIC {
            FLAG_RESEAL_CHECKPOINTS
        } else if magic32 == JOURNAL_MAGIC {
            FLAG_RESEAL_JOURNAL
        } else {
            continue;
        };
        if flags & want != 0 {
            page[4..8].fill(0);
            let crc = crc32c::crc32c(page);
            page[4..8].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

/// The compact input describing a real image of the harness's device (for
/// fuzz seeds): every non-zero metadata page, trailing zeroes left out.
pub fn input_from_image(image: &[u8], flags: u8) -> Vec<u8> {
    let offsets = page_offsets(&layout());
    let mut out = vec![flags];
    for (placement, &off) in offsets.iter().enumerate() {
        let page = &image[off as usize..(off + PAGE_BYTES) as usize];
        let len = page.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        if len > 0 {
            out.extend_from_slice(&(placement as u16).to_le_bytes());
            out.extend_from_slice(&(len as u16).to_le_bytes());
            out.extend_from_slice(&page[..len]);
        }
    }
    out
}

/// What [`exercise`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Both `check` and `open` refused the metadata.
    Refused,
    /// The origin size the metadata records was not tried (too large or
    /// not a whole number of sectors); `check` ran, `open` refused the size.
    OriginNotTried,
    /// Opened, and the volume was used.
    Opened,
}

/// The origin size recorded in the current superblock, if any.
fn recorded_origin_bytes(image: &[u8]) -> Option<u64> {
    let [a, b] = [0usize, 1].map(|c| {
        Superblock::parse(&image[c * PAGE_BYTES as usize..(c + 1) * PAGE_BYTES as usize]).ok()
    });
    // The same choice as recovery: the higher generation, copy 0 on a tie.
    let sb = match (a, b) {
        (Some(a), Some(b)) => Some(if a.generation.get() >= b.generation.get() {
            a
        } else {
            b
        }),
        (a, b) => a.or(b),
    };
    sb.map(|sb| sb.origin_bytes.get())
}

fn open_opts() -> OpenOptions {
    OpenOptions {
        // The harness's origin is never the recorded one.
        force: true,
        no_background: true,
        ..OpenOptions::default()
    }
}

/// Loads the metadata an input describes and, if it is accepted, uses the
/// volume. Panics on a violated invariant (a fuzz finding).
pub fn exercise(data: &[u8]) -> Outcome {
    let flags = data.first().copied().unwrap_or(0);
    let image = image_from_input(data);
    let recorded = recorded_origin_bytes(&image);
    let cache: DeviceRef = Arc::new(FaultDevice::from_image("cache", image, 0));
    let report = check(&cache, None);
    let origin_bytes = recorded
        .filter(|&b| b > 0 && b <= ORIGIN_BYTES_MAX && b % 512 == 0)
        .unwrap_or(ORIGIN_BYTES_DEFAULT);
    let origin: DeviceRef = Arc::new(FaultDevice::new("origin", origin_bytes, 0));
    let opened = Engine::open(cache.clone(), origin.clone(), &open_opts());
    if recorded.is_some_and(|r| r != origin_bytes) {
        // Not told the origin grew: any other size is refused.
        assert!(opened.is_err(), "open accepted an origin of the wrong size");
        return Outcome::OriginNotTried;
    }
    let engine = match opened {
        Ok(e) => e,
        Err(e) => {
            assert!(
                !report.ok,
                "open refused ({e}) what check calls intact: {:?}",
                report.findings
            );
            return Outcome::Refused;
        }
    };
    assert!(
        report.ok,
        "open accepted what check calls damaged: {:?}",
        report.findings
    );
    let volume_bytes = engine.volume_bytes();
    let before = engine
        .read(0, volume_bytes)
        .unwrap_or_else(|e| panic!("reading an opened volume: {e}"));
    if flags & FLAG_USE_VOLUME == 0 {
        return Outcome::Opened;
    }
    let block = vec![0xA5u8; BLOCK_BYTES as usize];
    let at = volume_bytes / BLOCK_BYTES as u64 / 2 * BLOCK_BYTES as u64;
    let writable = at + BLOCK_BYTES as u64 <= volume_bytes;
    if writable {
        engine.write(at, &block, false).expect("write");
    }
    engine.flush().expect("flush");
    engine.close().expect("close");
    drop(engine);
    let report = check(&cache, Some(origin_bytes));
    assert!(
        report.ok && report.clean_shutdown == Some(true),
        "metadata written by a clean shutdown fails check: {:?}",
        report.findings
    );
    let engine = Engine::open(cache.clone(), origin, &open_opts())
        .unwrap_or_else(|e| panic!("reopening after a clean shutdown: {e}"));
    let after = engine.read(0, volume_bytes).expect("read after reopen");
    let mut expect = before.to_vec();
    if writable {
        expect[at as usize..at as usize + block.len()].copy_from_slice(&block);
    }
    assert!(
        after[..] == expect[..],
        "the volume changed across a clean shutdown"
    );
    Outcome::Opened
}
