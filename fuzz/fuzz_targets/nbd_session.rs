//! The whole NBD server from a client's bytes: greeting, option haggling,
//! then transmission requests through `execute()` to a small engine over
//! RAM, with the process's live heap counted by the global allocator
//! below. A session that makes the server allocate more than its buffers
//! (`--total-buffer`) and a margin fails: the NBD_CMD_CACHE exhaustion
//! (two pipelined 1 GiB CACHE took the daemon to 4.28 GB) is such a
//! session (`tiercache::frontend::nbd::fuzz_session`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::frontend::nbd::fuzz_session::{self, CappedAlloc};

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

fuzz_target!(|data: &[u8]| {
    fuzz_session::session(data);
});
