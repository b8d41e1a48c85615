//! Sector-granular cache blocks: writes of any 512-byte multiple go to the
//! cache without reading the origin; reads take what the cache holds and
//! only the missing sectors from the origin; writeback writes only dirty
//! sectors; a sector that was never written or read is never served from
//! the cache, across restarts and crashes. Origin I/O is counted on the
//! origin device itself.

mod common;

use std::sync::Arc;

use tiercache::device::fault::FaultDevice;
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::format::PAGE_BYTES;
use tiercache::engine::{CreateOptions, Engine, Mode};

const ORIGIN_BYTES: u64 = 1 << 20;
const BS: u32 = 4096;

struct Setup {
    origin: Arc<FaultDevice>,
    cache: Arc<FaultDevice>,
    engine: Arc<Engine>,
}

impl Setup {
    fn new(mode: Mode, block_bytes: u32) -> Setup {
        let origin = Arc::new(FaultDevice::from_image(
            "origin",
            common::initial_origin(ORIGIN_BYTES),
            1,
        ));
        let cache = Arc::new(FaultDevice::new(
            "cache",
            common::cache_bytes_for(64, block_bytes),
            2,
        ));
        let opts = CreateOptions {
            mode,
            block_bytes,
            // No background writeback unless a test asks for it.
            writeback: common::held_writeback(),
            ..Default::default()
        };
        let (c, o): (DeviceRef, DeviceRef) = (cache.clone(), origin.clone());
        Engine::create(c.clone(), o.clone(), &opts)
            .unwrap()
            .close()
            .unwrap();
        let engine = Engine::open(c, o, &common::no_bg()).unwrap();
        Setup {
            origin,
            cache,
            engine,
        }
    }

    /// (origin reads, origin writes) so far.
    fn origin_io(&self) -> (u64, u64) {
        (self.origin.reads(), self.origin.writes())
    }

    /// The engine reopened from the cache device's current contents, as
    /// after `kill -9` with the devices' volatile caches kept (`durable`:
    /// from what is durable only, as after a power loss).
    fn reopen(&mut self, durable: bool) {
        self.engine.abandon();
        let image = if durable {
            self.cache.durable_image()
        } else {
            self.cache.snapshot_current()
        };
        let (cache, c) = common::restart_dev("cache", image, 3);
        let (origin, o) = common::restart_dev("origin", self.origin.snapshot_current(), 4);
        self.engine = Engine::open(c, o, &common::no_bg()).unwrap();
        self.cache = cache;
        self.origin = origin;
    }

    fn expect(&self, first_sector: u64, versions: &[u64]) {
        let got = self
            .engine
            .read(first_sector * 512, versions.len() as u64 * 512)
            .unwrap();
        for (k, &v) in versions.iter().enumerate() {
            let s = first_sector + k as u64;
            assert_eq!(
                common::decode_sector(&got[k * 512..(k + 1) * 512]),
                Some((s, v)),
                "sector {s}"
            );
        }
    }
}

#[test]
fn a_512_byte_write_to_an_uncached_block_does_no_origin_io() {
    for mode in [Mode::Writeback, Mode::Writeonly] {
        let s = Setup::new(mode, BS);
        let before = s.origin_io();
        // Sector 3 of block 5, then three sectors across blocks 6 and 7.
        s.engine
            .write(43 * 512, &common::stamped(43, 1, 1), false)
            .unwrap();
        s.engine
            .write(55 * 512, &common::stamped(55, 3, 2), false)
            .unwrap();
        s.engine.flush().unwrap();
        assert_eq!(s.origin_io(), before, "{mode}: no origin read or write");
        let st = s.engine.status().stats;
        assert_eq!((st.origin_reads, st.origin_writes), (0, 0));
        // Reading back the written sectors needs no origin either.
        s.engine.read(43 * 512, 512).unwrap();
        s.expect(55, &[2, 2, 2]);
        assert_eq!(s.origin_io(), before, "{mode}: hits of written sectors");
    }
}

#[test]
fn reads_fetch_only_what_the_cache_lacks_and_keep_it() {
    let s = Setup::new(Mode::Writeback, BS);
    // Sectors 2 and 5 of block 1 (sectors 8..16) are dirty.
    s.engine
        .write(10 * 512, &common::stamped(10, 1, 1), false)
        .unwrap();
    s.engine
        .write(13 * 512, &common::stamped(13, 1, 2), false)
        .unwrap();
    let before = s.origin_io();
    // A read of the whole block: one origin request for the rest.
    s.expect(8, &[0, 0, 1, 0, 0, 2, 0, 0]);
    assert_eq!(s.origin_io().0, before.0 + 1, "one origin read");
    // Kept: the block is whole now, read again from the cache alone.
    s.expect(8, &[0, 0, 1, 0, 0, 2, 0, 0]);
    assert_eq!(
        s.origin_io().0,
        before.0 + 1,
        "no origin read the second time"
    );
    assert!(s.engine.status().partial_blocks >= 1, "dirty in part");
    // Writeback writes only the two dirty sectors (one write each: sectors
    // 11 and 12 hold clean data between them, so they may be merged into
    // one write of 10..14).
    let writes = s.origin.writes();
    s.engine.write_back_all(&mut |_, _| {}).unwrap();
    assert!(s.origin.writes() - writes <= 2);
    let mut back = vec![0u8; 8 * 512];
    s.origin.read_at(&mut back, 8 * 512).unwrap();
    for (k, v) in [0u64, 0, 1, 0, 0, 2, 0, 0].iter().enumerate() {
        assert_eq!(
            common::decode_sector(&back[k * 512..(k + 1) * 512]),
            Some((8 + k as u64, *v))
        );
    }
    assert_eq!(s.engine.status().partial_blocks, 0, "whole and clean again");
}

