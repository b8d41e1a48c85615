//! The bodies of the NBD fuzz targets (fuzz/fuzz_targets/nbd_*.rs), here
//! so the seeded mutation tests in tests/nbd_fuzz.rs run the same code in
//! CI. Each takes untrusted bytes, drives a parser or state machine of the
//! server, and asserts the invariants the connection code relies on; none
//! may panic otherwise.
//!
//! Input formats:
//! - [`options`]: client flags (u32 BE), then options as on the wire
//!   (IHAVEOPT, code, length, data). An acknowledged NBD_OPT_STARTTLS is
//!   taken as a successful TLS handshake, so the options after it reach the
//!   state machine as they would inside TLS.
//! - [`request`]: one configuration byte (bit 0 read-only, bit 1 the
//!   client agreed to 512-byte blocks, bit 2 base:allocation selected, bit
//!   3 tiercache:cache selected), then a request header.
//! - [`block_status`]: a flags byte (bit 0 REQ_ONE), the request length
//!   (u32 LE), then extents of 12 bytes (length u64 LE, flags u32 LE); the
//!   whole input is also fed to the client-side reply parser and the meta
//!   context option parser.

use super::handshake::{
    ExportInfo, MetaContexts, Negotiation, OptionOutcome, TlsPolicy, CONTEXT_ID_BASE_ALLOCATION,
    CONTEXT_ID_CACHE,
};
use super::transmission::{check_request, descriptors, Action, Disposition, ExportLimits};
use crate::nbd::proto::{self, Command};
use crate::volume::Extent;

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
        max_block_bytes: 64 << 20,
    }
}

/// Splits `out` into option replies for `option`: (reply type, data).
/// Panics if the bytes are not exactly a sequence of framed replies.
fn replies(mut out: &[u8], option: u32) -> Vec<(u32, &[u8])> {
    let mut v = Vec::new();
    while !out.is_empty() {
        assert!(out.len() >= 20, "truncated option reply");
        let (h, rest) = out.split_at(20);
        assert_eq!(h[..8], proto::OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(h[8..12], option.to_be_bytes());
        let t = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        assert!(rest.len() >= len, "option reply longer than the bytes sent");
        v.push((t, &rest[..len]));
        out = &rest[len..];
    }
    v
}

/// How an option sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionsEnd {
    /// The client flags were refused.
    BadFlags,
    /// The input ran out (or held a malformed header) mid-haggling.
    Ran,
    Aborted,
    Disconnected,
    Transmission {
        tls: bool,
    },
}

/// The transmission mode a handshake ends in: a known minimum block size,
/// metadata contexts only with structured replies, and only ours.
fn check_mode(mode: &super::handshake::TransmissionMode) {
    assert!(mode.min_block_bytes == 1 || mode.min_block_bytes == 512);
    if !mode.structured_replies {
        assert!(
            mode.contexts.is_empty(),
            "contexts without structured replies"
        );
    }
    for id in [mode.contexts.base_allocation, mode.contexts.cache]
        .into_iter()
        .flatten()
    {
        assert!(id == CONTEXT_ID_BASE_ALLOCATION || id == CONTEXT_ID_CACHE);
    }
}

/// Option haggling on a listener with `tls` policy. See the module doc.
pub fn options(tls: TlsPolicy, data: &[u8]) -> OptionsEnd {
    let Some((flags, mut rest)) = data.split_first_chunk::<4>() else {
        return OptionsEnd::Ran;
    };
    let Ok(client) = proto::parse_client_flags(u32::from_be_bytes(*flags)) else {
        return OptionsEnd::BadFlags;
    };
    let mut neg = Negotiation::new(vec![export()], client, tls);
    let mut out = Vec::new();
    loop {
        let Ok(opt) = proto::parse_option_header(rest) else {
            return OptionsEnd::Ran;
        };
        rest = &rest[proto::OPTION_HEADER_BYTES..];
        let len = opt.data_bytes as usize;
        if len > OPTION_BYTES_MAX || len > rest.len() {
            return OptionsEnd::Ran;
        }
        let (payload, after) = rest.split_at(len);
        rest = after;
        out.clear();
        let before_tls = tls == TlsPolicy::Required && !neg.tls_active();
        let outcome = neg.answer(opt.option, payload, &mut out);
        if before_tls {
            check_forced_tls(opt.option, outcome, &out);
        }
        match outcome {
            OptionOutcome::Continue => {
                replies(&out, opt.option);
            }
            OptionOutcome::StartTls => {
                assert!(tls != TlsPolicy::Off && !neg.tls_active());
                assert_eq!(opt.option, proto::OPT_STARTTLS);
                let r = replies(&out, opt.option);
                assert_eq!(r, vec![(proto::REP_ACK, &[][..])]);
                neg.tls_started();
            }
            OptionOutcome::Abort => {
                replies(&out, opt.option);
                return OptionsEnd::Aborted;
            }
            OptionOutcome::Disconnect(_) => {
                assert!(out.is_empty(), "a disconnect sends nothing");
                return OptionsEnd::Disconnected;
            }
            OptionOutcome::Transmission(mode) => {
                assert!(tls != TlsPolicy::Required || neg.tls_active());
                check_mode(&mode);
                if opt.option != proto::OPT_EXPORT_NAME {
                    let r = replies(&out, opt.option);
                    assert_eq!(r.last().map(|x| x.0), Some(proto::REP_ACK));
                }
                return OptionsEnd::Transmission {
                    tls: neg.tls_active(),
                };
            }
        }
    }
}

