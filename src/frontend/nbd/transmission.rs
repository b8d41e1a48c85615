//! The transmission phase: request validation ([`check_request`], pure, so
//! it can be fuzzed), execution (read-modify-write of partial sectors,
//! block status) and the pipelined connection loop ([`run`]).
//!
//! One task reads requests in order (a write's payload must be consumed
//! before the next header); each valid request runs in its own task; replies
//! go to one writer task and may leave in any order (proto.md
//! "Transmission": replies need not be in request order).
//!
//! Bounds, all taken before the reader reads on, so a client that sends
//! faster than the volume takes is slowed by TCP back pressure (its socket
//! is not read) rather than growing the daemon: requests in flight per
//! connection, and bytes held for them (write payloads, read data,
//! read-modify-write sectors, extents; see [`Action::buffer_bytes`]) per
//! connection and across all connections, and for write payloads still
//! arriving a share of the total. A reply write or a write payload that
//! makes no progress for the stall timeout ends the connection, so a
//! client that stops reading its replies holds its buffers only that long;
//! one not through within the transfer timeout ends it too, so neither
//! does a client that trickles a byte now and then.
//!
//! Byte-granular requests (from clients that did not negotiate block
//! sizes) reach the volume, which takes whole 512-byte sectors, as: reads
//! of the covering sectors, cut to the requested bytes; writes and zeroing
//! as read-modify-write of the partial first and last sectors under an
//! exclusive [`RangeLocks`] lock on the covering sectors (every other write
//! holds a shared lock on its range, so none can land between the read and
//! the write-back); trims rounded inward to whole sectors (a trim is a
//! hint; the bytes it leaves alone keep their contents).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use log::{debug, warn};
use tokio::io::{
    AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use super::handshake::{MetaContexts, TransmissionMode};
use super::ranges::RangeLocks;
use crate::device::{AlignedBuf, SECTOR_BYTES};
use crate::nbd::proto::{self, Command, Request};
use crate::volume::{
    self, ErrorKind, Extent, Volume, VolumeError, VolumeResult, EFFECT_PIECE_BYTES,
    EXTENTS_PER_CALL_MAX, PREFETCH_PIECE_BYTES,
};

const _: () = assert!(volume::ALLOC_HOLE == proto::STATE_HOLE);
const _: () = assert!(volume::ALLOC_ZERO == proto::STATE_ZERO);
const _: () = assert!(volume::CACHE_CACHED == proto::STATE_CACHED);
const _: () = assert!(volume::CACHE_DIRTY == proto::STATE_DIRTY);

/// What a request may do on this connection.
#[derive(Debug, Clone, Copy)]
pub struct ExportLimits {
    pub size_bytes: u64,
    pub read_only: bool,
    /// Largest READ or WRITE payload; a larger WRITE ends the connection.
    pub max_request_bytes: u32,
    /// Offsets and lengths must be multiples of this: 512 for a client
    /// that negotiated block sizes, 1 for one that did not.
    pub min_block_bytes: u32,
    /// The metadata contexts the client selected (none: no block status).
    pub contexts: MetaContexts,
    /// The volume's block size, for what a request is charged.
    pub block_bytes: u32,
}

/// A validated operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        len: u32,
    },
    BlockStatus {
        offset: u64,
        len: u32,
        req_one: bool,
    },
    /// A zero-length request: valid, nothing to do, reply success.
    Noop {
        is_read: bool,
    },
}

/// The 512-byte sectors covering `[offset, offset + len)`: (start, bytes).
pub fn sector_span(offset: u64, len: u64) -> (u64, u64) {
    let start = offset / SECTOR_BYTES * SECTOR_BYTES;
    let end = (offset + len).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
    (start, end - start)
}

fn is_aligned(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(SECTOR_BYTES) && len.is_multiple_of(SECTOR_BYTES)
}

/// Bytes of read-modify-write buffer for zeroing a partial first and last
/// sector.
const EDGE_SECTORS_BYTES: u64 = 2 * SECTOR_BYTES;

/// The volume's bookkeeping per block of a request, generously: the
/// engine's segment is 32 bytes.
const PER_BLOCK_BYTES: u64 = 64;

/// The zero buffer the engine writes a WRITE_ZEROES piece from.
const ZERO_BUFFER_BYTES: u64 = 1 << 20;

/// What a BLOCK_STATUS holds until its reply is written: per context (two
/// at most), the volume's extents and their descriptors.
const BLOCK_STATUS_BYTES: u64 =
    2 * EXTENTS_PER_CALL_MAX as u64 * (std::mem::size_of::<Extent>() as u64 + 8);

/// What a read of `span` bytes holds at most while it runs: the data, and
/// for the sectors the cache lacks a second buffer the origin is read into,
/// which covers the whole blocks touched (a block more at each end).
fn read_bytes(span: u64, block_bytes: u64) -> u64 {
    2 * span + 2 * block_bytes
}

impl Action {
    /// Bytes of buffer the action holds while it runs on a volume of
    /// `block_bytes` blocks: write payload, read data and the origin
    /// buffer of a miss, read-modify-write sectors, zeroes, extents; a
    /// CACHE, TRIM or WRITE_ZEROES of any length only one piece's worth.
    pub fn buffer_bytes(&self, block_bytes: u64) -> u64 {
        let effect = |len: u32| {
            let piece = u64::from(len).min(EFFECT_PIECE_BYTES);
            (piece / block_bytes.max(1) + 2) * PER_BLOCK_BYTES
        };
        match *self {
            Action::Read { offset, len } => {
                read_bytes(sector_span(offset, u64::from(len)).1, block_bytes)
            }
            Action::Write { offset, len, .. } => sector_span(offset, u64::from(len)).1,
            Action::Cache { offset, len } => {
                let span = sector_span(offset, u64::from(len)).1;
                read_bytes(span.min(PREFETCH_PIECE_BYTES), block_bytes)
            }
            Action::WriteZeroes { len, .. } => {
                effect(len) + ZERO_BUFFER_BYTES.min(u64::from(len)) + EDGE_SECTORS_BYTES
            }
            Action::Trim { len, .. } => effect(len),
            Action::BlockStatus { .. } => BLOCK_STATUS_BYTES,
            Action::Flush | Action::Noop { .. } => 0,
        }
    }