#[test]
fn writeback_writes_only_dirty_sectors_never_empty_ones() {
    let s = Setup::new(Mode::Writeback, 16384);
    // Block 2 (sectors 64..96): dirty sectors 65 and 90, nothing else held.
    s.engine
        .write(65 * 512, &common::stamped(65, 1, 7), false)
        .unwrap();
    s.engine
        .write(90 * 512, &common::stamped(90, 2, 8), false)
        .unwrap();
    let w = s.origin.writes();
    s.engine.write_back_all(&mut |_, _| {}).unwrap();
    // Two writes: the sectors between hold no data, so they are not merged.
    assert_eq!(s.origin.writes() - w, 2);
    let mut back = vec![0u8; 32 * 512];
    s.origin.read_at(&mut back, 64 * 512).unwrap();
    for k in 0..32u64 {
        let v = match 64 + k {
            65 => 7,
            90 | 91 => 8,
            _ => 0,
        };
        assert_eq!(
            common::decode_sector(&back[k as usize * 512..(k as usize + 1) * 512]),
            Some((64 + k, v)),
            "sector {}",
            64 + k
        );
    }
}

#[test]
fn a_partial_write_over_clean_data_keeps_the_rest_without_the_origin() {
    let s = Setup::new(Mode::Writeback, BS);
    // Block 3 cached whole and clean by a read.
    s.expect(24, &[0; 8]);
    let before = s.origin_io();
    s.engine
        .write(26 * 512, &common::stamped(26, 2, 5), false)
        .unwrap();
    s.engine.flush().unwrap();
    s.expect(24, &[0, 0, 5, 5, 0, 0, 0, 0]);
    assert_eq!(s.origin_io(), before, "served from the cache alone");
}

#[test]
fn never_written_or_read_sectors_are_not_served_from_the_cache_after_a_crash() {
    for durable in [false, true] {
        let mut s = Setup::new(Mode::Writeback, BS);
        // Stale bytes in the slot a block will land in: fill the data
        // region of the cache with another sector's stamps first.
        let layout = tiercache::engine::format::Layout::compute(s.cache.size_bytes(), BS).unwrap();
        let junk = common::stamped(999, (layout.slot_count * BS as u64 / 512).min(64), 9);
        s.cache.write_at(&junk, layout.data_offset).unwrap();
        s.engine
            .write(40 * 512, &common::stamped(40, 1, 3), false)
            .unwrap();
        s.engine.flush().unwrap();
        // Unflushed: a partial write to block 6 and a fill of block 5.
        s.engine
            .write(49 * 512, &common::stamped(49, 1, 4), false)
            .unwrap();
        s.reopen(durable);
        // Block 5: sector 40 is flushed, the rest is the origin's.
        s.expect(40, &[3, 0, 0, 0, 0, 0, 0, 0]);
        let got = s.engine.read(48 * 512, 8 * 512).unwrap();
        for k in 0..8u64 {
            let (sector, v) = common::decode_sector(&got[k as usize * 512..][..512])
                .unwrap_or_else(|| panic!("sector {} holds garbage", 48 + k));
            assert_eq!(sector, 48 + k);
            assert!(v == 0 || (sector == 49 && v == 4), "sector {sector} v{v}");
        }
    }
}

#[test]
fn partial_blocks_survive_a_clean_restart_and_a_checkpoint() {
    let mut s = Setup::new(Mode::Writeback, BS);
    for k in 0..40u64 {
        // Sector k % 8 of block k: 40 blocks, each dirty in one sector.
        let sector = k * 8 + k % 8;
        s.engine
            .write(sector * 512, &common::stamped(sector, 1, k + 1), false)
            .unwrap();
    }
    s.engine.close().unwrap();
    s.reopen(true);
    assert_eq!(s.engine.status().partial_blocks, 40);
    assert_eq!(s.engine.status().cache_blocks_dirty, 40);
    let before = s.origin_io();
    for k in 0..40u64 {
        let sector = k * 8 + k % 8;
        s.expect(sector, &[k + 1]);
    }
    assert_eq!(s.origin_io(), before);
    let volume = common::read_volume(&s.engine).unwrap();
    common::detach_and_compare(&s.engine, s.origin.as_ref(), &volume).unwrap();
}

#[test]
fn writethrough_caches_the_sectors_it_writes() {
    let s = Setup::new(Mode::Writethrough, BS);
    s.engine
        .write(17 * 512, &common::stamped(17, 2, 6), false)
        .unwrap();
    let (reads, _) = s.origin_io();
    s.expect(17, &[6, 6]);
    assert_eq!(s.origin_io().0, reads, "a hit");
    assert_eq!(s.engine.status().cache_blocks_dirty, 0);
}

