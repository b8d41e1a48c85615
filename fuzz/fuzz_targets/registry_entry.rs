//! A registry entry (`caches/<name>.json`): what is accepted is named as its
//! file, with devices that are absolute paths or URIs, and round-trips
//! (`tiercache::daemon::fuzz::registry_entry`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::daemon::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::registry_entry(data);
});