    /// Memory the action is charged against the buffer limits before its
    /// payload is read: its buffer, plus 1/32 of it for the volume's
    /// bookkeeping of the request (the engine keeps a segment per cache
    /// block: 4 MiB for three 64 MiB writes in flight, measured by
    /// tests/serve_limits.rs, about 2%).
    pub fn charge_bytes(&self, block_bytes: u64) -> u64 {
        let b = self.buffer_bytes(block_bytes);
        b + b / 32
    }
}

/// The server's decision on one request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    Execute(Action),
    /// NBD_CMD_DISC: stop reading, finish in-flight requests, close.
    Disconnect,
    /// Consume `payload_bytes` of write payload, then reply `errno`.
    Fail {
        errno: u32,
        payload_bytes: u32,
        why: &'static str,
    },
    /// Close the connection: the stream cannot be resynchronised or the
    /// request cannot be consumed within the memory bound.
    Drop(&'static str),
}

/// Checks a request against the connection's limits. Order matters: the
/// payload size is settled first, so every error after it still consumes
/// the payload and keeps the stream framed.
pub fn check_request(req: &Request, limits: &ExportLimits) -> Disposition {
    let payload_bytes = if req.command == Command::Write {
        req.length
    } else {
        0
    };
    if payload_bytes > limits.max_request_bytes {
        // NBD proto.md "Block size constraints": the server MAY close the
        // connection on a payload beyond the maximum; consuming it would
        // need unbounded memory or a drain we would rather not offer.
        return Disposition::Drop("write payload larger than the maximum block size");
    }
    let fail = |(errno, why): Refusal| Disposition::Fail {
        errno,
        payload_bytes,
        why,
    };
    if let Err(r) = check_command(req, limits) {
        return fail(r);
    }
    match req.command {
        Command::Disc => return Disposition::Disconnect,
        // Offset and length of FLUSH are ignored (the client MUST send 0).
        Command::Flush => return Disposition::Execute(Action::Flush),
        _ => {}
    }
    let checked = if req.length == 0 {
        zero_length(req, limits)
    } else {
        check_range(req, limits).and_then(|()| action(req))
    };
    checked.map_or_else(fail, Disposition::Execute)
}

