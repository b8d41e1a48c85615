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
//! violation) it is dead. The reader drops every pending sender, so every
//! request waiting on it fails with `DeviceError::Io`; nothing waits
//! forever on a closed socket. Requests go to the connections still up;
//! while none is, the server is unreachable (since that moment: `health`)
//! and every request fails at once with `DeviceError::Io`, without waiting
//! for a connect. A thread per device reconnects with exponential backoff
//! (100 ms doubling to 5 s, each attempt bounded by a 2 s timeout), and
//! only to the same export: same size and flags, or it stays unreachable
//! saying why (link.rs). A flush with no write completed since the last
//! successful one is answered without the server (`flush`), so a cached
//! volume's FLUSH keeps working during an outage when no writeback
//! reached the origin since its last flush.
//!
//! - `uri.rs`: the URIs and their TLS credentials.
//! - `stream.rs`: a connected TCP or Unix socket.
//! - `handshake.rs`: the option haggling, STARTTLS and the TLS relay.
//! - `conn.rs`: the transmission phase (request table, reader thread).
//! - `link.rs`: the connections, the server's reachability, reconnects.
//! - here: the device (`NbdDevice`), which splits requests to the
//!   export's limits and spreads them over its connections.

mod conn;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
mod handshake;
mod link;
mod stream;
mod uri;

use conn::*;
use handshake::*;
use link::*;
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
/// At open: bound on the connect and on each step of the handshake
/// (reconnects have a shorter one: link.rs).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest option reply we accept during the handshake (proto.md: strings are
/// at most 4096 bytes; INFO payloads are tiny).
const OPTION_REPLY_BYTES_MAX: u32 = 64 << 10;
/// Most replies we read to one option: a server that sends NBD_REP_INFO
/// without end would otherwise hold the handshake for good (each read is
/// bounded in time, their number was not).
const OPTION_REPLIES_MAX: usize = 64;

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
    link: Arc<Link>,
    reconnector: Option<JoinHandle<()>>,
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
        let identity = fnv1a64(parsed.normalized().as_bytes());
        let link = Arc::new(Link::new(uri.trim().to_string(), parsed, connector));
        let connect_one = || {
            link.open(CONNECT_TIMEOUT)
                .map_err(|e| match &link.uri().address {
                    NbdAddress::Unix { socket } => {
                        open_err(format!("NBD socket {}: {e}", socket.display()))
                    }
                    NbdAddress::Tcp { host, port } => {
                        open_err(format!("NBD server {host}:{port}: {e}"))
                    }
                })
        };
        let (first, info) = connect_one()?;
        link.add(first);
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
                link.add(c);
            }
        }
        let thread_link = Arc::clone(&link);
        let reconnector = std::thread::Builder::new()
            .name("nbd-client-reconnect".into())
            .spawn(move || thread_link.run_reconnects())
            .map_err(|e| open_err(format!("starting the reconnect thread: {e}")))?;
        Ok(NbdDevice {
            name: uri.trim().to_string(),
            identity,
            size_bytes: info.size_bytes / SECTOR_BYTES * SECTOR_BYTES,
            transmission_flags: info.transmission_flags,
            payload_bytes_max: info.payload_bytes_max,
            link,
            reconnector: Some(reconnector),
        })
    }

    /// Number of connections (1 unless multi-conn was granted), up or not.
    pub fn connection_count(&self) -> usize {
        self.link.connection_count()
    }

    /// True if the server refuses writes.
    pub fn is_read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }

    /// A connection that is up, or the reason none is.
    fn conn(&self, what: &'static str) -> DeviceResult<Arc<Conn>> {
        self.link.pick().map_err(|e| self.io_err(what, e))
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
        let conn = self.conn(what)?;
        let mut tickets = Vec::with_capacity(len.div_ceil(piece_bytes) as usize);
        let mut done = 0;
        let sent = loop {
            if done >= len {
                break Ok(());
            }
            let n = (len - done).min(piece_bytes);
            let piece = done..done + n;
            match conn.submit(cmd, offset + done, n as u32, payload(piece.clone())) {
                Ok(t) => tickets.push((piece, t)),
                Err(e) => break Err(self.io_err(what, e)),
            }
            done += n;
        };
        let any_sent = !tickets.is_empty();
        let replied = sent.and_then(|()| {
            tickets.into_iter().try_for_each(|(piece, t)| {
                reply(piece, conn.wait(t).map_err(|e| self.io_err(what, e))?);
                Ok(())
            })
        });
        // Counted once the command has ended, whatever its outcome: a
        // failed write may still have reached the server (see `flush`).
        if cmd != CMD_READ && any_sent {
            self.link.writes_ended.fetch_add(1, Ordering::AcqRel);
        }
        replied
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
        // proto.md, "Ordering of messages and writes": a flush makes durable
        // the write commands (WRITE, WRITE_ZEROES, TRIM) the server replied
        // to before processing it, and nothing else. `writes_ended` is read
        // before the flush is sent, so every write it counts had ended
        // before the flush left, and a successful flush covers them all
        // (the device contract asks no more: "every completed write"). If
        // none ended since the last successful flush's count, the server
        // has nothing of ours to make durable: the flush is answered here.
        // That keeps a cached volume's FLUSH (a commit, which flushes the
        // origin first) working while the server is unreachable, as long
        // as no writeback reached it since its last flush. A write that
        // failed counts too: it may have reached the server's cache.
        let ended = self.link.writes_ended.load(Ordering::Acquire);
        if ended == self.link.flushed_through.load(Ordering::Acquire) {
            return Ok(());
        }
        // One connection suffices: with several, CAN_MULTI_CONN was granted,
        // so a flush covers writes completed on every connection (proto.md).
        // Each flush uses the next connection, like any request.
        let conn = self.conn("flush")?;
        let t = conn
            .submit(CMD_FLUSH, 0, 0, &[])
            .map_err(|e| self.io_err("flush", e))?;
        if let Err(e) = conn.wait(t) {
            // The server may have dropped the writes it could not make
            // durable; a later flush that succeeds would not cover them.
            self.link.loss_epoch.fetch_add(1, Ordering::AcqRel);
            return Err(self.io_err("flush", e));
        }
        self.link.flushed_through.fetch_max(ended, Ordering::AcqRel);
        Ok(())
    }

    /// Moves at every lost connection (the server may have restarted and
    /// lost its cache with the writes in it) and every failed flush.
    fn loss_epoch(&self) -> u64 {
        self.link.loss_epoch.load(Ordering::Acquire)
    }

    /// The export is thin or flash behind a server: a trim may free space.
    fn discard_helps(&self) -> bool {
        true
    }
    fn reads_in_parallel(&self) -> bool {
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

    fn health(&self) -> Option<super::DeviceHealth> {
        Some(self.link.health())
    }
    fn is_reachable(&self) -> bool {
        self.link.connections_up() > 0
    }
}

