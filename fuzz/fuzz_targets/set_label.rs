//! Cache-set member labels from a device's bytes: both copies parsed, the
//! current one chosen, a set opened of members bearing it, with the counts
//! and sizes the set relies on checked (`tiercache::device::fuzz::set_label`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::device::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::set_label(data);
});
