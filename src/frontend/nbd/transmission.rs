//! The transmission phase: request validation ([`check_request`], pure, so
//! it can be fuzzed) and the pipelined connection loop ([`run`]).
//!
//! One task reads requests in order (a write's payload must be consumed
//! before the next header); each valid request runs in its own task; replies
//! go to one writer task and may leave in any order (proto.md
//! "Transmission": replies need not be in request order). Two semaphores
//! bound a connection: requests in flight and bytes buffered for them.

use std::sync::Arc;
use std::time::Duration;

use log::{debug, warn};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use super::handshake::TransmissionMode;
use super::proto::{self, Command, Request};
use crate::device::{AlignedBuf, SECTOR_BYTES};
use crate::volume::{ErrorKind, Volume, VolumeError};

/// What a request may do on this export.
#[derive(Debug, Clone, Copy)]
pub struct ExportLimits {
    pub size_bytes: u64,
    pub read_only: bool,
    /// Largest READ or WRITE payload; a larger WRITE ends the connection.
    pub max_request_bytes: u32,
}

/// A validated operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
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
    /// A zero-length request: valid, nothing to do, reply success.
    Noop {
        is_read: bool,
    },
}

/// The server's decision on one request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Execute(Op),
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

/// Checks a request against the export. Order matters: the payload size is
/// settled first, so every error after it still consumes the payload and
/// keeps the stream framed.
pub fn check_request(req: &Request, limits: &ExportLimits) -> Verdict {
    let payload_bytes = if req.command == Command::Write {
        req.length
    } else {
        0
    };
    if payload_bytes > limits.max_request_bytes {
        // NBD proto.md "Block size constraints": the server MAY close the
        // connection on a payload beyond the maximum; consuming it would
        // need unbounded memory or a drain we would rather not offer.
        return Verdict::Drop("write payload larger than the maximum block size");
    }
    let fail = |errno, why| Verdict::Fail {
        errno,
        payload_bytes,
        why,
    };
    // FUA is valid on every command once SEND_FUA is advertised (proto.md
    // NBD_CMD_FLAG_FUA); NO_HOLE and FAST_ZERO only on WRITE_ZEROES; DF is
    // not advertised, so it is unknown here.
    let allowed_flags = match req.command {
        Command::WriteZeroes => {
            proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO
        }
        _ => proto::CMD_FLAG_FUA,
    };
    if let Command::Unknown(_) = req.command {
        return fail(proto::EINVAL, "unknown command");
    }
    if req.flags & !allowed_flags != 0 {
        return fail(proto::EINVAL, "unknown or unsupported command flags");
    }
    let fua = req.flags & proto::CMD_FLAG_FUA != 0;
    let writes = matches!(
        req.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    match req.command {
        Command::Disc => return Verdict::Disconnect,
        // Offset and length of FLUSH are ignored (the client MUST send 0).
        Command::Flush => return Verdict::Execute(Op::Flush),
        _ => {}
    }
    if writes && limits.read_only {
        return fail(proto::EPERM, "write to a read-only export");
    }
    let (offset, len) = (req.offset, req.length);
    let end = offset.checked_add(u64::from(len));
    let beyond_end = end.is_none_or(|e| e > limits.size_bytes);
    let is_write = matches!(req.command, Command::Write | Command::WriteZeroes);
    let range_errno = if is_write {
        proto::ENOSPC
    } else {
        proto::EINVAL
    };
    if len == 0 {
        if offset > limits.size_bytes {
            return fail(range_errno, "offset beyond the end of the export");
        }
        return Verdict::Execute(Op::Noop {
            is_read: req.command == Command::Read,
        });
    }
    if req.command == Command::Read && len > limits.max_request_bytes {
        return fail(proto::EINVAL, "read larger than the maximum block size");
    }
    // The Volume takes 512-byte units; NBD_INFO_BLOCK_SIZE advertises a
    // minimum of 512, so unaligned requests may fail with EINVAL.
    if !offset.is_multiple_of(SECTOR_BYTES) || !u64::from(len).is_multiple_of(SECTOR_BYTES) {
        return fail(proto::EINVAL, "request not aligned to 512 bytes");
    }
    if beyond_end {
        return fail(range_errno, "request beyond the end of the export");
    }
    let fast_zero = req.flags & proto::CMD_FLAG_FAST_ZERO != 0;
    Verdict::Execute(match req.command {
        Command::Read => Op::Read { offset, len },
        Command::Write => Op::Write { offset, len, fua },
        Command::Trim => Op::Trim { offset, len, fua },
        Command::WriteZeroes if fast_zero => {
            // Zeroing is never faster than writing here (proto.md
            // NBD_CMD_FLAG_FAST_ZERO: fail quickly with ENOTSUP).
            return fail(proto::ENOTSUP, "fast zero not supported");
        }
        Command::WriteZeroes => Op::WriteZeroes { offset, len, fua },
        Command::Cache => Op::Cache { offset, len },
        Command::Disc | Command::Flush | Command::Unknown(_) => {
            unreachable!("handled above")
        }
    })
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
    /// Payload and read-data bytes held by in-flight requests.
    pub buffered_bytes_max: u32,
    /// How long in-flight requests may run after shutdown before the
    /// connection is dropped without their replies.
    pub shutdown_grace: Duration,
}

enum ReplyBody {
    /// Success without data.
    Done {
        is_read: bool,
    },
    Data {
        offset: u64,
        data: AlignedBuf,
    },
    Error {
        errno: u32,
        message: String,
    },
}

struct Reply {
    cookie: u64,
    body: ReplyBody,
    /// Released once the reply is written, so buffered replies are bounded.
    _permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
}

/// Why a connection ended.
#[derive(Debug)]
pub enum ConnEnd {
    /// NBD_CMD_DISC or end of stream between requests.
    Clean,
    ServerShutdown,
    /// A protocol violation or I/O error; the message says which.
    Broken(String),
}

/// Resolves when shutdown is requested; never if the sender is gone.
pub(crate) async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Serves requests on a connection in transmission phase until it ends.
pub async fn run<R, W, V>(
    rd: R,
    wr: W,
    volume: Arc<V>,
    export: ExportLimits,
    mode: TransmissionMode,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) -> ConnEnd
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    V: Volume,
{
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(write_replies(wr, rx, mode));
    let writer_abort = writer.abort_handle();
    let in_flight = Arc::new(Semaphore::new(limits.in_flight_max.max(1)));
    let buffered = Arc::new(Semaphore::new(limits.buffered_bytes_max as usize));
    let mut rd = BufReader::with_capacity(64 << 10, rd);

    let end = tokio::select! {
        biased;
        _ = shutdown_requested(&mut shutdown) => ConnEnd::ServerShutdown,
        _ = tx.closed() => ConnEnd::Broken("reply writer failed".into()),
        end = read_requests(&mut rd, &volume, &export, &limits, &in_flight, &buffered, &tx) => end,
    };
    drop(tx);
    // In-flight tasks hold senders; the writer ends after their replies.
    match tokio::time::timeout(limits.shutdown_grace, writer).await {
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

async fn read_requests<R, V>(
    rd: &mut R,
    volume: &Arc<V>,
    export: &ExportLimits,
    limits: &ConnLimits,
    in_flight: &Arc<Semaphore>,
    buffered: &Arc<Semaphore>,
    tx: &mpsc::UnboundedSender<Reply>,
) -> ConnEnd
where
    R: AsyncRead + Unpin,
    V: Volume,
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
        let verdict = check_request(&req, export);
        let data_bytes = match verdict {
            Verdict::Execute(Op::Read { len, .. } | Op::Write { len, .. }) => len,
            Verdict::Fail { payload_bytes, .. } => payload_bytes,
            _ => 0,
        };
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let bytes_permit = if data_bytes > 0 {
            let n = data_bytes.min(limits.buffered_bytes_max);
            Some(
                buffered
                    .clone()
                    .acquire_many_owned(n)
                    .await
                    .expect("never closed"),
            )
        } else {
            None
        };
        let permits = (permit, bytes_permit);
        let cookie = req.cookie;
        let send = |body, permits| {
            // A send fails only when the writer is gone; the select in
            // `run` notices that.
            let _ = tx.send(Reply {
                cookie,
                body,
                _permits: permits,
            });
        };
        match verdict {
            Verdict::Disconnect => return ConnEnd::Clean,
            Verdict::Drop(why) => return ConnEnd::Broken(why.into()),
            Verdict::Fail {
                errno,
                payload_bytes,
                why,
            } => {
                if let Err(e) = skip(rd, payload_bytes).await {
                    return ConnEnd::Broken(format!("reading write payload: {e}"));
                }
                debug!("request {req:?} failed: {why}");
                let message = why.to_string();
                send(ReplyBody::Error { errno, message }, permits);
            }
            Verdict::Execute(Op::Noop { is_read }) => send(ReplyBody::Done { is_read }, permits),
            Verdict::Execute(op) => {
                let payload = if let Op::Write { len, .. } = op {
                    let mut buf = AlignedBuf::zeroed(len as usize);
                    if let Err(e) = rd.read_exact(&mut buf).await {
                        return ConnEnd::Broken(format!("reading write payload: {e}"));
                    }
                    Some(buf)
                } else {
                    None
                };
                let volume = volume.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let body = execute(&*volume, op, payload).await;
                    let _ = tx.send(Reply {
                        cookie,
                        body,
                        _permits: permits,
                    });
                });
            }
        }
    }
}