/// Why a request fails: (errno, a reason for the log).
type Refusal = (u32, &'static str);

/// The command, its flags, and whether this export allows it.
fn check_command(req: &Request, limits: &ExportLimits) -> Result<(), Refusal> {
    // FUA is valid on every command once SEND_FUA is advertised (proto.md
    // NBD_CMD_FLAG_FUA); NO_HOLE and FAST_ZERO only on WRITE_ZEROES;
    // REQ_ONE only on BLOCK_STATUS; DF is not advertised, so it is unknown.
    let allowed_flags = match req.command {
        Command::WriteZeroes => {
            proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO
        }
        Command::BlockStatus => proto::CMD_FLAG_FUA | proto::CMD_FLAG_REQ_ONE,
        _ => proto::CMD_FLAG_FUA,
    };
    if let Command::Unknown(_) = req.command {
        return Err((proto::EINVAL, "unknown command"));
    }
    if req.flags & !allowed_flags != 0 {
        return Err((proto::EINVAL, "unknown or unsupported command flags"));
    }
    // proto.md NBD_CMD_BLOCK_STATUS: SHOULD reply EINVAL to a client that
    // selected no metadata context.
    if req.command == Command::BlockStatus && limits.contexts.is_empty() {
        return Err((proto::EINVAL, "no metadata context selected"));
    }
    let writes = matches!(
        req.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && limits.read_only {
        return Err((proto::EPERM, "write to a read-only export"));
    }
    Ok(())
}

/// The errno of a range error: ENOSPC for a write (proto.md), EINVAL
/// otherwise.
fn range_errno(req: &Request) -> u32 {
    if matches!(req.command, Command::Write | Command::WriteZeroes) {
        proto::ENOSPC
    } else {
        proto::EINVAL
    }
}

/// A request of no bytes: done at once if its offset is inside the export.
fn zero_length(req: &Request, limits: &ExportLimits) -> Result<Action, Refusal> {
    if req.offset > limits.size_bytes {
        return Err((range_errno(req), "offset beyond the end of the export"));
    }
    // A success reply to BLOCK_STATUS needs an extent of length > 0.
    if req.command == Command::BlockStatus {
        return Err((proto::EINVAL, "block status of zero bytes"));
    }
    Ok(Action::Noop {
        is_read: req.command == Command::Read,
    })
}

/// A request of some bytes: within the maximum, aligned to the minimum
/// block size, inside the export.
fn check_range(req: &Request, limits: &ExportLimits) -> Result<(), Refusal> {
    let (offset, len) = (req.offset, req.length);
    if req.command == Command::Read && len > limits.max_request_bytes {
        return Err((proto::EINVAL, "read larger than the maximum block size"));
    }
    // proto.md "Block size constraints": SHOULD fail requests not aligned
    // to the minimum block size the client agreed to with EINVAL.
    let min = u64::from(limits.min_block_bytes.max(1));
    if !offset.is_multiple_of(min) || !u64::from(len).is_multiple_of(min) {
        return Err((
            proto::EINVAL,
            "request not aligned to the minimum block size",
        ));
    }
    let end = offset.checked_add(u64::from(len));
    if end.is_none_or(|e| e > limits.size_bytes) {
        return Err((range_errno(req), "request beyond the end of the export"));
    }
    Ok(())
}

/// What a checked request of some bytes asks the volume to do.
fn action(req: &Request) -> Result<Action, Refusal> {
    let (offset, len) = (req.offset, req.length);
    let fua = req.flags & proto::CMD_FLAG_FUA != 0;
    let fast_zero = req.flags & proto::CMD_FLAG_FAST_ZERO != 0;
    Ok(match req.command {
        Command::Read => Action::Read { offset, len },
        Command::Write => Action::Write { offset, len, fua },
        Command::Trim => Action::Trim { offset, len, fua },
        Command::WriteZeroes if fast_zero => {
            // Zeroing is never faster than writing here (proto.md
            // NBD_CMD_FLAG_FAST_ZERO: fail quickly with ENOTSUP).
            return Err((proto::ENOTSUP, "fast zero not supported"));
        }
        Command::WriteZeroes => Action::WriteZeroes { offset, len, fua },
        Command::Cache => Action::Cache { offset, len },
        Command::BlockStatus => Action::BlockStatus {
            offset,
            len,
            req_one: req.flags & proto::CMD_FLAG_REQ_ONE != 0,
        },
        Command::Disc | Command::Flush | Command::Unknown(_) => {
            unreachable!("handled by check_request")
        }
    })
}

/// Turns a volume's extents into NBD block status descriptors for a
/// request of `len` bytes: clipped to `len`, adjacent runs of one status
/// merged, at most [`proto::BLOCK_STATUS_EXTENTS_MAX`] (one with
/// `req_one`). Never empty: a volume that reports nothing gets one extent
/// of status 0 over the whole request, which every context allows.
pub fn descriptors(extents: &[Extent], len: u32, req_one: bool) -> Vec<(u32, u32)> {
    let cap = if req_one {
        1
    } else {
        proto::BLOCK_STATUS_EXTENTS_MAX
    };
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut left = len;
    for e in extents {
        if left == 0 {
            break;
        }
        let n = e.len.min(u64::from(left)) as u32;
        if n == 0 {
            continue;
        }
        let full = out.len() == cap;
        match out.last_mut() {
            Some(last) if last.1 == e.flags => last.0 += n,
            _ if full => break,
            _ => out.push((n, e.flags)),
        }
        left -= n;
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    out
}

/// Maps a volume error to an NBD error number.
pub fn errno_of(e: &VolumeError) -> u32 {
    match e.kind {
        ErrorKind::Io => proto::EIO,
        ErrorKind::Invalid => proto::EINVAL,
        ErrorKind::NoSpace => proto::ENOSPC,
        ErrorKind::ReadOnly => proto::EPERM,
        ErrorKind::NotSupported => proto::ENOTSUP,
        ErrorKind::ShuttingDown => proto::ESHUTDOWN,
    }
}

/// Per-connection bounds.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub in_flight_max: usize,
    /// Bytes charged to this connection's in-flight requests
    /// ([`Action::charge_bytes`]).
    pub buffered_bytes_max: u32,
    /// How long in-flight requests may run after shutdown before the
    /// connection is dropped without their replies.
    pub shutdown_grace: Duration,
    /// A reply write or a write payload read that makes no progress for
    /// this long ends the connection.
    pub stall_timeout: Duration,
    /// A write payload, or a reply, not through the socket this long after
    /// its first byte ends the connection, progress or not: a client that
    /// trickles a byte now and then defeats the stall timeout, not this.
    pub transfer_timeout: Duration,
}

/// Bytes that requests are charged against: a connection's, the server's.
#[derive(Clone)]
pub struct Budget {
    permits: Arc<Semaphore>,
    max_bytes: u64,
}

impl Budget {
    /// At most 256 TiB (what a tokio semaphore holds; the server checks).
    pub fn new(max_bytes: u64) -> Budget {
        Budget {
            permits: Arc::new(Semaphore::new(max_bytes as usize)),
            max_bytes,
        }
    }

    /// Waits for `bytes` of the budget (`None` for none). A request never
    /// takes more than the whole budget (the server configuration keeps
    /// the largest below it), so none waits for good.
    async fn take(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        if bytes == 0 {
            return None;
        }
        let n = bytes.min(self.max_bytes).min(u64::from(u32::MAX)) as u32;
        let permit = self.permits.clone().acquire_many_owned(n).await;
        Some(permit.expect("never closed"))
    }
}

/// What every connection to one export shares.
pub struct SharedExport<V> {
    pub volume: Arc<V>,
    pub locks: Arc<RangeLocks>,
    /// Bytes held by the requests of all connections together.
    pub buffered_total: Budget,
    /// The share of `buffered_total` that write payloads may hold while
    /// they arrive. The client decides how fast that is; the rest of the
    /// total stays for requests whose bytes the server has (reads, writes
    /// received), so clients that trickle their payloads cannot hold all
    /// of it (they are cut off at the transfer timeout).
    pub receiving: Budget,
}

impl<V> Clone for SharedExport<V> {
    fn clone(&self) -> Self {
        SharedExport {
            volume: self.volume.clone(),
            locks: self.locks.clone(),
            buffered_total: self.buffered_total.clone(),
            receiving: self.receiving.clone(),
        }
    }
}

enum ReplyBody {
    /// Success without data.
    Done {
        is_read: bool,
    },
    /// Read data: `len` bytes of `data` from `start` (a byte-granular read
    /// reads the covering sectors).
    Data {
        offset: u64,
        data: AlignedBuf,
        start: usize,
        len: usize,
    },
    /// One chunk per selected metadata context: (context id, extents).
    BlockStatus {
        chunks: Vec<(u32, Vec<(u32, u32)>)>,
    },
    Error {
        errno: u32,
        message: String,
    },
}

/// The permits a request holds until its reply is written, so buffered
/// replies stay within the bounds.
struct Permits {
    _request: OwnedSemaphorePermit,
    _conn_bytes: Option<OwnedSemaphorePermit>,
    _total_bytes: Option<OwnedSemaphorePermit>,
}

/// A write's share of [`SharedExport::receiving`], held until its payload
/// is in.
type Receiving = Option<OwnedSemaphorePermit>;

struct Reply {
    cookie: u64,
    body: ReplyBody,
    _permits: Permits,
}

/// Why a connection ended.
#[derive(Debug)]
pub enum ConnEnd {
    /// NBD_CMD_DISC or end of stream between requests.
    Clean,
    ServerShutdown,
    /// A protocol violation, a stall or an I/O error; the message says which.
    Broken(String),
}

/// Resolves when shutdown is requested; never if the sender is gone.
pub(crate) async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Serves requests on a connection in transmission phase until it ends.
#[allow(clippy::too_many_arguments)]
pub async fn run<R, W, V>(
    rd: R,
    wr: W,
    export: SharedExport<V>,
    limits: ExportLimits,
    mode: TransmissionMode,
    conn: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) -> ConnEnd
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    V: Volume,
{
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let wr = StallGuard::new(wr, conn.stall_timeout);
    let writer = tokio::spawn(write_replies(wr, rx, mode, conn.transfer_timeout));
    let writer_abort = writer.abort_handle();
    let mut rd = BufReader::with_capacity(64 << 10, rd);
    let reader = Reader {
        export: &export,
        limits: &limits,
        conn: &conn,
        in_flight: Arc::new(Semaphore::new(conn.in_flight_max.max(1))),
        conn_bytes: Budget::new(u64::from(conn.buffered_bytes_max)),
        tx: &tx,
    };

    let end = tokio::select! {
        biased;
        _ = shutdown_requested(&mut shutdown) => ConnEnd::ServerShutdown,
        _ = tx.closed() => ConnEnd::Broken("reply writer failed".into()),
        end = reader.read_requests(&mut rd) => end,
    };
    drop(reader);
    drop(tx);
    // In-flight tasks hold senders; the writer ends after their replies.
    match tokio::time::timeout(conn.shutdown_grace, writer).await {
        Ok(Ok(Ok(()))) => end,
        Ok(Ok(Err(e))) => ConnEnd::Broken(format!("writing replies: {e}")),
        Ok(Err(e)) => ConnEnd::Broken(format!("reply writer: {e}")),
        Err(_) => {
            // A client that stops reading must not keep the socket open.
            writer_abort.abort();
            ConnEnd::Broken("replies not done within the shutdown grace time".into())
        }
    }
}

struct Reader<'a, V> {
    export: &'a SharedExport<V>,
    limits: &'a ExportLimits,
    conn: &'a ConnLimits,
    in_flight: Arc<Semaphore>,
    conn_bytes: Budget,
    tx: &'a mpsc::UnboundedSender<Reply>,
}

impl<V: Volume> Reader<'_, V> {
    async fn read_requests<R>(&self, rd: &mut BufReader<R>) -> ConnEnd
    where
        R: AsyncRead + Unpin,
    {
        let mut header = [0u8; proto::REQUEST_HEADER_BYTES];
        loop {
            // A clean close is an EOF before the first byte of a header.
            match rd.read(&mut header[..1]).await {
                Ok(0) => return ConnEnd::Clean,
                Ok(_) => {}
                Err(e) => return ConnEnd::Broken(format!("reading request: {e}")),
            }
            if let Err(e) = rd.read_exact(&mut header[1..]).await {
                return ConnEnd::Broken(format!("reading request: {e}"));
            }
            let req = match proto::parse_request(&header) {
                Ok(r) => r,
                Err(e) => return ConnEnd::Broken(e.to_string()),
            };
            let disposition = check_request(&req, self.limits);
            let (charge, receiving) = match disposition {
                Disposition::Execute(a) => {
                    let c = a.charge_bytes(u64::from(self.limits.block_bytes));
                    (
                        c,
                        if matches!(a, Action::Write { .. }) {
                            c
                        } else {
                            0
                        },
                    )
                }
                Disposition::Fail { .. } | Disposition::Disconnect | Disposition::Drop(_) => (0, 0),
            };
            let (permits, receiving) = self.permits(charge, receiving).await;
            if let Some(end) = self
                .dispose(rd, &req, disposition, permits, receiving)
                .await
            {
                return end;
            }
        }
    }

    /// Carries out what `check_request` decided for `req`, holding
    /// `permits` until its reply is sent; `Some` ends the connection.
    async fn dispose<R>(
        &self,
        rd: &mut BufReader<R>,
        req: &Request,
        disposition: Disposition,
        permits: Permits,
        receiving: Receiving,
    ) -> Option<ConnEnd>
    where
        R: AsyncRead + Unpin,
    {
        let send = |body, permits| {
            // A send fails only when the writer is gone; the select in
            // `run` notices that.
            let _ = self.tx.send(Reply {
                cookie: req.cookie,
                body,
                _permits: permits,
            });
        };
        match disposition {
            Disposition::Disconnect => return Some(ConnEnd::Clean),
            Disposition::Drop(why) => return Some(ConnEnd::Broken(why.into())),
            Disposition::Fail {
                errno,
                payload_bytes,
                why,
            } => {
                if let Err(e) = skip(rd, payload_bytes, self.transfer()).await {
                    return Some(ConnEnd::Broken(format!("reading write payload: {e}")));
                }
                debug!("request {req:?} failed: {why}");
                let message = why.to_string();
                send(ReplyBody::Error { errno, message }, permits);
            }
            Disposition::Execute(Action::Noop { is_read }) => {
                send(ReplyBody::Done { is_read }, permits)
            }
            Disposition::Execute(action) => {
                let payload = match self.read_write_payload(rd, action).await {
                    Ok(p) => p,
                    Err(e) => return Some(ConnEnd::Broken(format!("reading write payload: {e}"))),
                };
                drop(receiving);
                let export = self.export.clone();
                let contexts = self.limits.contexts;
                let (tx, cookie) = (self.tx.clone(), req.cookie);
                tokio::spawn(async move {
                    let body = execute(&export, contexts, action, payload).await;
                    let _ = tx.send(Reply {
                        cookie,
                        body,
                        _permits: permits,
                    });
                });
            }
        }
        None
    }

    /// A write's payload, placed where it belongs in the sectors that cover
    /// it (a read-modify-write fills in the rest); `None` for other actions.
    async fn read_write_payload<R>(
        &self,
        rd: &mut BufReader<R>,
        action: Action,
    ) -> std::io::Result<Option<AlignedBuf>>
    where
        R: AsyncRead + Unpin,
    {
        let Action::Write { offset, len, .. } = action else {
            return Ok(None);
        };
        let (start, span) = sector_span(offset, u64::from(len));
        let mut buf = AlignedBuf::zeroed(span as usize);
        let at = (offset - start) as usize;
        read_payload(rd, &mut buf[at..at + len as usize], self.transfer()).await?;
        Ok(Some(buf))
    }

    /// The bounds on a payload whose reading starts now.
    fn transfer(&self) -> Transfer {
        Transfer {
            stall: self.conn.stall_timeout,
            deadline: Instant::now() + self.conn.transfer_timeout,
        }
    }

    /// Waits for a request slot and `bytes` of buffer on this connection and
    /// across the server, and (a write) `receiving` bytes of the share
    /// payloads may hold while they arrive. The reader does not read on
    /// meanwhile: that is the back pressure. The receiving share is taken
    /// before the total, so a write waiting for it holds nothing that
    /// other connections need.
    async fn permits(&self, bytes: u64, receiving: u64) -> (Permits, Receiving) {
        let request = self
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let conn_bytes = self.conn_bytes.take(bytes).await;
        let receiving = self.export.receiving.take(receiving).await;
        let total_bytes = self.export.buffered_total.take(bytes).await;
        let permits = Permits {
            _request: request,
            _conn_bytes: conn_bytes,
            _total_bytes: total_bytes,
        };
        (permits, receiving)
    }
}

