//! Transmission requests from untrusted bytes: header parsing, then
//! validation against a connection's limits (byte-granular or 512-byte
//! clients, metadata contexts, read-only), checking the invariants the
//! connection loop relies on (`tiercache::frontend::nbd::fuzz::request`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::frontend::nbd::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::request(data);
});
