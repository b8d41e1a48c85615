//! `nbd://host[:port]/EXPORT` and `nbd+unix:///EXPORT?socket=PATH`: a remote
//! NBD export used as a block device (typically the slow origin). With TLS:
//! `nbds://[USER@]host[:port]/EXPORT?tls-certificates=DIR` (X.509: DIR
//! holds ca-cert.pem, and client-cert.pem with client-key.pem when the
//! server verifies clients) or `?tls-psk-file=FILE` (USER's key from a
//! psktool file), and `nbds+unix://` likewise; the query names of libnbd.
//!
//! TLS runs on a relay thread per connection: the handshake and
//! NBD_OPT_STARTTLS happen in plaintext on the socket, then the TLS stream
//! (crate::nbd::tls, shared with the server) is pumped to one end of a
//! socketpair and everything below speaks plaintext NBD on the other end,
//! unchanged. It costs a copy and a thread hop per request, which an origin
//! (the slow device) can afford. TLS is required once asked for: a server
//! that refuses NBD_OPT_STARTTLS is an open error, never a plaintext
//! fallback.
//!
//! Protocol (NetworkBlockDevice/nbd doc/proto.md): fixed newstyle handshake
//! with `NBD_OPT_GO` (falling back to `NBD_OPT_EXPORT_NAME`), then simple
//! replies only, so a read reply is a header followed by exactly the
//! requested bytes.
//!
//! Concurrency model, per connection: callers register a cookie in the
//! pending map, then write the request under the writer mutex; one reader
//! thread reads replies in whatever order the server sends them and hands each
//! to its caller through a one-shot channel. At most [`INFLIGHT_MAX`] requests
//! are pending per connection; further callers wait.
//!
//! Failure model: once a connection fails (EOF, socket error, protocol
//! violation) it is dead for good. The reader drops every pending sender, so
//! every waiting and every later request fails with `DeviceError::Io`; nothing
//! waits forever on a closed socket. There is no reconnect.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sync::{Condvar, Mutex, Rank};
use zerocopy::byteorder::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use super::{check_range, BlockDevice, DeviceError, DeviceResult, SECTOR_BYTES};
use crate::nbd::proto::{
    is_error_reply, ExportNameReply, InfoBlockSize, InfoExport, OptionHeader, OptionReplyHeader,
    RequestHeader, SimpleReplyHeader, CMD_DISC, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE,
    FLAG_CAN_MULTI_CONN, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, FLAG_READ_ONLY, FLAG_SEND_FLUSH,
    FLAG_SEND_TRIM, IHAVEOPT, INFO_BLOCK_SIZE, INFO_EXPORT, NBDMAGIC, OPTION_REPLY_MAGIC,
    OPT_EXPORT_NAME, OPT_GO, OPT_STARTTLS, REP_ACK, REP_ERR, REP_ERR_UNSUP, REP_INFO,
    REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};
use crate::nbd::tls::{ClientCredentials, TlsConnector};

/// Default TCP port (proto.md: IANA-assigned 10809).
pub const DEFAULT_PORT: u16 = 10809;
/// Requests pending on one connection at most; more callers wait.
pub const INFLIGHT_MAX: usize = 64;
/// Payload bytes per request when the server states no maximum (proto.md,
/// "Block size constraints": clients may assume 32 MiB).
const PAYLOAD_BYTES_MAX_DEFAULT: u32 = 32 << 20;
/// TRIM carries no payload, but its length is a u32; split at 1 GiB.
const TRIM_BYTES_MAX: u64 = 1 << 30;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest option reply we accept during the handshake (proto.md: strings are
/// at most 4096 bytes; INFO payloads are tiny).
const OPTION_REPLY_BYTES_MAX: u32 = 64 << 10;

// Wire constants and layouts come from the one place that defines them for
// the server too (crate::nbd::proto). The client alone needs this one: an
// oldstyle server's greeting, which it refuses.
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;

// ---------------------------------------------------------------------------
// URIs (NBD URI spec, NetworkBlockDevice/nbd doc/uri.md).

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddress {
    Tcp { host: String, port: u16 },
    Unix { socket: PathBuf },
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: NbdAddress,
    /// Export name, percent-decoded; empty means the server's default export.
    pub export: String,
    /// TLS credentials (`nbds://`, `nbds+unix://`); `None` is plaintext.
    pub tls: Option<ClientCredentials>,
}

impl NbdUri {
    /// Parses `nbd://host[:port]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`
    /// and their TLS forms `nbds://` and `nbds+unix://`. The error is a
    /// reason suitable for `DeviceError::Open`.
    pub fn parse(uri: &str) -> Result<NbdUri, String> {
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| "not a URI (expected nbd:// or nbd+unix://)".to_string())?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path_query) = rest.split_at(authority_end);
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        if path_query.contains('#') {
            return Err("fragments ('#') are not allowed in an NBD URI".into());
        }
        let export = percent_decode(path.strip_prefix('/').unwrap_or(path))
            .map_err(|e| format!("export name: {e}"))?;
        let scheme = scheme.to_ascii_lowercase();
        let (tls, unix) = match scheme.as_str() {
            "nbd" => (false, false),
            "nbd+unix" => (false, true),
            "nbds" => (true, false),
            "nbds+unix" => (true, true),
            s if s.starts_with("nbd") => {
                return Err(format!(
                    "transport '{s}://' is not supported (use nbd://, nbd+unix://, nbds:// or nbds+unix://)"
                ))
            }
            s => return Err(format!("scheme '{s}' is not an NBD scheme")),
        };
        let mut q = parse_query(query, unix, tls)?;
        let (user, authority) = match authority.rsplit_once('@') {
            Some((u, a)) if tls => (Some(percent_decode(u)?), a),
            Some(_) => {
                return Err("user names in NBD URIs are only for TLS (nbds://USER@host)".into())
            }
            None => (None, authority),
        };
        let address = if unix {
            if !authority.is_empty() {
                return Err(format!(
                    "{scheme}:// takes no host (found '{authority}'); \
                     write {scheme}:///EXPORT?socket=/path.sock"
                ));
            }
            NbdAddress::Unix {
                socket: q
                    .socket
                    .take()
                    .ok_or("nbd+unix:// needs '?socket=/absolute/path.sock'")?,
            }
        } else {
            let (host, port) = parse_host(authority)?;
            NbdAddress::Tcp { host, port }
        };
        let tls = if tls {
            Some(tls_credentials(q, user)?)
        } else {
            None
        };
        Ok(NbdUri {
            address,
            export,
            tls,
        })
    }

    /// The canonical spelling of the export's address: lowercase host,
    /// explicit port, canonical percent-encoding. Two URIs naming the same
    /// export normalize equally. TLS is left out: it is how the export is
    /// reached, not which export it is (the cache's origin identity must not
    /// change when TLS is turned on).
    pub fn normalized(&self) -> String {
        let export = percent_encode(&self.export);
        match &self.address {
            NbdAddress::Tcp { host, port } if host.contains(':') => {
                format!("nbd://[{host}]:{port}/{export}")
            }
            NbdAddress::Tcp { host, port } => format!("nbd://{host}:{port}/{export}"),
            NbdAddress::Unix { socket } => format!(
                "nbd+unix:///{export}?socket={}",
                percent_encode(&socket.to_string_lossy())
            ),
        }
    }
}

