//! Block status: descriptors built from arbitrary volume extents, their
//! encoding round trip, and the reply and meta-context parsers on raw
//! bytes (`tiercache::frontend::nbd::fuzz::block_status`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::frontend::nbd::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::block_status(data);
});
