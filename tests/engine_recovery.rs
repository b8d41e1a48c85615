//! Recovery refuses damaged metadata and never serves it: a damaged journal
//! page followed by a later commit, a damaged checkpoint page, both
//! superblock copies damaged. What a crash can legitimately leave (a torn
//! last journal page, one torn superblock copy) is recovered.

mod common;

use std::sync::Arc;

use tiercache::device::fault::FaultDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::format::{Layout, PAGE_BYTES};
use tiercache::engine::recovery::check;
use tiercache::engine::{CreateOptions, Engine, OpenOptions};

const ORIGIN_BYTES: u64 = 1 << 20;
const BS: u64 = 4096;

fn no_bg() -> OpenOptions {
    OpenOptions {
        no_background: true,
        ..Default::default()
    }
}

/// A crashed cache whose journal holds three commits (one page each), each
/// mapping one dirty block (0, 1, 2) holding bytes 1, 2, 3.
fn crashed_cache() -> (Vec<u8>, Layout, DeviceRef) {
    let cache_bytes = common::cache_bytes_for(32, BS as u32);
    let cache = Arc::new(FaultDevice::new("cache", cache_bytes, 1));
    let origin: DeviceRef = Arc::new(FaultDevice::new("origin", ORIGIN_BYTES, 2));
    Engine::create(cache.clone(), origin.clone(), &CreateOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(cache.clone(), origin.clone(), &no_bg()).unwrap();
    for b in 0..3u64 {
        engine
            .write(b * BS, &vec![b as u8 + 1; BS as usize], false)
            .unwrap();
        engine.flush().unwrap();
    }
    engine.abandon();
    (
        cache.snapshot_current(),
        Layout::compute(cache_bytes, BS as u32).unwrap(),
        origin,
    )
}

/// Byte offset of the `k`-th journal page to replay (0 = first).
fn journal_page(image: &[u8], layout: &Layout, k: u64) -> usize {
    layout.journal_page_offset(common::current_superblock(image).journal_replay_seq.get() + k)
        as usize
}

fn open_image(image: Vec<u8>, origin: &DeviceRef) -> (DeviceRef, Result<Arc<Engine>, String>) {
    let cache: DeviceRef = Arc::new(FaultDevice::from_image("cache", image, 3));
    let r = Engine::open(cache.clone(), origin.clone(), &no_bg()).map_err(|e| e.to_string());
    (cache, r)
}

/// True if block `b` reads as `byte` repeated.
fn holds(engine: &Engine, b: u64, byte: u8) -> bool {
    engine.read(b * BS, BS).unwrap().iter().all(|&x| x == byte)
}

#[test]
fn intact_journal_replays_every_commit() {
    let (image, _, origin) = crashed_cache();
    let (_, r) = open_image(image, &origin);
    let engine = r.unwrap();
    for b in 0..3u64 {
        assert!(holds(&engine, b, b as u8 + 1), "block {b}");
    }
}

#[test]
fn damaged_journal_page_before_a_later_commit_is_refused() {
    let (mut image, layout, origin) = crashed_cache();
    image[(layout.journal_page_offset(1) + 100) as usize] ^= 0x40;
    let (cache, r) = open_image(image, &origin);
    let err = r.err().expect("damaged journal accepted");
    assert!(
        err.contains("corrupted") && err.contains("journal page 1"),
        "{err}"
    );
    let report = check(&cache, Some(ORIGIN_BYTES));
    assert!(!report.ok);
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.contains("DAMAGE") && f.contains("journal page 1")),
        "{:?}",
        report.findings
    );
}

#[test]
fn torn_last_journal_page_is_the_end_of_the_journal() {
    let (mut image, layout, origin) = crashed_cache();
    // Tear the last page: its first sector (header and records) never
    // reached the disk; the rest of the page was zero anyway.
    let at = journal_page(&image, &layout, 2);
    image[at..at + 512].fill(0);
    let (_, r) = open_image(image, &origin);
    let engine = r.unwrap();
    assert!(holds(&engine, 0, 1) && holds(&engine, 1, 2));
    // The third commit is lost, as if power failed during its flush: block 2
    // reads as the origin holds it.
    assert!(holds(&engine, 2, 0), "block 2 should read the origin");
}

#[test]
fn damaged_checkpoint_page_is_refused() {
    let (mut image, layout, origin) = crashed_cache();
    let area = common::current_superblock(&image).checkpoint_area.get() as usize;
    image[(layout.checkpoint_offset[area] + 64) as usize] ^= 1;
    let (cache, r) = open_image(image, &origin);
    let err = r.err().expect("damaged checkpoint accepted");
    assert!(
        err.contains(&format!("checkpoint area {area} page 0")),
        "{err}"
    );
    assert!(!check(&cache, Some(ORIGIN_BYTES)).ok);
}

#[test]
fn one_damaged_superblock_copy_falls_back_to_the_other() {
    for copy in 0..2u64 {
        let (mut image, _, origin) = crashed_cache();
        image[(copy * PAGE_BYTES + 40) as usize] ^= 0xff;
        let damaged: DeviceRef = Arc::new(FaultDevice::from_image("cache", image.clone(), 3));
        let report = check(&damaged, Some(ORIGIN_BYTES));
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.contains(&format!("copy {copy}: INVALID"))),
            "{:?}",
            report.findings
        );
        let (_, r) = open_image(image, &origin);
        let engine = r.unwrap_or_else(|e| panic!("copy {copy}: {e}"));
        for b in 0..3u64 {
            assert!(holds(&engine, b, b as u8 + 1), "copy {copy} block {b}");
        }
    }
}

#[test]
fn both_superblock_copies_damaged_is_not_a_cache() {
    let (mut image, _, origin) = crashed_cache();
    image[10] ^= 1;
    image[PAGE_BYTES as usize + 10] ^= 1;
    let (cache, r) = open_image(image, &origin);
    let err = r.err().expect("opened without a superblock");
    assert!(err.contains("not a tiercache cache device"), "{err}");
    assert!(!check(&cache, Some(ORIGIN_BYTES)).ok);
}