/// Before TLS on a `require` listener: nothing about the export leaves the
/// server. Every option but STARTTLS and ABORT gets exactly one
/// NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME a disconnect.
fn check_forced_tls(option: u32, outcome: OptionOutcome, out: &[u8]) {
    match option {
        proto::OPT_STARTTLS | proto::OPT_ABORT => {
            for (t, _) in replies(out, option) {
                assert!(t == proto::REP_ACK || t == proto::REP_ERR_INVALID);
            }
        }
        proto::OPT_EXPORT_NAME => {
            assert!(matches!(outcome, OptionOutcome::Disconnect(_)));
            assert!(out.is_empty());
        }
        _ => {
            assert_eq!(outcome, OptionOutcome::Continue);
            let r = replies(out, option);
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].0, proto::REP_ERR_TLS_REQD);
        }
    }
}

/// What `check_request` lets through keeps to the limits: flags the
/// command allows, a bounded buffer charge, a range inside the export and
/// aligned, no write to a read-only export, block status only with a
/// context.
fn check_action(req: &proto::Request, limits: &ExportLimits, action: Action) {
    let allowed = match req.command {
        Command::WriteZeroes => {
            proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO
        }
        Command::BlockStatus => proto::CMD_FLAG_FUA | proto::CMD_FLAG_REQ_ONE,
        _ => proto::CMD_FLAG_FUA,
    };
    assert_eq!(req.flags & !allowed, 0);
    // The buffer charged before the payload is read is bounded by what a
    // read of the maximum holds (its data and an origin buffer), whatever
    // the length of a CACHE, TRIM or WRITE_ZEROES.
    let (max, block) = (
        u64::from(limits.max_request_bytes),
        u64::from(limits.block_bytes),
    );
    let cap = 2 * (max + 1024) + 2 * block + (4 << 20);
    assert!(action.charge_bytes(block) <= cap + cap / 32);
    let range = match action {
        Action::Read { offset, len } => {
            assert!(len <= limits.max_request_bytes);
            Some((offset, len))
        }
        Action::Write { offset, len, .. } => {
            assert!(!limits.read_only && len <= limits.max_request_bytes);
            Some((offset, len))
        }
        Action::Trim { offset, len, .. } | Action::WriteZeroes { offset, len, .. } => {
            assert!(!limits.read_only);
            Some((offset, len))
        }
        Action::BlockStatus { offset, len, .. } => {
            assert!(!limits.contexts.is_empty());
            Some((offset, len))
        }
        Action::Cache { offset, len } => Some((offset, len)),
        Action::Flush | Action::Noop { .. } => None,
    };
    if let Some((offset, len)) = range {
        let min = u64::from(limits.min_block_bytes);
        assert!(len > 0 && offset.is_multiple_of(min) && u64::from(len).is_multiple_of(min));
        let end = offset.checked_add(u64::from(len));
        assert!(end.is_some_and(|e| e <= limits.size_bytes));
    }
}

