//! NBD URIs (`nbd://`, `nbd+unix://`, `nbds://`, ...) and RBD URIs
//! (`rbd://POOL/IMAGE?...`): what is accepted, and that the normalized or
//! re-encoded spelling parses back to the same URI
//! (`tiercache::device::nbd::fuzz::uris`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::device::nbd::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::uris(data);
});
