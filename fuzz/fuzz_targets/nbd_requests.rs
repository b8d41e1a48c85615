//! Transmission requests from untrusted bytes: header parsing, then
//! validation against an export, checking the invariants the connection
//! loop relies on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache::nbd::proto::{self, Command};
use tiercache::nbd::handshake::MetaContexts;
use tiercache::nbd::transmission::{check_request, Action, Disposition, ExportLimits};

fuzz_target!(|data: &[u8]| {
    let Some((config, header)) = data.split_first() else {
        return;
    };
    let limits = ExportLimits {
        size_bytes: 1 << 30,
        read_only: config & 1 != 0,
        max_request_bytes: 1 << 20,
        min_block_bytes: 512,
        contexts: MetaContexts::default(),
    };
    let Ok(req) = proto::parse_request(header) else {
        return;
    };
    let end = req.offset.checked_add(u64::from(req.length));
    match check_request(&req, &limits) {
        Disposition::Execute(op) => {
            if req.flags & !(proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE) != 0 {
                assert_eq!(req.command, Command::WriteZeroes);
            }
            let range = match op {
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
                Action::Cache { offset, len } => Some((offset, len)),
                Action::BlockStatus { offset, len, .. } => Some((offset, len)),
                Action::Flush | Action::Noop { .. } => None,
            };
            if let Some((offset, len)) = range {
                assert!(len > 0 && offset.is_multiple_of(512) && len.is_multiple_of(512));
                assert!(end.is_some_and(|e| e <= limits.size_bytes));
            }
        }
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
});
