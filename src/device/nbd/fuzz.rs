//! The bodies of the NBD client's fuzz targets
//! (fuzz/fuzz_targets/{nbd_client_options,nbd_client_replies,device_uris}.rs),
//! here so the seeded mutation tests in tests/fuzz_parsers.rs run the same
//! code in CI. The bytes are what a hostile or broken origin server sends
//! (or a URI an operator typed); none may make the client panic, hang or
//! allocate beyond its bounds, and each body checks what the client does
//! with what it accepted.
//!
//! Input formats:
//! - [`client_options`]: a mode byte (bit 0: the TLS path, as `Conn::open`
//!   takes it: greeting, NBD_OPT_STARTTLS, then NBD_OPT_GO as if inside
//!   TLS; bit 1: export "disk" rather than the default ""), then what the
//!   server sends from its greeting on (at most [`SERVER_BYTES_MAX`]).
//! - [`client_replies`]: a byte `n` (`n % 8 + 1` requests pending, cookies
//!   1, 2, ...), per request a kind byte (bit 0: a read) and a length (u16
//!   LE, the bytes a successful read reply carries), then the reply stream.
//! - [`uris`]: a URI (UTF-8, invalid sequences replaced), parsed as an NBD
//!   URI and as an RBD URI.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::atomic::AtomicUsize;

use super::*;
use crate::device::rbd::RbdUri;
use crate::nbd::proto;

/// Bytes of server input a body takes: what a socket buffer holds at once,
/// so the input is written before the client runs, without a thread.
pub const SERVER_BYTES_MAX: usize = 32 << 10;

/// A read the client would wait on for longer than this is a hang: every
/// input ends in EOF.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A socket whose peer has sent `server` and closed its sending side; the
/// peer is returned to read what the client sent.
fn fed_socket(server: &[u8]) -> (Stream, UnixStream) {
    let (ours, mut theirs) = UnixStream::pair().expect("socketpair");
    theirs
        .write_all(&server[..server.len().min(SERVER_BYTES_MAX)])
        .expect("the socket buffer holds the input");
    theirs.shutdown(Shutdown::Write).expect("shutdown");
    ours.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    (Stream::Unix(ours), theirs)
}

fn not_a_hang<T>(r: &io::Result<T>) {
    if let Err(e) = r {
        assert!(
            !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "the client waited {READ_TIMEOUT:?} on a closed stream: {e}"
        );
    }
}

/// The handshake against server bytes. See the module doc.
pub fn client_options(data: &[u8]) {
    let Some((&mode, server)) = data.split_first() else {
        return;
    };
    let tls = mode & 1 != 0;
    let export = if mode & 2 != 0 { "disk" } else { "" };
    let (mut s, mut theirs) = fed_socket(server);
    let result = if tls {
        tls_path(&mut s, export)
    } else {
        handshake(&mut s, export)
    };
    not_a_hang(&result);
    let Stream::Unix(mut ours) = s else {
        unreachable!("a socketpair")
    };
    let mut unread = Vec::new();
    ours.read_to_end(&mut unread)
        .expect("the rest of the input");
    let consumed = &server[..server.len().min(SERVER_BYTES_MAX) - unread.len()];
    assert!(
        option_replies(consumed) <= OPTION_REPLIES_MAX + 1,
        "the client read {} option replies",
        option_replies(consumed)
    );
    drop(ours);
    let mut sent = Vec::new();
    theirs.read_to_end(&mut sent).expect("what the client sent");
    let fixed = server
        .get(16..18)
        .is_some_and(|f| u16::from_be_bytes([f[0], f[1]]) & FLAG_FIXED_NEWSTYLE != 0);
    check_sent(&sent, tls, fixed, export);
    if let Ok(info) = result {
        let max = info.payload_bytes_max;
        assert!(
            (512..=PAYLOAD_BYTES_MAX_DEFAULT).contains(&max) && max % 512 == 0,
            "payload maximum {max} kept"
        );
    }
}

/// Option replies at the start of what the client read after the
/// greeting.
fn option_replies(consumed: &[u8]) -> usize {
    let mut rest = consumed.get(18..).unwrap_or_default();
    let mut n = 0;
    while let Some((h, after)) = rest.split_first_chunk::<20>() {
        if h[..8] != OPTION_REPLY_MAGIC.to_be_bytes() {
            break;
        }
        n += 1;
        let len = u32::from_be_bytes(h[16..].try_into().unwrap()) as usize;
        rest = after.get(len..).unwrap_or_default();
    }
    n
}

/// `Conn::open`'s TLS handshake with the TLS stream taken as up.
fn tls_path(s: &mut Stream, export: &str) -> io::Result<ExportInfo> {
    let (fixed, no_zeroes) = greet(s)?;
    if !fixed {
        return Err(proto_err("no fixed newstyle"));
    }
    start_tls(s)?;
    choose_export(s, export, true, no_zeroes)
}