fn stalled(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} made no progress"))
}

fn late(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} not through within the transfer timeout"),
    )
}

/// How long a payload may take: no byte for `stall`, or not all of it by
/// `deadline`, ends the connection.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    stall: Duration,
    deadline: Instant,
}

/// Reads `buf` in full under `limits`. Bytes the reader has buffered
/// already are taken without a timer.
async fn read_payload<R>(rd: &mut BufReader<R>, buf: &mut [u8], limits: Transfer) -> io::Result<()>
where
    R: AsyncRead + Unpin,
{
    let mut done = 0;
    while done < buf.len() {
        let buffered = rd.buffer();
        if !buffered.is_empty() {
            let n = buffered.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&buffered[..n]);
            Pin::new(&mut *rd).consume(n);
            done += n;
            continue;
        }
        let left = limits.deadline.saturating_duration_since(Instant::now());
        let n = match tokio::time::timeout(limits.stall.min(left), rd.read(&mut buf[done..])).await
        {
            Ok(n) => n?,
            Err(_) if limits.stall < left => return Err(stalled("write payload")),
            Err(_) => return Err(late("write payload")),
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        done += n;
    }
    Ok(())
}

/// Reads and discards `n` bytes, under the same bounds.
async fn skip<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    n: u32,
    limits: Transfer,
) -> io::Result<()> {
    let mut scratch = vec![0u8; (n as usize).min(64 << 10)];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(scratch.len());
        read_payload(rd, &mut scratch[..k], limits).await?;
        left -= k;
    }
    Ok(())
}