/// A request header against limits from the configuration byte. See the
/// module doc.
pub fn request(data: &[u8]) {
    let Some((config, header)) = data.split_first() else {
        return;
    };
    let limits = ExportLimits {
        size_bytes: 1 << 30,
        read_only: config & 1 != 0,
        max_request_bytes: 1 << 20,
        min_block_bytes: if config & 2 != 0 { 512 } else { 1 },
        contexts: MetaContexts {
            base_allocation: (config & 4 != 0).then_some(CONTEXT_ID_BASE_ALLOCATION),
            cache: (config & 8 != 0).then_some(CONTEXT_ID_CACHE),
        },
        block_bytes: if config & 16 != 0 { 1 << 20 } else { 4096 },
    };
    let Ok(req) = proto::parse_request(header) else {
        return;
    };
    match check_request(&req, &limits) {
        Disposition::Execute(action) => check_action(&req, &limits, action),
        Disposition::Fail { payload_bytes, .. } => {
            // The payload of a failed write is consumed to keep framing.
            let want = if req.command == Command::Write {
                req.length
            } else {
                0
            };
            assert_eq!(payload_bytes, want);
            assert!(payload_bytes <= limits.max_request_bytes);
        }
        Disposition::Drop(_) => {
            assert!(req.command == Command::Write && req.length > limits.max_request_bytes)
        }
        Disposition::Disconnect => assert_eq!(req.command, Command::Disc),
    }
}

/// Block status descriptors from arbitrary extents, their encoding and
/// decoding; and the untrusted-bytes parsers of both sides. See the module
/// doc.
pub fn block_status(data: &[u8]) {
    let _ = proto::parse_block_status_payload(data);
    let _ = proto::parse_meta_context_request(data);
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((len, rest)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len);
    if len == 0 {
        return; // refused with EINVAL before the volume is asked
    }
    let req_one = flags & 1 != 0;
    let extents: Vec<Extent> = rest
        .chunks_exact(12)
        .map(|c| Extent {
            len: u64::from_le_bytes(c[..8].try_into().unwrap()),
            flags: u32::from_le_bytes(c[8..].try_into().unwrap()),
        })
        .collect();
    let d = descriptors(&extents, len, req_one);
    assert!(!d.is_empty() && d.len() <= proto::BLOCK_STATUS_EXTENTS_MAX);
    if req_one {
        assert_eq!(d.len(), 1);
    }
    let total: u64 = d.iter().map(|x| u64::from(x.0)).sum();
    assert!(total <= u64::from(len));
    assert!(d.iter().all(|x| x.0 > 0));
    assert!(
        d.windows(2).all(|w| w[0].1 != w[1].1),
        "adjacent runs not merged"
    );
    // The descriptors are the extents' own statuses, byte for byte.
    if extents.iter().any(|e| e.len > 0) {
        let mut pos = 0u64;
        for &(n, status) in &d {
            for probe in [pos, pos + u64::from(n) - 1] {
                assert_eq!(status, status_at(&extents, probe), "byte {probe}");
            }
            pos += u64::from(n);
        }
    }
    let mut out = Vec::new();
    proto::put_block_status_chunk(&mut out, 7, true, CONTEXT_ID_CACHE, &d);
    let (id, back) = proto::parse_block_status_payload(&out[20..]).expect("own encoding parses");
    assert_eq!((id, back), (CONTEXT_ID_CACHE, d));
}

fn status_at(extents: &[Extent], byte: u64) -> u32 {
    let mut pos = 0u64;
    for e in extents {
        if byte < pos.saturating_add(e.len) {
            return e.flags;
        }
        pos = pos.saturating_add(e.len);
    }
    unreachable!("byte {byte} beyond the extents")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(code: u32, data: &[u8]) -> Vec<u8> {
        let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&code.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn a_tls_session_reaches_transmission() {
        let mut s = 3u32.to_be_bytes().to_vec();
        s.extend(opt(proto::OPT_GO, &[0, 0, 0, 0, 0, 0]));
        s.extend(opt(proto::OPT_STARTTLS, &[]));
        s.extend(opt(proto::OPT_STRUCTURED_REPLY, &[]));
        s.extend(opt(proto::OPT_GO, &[0, 0, 0, 0, 0, 0]));
        assert_eq!(
            options(TlsPolicy::Required, &s),
            OptionsEnd::Transmission { tls: true }
        );
        assert_eq!(
            options(TlsPolicy::Off, &s),
            OptionsEnd::Transmission { tls: false }
        );
    }

    #[test]
    fn block_status_extents() {
        let mut s = vec![0u8];
        s.extend_from_slice(&4096u32.to_le_bytes());
        for (len, flags) in [(512u64, 1u32), (512, 1), (1 << 40, 3)] {
            s.extend_from_slice(&len.to_le_bytes());
            s.extend_from_slice(&flags.to_le_bytes());
        }
        block_status(&s);
        s[0] = 1;
        block_status(&s);
    }
}