/// What the client sent is well-formed: its flags, then only the options
/// it uses (STARTTLS first and only with TLS, NBD_OPT_GO only to a fixed
/// newstyle server, each with the data it must carry).
fn check_sent(sent: &[u8], tls: bool, fixed: bool, export: &str) {
    let Some((flags, mut rest)) = sent.split_first_chunk::<4>() else {
        assert!(sent.is_empty(), "partial client flags");
        return;
    };
    let flags = u32::from_be_bytes(*flags);
    assert_eq!(
        flags & !u32::from(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES),
        0,
        "client flags"
    );
    let mut options = Vec::new();
    while !rest.is_empty() {
        let h = proto::parse_option_header(rest).expect("the client's option header");
        rest = &rest[proto::OPTION_HEADER_BYTES..];
        let data = rest
            .get(..h.data_bytes as usize)
            .expect("the client's option data");
        rest = &rest[data.len()..];
        options.push(h.option);
        let want = match h.option {
            OPT_STARTTLS => Vec::new(),
            OPT_EXPORT_NAME => export.as_bytes().to_vec(),
            OPT_GO => {
                let mut d = (export.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(export.as_bytes());
                d.extend_from_slice(&1u16.to_be_bytes());
                d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                d
            }
            o => panic!("the client sent option {o}"),
        };
        assert_eq!(data, want, "data of option {}", h.option);
    }
    if tls && !options.is_empty() {
        assert!(fixed, "TLS asked of a server without fixed newstyle");
        assert_eq!(options[0], OPT_STARTTLS, "an option before STARTTLS");
    }
    assert!(options.iter().skip(1).all(|&o| o != OPT_STARTTLS));
    if !fixed {
        assert!(options.iter().all(|&o| o == OPT_EXPORT_NAME), "{options:?}");
    }
    // NBD_OPT_EXPORT_NAME ends the haggling: nothing follows it.
    let last = options.iter().position(|&o| o == OPT_EXPORT_NAME);
    assert!(last.is_none_or(|i| i + 1 == options.len()));
}

/// What the reader thread must hand each caller: (errno, data), by cookie.
/// A reply ends the stream when its magic is not a simple reply's, its
/// cookie is not pending, or its data is cut short.
fn expected_completions(mut s: &[u8], reads: &[u32]) -> HashMap<u64, Completion> {
    let mut pending: HashMap<u64, u32> = (1u64..).zip(reads.iter().copied()).collect();
    let mut done = HashMap::new();
    while let Some((h, rest)) = s.split_first_chunk::<16>() {
        if u32::from_be_bytes(h[..4].try_into().unwrap()) != SIMPLE_REPLY_MAGIC {
            break;
        }
        let errno = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..].try_into().unwrap());
        let Some(reply_bytes) = pending.remove(&cookie) else {
            break;
        };
        s = rest;
        let mut data = Vec::new();
        if errno == 0 && reply_bytes > 0 {
            let Some(d) = s.get(..reply_bytes as usize) else {
                break;
            };
            data = d.to_vec();
            s = &s[d.len()..];
        }
        done.insert(cookie, (errno, data));
    }
    done
}

/// The reader thread's loop against server bytes, compared with
/// [`expected_completions`]. See the module doc.
pub fn client_replies(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 8) + 1;
    let Some(specs) = rest.get(..3 * n) else {
        return;
    };
    let stream = &rest[3 * n..];
    let stream = &stream[..stream.len().min(SERVER_BYTES_MAX)];
    let reads: Vec<u32> = specs
        .chunks_exact(3)
        .map(|c| {
            let len = u32::from(u16::from_le_bytes([c[1], c[2]]));
            if c[0] & 1 != 0 {
                len
            } else {
                0
            }
        })
        .collect();
    let lost = Arc::new(AtomicUsize::new(0));
    let lost_hook = lost.clone();
    let shared = Shared {
        state: Mutex::new(Rank::NbdClient, State::default()),
        slot_free: Condvar::new(),
        on_lost: Box::new(move |_| {
            lost_hook.fetch_add(1, Ordering::Relaxed);
        }),
    };
    let mut receivers = Vec::new();
    for (cookie, &reply_bytes) in (1u64..).zip(&reads) {
        let (tx, rx) = mpsc::sync_channel(1);
        let pending = Pending { reply_bytes, tx };
        shared.state.lock().pending.insert(cookie, pending);
        receivers.push((cookie, rx));
    }
    let (s, _theirs) = fed_socket(stream);
    reader_loop(s, &shared);
    let want = expected_completions(stream, &reads);
    for (cookie, rx) in receivers {
        let got = rx.try_recv().ok();
        assert_eq!(got.as_ref(), want.get(&cookie), "cookie {cookie}");
    }
    let st = shared.state.lock();
    let reason = st.dead.as_deref().expect("the connection ends dead");
    assert!(!reason.contains("timed out"), "a hang: {reason}");
    assert!(st.pending.is_empty(), "callers left waiting");
    assert_eq!(lost.load(Ordering::Relaxed), 1, "the loss is told once");
}

