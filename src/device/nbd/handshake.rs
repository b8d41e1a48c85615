//! The handshake: fixed newstyle, NBD_OPT_GO (falling back to
//! NBD_OPT_EXPORT_NAME), NBD_OPT_STARTTLS and the TLS relay.

use super::*;

/// What the handshake learned about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ExportInfo {
    pub(super) size_bytes: u64,
    pub(super) transmission_flags: u16,
    pub(super) payload_bytes_max: u32,
}

pub(super) fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

pub(super) fn read_struct<T: FromBytes + IntoBytes>(s: &mut Stream) -> io::Result<T> {
    let mut v = T::new_zeroed();
    s.read_exact(v.as_mut_bytes())?;
    Ok(v)
}

pub(super) fn send_option(s: &mut Stream, option: u32, data: &[u8]) -> io::Result<()> {
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

pub(super) fn rep_err_name(t: u32) -> &'static str {
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
pub(super) fn greet(s: &mut Stream) -> io::Result<(bool, bool)> {
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
pub(super) fn handshake(s: &mut Stream, export: &str) -> io::Result<ExportInfo> {
    let (fixed, no_zeroes) = greet(s)?;
    choose_export(s, export, fixed, no_zeroes)
}

/// One option reply to `option` (named `what` in errors): its type and
/// body, the header checked and the body bounded.
pub(super) fn read_option_reply(
    s: &mut Stream,
    option: u32,
    what: &str,
) -> io::Result<(u32, Vec<u8>)> {
    let h: OptionReplyHeader = read_struct(s)?;
    if h.magic.get() != OPTION_REPLY_MAGIC || h.option.get() != option {
        return Err(proto_err(format!("malformed reply to {what}")));
    }
    let len = h.length.get();
    if len > OPTION_REPLY_BYTES_MAX {
        return Err(proto_err(format!(
            "option reply of {len} bytes is too long"
        )));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok((h.reply_type.get(), body))
}

/// NBD_OPT_STARTTLS; anything but NBD_REP_ACK is an error (proto.md: a
/// client that only wishes to use TLS SHOULD terminate the session).
pub(super) fn start_tls(s: &mut Stream) -> io::Result<()> {
    send_option(s, OPT_STARTTLS, &[])?;
    let (reply_type, body) = read_option_reply(s, OPT_STARTTLS, "NBD_OPT_STARTTLS")?;
    match reply_type {
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
pub(super) fn choose_export(
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
pub(super) type RelayError = Arc<Mutex<Option<String>>>;

/// After NBD_OPT_STARTTLS was acknowledged on `s`: runs the TLS handshake
/// on a relay thread and returns the plaintext end of a socketpair that the
/// thread pumps to and from the TLS stream.
pub(super) fn tls_relay(
    s: Stream,
    connector: &TlsConnector,
    server_name: &str,
    timeout: Duration,
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
    match done_rx.recv_timeout(timeout) {
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
pub(super) async fn pump(
    tls: crate::nbd::tls::BoxStream,
    local: tokio::net::UnixStream,
    error: RelayError,
) {
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
pub(super) fn take_info(
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
pub(super) fn opt_go(s: &mut Stream, export: &str) -> io::Result<Option<ExportInfo>> {
    let name_len = u32::try_from(export.len()).map_err(|_| proto_err("export name too long"))?;
    let mut data = Vec::with_capacity(export.len() + 8);
    data.extend_from_slice(U32::new(name_len).as_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(U16::new(1).as_bytes());
    data.extend_from_slice(U16::new(INFO_BLOCK_SIZE).as_bytes());
    send_option(s, OPT_GO, &data)?;

    let mut export_info: Option<(u64, u16)> = None;
    let mut payload_bytes_max = PAYLOAD_BYTES_MAX_DEFAULT;
    for replies in 1.. {
        if replies > OPTION_REPLIES_MAX {
            return Err(proto_err(format!(
                "more than {OPTION_REPLIES_MAX} replies to NBD_OPT_GO"
            )));
        }
        let (reply_type, body) = read_option_reply(s, OPT_GO, "NBD_OPT_GO")?;
        match reply_type {
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
