//! Unix sockets only their owner may connect to, whatever the umask.
//!
//! `bind(2)` creates the socket file with the socket inode's mode less the
//! umask (Linux af_unix.c, `unix_bind_bsd`); a fresh socket's inode is
//! 0777, so under a umask of 0 any local user could connect. The mode is
//! set with `fchmod` on the socket before `bind`, so the file is 0600 (or
//! tighter) from the moment it exists: there is no window in which it is
//! looser, and nothing process-wide (the umask) changes under the other
//! threads.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Pending connections the kernel queues before `accept`.
const BACKLOG: libc::c_int = 128;

/// Binds and listens on a Unix stream socket at `path` with mode 0600.
pub fn bind_private(path: &Path) -> io::Result<UnixListener> {
    let addr = sockaddr(path)?;
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod on a descriptor we own; no memory is involved.
    if unsafe { libc::fchmod(sock.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a filled sockaddr_un and `len` its size.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on a bound socket we own.
    if unsafe { libc::listen(sock.as_raw_fd(), BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    check_mode(path)?;
    Ok(UnixListener::from(sock))
}

/// The bound file must be private; a kernel that took the mode from the
/// umask alone would leave it looser: tighten it then, and say so.
fn check_mode(path: &Path) -> io::Result<()> {
    let mode = std::fs::symlink_metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        log::warn!(
            "{}: the socket was created with mode {:o} despite fchmod; set to 0600",
            path.display(),
            mode & 0o777
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn sockaddr(path: &Path) -> io::Result<libc::sockaddr_un> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays zero: the path is NUL-terminated.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a Unix socket path must be 1 to {} bytes without NUL: {}",
                addr.sun_path.len() - 1,
                path.display()
            ),
        ));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Ok(addr)
}

/// Who is at the other end of a Unix socket (`SO_PEERCRED`: the
/// credentials it had when it connected).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
}

pub fn peer(stream: &impl AsRawFd) -> io::Result<Peer> {
    // SAFETY: ucred is plain data; all zeroes is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt with a ucred buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The socket file is 0600 whatever the umask (the usual 022 would
    /// give 0755). Under a umask of 0: tests/security_daemon.rs (the umask
    /// is process-wide, not for a unit test beside others).
    #[test]
    fn private_socket_and_its_peer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _listener = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(peer(&s).unwrap().uid, unsafe { libc::getuid() });
    }

    #[test]
    fn long_paths_are_an_error() {
        let long = format!("/tmp/{}", "x".repeat(200));
        let e = bind_private(Path::new(&long)).unwrap_err();
        assert!(e.to_string().contains("Unix socket path"), "{e}");
    }
}