/// Splits `host[:port]` or `[v6]:port`.
fn parse_host(authority: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unterminated '[' in host '{authority}'"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("junk after ']' in host '{authority}'"))?,
            ),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("nbd:// needs a host, e.g. nbd://127.0.0.1/EXPORT".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 => n,
            _ => return Err(format!("'{p}' is not a TCP port (1-65535)")),
        },
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// The query parameters we accept (libnbd's names).
#[derive(Default)]
struct Query {
    socket: Option<PathBuf>,
    tls_certificates: Option<PathBuf>,
    tls_psk_file: Option<PathBuf>,
    tls_username: Option<String>,
}

/// Parses `socket=PATH` (Unix transports) and, with TLS,
/// `tls-certificates=DIR`, `tls-psk-file=FILE` and `tls-username=USER`.
/// Paths must be absolute: the URI is stored and used from elsewhere.
fn parse_query(query: Option<&str>, unix: bool, tls: bool) -> Result<Query, String> {
    let mut q = Query::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).map_err(|e| format!("{key}: {e}"))?;
        let path = |what: &str| -> Result<PathBuf, String> {
            if !value.starts_with('/') {
                return Err(format!("{what} path '{value}' is not absolute"));
            }
            Ok(PathBuf::from(&value))
        };
        let slot_taken = match key {
            "socket" if unix => q.socket.replace(path("socket")?).is_some(),
            "tls-certificates" if tls => q
                .tls_certificates
                .replace(path("tls-certificates")?)
                .is_some(),
            "tls-psk-file" if tls => q.tls_psk_file.replace(path("tls-psk-file")?).is_some(),
            "tls-username" if tls => q.tls_username.replace(value.clone()).is_some(),
            other => return Err(format!("query parameter '{other}' is not supported here")),
        };
        if slot_taken {
            return Err(format!("'{key}' given twice"));
        }
    }
    Ok(q)
}

/// The TLS credentials an `nbds` URI names.
fn tls_credentials(q: Query, user: Option<String>) -> Result<ClientCredentials, String> {
    match (q.tls_certificates, q.tls_psk_file) {
        (Some(dir), None) => Ok(ClientCredentials::Certificates { dir }),
        (None, Some(file)) => {
            let username =
                match (user, q.tls_username) {
                    (Some(u), None) | (None, Some(u)) if !u.is_empty() => u,
                    (Some(_), Some(_)) => return Err("user name given twice".into()),
                    _ => return Err(
                        "tls-psk-file needs a user name: nbds://USER@host/... or tls-username=USER"
                            .into(),
                    ),
                };
            Ok(ClientCredentials::Psk { file, username })
        }
        (Some(_), Some(_)) => Err("give tls-certificates or tls-psk-file, not both".into()),
        (None, None) => {
            Err("TLS (nbds://) needs '?tls-certificates=/DIR' or '?tls-psk-file=/FILE'".into())
        }
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let out = String::from_utf8(out).map_err(|_| format!("'{s}' does not decode to UTF-8"))?;
    if out.contains('\0') {
        return Err(format!("'{s}' decodes to a NUL character"));
    }
    Ok(out)
}

/// Encodes everything except RFC 3986 unreserved characters and '/'.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// 64-bit FNV-1a: stable across runs and builds, unlike std's `DefaultHasher`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

// ---------------------------------------------------------------------------
// Sockets.

/// A connected socket of either transport.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn connect(address: &NbdAddress) -> io::Result<Stream> {
        match address {
            NbdAddress::Unix { socket } => Ok(Stream::Unix(UnixStream::connect(socket)?)),
            NbdAddress::Tcp { host, port } => {
                let mut last_err = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                        Ok(s) => {
                            // Requests are small and latency-bound.
                            s.set_nodelay(true)?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last_err = Some(e),
                    }
                }
                Err(last_err.unwrap_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, "host has no addresses")
                }))
            }
        }
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    fn shutdown(&self) {
        // Errors mean the socket is already gone, which is the goal.
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes all of `bufs` (header and payload) with as few syscalls as possible.
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Handshake.

/// What the handshake learned about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ExportInfo {
    size_bytes: u64,
    transmission_flags: u16,
    payload_bytes_max: u32,
}

fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_struct<T: FromBytes + IntoBytes>(s: &mut Stream) -> io::Result<T> {
    let mut v = T::new_zeroed();
    s.read_exact(v.as_mut_bytes())?;
    Ok(v)
}

fn send_option(s: &mut Stream, option: u32, data: &[u8]) -> io::Result<()> {
    let header = OptionHeader {
        magic: IHAVEOPT.into(),
        option: option.into(),
        length: u32::try_from(data.len())
            .map_err(|_| proto_err("option too long"))?
            .into(),
    };
    write_all_vectored(
        s,
        &mut [IoSlice::new(header.as_bytes()), IoSlice::new(data)],
    )
}

fn rep_err_name(t: u32) -> &'static str {
    match t & !REP_ERR {
        1 => "NBD_REP_ERR_UNSUP",
        2 => "NBD_REP_ERR_POLICY",
        3 => "NBD_REP_ERR_INVALID",
        4 => "NBD_REP_ERR_PLATFORM",
        5 => "NBD_REP_ERR_TLS_REQD",
        6 => "NBD_REP_ERR_UNKNOWN (no such export)",
        7 => "NBD_REP_ERR_SHUTDOWN",
        8 => "NBD_REP_ERR_BLOCK_SIZE_REQD",
        9 => "NBD_REP_ERR_TOO_BIG",
        _ => "unknown option error",
    }
}

/// Reads the server greeting and sends the client flags. Returns whether
/// the server speaks fixed newstyle, and whether NO_ZEROES was agreed.
fn greet(s: &mut Stream) -> io::Result<(bool, bool)> {
    let magic: U64 = read_struct(s)?;
    if magic.get() != NBDMAGIC {
        return Err(proto_err("not an NBD server (bad greeting magic)"));
    }
    let style: U64 = read_struct(s)?;
    match style.get() {
        IHAVEOPT => {}
        OLDSTYLE_MAGIC => return Err(proto_err("oldstyle NBD servers are not supported")),
        m => return Err(proto_err(format!("unknown handshake style {m:#x}"))),
    }
    let server_flags: U16 = read_struct(s)?;
    let server_flags = server_flags.get();
    let client_flags = server_flags & (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    s.write_all(U32::new(u32::from(client_flags)).as_bytes())?;
    Ok((
        server_flags & FLAG_FIXED_NEWSTYLE != 0,
        client_flags & FLAG_NO_ZEROES != 0,
    ))
}

/// Runs the handshake on a fresh socket and leaves it in transmission phase.
fn handshake(s: &mut Stream, export: &str) -> io::Result<ExportInfo> {
    let (fixed, no_zeroes) = greet(s)?;
    choose_export(s, export, fixed, no_zeroes)
}

/// NBD_OPT_STARTTLS; anything but NBD_REP_ACK is an error (proto.md: a
/// client that only wishes to use TLS SHOULD terminate the session).
fn start_tls(s: &mut Stream) -> io::Result<()> {
    send_option(s, OPT_STARTTLS, &[])?;
    let h: OptionReplyHeader = read_struct(s)?;
    if h.magic.get() != OPTION_REPLY_MAGIC || h.option.get() != OPT_STARTTLS {
        return Err(proto_err("malformed reply to NBD_OPT_STARTTLS"));
    }
    let len = h.length.get();
    if len > OPTION_REPLY_BYTES_MAX {
        return Err(proto_err(format!(
            "option reply of {len} bytes is too long"
        )));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    match h.reply_type.get() {
        REP_ACK => Ok(()),
        t if is_error_reply(t) => Err(io::Error::other(format!(
            "server refused TLS (NBD_OPT_STARTTLS): {}: {}",
            rep_err_name(t),
            String::from_utf8_lossy(&body)
        ))),
        t => Err(proto_err(format!(
            "unexpected reply {t} to NBD_OPT_STARTTLS"
        ))),
    }
}

/// NBD_OPT_GO, or NBD_OPT_EXPORT_NAME if the server lacks it.
fn choose_export(
    s: &mut Stream,
    export: &str,
    fixed: bool,
    no_zeroes: bool,
) -> io::Result<ExportInfo> {
    // proto.md: without fixed newstyle, EXPORT_NAME is the only valid option.
    if fixed {
        if let Some(info) = opt_go(s, export)? {
            return Ok(info);
        }
    }
    send_option(s, OPT_EXPORT_NAME, export.as_bytes())?;
    let reply: ExportNameReply = read_struct(s).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            proto_err(format!(
                "server closed the connection: export '{export}' does not exist or is refused"
            ))
        } else {
            e
        }
    })?;
    if !no_zeroes {
        let mut zeroes = [0u8; 124];
        s.read_exact(&mut zeroes)?;
    }
    Ok(ExportInfo {
        size_bytes: reply.size_bytes.get(),
        transmission_flags: reply.transmission_flags.get(),
        payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
    })
}

/// Why a TLS relay stopped reading from the server, if it was an error
/// (e.g. the alert of a server that refused the client certificate).
type RelayError = Arc<Mutex<Option<String>>>;