/// Reads and discards `n` bytes.
async fn skip<R: AsyncRead + Unpin>(rd: &mut R, n: u32) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut rd.take(u64::from(n)), &mut tokio::io::sink()).await?;
    if copied < u64::from(n) {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

async fn execute<V: Volume>(volume: &V, op: Op, payload: Option<AlignedBuf>) -> ReplyBody {
    let done = ReplyBody::Done { is_read: false };
    let result = match op {
        Op::Read { offset, len } => match volume.read(offset, len).await {
            Ok(data) if data.len() == len as usize => return ReplyBody::Data { offset, data },
            Ok(data) => Err(VolumeError::new(
                ErrorKind::Io,
                format!("volume returned {} bytes for a {len}-byte read", data.len()),
            )),
            Err(e) => Err(e),
        },
        Op::Write { offset, fua, .. } => {
            let data = payload.expect("write payload read before execute");
            volume.write(offset, data, fua).await
        }
        Op::Flush => volume.flush().await,
        Op::Trim { offset, len, fua } => volume.trim(offset, u64::from(len), fua).await,
        Op::WriteZeroes { offset, len, fua } => {
            volume.write_zeroes(offset, u64::from(len), fua).await
        }
        Op::Cache { offset, len } => volume.prefetch(offset, u64::from(len)).await,
        Op::Noop { is_read } => return ReplyBody::Done { is_read },
    };
    match result {
        Ok(()) => done,
        Err(e) => {
            warn!("{op:?} failed: {e}");
            ReplyBody::Error {
                errno: errno_of(&e),
                message: e.message,
            }
        }
    }
}

async fn write_replies<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    mode: TransmissionMode,
) -> std::io::Result<()> {
    let mut wr = BufWriter::with_capacity(64 << 10, wr);
    let mut head = Vec::with_capacity(64);
    while let Some(reply) = rx.recv().await {
        head.clear();
        let c = reply.cookie;
        let mut data: Option<&[u8]> = None;
        match (&reply.body, mode.structured_replies) {
            (ReplyBody::Done { .. }, false) => proto::put_simple_reply(&mut head, c, 0),
            // proto.md: with structured replies a READ must be answered
            // with chunks; other commands may get a simple reply.
            (ReplyBody::Done { is_read: true }, true) => {
                proto::put_chunk_header(&mut head, c, proto::REPLY_FLAG_DONE, 0, 0)
            }
            (ReplyBody::Done { is_read: false }, true) => proto::put_simple_reply(&mut head, c, 0),
            (ReplyBody::Data { data: d, .. }, false) => {
                proto::put_simple_reply(&mut head, c, 0);
                data = Some(d);
            }
            (ReplyBody::Data { offset, data: d }, true) => {
                proto::put_offset_data_head(&mut head, c, *offset, d.len() as u32);
                data = Some(d);
            }
            (ReplyBody::Error { errno, .. }, false) => {
                proto::put_simple_reply(&mut head, c, *errno)
            }
            (ReplyBody::Error { errno, message }, true) => {
                proto::put_error_chunk(&mut head, c, *errno, message)
            }
        }
        wr.write_all(&head).await?;
        if let Some(d) = data {
            wr.write_all(d).await?;
        }
        drop(reply);
        // Coalesce replies that are already waiting into one flush.
        if rx.is_empty() {
            wr.flush().await?;
        }
    }
    wr.flush().await?;
    wr.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ExportLimits = ExportLimits {
        size_bytes: 1 << 20,
        read_only: false,
        max_request_bytes: 1 << 16,
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

    fn errno(v: Verdict) -> u32 {
        match v {
            Verdict::Fail { errno, .. } => errno,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    #[test]
    fn checks() {
        use proto::*;
        let c = |r| check_request(&r, &LIMITS);
        assert_eq!(
            c(req(CMD_READ, 0, 512, 1024)),
            Verdict::Execute(Op::Read {
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
        assert!(matches!(c(req(CMD_WRITE, 0, 0, 1 << 17)), Verdict::Drop(_)));
        assert_eq!(
            c(req(CMD_WRITE, 1 << 7, 0, 512)),
            Verdict::Fail {
                errno: EINVAL,
                payload_bytes: 512,
                why: "unknown or unsupported command flags"
            }
        );
        assert_eq!(
            c(req(CMD_READ, 0, 7, 0)),
            Verdict::Execute(Op::Noop { is_read: true })
        );
        assert_eq!(c(req(CMD_DISC, 0, 0, 0)), Verdict::Disconnect);
        let ro = ExportLimits {
            read_only: true,
            ..LIMITS
        };
        assert_eq!(errno(check_request(&req(CMD_TRIM, 0, 0, 512), &ro)), EPERM);
    }
}
