//! The bodies of the daemon's fuzz targets
//! (fuzz/fuzz_targets/{control_request,registry_entry}.rs), here so
//! tests/fuzz_parsers.rs runs the same code in CI.
//!
//! - [`control_request`]: what a client sends on the control socket (only
//!   root and the daemon's user may, but the daemon runs as root and the
//!   bytes are still a client's). The input is the bytes sent before the
//!   client closes its side (at most [`CONTROL_BYTES_MAX`]). The request
//!   line is read as the listener reads it (`read_request`, compared with a
//!   model of its framing), decoded (its JSON round-trips), and, unless it
//!   would end the cache (detach, give-up-cache) or open a path
//!   (replace-cache), answered by `control::answer` on a small engine over
//!   RAM: the answer is one JSON line after any progress lines, and says
//!   ok exactly when the request's own checks pass.
//! - [`registry_entry`]: the text of `caches/tc0.json` (invalid UTF-8
//!   replaced). An entry `parse_entry` accepts is named as its file, with a
//!   valid name, and devices that are absolute paths or URIs; written back
//!   as `add` writes it, it parses to the same entry.

use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::control::{answer, Request, Response, MAX_REQUEST_BYTES};
use super::control_listener::read_request;
use super::frontends::{Frontends, Served};
use super::registry::{parse_entry, validate_name};
use crate::device::ram::RamDevice;
use crate::engine::policy::PolicyKind;
use crate::engine::{CreateOptions, Engine, Mode, OpenOptions};

/// Bytes of client input a body takes: a line past the limit, and more.
pub const CONTROL_BYTES_MAX: usize = MAX_REQUEST_BYTES as usize + (8 << 10);

/// The engine requests are answered on (made once; requests change its
/// settings, which is what a daemon's engine goes through too).
fn engine() -> &'static Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        let opts = CreateOptions {
            mode: Mode::Writethrough,
            allow_data_loss: true,
            ..CreateOptions::default()
        };
        let open = OpenOptions {
            no_background: true,
            ..OpenOptions::default()
        };
        let cache = Arc::new(RamDevice::new("cache", 2 << 20));
        let origin = Arc::new(RamDevice::new("origin", 8 << 20));
        Engine::create_with(cache, origin, &opts, &open).expect("the harness engine")
    })
}

/// The line `read_request` must return for `sent`, or the error kind.
fn model_line(sent: &[u8]) -> Result<String, std::io::ErrorKind> {
    let end = sent.iter().position(|&b| b == b'\n');
    let line = &sent[..end.unwrap_or(sent.len())];
    if line.len() as u64 > MAX_REQUEST_BYTES {
        return Err(std::io::ErrorKind::InvalidData);
    }
    if end.is_none() && line.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof);
    }
    String::from_utf8(line.to_vec()).map_err(|_| std::io::ErrorKind::InvalidData)
}

/// One control connection. See the module doc.
pub fn control_request(data: &[u8]) {
    let sent = &data[..data.len().min(CONTROL_BYTES_MAX)];
    let (ours, mut theirs) = UnixStream::pair().expect("socketpair");
    theirs
        .write_all(sent)
        .expect("the socket buffer holds the input");
    theirs.shutdown(Shutdown::Write).expect("shutdown");
    let read = read_request(&ours, Instant::now() + Duration::from_secs(10));
    assert_eq!(
        read.as_ref().map_err(|e| e.kind()),
        model_line(sent).as_ref().map_err(|k| *k),
        "framing"
    );
    let Ok(line) = read else {
        return;
    };
    let Ok(req) = serde_json::from_str::<Request>(&line) else {
        return;
    };
    let text = serde_json::to_string(&req).expect("a request encodes");
    let again: Request = serde_json::from_str(&text).expect("an encoded request decodes");
    assert_eq!(serde_json::to_string(&again).unwrap(), text, "round trip");
    // The fuzz engine's one volume is vol0; no name means it too.
    let known = |volume: &Option<String>| volume.as_deref().is_none_or(|v| v == "vol0");
    let want_ok = match &req {
        Request::Detach { .. } | Request::GiveUpCache | Request::ReplaceCache { .. } => return,
        // Its front end serves no added volume, and takes none away:
        // refused, nothing opened or removed.
        Request::AddOrigin { .. } | Request::RemoveOrigin { .. } => false,
        Request::SetWriteback { settings } => settings.validate().is_ok(),
        Request::SetAdmission { settings } => settings.validate().is_ok(),
        Request::SetPolicy { policy } => PolicyKind::parse(policy).is_some(),
        // One volume shares with nobody: only a change of nothing passes.
        Request::SetShare { change } => *change == Default::default(),
        // A range cut at the volume's end, refused unless sector-aligned.
        Request::Warm {
            offset,
            length,
            volume,
        } => {
            let end = offset.saturating_add(*length).min(engine().volume_bytes());
            known(volume) && (end <= *offset || (offset % 512 == 0 && end % 512 == 0))
        }
        // The fuzz engine's devices (RAM) never grow: resize is a no-op.
        Request::Flush { volume }
        | Request::SetMode { volume, .. }
        | Request::Resize { volume, .. } => known(volume),
        Request::Status => true,
    };
    let served = Served::new(Frontends::default(), Arc::default());
    answer(engine(), &served, &line, ours, &|| {
        panic!("detached by {line:?}")
    });
    let last = BufReader::new(theirs)
        .lines()
        .map(|l| l.expect("an answer line"))
        .map(|l| serde_json::from_str::<Response>(&l).expect("a JSON answer"))
        .inspect(|r| assert!(r.progress.is_none() || r.ok))
        .last()
        .expect("an answer");
    assert!(last.progress.is_none(), "the answer ends with progress");
    assert_eq!(last.ok, want_ok, "{line:?} answered {:?}", last.error);
}

/// One registry file's text. See the module doc.
pub fn registry_entry(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let path = Path::new("/state/caches/tc0.json");
    let Ok(entry) = parse_entry(&text, path) else {
        return;
    };
    assert_eq!(entry.name, "tc0");
    assert!(validate_name(&entry.name).is_ok());
    for d in &entry.device_paths() {
        assert!(
            d.starts_with('/') || crate::device::is_network_spec(d),
            "{d}"
        );
    }
    let written = serde_json::to_string_pretty(&entry).expect("an entry encodes");
    let back = parse_entry(&written, path).expect("a written entry parses");
    assert_eq!(back, entry, "round trip through {written}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_entries() {
        for line in [
            &b"{\"op\":\"status\"}\n"[..],
            b"{\"op\":\"set-policy\",\"policy\":\"lru\"}",
            b"{\"op\":\"set-policy\",\"policy\":\"mru\"}\n",
            b"{\"op\":\"warm\",\"offset\":0,\"length\":18446744073709551615}\n",
            b"",
            b"\xff\n",
        ] {
            control_request(line);
        }
        registry_entry(br#"{"name":"tc0","origin":"/dev/a","cache":"nbd://h/e","created":"x"}"#);
        let bad = br#"{"name":"../x","origin":"/dev/a","cache":"/b","created":"x"}"#;
        assert!(parse_entry(
            &String::from_utf8_lossy(bad),
            Path::new("/s/caches/tc0.json")
        )
        .is_err());
        let relative = br#"{"name":"tc0","origin":"dev/a","cache":"/b","created":"x"}"#;
        assert!(parse_entry(
            &String::from_utf8_lossy(relative),
            Path::new("/s/caches/tc0.json")
        )
        .is_err());
    }
}