/// After NBD_OPT_STARTTLS was acknowledged on `s`: runs the TLS handshake
/// on a relay thread and returns the plaintext end of a socketpair that the
/// thread pumps to and from the TLS stream.
fn tls_relay(
    s: Stream,
    connector: &TlsConnector,
    server_name: &str,
) -> io::Result<(Stream, RelayError)> {
    let relay_error: RelayError = Arc::new(Mutex::new(Rank::NbdRelay, None));
    let relay_error_thread = relay_error.clone();
    let (local, remote) = UnixStream::pair()?;
    s.set_timeouts(None)?;
    let control = s.try_clone()?;
    let (done_tx, done_rx) = mpsc::sync_channel::<io::Result<()>>(1);
    let connector = connector.clone();
    let name = server_name.to_string();
    std::thread::Builder::new()
        .name("nbd-client-tls".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return drop(done_tx.send(Err(e))),
            };
            rt.block_on(async move {
                let up = match s {
                    Stream::Tcp(t) => {
                        t.set_nonblocking(true)?;
                        let t = tokio::net::TcpStream::from_std(t)?;
                        connector.connect(&name, t).await
                    }
                    Stream::Unix(u) => {
                        u.set_nonblocking(true)?;
                        let u = tokio::net::UnixStream::from_std(u)?;
                        connector.connect(&name, u).await
                    }
                };
                let tls = match up {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = done_tx.send(Err(io::Error::other(e.to_string())));
                        return Ok(());
                    }
                };
                let _ = done_tx.send(Ok(()));
                remote.set_nonblocking(true)?;
                let local = tokio::net::UnixStream::from_std(remote)?;
                pump(tls, local, relay_error_thread).await;
                Ok::<(), io::Error>(())
            })
            .ok();
        })?;
    match done_rx.recv_timeout(HANDSHAKE_TIMEOUT) {
        Ok(Ok(())) => Ok((Stream::Unix(local), relay_error)),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            // Unblocks the relay thread, which then ends.
            control.shutdown();
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            ))
        }
    }
}