async fn execute<V: Volume>(
    ex: &SharedExport<V>,
    contexts: MetaContexts,
    action: Action,
    payload: Option<AlignedBuf>,
) -> ReplyBody {
    let v = &*ex.volume;
    let result = match action {
        Action::Read { offset, len } => return read(v, offset, len).await,
        Action::Write { offset, len, fua } => {
            let buf = payload.expect("write payload read before execute");
            write(ex, offset, len, buf, fua).await
        }
        Action::Flush => v.flush().await,
        Action::Trim { offset, len, fua } => {
            // Round inward: a trim may do less than asked (proto.md
            // NBD_CMD_TRIM), and must not touch bytes it was not given.
            let start = offset.div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
            let end = (offset + u64::from(len)) / SECTOR_BYTES * SECTOR_BYTES;
            if start < end {
                let _g = ex.locks.lock(start, end, false).await;
                v.trim(start, end - start, fua).await
            } else {
                Ok(())
            }
        }
        Action::WriteZeroes { offset, len, fua } => write_zeroes(ex, offset, len, fua).await,
        Action::Cache { offset, len } => {
            // The volume goes through it in pieces (`PREFETCH_PIECE_BYTES`,
            // what the request is charged).
            let (start, span) = sector_span(offset, u64::from(len));
            v.prefetch(start, span).await
        }
        Action::BlockStatus {
            offset,
            len,
            req_one,
        } => {
            let mut chunks = Vec::with_capacity(2);
            if let Some(id) = contexts.base_allocation {
                let e = v.allocation(offset, u64::from(len));
                chunks.push((id, descriptors(&e, len, req_one)));
            }
            if let Some(id) = contexts.cache {
                let e = v.cache_state(offset, u64::from(len));
                chunks.push((id, descriptors(&e, len, req_one)));
            }
            return ReplyBody::BlockStatus { chunks };
        }
        Action::Noop { is_read } => return ReplyBody::Done { is_read },
    };
    match result {
        Ok(()) => ReplyBody::Done { is_read: false },
        Err(e) => error_body(action, e),
    }
}

