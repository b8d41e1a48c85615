//! The connected socket of either transport.

use super::*;

/// A connected socket of either transport.
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Connects; a TCP connect waits at most `timeout` per address, a Unix
    /// socket's never waits (see `connect_unix`).
    pub(super) fn connect(address: &NbdAddress, timeout: Duration) -> io::Result<Stream> {
        match address {
            NbdAddress::Unix { socket } => Ok(Stream::Unix(connect_unix(socket)?)),
            NbdAddress::Tcp { host, port } => {
                let mut last_err = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, timeout) {
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

    pub(super) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(super) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
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

    /// Bounds a write to the socket only (the reader thread's clone
    /// shares the socket's options, and waits for replies as long as it
    /// must): a server that stops reading stops a request's bytes here.
    pub(super) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    /// TCP keepalive, so a peer that vanished (host down, a partition)
    /// is noticed while no request is under way: first probe after 10 s
    /// idle, then every 5 s, dead after 3 unanswered. A Unix peer's death
    /// closes the socket.
    pub(super) fn keep_alive(&self) -> io::Result<()> {
        let Stream::Tcp(s) = self else {
            return Ok(());
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(s);
        for (level, name, value) in [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
        ] {
            let v: libc::c_int = value;
            // SAFETY: `fd` is this stream's open socket; `v` is a c_int
            // that outlives the call and its size is passed.
            let r = unsafe {
                libc::setsockopt(
                    fd,
                    level,
                    name,
                    (&raw const v).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    pub(super) fn shutdown(&self) {
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

/// Connects to a Unix socket without waiting. A blocking connect waits
/// for as long as the listener's backlog is full, which it stays with a
/// server that is frozen (stopped, wedged) and no longer accepts; a
/// non-blocking one fails at once then (Linux af_unix: EAGAIN), which
/// bounds a reconnect attempt. A Unix connect is otherwise immediate.
fn connect_unix(path: &std::path::Path) -> io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, valid all zero.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket path is too long or holds a NUL byte",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: a plain syscall; no memory is passed.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just made and owned by nothing else; the
    // stream closes it.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: `addr` is a sockaddr_un that outlives the call, and `len`
    // (the family, the path and its NUL) is within it.
    let r = unsafe {
        libc::connect(
            fd,
            (&raw const addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the server accepts no connections (its listen backlog is full)",
            ));
        }
        return Err(e);
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Writes all of `bufs` (header and payload) with as few syscalls as possible.
pub(super) fn write_all_vectored(
    w: &mut impl Write,
    mut bufs: &mut [IoSlice<'_>],
) -> io::Result<()> {
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