#[test]
fn a_commit_is_replayed_whole_or_not_at_all() {
    let mut s = Setup::new(Mode::Writeback, BS);
    s.engine.flush().unwrap();
    // One commit of more records than one journal page holds (254): each
    // sector of 40 blocks written alone, one record each (320).
    for k in 0..8u64 {
        for b in 0..40u64 {
            let sector = b * 8 + k;
            s.engine
                .write(sector * 512, &common::stamped(sector, 1, 1), false)
                .unwrap();
        }
    }
    s.engine.flush().unwrap();
    // Damage the second page of that commit: the first page alone must not
    // be replayed.
    let layout = tiercache::engine::format::Layout::compute(s.cache.size_bytes(), BS).unwrap();
    let image = s.cache.durable_image();
    let mut commit_pages = Vec::new();
    for k in 0..layout.journal_pages {
        let at = (layout.journal_offset + k * PAGE_BYTES) as usize;
        if let Ok(p) =
            tiercache::engine::format::parse_journal_page(&image[at..at + PAGE_BYTES as usize])
        {
            if p.commit_pages >= 2 {
                commit_pages.push((p.seq, at));
            }
        }
    }
    commit_pages.sort();
    assert!(commit_pages.len() >= 2, "the commit spans two pages");
    let mut damaged = image.clone();
    damaged[commit_pages[1].1 + 100] ^= 0xff;
    s.cache.write_at(&damaged, 0).unwrap();
    s.cache.flush().unwrap();
    s.reopen(true);
    let st = s.engine.status();
    assert_eq!(
        st.cache_blocks_used, 0,
        "no record of the torn commit is applied"
    );
}

#[test]
fn a_version_1_cache_is_refused_with_a_clear_message() {
    let s = Setup::new(Mode::Writeback, BS);
    s.engine.close().unwrap();
    let mut page = vec![0u8; PAGE_BYTES as usize];
    for copy in 0..2u64 {
        s.cache.read_at(&mut page, copy * PAGE_BYTES).unwrap();
        page[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&page[..252]);
        page[252..256].copy_from_slice(&crc.to_le_bytes());
        s.cache.write_at(&page, copy * PAGE_BYTES).unwrap();
    }
    let (c, o): (DeviceRef, DeviceRef) = (s.cache.clone(), s.origin.clone());
    let err = Engine::open(c, o, &common::no_bg())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("format version 1") && err.contains("detach"),
        "{err}"
    );
}

#[test]
fn a_read_with_misses_around_cached_blocks_is_one_origin_request() {
    let s = Setup::new(Mode::Writeback, BS);
    // Blocks 11 and 13 dirty; 10, 12 and 14 never touched.
    s.engine
        .write(11 * 8 * 512, &common::stamped(88, 8, 3), false)
        .unwrap();
    s.engine
        .write(13 * 8 * 512, &common::stamped(104, 8, 4), false)
        .unwrap();
    let before = s.origin_io().0;
    let mut want = vec![0u64; 40];
    want[8..16].fill(3);
    want[24..32].fill(4);
    s.expect(80, &want);
    assert_eq!(
        s.origin_io().0,
        before + 1,
        "three missing blocks around two cached ones: one origin read"
    );
}

#[test]
fn reads_that_keep_nothing_go_straight_to_the_reader_around_cached_data() {
    // Writeonly keeps no read: misses are read into the reader's buffer
    // itself when they are one stretch, never over a cached block between
    // them.
    let s = Setup::new(Mode::Writeonly, BS);
    // Block 11 whole and sectors 2..4 of block 13 dirty; 10, 12, 14 never
    // touched.
    s.engine
        .write(11 * 8 * 512, &common::stamped(88, 8, 3), false)
        .unwrap();
    s.engine
        .write(106 * 512, &common::stamped(106, 2, 4), false)
        .unwrap();
    let before = s.engine.status().stats;
    // Misses either side of a cached block: not straight (the origin's
    // bytes between them are not the reader's).
    let mut want = vec![0u64; 24];
    want[8..16].fill(3);
    s.expect(80, &want);
    // A block cached in part: not straight either.
    let mut want = vec![0u64; 16];
    want[2..4].fill(4);
    s.expect(104, &want);
    // Blocks 15..17 and a part of 18: straight, one origin request.
    s.expect(120, &[0; 29]);
    // A sector in the middle of a block.
    s.expect(147, &[0]);
    let after = s.engine.status().stats;
    assert_eq!(
        after.promotions, before.promotions,
        "writeonly keeps no read"
    );
    assert_eq!(after.read_hits - before.read_hits, 1, "block 11");
    // Blocks 10, 12, 13 (in part), 14, then 15..18 and 18 again.
    assert_eq!(after.read_misses - before.read_misses, 9);
    assert_eq!(after.bypassed_ios - before.bypassed_ios, 9);
    assert_eq!(after.origin_reads - before.origin_reads, 4);
}