fn error_body(action: Action, e: VolumeError) -> ReplyBody {
    warn!("{action:?} failed: {e}");
    ReplyBody::Error {
        errno: errno_of(&e),
        message: e.message,
    }
}

/// Reads the covering sectors and replies with the requested bytes.
async fn read<V: Volume>(v: &V, offset: u64, len: u32) -> ReplyBody {
    let (start, span) = sector_span(offset, u64::from(len));
    match v.read(start, span as u32).await {
        Ok(data) if data.len() == span as usize => ReplyBody::Data {
            offset,
            data,
            start: (offset - start) as usize,
            len: len as usize,
        },
        Ok(data) => error_body(
            Action::Read { offset, len },
            VolumeError::new(
                ErrorKind::Io,
                format!(
                    "volume returned {} bytes for a {span}-byte read",
                    data.len()
                ),
            ),
        ),
        Err(e) => error_body(Action::Read { offset, len }, e),
    }
}

/// Writes `len` bytes at `offset`; `buf` holds the covering sectors with the
/// payload in place. Partial first and last sectors are read and merged
/// under an exclusive lock on the covering sectors.
async fn write<V: Volume>(
    ex: &SharedExport<V>,
    offset: u64,
    len: u32,
    mut buf: AlignedBuf,
    fua: bool,
) -> VolumeResult<()> {
    let len = u64::from(len);
    if is_aligned(offset, len) {
        let _g = ex.locks.lock(offset, offset + len, false).await;
        return ex.volume.write(offset, buf, fua).await;
    }
    let (start, span) = sector_span(offset, len);
    let _g = ex.locks.lock(start, start + span, true).await;
    let at = (offset - start) as usize;
    let end = at + len as usize;
    let head = !at.is_multiple_of(SECTOR_BYTES as usize);
    let tail = !end.is_multiple_of(SECTOR_BYTES as usize);
    let last = span - SECTOR_BYTES;
    // The first and last sector, read at once (one read if they are one).
    let read_head = async {
        match head || (tail && last == 0) {
            true => ex.volume.read(start, SECTOR_BYTES as u32).await.map(Some),
            false => Ok(None),
        }
    };
    let read_tail = async {
        match tail && last > 0 {
            true => ex
                .volume
                .read(start + last, SECTOR_BYTES as u32)
                .await
                .map(Some),
            false => Ok(None),
        }
    };
    let (h, t) = tokio::join!(read_head, read_tail);
    if let Some(h) = h? {
        buf[..at].copy_from_slice(&h[..at]);
        if last == 0 {
            buf[end..].copy_from_slice(&h[end..]);
        }
    }
    if let Some(t) = t? {
        let from = end - last as usize;
        buf[end..].copy_from_slice(&t[from..]);
    }
    ex.volume.write(start, buf, fua).await
}

/// Zeroes `[offset, offset + len)`: the whole sectors inside with the
/// volume's write_zeroes, partial ones by read-modify-write.
async fn write_zeroes<V: Volume>(
    ex: &SharedExport<V>,
    offset: u64,
    len: u32,
    fua: bool,
) -> VolumeResult<()> {
    let v = &*ex.volume;
    let len = u64::from(len);
    if is_aligned(offset, len) {
        let _g = ex.locks.lock(offset, offset + len, false).await;
        return v.write_zeroes(offset, len, fua).await;
    }
    let (start, span) = sector_span(offset, len);
    let _g = ex.locks.lock(start, start + span, true).await;
    let end = offset + len;
    let inner_start = offset.div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
    let inner_end = end / SECTOR_BYTES * SECTOR_BYTES;
    let mut partial = Vec::with_capacity(2);
    if !offset.is_multiple_of(SECTOR_BYTES) {
        partial.push(start);
    }
    let last = start + span - SECTOR_BYTES;
    if !end.is_multiple_of(SECTOR_BYTES) && partial.last() != Some(&last) {
        partial.push(last);
    }
    for sector in partial {
        let mut s = v.read(sector, SECTOR_BYTES as u32).await?;
        let from = offset.max(sector) - sector;
        let to = end.min(sector + SECTOR_BYTES) - sector;
        s[from as usize..to as usize].fill(0);
        v.write(sector, s, fua).await?;
    }
    if inner_start < inner_end {
        let inner = inner_end - inner_start;
        v.write_zeroes(inner_start, inner, fua).await?;
    }
    Ok(())
}

