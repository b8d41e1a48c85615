//! Option haggling on a listener that offers TLS: the first byte picks
//! optional (even) or required (odd) TLS, the rest is as in nbd_options.
//! An acknowledged NBD_OPT_STARTTLS counts as a completed TLS handshake,
//! so what follows is fuzzed as options inside TLS; before it, a required
//! listener must leak nothing (`tiercache::frontend::nbd::fuzz::options`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::frontend::nbd::fuzz;
use tiercache::frontend::nbd::handshake::TlsPolicy;

fuzz_target!(|data: &[u8]| {
    let Some((&policy, rest)) = data.split_first() else {
        return;
    };
    let tls = if policy & 1 == 0 {
        TlsPolicy::Optional
    } else {
        TlsPolicy::Required
    };
    fuzz::options(tls, rest);
});