/// Every byte but RFC 3986's unreserved characters percent-encoded.
fn encode_component(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn check_nbd_uri(text: &str, u: &NbdUri) {
    assert!(!u.export.contains('\0'));
    let scheme = text
        .split_once("://")
        .expect("a URI")
        .0
        .to_ascii_lowercase();
    assert_eq!(u.tls.is_some(), scheme.starts_with("nbds"), "{text}");
    match &u.address {
        NbdAddress::Tcp { host, port } => {
            assert!(!host.is_empty() && *port != 0);
            assert_eq!(*host, host.to_ascii_lowercase());
        }
        NbdAddress::Unix { socket } => assert!(socket.is_absolute()),
    }
    match &u.tls {
        Some(ClientCredentials::Certificates { dir }) => assert!(dir.is_absolute()),
        Some(ClientCredentials::Psk { file, username }) => {
            assert!(file.is_absolute() && !username.is_empty())
        }
        None => {}
    }
    // The normalized spelling names the same export, and is a fixed point.
    let n = u.normalized();
    let back = NbdUri::parse(&n).unwrap_or_else(|e| panic!("{text}: normalized {n}: {e}"));
    assert_eq!(
        (&back.address, &back.export, &back.tls),
        (&u.address, &u.export, &None),
        "{text} normalized to {n}"
    );
    assert_eq!(back.normalized(), n);
}

fn check_rbd_uri(text: &str, r: &RbdUri) {
    assert!(!r.pool.is_empty() && !r.image.is_empty() && !r.id.is_empty());
    assert!(!r.image.contains(['/', '@']));
    assert!(!r.id.starts_with("client.") || r.id.len() > "client.".len());
    // Written back with every part encoded, it parses to the same URI.
    let mut s = format!(
        "rbd://{}/{}?id=client.{}",
        encode_component(&r.pool),
        encode_component(&r.image),
        encode_component(&r.id)
    );
    if let Some(conf) = &r.conf {
        s.push_str(&format!("&conf={}", encode_component(conf)));
    }
    let back = RbdUri::parse(&s).unwrap_or_else(|e| panic!("{text}: written as {s}: {e}"));
    assert_eq!(&back, r, "{text} written as {s}");
}

/// NBD and RBD URI parsing. See the module doc.
pub fn uris(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(u) = NbdUri::parse(&text) {
        check_nbd_uri(&text, &u);
    }
    if let Ok(r) = RbdUri::parse(&text) {
        check_rbd_uri(&text, &r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting(flags: u16) -> Vec<u8> {
        let mut g = NBDMAGIC.to_be_bytes().to_vec();
        g.extend_from_slice(&IHAVEOPT.to_be_bytes());
        g.extend_from_slice(&flags.to_be_bytes());
        g
    }

    #[test]
    fn an_export_name_handshake_is_accepted() {
        let mut s = vec![2u8];
        s.extend(greeting(FLAG_NO_ZEROES));
        s.extend_from_slice(&(1u64 << 30).to_be_bytes());
        s.extend_from_slice(&3u16.to_be_bytes());
        client_options(&s);
        uris(b"nbd://Host:7/a%20b");
        uris(b"rbd://p%2Fq/i?id=client.x&conf=/c");
    }

    /// A server that answers NBD_OPT_GO with NBD_REP_INFO without end is
    /// refused after OPTION_REPLIES_MAX of them.
    #[test]
    fn an_info_flood_ends_the_handshake() {
        let mut server = greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let mut info = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
        info.extend_from_slice(&OPT_GO.to_be_bytes());
        info.extend_from_slice(&REP_INFO.to_be_bytes());
        info.extend_from_slice(&2u32.to_be_bytes());
        info.extend_from_slice(&[0, 9]);
        for _ in 0..100 {
            server.extend_from_slice(&info);
        }
        let (mut s, _theirs) = fed_socket(&server);
        let e = handshake(&mut s, "").unwrap_err();
        assert!(e.to_string().contains("more than 64 replies"), "{e}");
        let mut input = vec![0];
        input.extend(server);
        client_options(&input);
    }

    #[test]
    fn replies_complete_their_callers() {
        let mut s = vec![1u8, 1, 4, 0, 0, 0, 0];
        for (cookie, errno, data) in [(2u64, 5u32, &[][..]), (1, 0, &[9u8; 4][..])] {
            s.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
            s.extend_from_slice(&errno.to_be_bytes());
            s.extend_from_slice(&cookie.to_be_bytes());
            s.extend_from_slice(data);
        }
        client_replies(&s);
    }
}