/// Copies both ways between the TLS stream and the plaintext socket until
/// either side ends; then both are closed (the TLS side with close_notify).
async fn pump(tls: crate::nbd::tls::BoxStream, local: tokio::net::UnixStream, error: RelayError) {
    use tokio::io::AsyncWriteExt;
    let (tr, mut tw) = tokio::io::split(tls);
    let (lr, mut lw) = local.into_split();
    let mut tr = tokio::io::BufReader::with_capacity(256 << 10, tr);
    let mut lr = tokio::io::BufReader::with_capacity(256 << 10, lr);
    let up = async {
        let _ = tokio::io::copy_buf(&mut lr, &mut tw).await;
        let _ = tw.shutdown().await;
    };
    let down = async {
        if let Err(e) = tokio::io::copy_buf(&mut tr, &mut lw).await {
            *error.lock() = Some(e.to_string());
        }
        let _ = lw.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// One NBD_REP_INFO of the reply to NBD_OPT_GO: the export's size and
/// flags, or its block sizes (the minimum must allow 512-byte requests).
fn take_info(
    body: &[u8],
    export_info: &mut Option<(u64, u16)>,
    payload_bytes_max: &mut u32,
) -> io::Result<()> {
    let Some(info_type) = body.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
        return Err(proto_err("empty NBD_REP_INFO"));
    };
    match info_type {
        INFO_EXPORT => {
            let i = InfoExport::read_from_bytes(body)
                .map_err(|_| proto_err("bad NBD_INFO_EXPORT length"))?;
            *export_info = Some((i.size_bytes.get(), i.transmission_flags.get()));
        }
        INFO_BLOCK_SIZE => {
            let i = InfoBlockSize::read_from_bytes(body)
                .map_err(|_| proto_err("bad NBD_INFO_BLOCK_SIZE length"))?;
            // Every request we send is 512-byte aligned.
            if i.min_block_bytes.get() > SECTOR_BYTES as u32 {
                return Err(proto_err(format!(
                    "export needs {}-byte aligned requests; only 512 is supported",
                    i.min_block_bytes.get()
                )));
            }
            *payload_bytes_max = i.max_block_bytes.get();
        }
        _ => {} // proto.md: clients ignore unrequested info types
    }
    Ok(())
}

/// `NBD_OPT_GO` asking for block size constraints. `Ok(None)` if the server
/// does not know the option (then the caller falls back to EXPORT_NAME).
fn opt_go(s: &mut Stream, export: &str) -> io::Result<Option<ExportInfo>> {
    let name_len = u32::try_from(export.len()).map_err(|_| proto_err("export name too long"))?;
    let mut data = Vec::with_capacity(export.len() + 8);
    data.extend_from_slice(U32::new(name_len).as_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(U16::new(1).as_bytes());
    data.extend_from_slice(U16::new(INFO_BLOCK_SIZE).as_bytes());
    send_option(s, OPT_GO, &data)?;

    let mut export_info: Option<(u64, u16)> = None;
    let mut payload_bytes_max = PAYLOAD_BYTES_MAX_DEFAULT;
    loop {
        let h: OptionReplyHeader = read_struct(s)?;
        if h.magic.get() != OPTION_REPLY_MAGIC || h.option.get() != OPT_GO {
            return Err(proto_err("malformed reply to NBD_OPT_GO"));
        }
        let len = h.length.get();
        if len > OPTION_REPLY_BYTES_MAX {
            return Err(proto_err(format!(
                "option reply of {len} bytes is too long"
            )));
        }
        let mut body = vec![0u8; len as usize];
        s.read_exact(&mut body)?;
        match h.reply_type.get() {
            REP_ACK => break,
            REP_INFO => take_info(&body, &mut export_info, &mut payload_bytes_max)?,
            REP_ERR_UNSUP => return Ok(None),
            t if is_error_reply(t) => {
                let msg = String::from_utf8_lossy(&body);
                let sep = if msg.is_empty() { "" } else { ": " };
                return Err(io::Error::other(format!(
                    "server refused export '{export}': {}{sep}{msg}",
                    rep_err_name(t)
                )));
            }
            t => return Err(proto_err(format!("unexpected option reply type {t}"))),
        }
    }
    let (size_bytes, transmission_flags) =
        export_info.ok_or_else(|| proto_err("server acknowledged GO without NBD_INFO_EXPORT"))?;
    // Keep payloads 512-aligned and bounded in memory.
    let payload_bytes_max = payload_bytes_max.min(PAYLOAD_BYTES_MAX_DEFAULT) / SECTOR_BYTES as u32
        * SECTOR_BYTES as u32;
    if payload_bytes_max == 0 {
        return Err(proto_err("server's maximum block size is below 512 bytes"));
    }
    Ok(Some(ExportInfo {
        size_bytes,
        transmission_flags,
        payload_bytes_max,
    }))
}

// ---------------------------------------------------------------------------
// Transmission.

/// What the reader thread hands to a waiting caller: the NBD error number
/// (0 = success) and, for a successful read, the data.
type Completion = (u32, Vec<u8>);

struct Pending {
    /// Payload bytes that follow a successful reply (reads only).
    reply_bytes: u32,
    tx: mpsc::SyncSender<Completion>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    /// Why the connection is unusable; set once, never cleared.
    dead: Option<String>,
    /// Set by `Drop`, so the reader's EOF is not reported as a failure.
    closing: bool,
}

/// State shared between callers and the reader thread of one connection.
struct Shared {
    state: Mutex<State>,
    /// Signalled when a pending slot frees up or the connection dies.
    slot_free: Condvar,
}

impl Shared {
    /// Marks the connection dead and fails every pending request (dropping
    /// the senders wakes their receivers with an error).
    fn kill(&self, reason: String) {
        let mut st = self.state.lock();
        if st.dead.is_none() {
            if !st.closing {
                log::warn!("NBD connection lost: {reason}");
            }
            st.dead = Some(reason);
        }
        st.pending.clear();
        drop(st);
        self.slot_free.notify_all();
    }
}

/// One transmission-phase connection.
struct Conn {
    shared: Arc<Shared>,
    writer: Mutex<Stream>,
    /// A clone of the socket for shutting it down without the writer lock.
    control: Stream,
    next_cookie: AtomicU64,
    reader: Option<JoinHandle<()>>,
}

/// A submitted request whose reply has not been collected yet.
struct Ticket {
    rx: mpsc::Receiver<Completion>,
}

impl Conn {
    fn open(uri: &NbdUri, tls: Option<&TlsConnector>) -> io::Result<(Conn, ExportInfo)> {
        let mut s = Stream::connect(&uri.address)?;
        s.set_timeouts(Some(HANDSHAKE_TIMEOUT))?;
        let timed_out = |e: io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("handshake not finished within {HANDSHAKE_TIMEOUT:?}"),
            ),
            _ => e,
        };
        let info = match tls {
            None => handshake(&mut s, &uri.export).map_err(timed_out)?,
            Some(connector) => {
                let (fixed, no_zeroes) = greet(&mut s).map_err(timed_out)?;
                if !fixed {
                    return Err(proto_err(
                        "the server does not speak fixed newstyle, so it cannot do TLS",
                    ));
                }
                start_tls(&mut s).map_err(timed_out)?;
                let name = match &uri.address {
                    NbdAddress::Tcp { host, .. } => host.clone(),
                    NbdAddress::Unix { .. } => "localhost".to_string(),
                };
                let (relayed, relay_error) = tls_relay(s, connector, &name)?;
                s = relayed;
                s.set_timeouts(Some(HANDSHAKE_TIMEOUT))?;
                choose_export(&mut s, &uri.export, true, no_zeroes).map_err(|e| {
                    match relay_error.lock().take() {
                        // The server ended TLS, e.g. refusing our certificate.
                        Some(why) => io::Error::other(format!("TLS: {why}")),
                        None => timed_out(e),
                    }
                })?
            }
        };
        s.set_timeouts(None)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(Rank::NbdClient, State::default()),
            slot_free: Condvar::new(),
        });
        let control = s.try_clone()?;
        let read_half = s.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        let reader = std::thread::Builder::new()
            .name("nbd-client-rx".into())
            .spawn(move || reader_loop(read_half, &reader_shared))?;
        let conn = Conn {
            shared,
            writer: Mutex::new(Rank::NbdClientWriter, s),
            control,
            next_cookie: AtomicU64::new(1),
            reader: Some(reader),
        };
        Ok((conn, info))
    }

    /// Sends one request and returns the ticket for its reply. Waits while
    /// [`INFLIGHT_MAX`] requests are pending.
    fn submit(&self, command: u16, offset: u64, length: u32, payload: &[u8]) -> io::Result<Ticket> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        let reply_bytes = if command == CMD_READ { length } else { 0 };
        {
            let mut st = self.shared.state.lock();
            while st.dead.is_none() && st.pending.len() >= INFLIGHT_MAX {
                self.shared.slot_free.wait(&mut st);
            }
            if let Some(reason) = &st.dead {
                return Err(lost(reason));
            }
            // Registered before the request is sent, so the reply always
            // finds its slot.
            st.pending.insert(cookie, Pending { reply_bytes, tx });
        }
        let header = RequestHeader {
            magic: REQUEST_MAGIC.into(),
            flags: 0.into(),
            command: command.into(),
            cookie: cookie.into(),
            offset: offset.into(),
            length: length.into(),
        };
        let sent = {
            let mut w = self.writer.lock();
            write_all_vectored(
                &mut *w,
                &mut [IoSlice::new(header.as_bytes()), IoSlice::new(payload)],
            )
        };
        if let Err(e) = sent {
            // A partial request corrupts the stream: the connection is over.
            // Shutting the socket down makes the reader fail everything.
            self.control.shutdown();
            self.shared.kill(format!("sending a request failed: {e}"));
            return Err(e);
        }
        Ok(Ticket { rx })
    }

    fn wait(&self, ticket: Ticket) -> io::Result<Vec<u8>> {
        match ticket.rx.recv() {
            Ok((0, data)) => Ok(data),
            Ok((errno, _)) => Err(server_error(errno)),
            Err(mpsc::RecvError) => {
                let st = self.shared.state.lock();
                Err(lost(st.dead.as_deref().unwrap_or("connection closed")))
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.state.lock().closing = true;
        let header = RequestHeader {
            magic: REQUEST_MAGIC.into(),
            flags: 0.into(),
            command: CMD_DISC.into(),
            cookie: 0.into(),
            offset: 0.into(),
            length: 0.into(),
        };
        // No caller is left (we own the device), so nothing is in flight and
        // DISC is the last request (proto.md: NBD_CMD_DISC). Errors only mean
        // the server is already gone.
        let _ = self.writer.lock().write_all(header.as_bytes());
        // The server may keep the socket open; shutting it down ends the
        // reader without waiting for it.
        self.control.shutdown();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

fn lost(reason: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!("NBD connection lost: {reason}"),
    )
}

/// Maps an NBD error number (proto.md, "Error values") to an `io::Error`
/// whose message names the errno.
fn server_error(errno: u32) -> io::Error {
    let (name, kind) = match errno {
        1 => ("EPERM", io::ErrorKind::PermissionDenied),
        5 => ("EIO", io::ErrorKind::Other),
        12 => ("ENOMEM", io::ErrorKind::OutOfMemory),
        22 => ("EINVAL", io::ErrorKind::InvalidInput),
        28 => ("ENOSPC", io::ErrorKind::StorageFull),
        75 => ("EOVERFLOW", io::ErrorKind::InvalidInput),
        95 => ("ENOTSUP", io::ErrorKind::Unsupported),
        108 => ("ESHUTDOWN", io::ErrorKind::Other),
        _ => ("unknown error", io::ErrorKind::Other),
    };
    io::Error::new(kind, format!("NBD server replied {name} (errno {errno})"))
}

/// Reads replies until the connection fails, completing pending requests.
fn reader_loop(mut s: Stream, shared: &Shared) {
    let reason = loop {
        let reply: SimpleReplyHeader = match read_struct(&mut s) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                break "server closed the connection".to_string()
            }
            Err(e) => break format!("reading a reply failed: {e}"),
        };
        match reply.magic.get() {
            SIMPLE_REPLY_MAGIC => {}
            STRUCTURED_REPLY_MAGIC => break "unrequested structured reply".into(),
            m => break format!("bad reply magic {m:#x}"),
        }
        let cookie = reply.cookie.get();
        let Some(pending) = shared.state.lock().pending.remove(&cookie) else {
            break format!("reply for unknown cookie {cookie}");
        };
        shared.slot_free.notify_one();
        let errno = reply.error.get();
        // Simple replies carry data only on success (proto.md: a server
        // sends no payload after a read error).
        let mut data = Vec::new();
        if errno == 0 && pending.reply_bytes > 0 {
            data = vec![0u8; pending.reply_bytes as usize];
            if let Err(e) = s.read_exact(&mut data) {
                // Kill before `pending` drops, so its caller sees the reason.
                let reason = format!("reading read data failed: {e}");
                shared.kill(reason.clone());
                break reason;
            }
        }
        // The caller may have given up (its split request failed elsewhere).
        let _ = pending.tx.send((errno, data));
    };
    shared.kill(reason);
}