impl Drop for NbdDevice {
    fn drop(&mut self) {
        self.link.stop();
        if let Some(t) = self.reconnector.take() {
            let _ = t.join();
        }
        // Closed here, outside the link's lock (closing joins each
        // connection's reader thread), while this device still holds the
        // link.
        drop(self.link.take_conns());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::{Child, Command};
    use std::time::Instant;

    /// `nbdkit -U SOCK -f ARGS`: a real server, killed with SIGKILL (a
    /// crash) by `kill` or on drop.
    struct Nbdkit(Child);

    impl Nbdkit {
        fn start(sock: &Path, args: &[&str]) -> Nbdkit {
            // A killed server leaves its socket file, which nbdkit refuses
            // to replace ("Address already in use").
            let _ = std::fs::remove_file(sock);
            let child = Command::new("nbdkit")
                .arg("-U")
                .arg(sock)
                .args(["-f", "--exit-with-parent"])
                .args(args)
                .spawn()
                .expect("nbdkit not found: install the Debian package 'nbdkit'");
            let server = Nbdkit(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            // The socket file appears at bind(), before listen().
            while UnixStream::connect(sock).is_err() {
                assert!(Instant::now() < deadline, "nbdkit did not start");
                std::thread::sleep(Duration::from_millis(10));
            }
            server
        }

        fn kill(mut self) {
            self.0.kill().unwrap();
            self.0.wait().unwrap();
        }
    }

    impl Drop for Nbdkit {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn uri(sock: &Path) -> String {
        format!("nbd+unix:///?socket={}", sock.display())
    }

    /// A device on `connections` connections to `nbdkit memory 1M` on a
    /// socket in a directory of its own (kept alive by the returned guard).
    fn served(connections: usize) -> (tempfile::TempDir, std::path::PathBuf, Nbdkit, NbdDevice) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let server = Nbdkit::start(&sock, &["memory", "1M"]);
        let dev = NbdDevice::connect(&uri(&sock), connections).unwrap();
        (dir, sock, server, dev)
    }

    /// Polls the device's health until `done` holds (10 s at most).
    fn wait_health(
        dev: &NbdDevice,
        what: &str,
        done: impl Fn(&DeviceHealth) -> bool,
    ) -> DeviceHealth {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let h = dev.health().expect("an NBD device has a health");
            if done(&h) {
                return h;
            }
            assert!(Instant::now() < deadline, "waiting for {what}: {h:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn unix_now_s() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    use crate::device::DeviceHealth;

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
        let (_dir, _, server, dev) = served(1);
        let mut buf = vec![0u8; 4096];
        let err = dev.read_raw(&mut buf, 1 << 20).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DeviceError::Io { .. }), "{msg}");
        assert!(msg.contains("errno"), "{msg}");
        // The connection survives a server error.
        dev.read_at(&mut buf, 0).unwrap();
        drop(dev);
        server.kill();
    }

    /// A server killed under the device: requests fail at once with Io
    /// and the device says since when; a flush with nothing written since
    /// the last one still succeeds; a server started again on the same
    /// socket is reconnected (both connections: nbdkit grants multi-conn)
    /// and I/O works.
    #[test]
    fn a_lost_server_fails_fast_and_is_reconnected() {
        let (_dir, sock, server, dev) = served(2);
        assert_eq!(dev.connection_count(), 2);
        dev.write_at(&[0xab; 4096], 0).unwrap();
        dev.flush().unwrap();
        let h = dev.health().unwrap();
        assert!(h.reachable && h.unreachable_since_unix_s.is_none(), "{h:?}");
        assert_eq!((h.connections_up, h.connections), (2, 2));

        let killed_at = unix_now_s();
        server.kill();
        let h = wait_health(&dev, "the loss", |h| !h.reachable);
        let since = h.unreachable_since_unix_s.expect("since when");
        assert!(since >= killed_at && since <= unix_now_s(), "{h:?}");
        assert!(h.unreachable_s.is_some_and(|s| s >= 0.0), "{h:?}");
        let why = h.last_error.clone().unwrap_or_default();
        assert!(why.contains("server closed the connection"), "{h:?}");
        assert_eq!(h.connections_up, 0);

        // Fail fast, with the reason, for every kind of request.
        let mut buf = vec![0u8; 4096];
        let t = Instant::now();
        let err = dev.read_at(&mut buf, 0).unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        let msg = err.to_string();
        assert!(matches!(err, DeviceError::Io { .. }), "{msg}");
        assert!(
            msg.contains("unreachable") && msg.contains("server closed"),
            "{msg}"
        );
        assert!(matches!(dev.write_at(&buf, 0), Err(DeviceError::Io { .. })));
        assert!(matches!(dev.discard(0, 4096), Err(DeviceError::Io { .. })));
        // Nothing reached the server since the last flush (the write above
        // never left): nothing to make durable, no error.
        dev.flush().unwrap();

        let server = Nbdkit::start(&sock, &["memory", "1M"]);
        let h = wait_health(&dev, "the reconnect", |h| h.connections_up == 2);
        assert!(h.reachable && h.unreachable_since_unix_s.is_none(), "{h:?}");
        assert!(
            h.reconnects >= 1 && h.reconnect_attempts >= h.reconnects,
            "{h:?}"
        );
        assert_eq!(h.next_attempt_s, None);
        // A new nbdkit memory export: zeroes, and it takes I/O.
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, vec![0u8; 4096]);
        dev.write_at(&[0xcd; 4096], 8192).unwrap();
        dev.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, vec![0xcd; 4096]);
        dev.flush().unwrap();
        drop(dev);
        server.kill();
    }

    /// A write the server acknowledged but no flush covered: a flush while
    /// the server is unreachable cannot promise it, so it fails; once a
    /// server is back, a flush is sent again.
    #[test]
    fn an_unflushed_write_makes_the_flush_fail_while_unreachable() {
        let (_dir, sock, server, dev) = served(1);
        dev.write_at(&[1; 512], 0).unwrap();
        server.kill();
        wait_health(&dev, "the loss", |h| !h.reachable);
        let t = Instant::now();
        let err = dev.flush().unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        assert!(err.to_string().contains("unreachable"), "{err}");
        let server = Nbdkit::start(&sock, &["memory", "1M"]);
        wait_health(&dev, "the reconnect", |h| h.reachable);
        dev.flush().unwrap();
        drop(dev);
        server.kill();
    }

    /// A server back with an export of another size is not the origin the
    /// device was opened on: the device stays unreachable, saying why, and
    /// reconnects once the right export is back.
    #[test]
    fn a_resized_export_is_refused_on_reconnect() {
        let (_dir, sock, server, dev) = served(1);
        server.kill();
        wait_health(&dev, "the loss", |h| !h.reachable);
        let wrong = Nbdkit::start(&sock, &["memory", "2M"]);
        let h = wait_health(&dev, "the refusal", |h| {
            h.last_error
                .as_deref()
                .is_some_and(|e| e.contains("size changed"))
        });
        assert!(
            !h.reachable && h.unreachable_since_unix_s.is_some(),
            "{h:?}"
        );
        assert_eq!(h.reconnects, 0, "{h:?}");
        let err = dev.read_at(&mut [0u8; 512], 0).unwrap_err().to_string();
        assert!(
            err.contains("from 1048576 to 2097152 bytes"),
            "the request's error says why: {err}"
        );
        wrong.kill();
        let server = Nbdkit::start(&sock, &["memory", "1M"]);
        wait_health(&dev, "the reconnect", |h| h.reachable);
        dev.read_at(&mut [0u8; 512], 0).unwrap();
        drop(dev);
        server.kill();
    }

    /// Closing a device whose server is gone neither hangs nor waits for a
    /// backoff.
    #[test]
    fn a_device_closes_promptly_while_unreachable() {
        let (_dir, _, server, dev) = served(1);
        server.kill();
        wait_health(&dev, "the loss", |h| !h.reachable);
        let t = Instant::now();
        drop(dev);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
