//! Option haggling from untrusted bytes: client flags, then a sequence of
//! option headers and data, through the same parser and state machine the
//! server uses. Checks that nothing panics and that every reply is framed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::nbd::handshake::{ExportInfo, Negotiation, OptionOutcome, TlsPolicy};
use tiercache::nbd::proto;

/// Option data accepted by the default server configuration.
const OPTION_BYTES_MAX: usize = 64 << 10;

fn export() -> ExportInfo {
    ExportInfo {
        name: "disk".into(),
        description: "fuzz".into(),
        size_bytes: 1 << 30,
        transmission_flags: proto::FLAG_HAS_FLAGS | proto::FLAG_SEND_FLUSH,
        min_block_bytes: 512,
        preferred_block_bytes: 4096,
        max_block_bytes: 32 << 20,
    }
}

/// Every byte of `out` must be option replies for `option`, unless the
/// outcome is transmission via NBD_OPT_EXPORT_NAME (no option reply).
fn check_replies(mut out: &[u8], option: u32) {
    while !out.is_empty() {
        let (h, rest) = out.split_at(20);
        assert_eq!(h[..8], proto::OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(h[8..12], option.to_be_bytes());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        out = &rest[len..];
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((flags, mut rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let Ok(client) = proto::parse_client_flags(u32::from_be_bytes(*flags)) else {
        return;
    };
    let mut neg = Negotiation::new(export(), client, TlsPolicy::Off);
    let mut out = Vec::new();
    while !rest.is_empty() {
        let opt = match proto::parse_option_header(rest) {
            Ok(o) => o,
            Err(_) => return,
        };
        rest = &rest[proto::OPTION_HEADER_BYTES..];
        let len = opt.data_bytes as usize;
        if len > OPTION_BYTES_MAX || len > rest.len() {
            return;
        }
        let (payload, after) = rest.split_at(len);
        rest = after;
        out.clear();
        match neg.answer(opt.option, payload, &mut out) {
            OptionOutcome::Continue => check_replies(&out, opt.option),
            OptionOutcome::StartTls => unreachable!("TLS is off"),
            OptionOutcome::Abort => return check_replies(&out, opt.option),
            OptionOutcome::Disconnect(_) => return assert!(out.is_empty()),
            OptionOutcome::Transmission(_) => {
                if opt.option != proto::OPT_EXPORT_NAME {
                    check_replies(&out, opt.option);
                }
                return;
            }
        }
    }
});
