//! The transmission phase of one connection: requests registered by
//! cookie, written under the writer lock, replies matched by a reader thread.

use super::*;

/// What the reader thread hands to a waiting caller: the NBD error number
/// (0 = success) and, for a successful read, the data.
pub(super) type Completion = (u32, Vec<u8>);

pub(super) struct Pending {
    /// Payload bytes that follow a successful reply (reads only).
    pub(super) reply_bytes: u32,
    pub(super) tx: mpsc::SyncSender<Completion>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) pending: HashMap<u64, Pending>,
    /// Why the connection is unusable; set once, never cleared.
    pub(super) dead: Option<String>,
    /// Set by `Drop`, so the reader's EOF is not reported as a failure.
    pub(super) closing: bool,
}

/// Told once why a connection was lost (not when it is closed on purpose):
/// the device's link (link.rs) records the outage and schedules a
/// reconnect. Called with no lock of the connection held.
pub(super) type LostHook = Box<dyn Fn(&str) + Send + Sync>;

/// State shared between callers and the reader thread of one connection.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Signalled when a pending slot frees up or the connection dies.
    pub(super) slot_free: Condvar,
    pub(super) on_lost: LostHook,
}

impl Shared {
    /// Marks the connection dead and fails every pending request (dropping
    /// the senders wakes their receivers with an error).
    pub(super) fn kill(&self, reason: String) {
        let mut st = self.state.lock();
        let lost = st.dead.is_none() && !st.closing;
        if st.dead.is_none() {
            if lost {
                log::warn!("NBD connection lost: {reason}");
            }
            st.dead = Some(reason.clone());
        }
        // Taken out here, dropped after the lock: every waiting caller
        // wakes with an error.
        let pending = std::mem::take(&mut st.pending);
        drop(st);
        drop(pending);
        self.slot_free.notify_all();
        if lost {
            (self.on_lost)(&reason);
        }
    }

    /// True once the connection failed or is being closed.
    pub(super) fn is_dead(&self) -> bool {
        let st = self.state.lock();
        st.dead.is_some() || st.closing
    }
}

/// One transmission-phase connection.
pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) writer: Mutex<Stream>,
    /// A clone of the socket for shutting it down without the writer lock.
    pub(super) control: Stream,
    pub(super) next_cookie: AtomicU64,
    pub(super) reader: Option<JoinHandle<()>>,
    /// How long a request waits for its reply (`device::origin_timeout`).
    pub(super) request_timeout: Duration,
}

/// A submitted request whose reply has not been collected yet.
pub(super) struct Ticket {
    pub(super) rx: mpsc::Receiver<Completion>,
}

impl Conn {
    /// Connects and runs the handshake, each step bounded by `timeout`;
    /// `on_lost` is told if the connection is lost later.
    pub(super) fn open(
        uri: &NbdUri,
        tls: Option<&TlsConnector>,
        timeout: Duration,
        on_lost: LostHook,
    ) -> io::Result<(Conn, ExportInfo)> {
        let mut s = Stream::connect(&uri.address, timeout)?;
        s.set_timeouts(Some(timeout))?;
        let timed_out = |e: io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("handshake not finished within {timeout:?}"),
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
                let (relayed, relay_error) = tls_relay(s, connector, &name, timeout)?;
                s = relayed;
                s.set_timeouts(Some(timeout))?;
                choose_export(&mut s, &uri.export, true, no_zeroes).map_err(|e| {
                    match relay_error.lock().take() {
                        // The server ended TLS, e.g. refusing our certificate.
                        Some(why) => io::Error::other(format!("TLS: {why}")),
                        None => timed_out(e),
                    }
                })?
            }
        };
        let request_timeout = crate::device::origin_timeout();
        s.set_timeouts(None)?;
        s.set_write_timeout(Some(request_timeout))?;
        s.keep_alive()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(Rank::NbdClient, State::default()),
            slot_free: Condvar::new(),
            on_lost,
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
            request_timeout,
        };
        Ok((conn, info))
    }

    /// Sends one request and returns the ticket for its reply. Waits while
    /// [`INFLIGHT_MAX`] requests are pending.
    pub(super) fn submit(
        &self,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<Ticket> {
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

    pub(super) fn is_dead(&self) -> bool {
        self.shared.is_dead()
    }

    /// Waits for a request's reply, at most the request timeout: a server
    /// that has not answered by then is taken to have stopped (frozen, or
    /// a partition without a reset), and the connection is dropped, which
    /// fails its other requests too and starts reconnecting.
    pub(super) fn wait(&self, ticket: Ticket) -> io::Result<Vec<u8>> {
        match ticket.rx.recv_timeout(self.request_timeout) {
            Ok((0, data)) => Ok(data),
            Ok((errno, _)) => Err(server_error(errno)),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let why = format!(
                    "no reply within {:?}: the server stopped answering",
                    self.request_timeout
                );
                // The reason first: the shutdown makes the reader see
                // an EOF, which must not pass for the server closing.
                self.shared.kill(why.clone());
                self.control.shutdown();
                Err(io::Error::new(io::ErrorKind::TimedOut, why))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
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

pub(super) fn lost(reason: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!("NBD connection lost: {reason}"),
    )
}

/// Maps an NBD error number (proto.md, "Error values") to an `io::Error`
/// whose message names the errno.
pub(super) fn server_error(errno: u32) -> io::Error {
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
pub(super) fn reader_loop(mut s: Stream, shared: &Shared) {
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
