//! Option haggling from untrusted bytes on a listener without TLS: client
//! flags, then a sequence of option headers and data, through the same
//! parser and state machine the server uses (`tiercache::frontend::nbd::fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::frontend::nbd::fuzz;
use tiercache::frontend::nbd::handshake::TlsPolicy;

fuzz_target!(|data: &[u8]| {
    fuzz::options(TlsPolicy::Off, data);
});
