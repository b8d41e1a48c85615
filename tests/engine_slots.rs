//! Where blocks land in the cache: a store of several blocks gets adjacent
//! slots even after the free slots have fragmented, so that reading them
//! back is one cache device read, not one per block.

mod common;

use std::sync::Arc;

use tiercache::device::fault::FaultDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::{CreateOptions, Engine, Mode};

const BS: u64 = 4096;

#[test]
fn a_promoted_run_gets_adjacent_slots_after_the_free_slots_fragment() {
    let cache = Arc::new(FaultDevice::new(
        "cache",
        common::cache_bytes_for(256, BS as u32),
        1,
    ));
    let origin_bytes = 1024 * BS;
    let origin_image = common::initial_origin(origin_bytes);
    let origin: DeviceRef = Arc::new(FaultDevice::from_image("origin", origin_image.clone(), 2));
    let opts = CreateOptions {
        mode: Mode::Writeback,
        ..Default::default()
    };
    Engine::create(cache.clone(), origin.clone(), &opts)
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(cache.clone(), origin, &common::no_bg()).unwrap();

    // Blocks 0..64 take the lowest slots, one write each; trimming every
    // other one and committing leaves free holes among them.
    for b in 0..64u64 {
        engine
            .write(b * BS, &vec![b as u8; BS as usize], false)
            .unwrap();
    }
    for b in (0..64u64).step_by(2) {
        engine.trim(b * BS, BS, false).unwrap();
    }
    engine.flush().unwrap();
    assert_eq!(engine.status().cache_blocks_used, 32);

    // A 64 KiB miss promotes 16 blocks; read again, they are hits from one
    // run of slots.
    let at = 500 * BS;
    let len = 16 * BS;
    let want = &origin_image[at as usize..(at + len) as usize];
    assert_eq!(&engine.read(at, len).unwrap()[..], want);
    assert_eq!(engine.status().cache_blocks_used, 48);
    let reads = cache.reads();
    assert_eq!(&engine.read(at, len).unwrap()[..], want);
    assert_eq!(
        cache.reads() - reads,
        1,
        "a 16-block hit took more than one cache read: its slots are not adjacent"
    );

    // Single blocks still fill the holes: 32 more fit, and the cache then
    // holds 80 blocks in 256 slots with every earlier block intact.
    for b in 600..632u64 {
        engine
            .write(b * BS, &vec![0xA5; BS as usize], false)
            .unwrap();
    }
    assert_eq!(engine.status().cache_blocks_used, 80);
    for b in (1..64u64).step_by(2) {
        assert_eq!(
            &engine.read(b * BS, BS).unwrap()[..],
            &vec![b as u8; BS as usize][..]
        );
    }
    assert_eq!(&engine.read(at, len).unwrap()[..], want);
    engine.close().unwrap();
}
