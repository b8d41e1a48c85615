//! The NBD client's handshake against bytes from a hostile origin server:
//! greeting, option replies to NBD_OPT_GO (with the fall back to
//! NBD_OPT_EXPORT_NAME) and NBD_OPT_STARTTLS, checked for what the client
//! sends and keeps (`tiercache::device::nbd::fuzz::client_options`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::device::nbd::fuzz;

fuzz_target!(|data: &[u8]| {
    fuzz::client_options(data);
});
