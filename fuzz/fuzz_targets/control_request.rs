//! A control socket connection: the request line framed as the listener
//! reads it, decoded, and answered on a small engine; the answer must say
//! ok exactly when the request's own checks pass
//! (`tiercache::daemon::fuzz::control_request`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::daemon::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::control_request(data);
});