// ---------------------------------------------------------------------------
// The device.

/// A remote NBD export behind [`BlockDevice`].
pub struct NbdDevice {
    name: String,
    identity: u64,
    size_bytes: u64,
    transmission_flags: u16,
    payload_bytes_max: u32,
    conns: Vec<Conn>,
    next_conn: AtomicUsize,
}

impl NbdDevice {
    /// Connects to `uri`. With `connections > 1`, opens that many connections
    /// and spreads requests round robin, but only if the server advertises
    /// `NBD_FLAG_CAN_MULTI_CONN` (else one connection is used).
    pub fn connect(uri: &str, connections: usize) -> DeviceResult<NbdDevice> {
        let open_err = |reason: String| DeviceError::Open {
            spec: uri.to_string(),
            reason,
        };
        let parsed = NbdUri::parse(uri.trim()).map_err(open_err)?;
        let connector = match &parsed.tls {
            Some(creds) => Some(
                TlsConnector::new(creds).map_err(|e| open_err(format!("TLS credentials: {e}")))?,
            ),
            None => None,
        };
        let connect_one = || {
            Conn::open(&parsed, connector.as_ref()).map_err(|e| match &parsed.address {
                NbdAddress::Unix { socket } => {
                    open_err(format!("NBD socket {}: {e}", socket.display()))
                }
                NbdAddress::Tcp { host, port } => {
                    open_err(format!("NBD server {host}:{port}: {e}"))
                }
            })
        };
        let (first, info) = connect_one()?;
        let mut conns = vec![first];
        let wanted = connections.max(1);
        if wanted > 1 && info.transmission_flags & FLAG_CAN_MULTI_CONN == 0 {
            log::info!("{uri}: server lacks NBD_FLAG_CAN_MULTI_CONN; using one connection");
        } else {
            for _ in 1..wanted {
                let (c, other) = connect_one()?;
                if other.size_bytes != info.size_bytes
                    || other.transmission_flags != info.transmission_flags
                {
                    return Err(open_err(
                        "connections disagree on the export size or flags".into(),
                    ));
                }
                conns.push(c);
            }
        }
        Ok(NbdDevice {
            name: uri.trim().to_string(),
            identity: fnv1a64(parsed.normalized().as_bytes()),
            size_bytes: info.size_bytes / SECTOR_BYTES * SECTOR_BYTES,
            transmission_flags: info.transmission_flags,
            payload_bytes_max: info.payload_bytes_max,
            conns,
            next_conn: AtomicUsize::new(0),
        })
    }

