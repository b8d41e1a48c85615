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
//!
//! - `uri.rs`: the URIs and their TLS credentials.
//! - `stream.rs`: a connected TCP or Unix socket.
//! - `handshake.rs`: the option haggling, STARTTLS and the TLS relay.
//! - `conn.rs`: the transmission phase (request table, reader thread).
//! - here: the device (`NbdDevice`), which splits requests to the
//!   export's limits and spreads them over its connections.

mod conn;
mod handshake;
mod stream;
mod uri;

use conn::*;
use handshake::*;
use stream::*;
pub(in crate::device) use uri::percent_decode;
use uri::*;
pub use uri::{NbdAddress, NbdUri};

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::ops::Range;
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

    /// Sends `cmd` for `len` bytes at `offset` in pieces (a trim of up to
    /// `TRIM_BYTES_MAX`, else of up to the server's payload size) on one
    /// connection, every piece submitted before any reply is awaited (a
    /// large request is pipelined). `payload` gives a piece's data (range
    /// relative to `offset`); `reply` takes each reply, in order.
    fn in_pieces<'a>(
        &self,
        cmd: u16,
        offset: u64,
        len: u64,
        payload: impl Fn(Range<u64>) -> &'a [u8],
        mut reply: impl FnMut(Range<u64>, Vec<u8>),
    ) -> DeviceResult<()> {
        let (what, piece_bytes) = match cmd {
            CMD_READ => ("read", self.payload_bytes_max as u64),
            CMD_WRITE => ("write", self.payload_bytes_max as u64),
            _ => ("discard", TRIM_BYTES_MAX),
        };
        let conn = self.conn();
        let mut tickets = Vec::with_capacity(len.div_ceil(piece_bytes) as usize);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(piece_bytes);
            let piece = done..done + n;
            let t = conn
                .submit(cmd, offset + done, n as u32, payload(piece.clone()))
                .map_err(|e| self.io_err(what, e))?;
            tickets.push((piece, t));
            done += n;
        }
        for (piece, t) in tickets {
            reply(piece, conn.wait(t).map_err(|e| self.io_err(what, e))?);
        }
        Ok(())
    }

    /// Reads without the bounds check: the server judges the range.
    fn read_raw(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        let len = buf.len() as u64;
        self.in_pieces(
            CMD_READ,
            offset,
            len,
            |_| &[],
            |p, data| buf[p.start as usize..p.end as usize].copy_from_slice(&data),
        )
    }

    fn write_raw(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        let payload = |p: Range<u64>| &buf[p.start as usize..p.end as usize];
        self.in_pieces(CMD_WRITE, offset, buf.len() as u64, payload, |_, _| {})
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

    /// The export is thin or flash behind a server: a trim may free space.
    fn discard_helps(&self) -> bool {
        true
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        if self.transmission_flags & FLAG_SEND_TRIM == 0 {
            return Ok(()); // discard is advisory
        }
        self.refuse_if_read_only("discard")?;
        self.in_pieces(CMD_TRIM, offset, len, |_| &[], |_, _| {})
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