/// Writes the replies in the order they come. Each reply must be through
/// within `transfer_timeout` of its first byte, so a client that reads a
/// byte now and then (which the stall guard counts as progress) cannot
/// hold a reply's buffer for longer.
async fn write_replies<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    mode: TransmissionMode,
    transfer_timeout: Duration,
) -> io::Result<()> {
    let mut wr = BufWriter::with_capacity(64 << 10, wr);
    let mut head = Vec::with_capacity(64);
    while let Some(reply) = rx.recv().await {
        head.clear();
        let data = encode_reply(&mut head, &reply, mode);
        let send = async {
            wr.write_all(&head).await?;
            if let Some(d) = data {
                wr.write_all(d).await?;
            }
            // Coalesce replies that are already waiting into one flush.
            if rx.is_empty() {
                wr.flush().await?;
            }
            Ok::<(), io::Error>(())
        };
        match tokio::time::timeout(transfer_timeout, send).await {
            Ok(r) => r?,
            Err(_) => return Err(late("reply")),
        }
        drop(reply);
    }
    wr.flush().await?;
    wr.shutdown().await
}

/// Puts the reply's header (and, for block status, its chunks) in `head`;
/// returns the data that follows it (a read's).
fn encode_reply<'a>(
    head: &mut Vec<u8>,
    reply: &'a Reply,
    mode: TransmissionMode,
) -> Option<&'a [u8]> {
    let c = reply.cookie;
    match (&reply.body, mode.structured_replies) {
        (ReplyBody::Done { .. }, false) => proto::put_simple_reply(head, c, 0),
        // proto.md: with structured replies a READ must be answered
        // with chunks; other commands may get a simple reply.
        (ReplyBody::Done { is_read: true }, true) => {
            proto::put_chunk_header(head, c, proto::REPLY_FLAG_DONE, 0, 0)
        }
        (ReplyBody::Done { is_read: false }, true) => proto::put_simple_reply(head, c, 0),
        (
            ReplyBody::Data {
                offset,
                data,
                start,
                len,
            },
            structured,
        ) => {
            if structured {
                proto::put_offset_data_head(head, c, *offset, *len as u32);
            } else {
                proto::put_simple_reply(head, c, 0);
            }
            return Some(&data[*start..*start + *len]);
        }
        (ReplyBody::BlockStatus { chunks }, true) => {
            for (i, (id, extents)) in chunks.iter().enumerate() {
                let done = i + 1 == chunks.len();
                proto::put_block_status_chunk(head, c, done, *id, extents);
            }
        }
        (ReplyBody::BlockStatus { .. }, false) => {
            // Contexts are only selectable with structured replies.
            unreachable!("block status without structured replies")
        }
        (ReplyBody::Error { errno, .. }, false) => proto::put_simple_reply(head, c, *errno),
        (ReplyBody::Error { errno, message }, true) => {
            proto::put_error_chunk(head, c, *errno, message)
        }
    }
    None
}

/// A writer that fails with `TimedOut` once a write, flush or shutdown has
/// made no progress for `limit`: a client that stops reading its replies
/// cannot hold the connection's buffers for longer.
struct StallGuard<W> {
    inner: W,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
    /// Set while the inner writer is blocked; the timer runs from then.
    stalled: bool,
}

impl<W> StallGuard<W> {
    fn new(inner: W, limit: Duration) -> Self {
        StallGuard {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
            stalled: false,
        }
    }