    /// Number of open connections (1 unless multi-conn was granted).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// True if the server refuses writes.
    pub fn is_read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }

    fn conn(&self) -> &Conn {
        let i = self.next_conn.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        &self.conns[i]
    }

    fn io_err(&self, what: &'static str, source: io::Error) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            what,
            source,
        }
    }

    fn refuse_if_read_only(&self, what: &'static str) -> DeviceResult<()> {
        if self.is_read_only() {
            return Err(self.io_err(
                what,
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the NBD export is read-only",
                ),
            ));
        }
        Ok(())
    }

    /// Reads without the bounds check: the server judges the range.
    fn read_raw(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        let conn = self.conn();
        let piece_bytes = self.payload_bytes_max as usize;
        // Submit every piece before waiting, so a large read is pipelined.
        let mut tickets = Vec::with_capacity(buf.len().div_ceil(piece_bytes));
        for (i, piece) in buf.chunks(piece_bytes).enumerate() {
            let at = offset + (i * piece_bytes) as u64;
            let t = conn
                .submit(CMD_READ, at, piece.len() as u32, &[])
                .map_err(|e| self.io_err("read", e))?;
            tickets.push(t);
        }
        for (piece, t) in buf.chunks_mut(piece_bytes).zip(tickets) {
            let data = conn.wait(t).map_err(|e| self.io_err("read", e))?;
            piece.copy_from_slice(&data);
        }
        Ok(())
    }

    fn write_raw(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        let conn = self.conn();
        let piece_bytes = self.payload_bytes_max as usize;
        let mut tickets = Vec::with_capacity(buf.len().div_ceil(piece_bytes));
        for (i, piece) in buf.chunks(piece_bytes).enumerate() {
            let at = offset + (i * piece_bytes) as u64;
            let t = conn
                .submit(CMD_WRITE, at, piece.len() as u32, piece)
                .map_err(|e| self.io_err("write", e))?;
            tickets.push(t);
        }
        for t in tickets {
            conn.wait(t).map_err(|e| self.io_err("write", e))?;
        }
        Ok(())
    }
}

