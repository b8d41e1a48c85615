//! The TLS-PSK keys file (psktool's `username:hexkey` lines): the parser
//! against a strict model of the format, and a round trip
//! (`tiercache::nbd::fuzz::psk_keys`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::nbd::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::psk_keys(data);
});