    /// Called when the inner writer returned Pending.
    fn poll_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.stalled {
            self.stalled = true;
            self.timer.as_mut().reset(Instant::now() + self.limit);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(stalled("reply write"))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, p: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match p {
            Poll::Pending => self.poll_stall(cx),
            ready => {
                self.stalled = false;
                ready
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for StallGuard<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(p, cx)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.inner).poll_flush(cx);
        this.progress(p, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.progress(p, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ExportLimits = ExportLimits {
        size_bytes: 1 << 20,
        read_only: false,
        max_request_bytes: 1 << 16,
        min_block_bytes: 512,
        contexts: MetaContexts {
            base_allocation: None,
            cache: None,
        },
        block_bytes: 4096,
    };

    fn req(command: u16, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command: Command::from_wire(command),
            cookie: 1,
            offset,
            length,
        }
    }

    fn errno(v: Disposition) -> u32 {
        match v {
            Disposition::Fail { errno, .. } => errno,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    #[test]
    fn checks_of_commands_flags_and_ranges() {
        use proto::*;
        let c = |r| check_request(&r, &LIMITS);
        assert_eq!(
            c(req(CMD_READ, 0, 512, 1024)),
            Disposition::Execute(Action::Read {
                offset: 512,
                len: 1024
            })
        );
        assert_eq!(errno(c(req(CMD_READ, 0, 1 << 20, 512))), EINVAL);
        assert_eq!(errno(c(req(CMD_WRITE, 0, 1 << 20, 512))), ENOSPC);
        assert_eq!(
            errno(c(req(CMD_WRITE_ZEROES, 0, u64::MAX - 511, 1024))),
            ENOSPC
        );
        assert_eq!(errno(c(req(CMD_READ, 0, 1, 512))), EINVAL);
        assert_eq!(errno(c(req(CMD_READ, CMD_FLAG_DF, 0, 512))), EINVAL);
        assert_eq!(errno(c(req(CMD_READ, 0, 0, 1 << 17))), EINVAL);
        assert_eq!(errno(c(req(42, 0, 0, 512))), EINVAL);
        assert_eq!(
            errno(c(req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512))),
            ENOTSUP
        );
        assert!(matches!(
            c(req(CMD_WRITE, 0, 0, 1 << 17)),
            Disposition::Drop(_)
        ));
        assert_eq!(
            c(req(CMD_WRITE, 1 << 7, 0, 512)),
            Disposition::Fail {
                errno: EINVAL,
                payload_bytes: 512,
                why: "unknown or unsupported command flags"
            }
        );
        assert_eq!(
            c(req(CMD_READ, 0, 7, 0)),
            Disposition::Execute(Action::Noop { is_read: true })
        );
        assert_eq!(c(req(CMD_DISC, 0, 0, 0)), Disposition::Disconnect);
    }

    #[test]
    fn checks_of_read_only_exports_and_block_status() {
        use proto::*;
        let c = |r| check_request(&r, &LIMITS);
        let ro = ExportLimits {
            read_only: true,
            ..LIMITS
        };
        assert_eq!(errno(check_request(&req(CMD_TRIM, 0, 0, 512), &ro)), EPERM);
        // Block status needs a selected context.
        assert_eq!(errno(c(req(CMD_BLOCK_STATUS, 0, 0, 512))), EINVAL);
        let bs = ExportLimits {
            contexts: MetaContexts {
                base_allocation: Some(1),
                cache: None,
            },
            ..LIMITS
        };
        assert_eq!(
            check_request(&req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20), &bs),
            Disposition::Execute(Action::BlockStatus {
                offset: 0,
                len: 1 << 20,
                req_one: true
            })
        );
        assert_eq!(
            errno(check_request(&req(CMD_BLOCK_STATUS, 0, 0, 0), &bs)),
            EINVAL
        );
        assert_eq!(
            errno(check_request(&req(CMD_BLOCK_STATUS, 0, 512, 1 << 20), &bs)),
            EINVAL
        );
    }

    #[test]
    fn byte_granular_clients() {
        use proto::*;
        let b = ExportLimits {
            min_block_bytes: 1,
            ..LIMITS
        };
        let c = |r| check_request(&r, &b);
        assert_eq!(
            c(req(CMD_WRITE, 0, 7, 3)),
            Disposition::Execute(Action::Write {
                offset: 7,
                len: 3,
                fua: false
            })
        );
        assert_eq!(errno(c(req(CMD_READ, 0, (1 << 20) - 1, 2))), EINVAL);
        assert_eq!(errno(c(req(CMD_WRITE, 0, (1 << 20) - 1, 2))), ENOSPC);
        assert_eq!(
            Action::Write {
                offset: 7,
                len: 3,
                fua: false
            }
            .buffer_bytes(4096),
            512
        );
        assert_eq!(
            Action::Read {
                offset: 511,
                len: 2
            }
            .buffer_bytes(4096),
            2 * 1024 + 2 * 4096
        );
        assert_eq!(
            Action::Read {
                offset: 512,
                len: 512
            }
            .buffer_bytes(4096),
            2 * 512 + 2 * 4096
        );
        assert_eq!(sector_span(511, 2), (0, 1024));
        assert_eq!(sector_span(512, 512), (512, 512));
    }

    #[test]
    fn every_command_that_holds_memory_is_charged_boundedly() {
        let (block, piece) = (4096u64, EFFECT_PIECE_BYTES);
        let read = |offset, len| Action::Read { offset, len }.buffer_bytes(block);
        // A read: its data and the origin buffer of a miss.
        assert_eq!(read(0, 1 << 20), (2 << 20) + 2 * block);
        // A CACHE of any length: one piece's read.
        for len in [4096, 1 << 20, u32::MAX - 511] {
            let c = Action::Cache { offset: 0, len }.buffer_bytes(block);
            assert_eq!(c, read(0, (len as u64).min(PREFETCH_PIECE_BYTES) as u32));
        }
        // TRIM and WRITE_ZEROES: one piece's bookkeeping (and zeroes).
        let trim = |len| {
            Action::Trim {
                offset: 0,
                len,
                fua: false,
            }
            .buffer_bytes(block)
        };
        assert_eq!(trim(4096), 3 * PER_BLOCK_BYTES);
        assert_eq!(trim(u32::MAX), (piece / block + 2) * PER_BLOCK_BYTES);
        let zero = |offset, len| Action::WriteZeroes {
            offset,
            len,
            fua: false,
        };
        assert_eq!(
            zero(1, 1 << 16).buffer_bytes(block),
            18 * PER_BLOCK_BYTES + (1 << 16) + 1024
        );
        assert_eq!(
            zero(0, u32::MAX - 511).buffer_bytes(block),
            trim(u32::MAX) + ZERO_BUFFER_BYTES + 1024
        );
        // BLOCK_STATUS: two contexts' extents and descriptors.
        let bs = Action::BlockStatus {
            offset: 0,
            len: u32::MAX,
            req_one: false,
        };
        assert_eq!(bs.buffer_bytes(block), 2 * 1024 * (16 + 8));
        assert_eq!(Action::Flush.buffer_bytes(block), 0);
        assert_eq!(bs.charge_bytes(block), 49152 + 49152 / 32);
    }

    #[test]
    fn descriptors_clip_merge_and_cap() {
        let e = |len, flags| Extent { len, flags };
        assert_eq!(descriptors(&[], 4096, false), vec![(4096, 0)]);
        assert_eq!(
            descriptors(&[e(512, 1), e(512, 1), e(1 << 40, 3)], 4096, false),
            vec![(1024, 1), (3072, 3)]
        );
        assert_eq!(
            descriptors(&[e(512, 1), e(512, 3)], 4096, true),
            vec![(512, 1)]
        );
        assert_eq!(descriptors(&[e(0, 1), e(100, 2)], 50, false), vec![(50, 2)]);
        let many: Vec<Extent> = (0..5000).map(|i| e(512, i % 2)).collect();
        let d = descriptors(&many, u32::MAX, false);
        assert_eq!(d.len(), proto::BLOCK_STATUS_EXTENTS_MAX);
    }
}