impl BlockDevice for NbdDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.read_raw(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.refuse_if_read_only("write")?;
        self.write_raw(buf, offset)
    }

    fn flush(&self) -> DeviceResult<()> {
        if self.transmission_flags & FLAG_SEND_FLUSH == 0 {
            return Ok(()); // proto.md: no flush flag means no volatile cache
        }
        // One connection suffices: with several, CAN_MULTI_CONN was granted,
        // so a flush covers writes completed on every connection (proto.md).
        // Each flush uses the next connection, like any request.
        let conn = self.conn();
        let t = conn
            .submit(CMD_FLUSH, 0, 0, &[])
            .map_err(|e| self.io_err("flush", e))?;
        conn.wait(t).map_err(|e| self.io_err("flush", e))?;
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        if self.transmission_flags & FLAG_SEND_TRIM == 0 {
            return Ok(()); // discard is advisory
        }
        self.refuse_if_read_only("discard")?;
        let conn = self.conn();
        let mut tickets = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(TRIM_BYTES_MAX);
            let t = conn
                .submit(CMD_TRIM, at, n as u32, &[])
                .map_err(|e| self.io_err("discard", e))?;
            tickets.push(t);
            at += n;
        }
        for t in tickets {
            conn.wait(t).map_err(|e| self.io_err("discard", e))?;
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn identity(&self) -> u64 {
        self.identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(export: &str, socket: &str) -> NbdUri {
        NbdUri {
            address: NbdAddress::Unix {
                socket: PathBuf::from(socket),
            },
            export: export.into(),
            tls: None,
        }
    }

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            address: NbdAddress::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
            tls: None,
        }
    }

    #[test]
    fn tls_uris_parse() {
        let p = |s| NbdUri::parse(s).unwrap();
        let u = p("nbds://alice@h:7/e?tls-psk-file=/k/keys.psk");
        assert_eq!(u.address, tcp("h", 7, "").address);
        assert_eq!(u.export, "e");
        assert_eq!(
            u.tls,
            Some(ClientCredentials::Psk {
                file: "/k/keys.psk".into(),
                username: "alice".into()
            })
        );
        let u = p("nbds://h/?tls-certificates=/pki");
        assert_eq!(
            u.tls,
            Some(ClientCredentials::Certificates { dir: "/pki".into() })
        );
        let u = p("nbds+unix:///x?socket=/s&tls-psk-file=/k&tls-username=bob");
        assert_eq!(u.address, unix("", "/s").address);
        assert!(
            matches!(u.tls, Some(ClientCredentials::Psk { ref username, .. }) if username == "bob")
        );
        // TLS does not change which export it is.
        assert_eq!(u.normalized(), "nbd+unix:///x?socket=/s");
        assert_eq!(
            p("nbds://h/?tls-certificates=/p").normalized(),
            "nbd://h:10809/"
        );
    }

    #[test]
    fn unix_uris_parse() {
        let p = |s| NbdUri::parse(s).unwrap();
        assert_eq!(
            p("nbd+unix:///?socket=/tmp/a.sock"),
            unix("", "/tmp/a.sock")
        );
        assert_eq!(p("nbd+unix://?socket=/tmp/a.sock"), unix("", "/tmp/a.sock"));
        assert_eq!(
            p("nbd+unix:///disk?socket=/tmp/a.sock"),
            unix("disk", "/tmp/a.sock")
        );
        assert_eq!(
            p("nbd+unix:///my%20disk%2Fx?socket=/tmp/s%20p.sock"),
            unix("my disk/x", "/tmp/s p.sock")
        );
        assert_eq!(p("NBD+UNIX:///a/b?socket=/s"), unix("a/b", "/s"));
    }

    #[test]
    fn tcp_uris_parse() {
        let p = |s| NbdUri::parse(s).unwrap();
        assert_eq!(p("nbd://localhost"), tcp("localhost", DEFAULT_PORT, ""));
        assert_eq!(
            p("nbd://Host.Example/"),
            tcp("host.example", DEFAULT_PORT, "")
        );
        assert_eq!(
            p("nbd://127.0.0.1:10900/exp"),
            tcp("127.0.0.1", 10900, "exp")
        );
        assert_eq!(p("nbd://[::1]:7/e%C3%A9"), tcp("::1", 7, "eé"));
        assert_eq!(p("nbd://[::1]/"), tcp("::1", DEFAULT_PORT, ""));
    }

    #[test]
    fn bad_uris_are_explained() {
        let cases = [
            ("/dev/sda", "not a URI"),
            ("http://x/", "not an NBD scheme"),
            ("nbds://x/", "TLS"),
            ("nbd+vsock:///", "not supported"),
            ("nbd://", "needs a host"),
            ("nbd://:10809/", "needs a host"),
            ("nbd://h:0/", "not a TCP port"),
            ("nbd://h:99999/", "not a TCP port"),
            ("nbd://h:x/", "not a TCP port"),
            ("nbd://[::1/", "unterminated"),
            ("nbd://u@h/", "user names"),
            ("nbd://h/?socket=/x", "not supported"),
            ("nbd://h/a%zz", "bad percent escape"),
            ("nbd://h/a%ff", "UTF-8"),
            ("nbd://h/a%00", "NUL"),
            ("nbd://h/a#frag", "fragments"),
            ("nbd+unix:///", "needs '?socket="),
            ("nbd+unix:///?socket=rel.sock", "not absolute"),
            ("nbd+unix://host/?socket=/s", "takes no host"),
            ("nbd+unix:///?socket=/a&socket=/b", "twice"),
            ("nbd+unix:///?socket=/a&tls=on", "'tls' is not supported"),
            ("nbd://h/?tls-psk-file=/k", "not supported"),
            ("nbds://h/?tls-psk-file=/k", "needs a user name"),
            ("nbds://h/?tls-psk-file=k", "not absolute"),
            ("nbds://a@h/?tls-psk-file=/k&tls-username=b", "twice"),
            ("nbds://h/?tls-psk-file=/k&tls-certificates=/d", "not both"),
            ("nbds+unix:///?tls-certificates=/d", "needs '?socket="),
        ];
        for (uri, want) in cases {
            let err = NbdUri::parse(uri).expect_err(uri);
            assert!(err.contains(want), "{uri}: '{err}' lacks '{want}'");
        }
    }

    #[test]
    fn normalization_is_canonical() {
        let n = |s: &str| NbdUri::parse(s).unwrap().normalized();
        assert_eq!(n("nbd://HOST/x"), "nbd://host:10809/x");
        assert_eq!(n("nbd://host:10809/x"), "nbd://host:10809/x");
        assert_eq!(n("nbd://[::1]/x"), "nbd://[::1]:10809/x");
        assert_eq!(n("nbd+unix://?socket=/s"), "nbd+unix:///?socket=/s");
        assert_eq!(n("nbd+unix:///a%62?socket=/s"), "nbd+unix:///ab?socket=/s");
        assert_eq!(
            n("nbd+unix:///a%20b?socket=/s"),
            "nbd+unix:///a%20b?socket=/s"
        );
        // Normalizing is idempotent.
        for s in ["nbd://h/a%20b", "nbd+unix:///%C3%A9?socket=/x%26y"] {
            assert_eq!(n(&n(s)), n(s));
        }
    }

    #[test]
    fn identity_hash_is_stable() {
        // FNV-1a test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn server_errors_map_to_errno_messages() {
        let e = server_error(22);
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("EINVAL (errno 22)"));
        assert!(server_error(4242).to_string().contains("errno 4242"));
    }

    /// The bounds check normally stops out-of-range requests before the
    /// server sees them; skip it to see a real server's refusal.
    #[test]
    fn server_side_out_of_range_is_a_clean_error() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let mut child = std::process::Command::new("nbdkit")
            .args(["-U"])
            .arg(&sock)
            .args(["-f", "--exit-with-parent", "memory", "1M"])
            .spawn()
            .expect("nbdkit not found: install the Debian package 'nbdkit'");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // The socket file appears at bind(), before listen().
        while UnixStream::connect(&sock).is_err() {
            assert!(std::time::Instant::now() < deadline, "nbdkit did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        let dev = NbdDevice::connect(&uri, 1).unwrap();
        let mut buf = vec![0u8; 4096];
        let err = dev.read_raw(&mut buf, 1 << 20).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DeviceError::Io { .. }), "{msg}");
        assert!(msg.contains("errno"), "{msg}");
        // The connection survives a server error.
        dev.read_at(&mut buf, 0).unwrap();
        drop(dev);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
