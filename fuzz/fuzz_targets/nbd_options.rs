//! Option haggling from untrusted bytes on a listener without TLS: client
//! flags, then a sequence of option headers and data, through the same
//! parser and state machine the server uses (`tiercache::nbd::fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::nbd::fuzz;
use tiercache::nbd::handshake::TlsPolicy;

fuzz_target!(|data: &[u8]| {
    fuzz::options(TlsPolicy::Off, data);
});
