//! The NBD client's reply reader against bytes from a hostile origin
//! server: simple replies matched to pending requests by cookie, compared
//! with a model of what each caller must get
//! (`tiercache::device::nbd::fuzz::client_replies`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::device::nbd::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::client_replies(data);
});
