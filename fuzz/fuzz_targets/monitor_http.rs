//! The metrics/dashboard server's connection from a client's bytes: the
//! request head read, parsed and answered, compared with a model of the
//! status and the response framing (`tiercache::monitor::fuzz::http_request`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::monitor::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::http_request(data);
});
