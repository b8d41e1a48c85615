//! systemd's readiness protocol (sd_notify(3)), without libsystemd: one
//! datagram of `KEY=VALUE` lines to the Unix socket named by
//! `$NOTIFY_SOCKET` (a path, or an abstract name when it starts with '@').
//! Without `$NOTIFY_SOCKET` (not started by systemd with `Type=notify`)
//! nothing is sent.

use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The service is up: its listeners accept, or its device is live.
pub const READY: &str = "READY=1";
/// The service has begun its clean shutdown.
pub const STOPPING: &str = "STOPPING=1";

/// Sends `state` to the service manager. `Ok(false)`: not asked for.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let target = target.to_string_lossy();
    let addr = match target.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(&*target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// [`notify`], logging a failure: the service manager not hearing from us
/// must not stop the daemon (systemd then times the start out itself).
pub fn notify_or_log(state: &str) {
    if let Err(e) = notify(state) {
        log::warn!("sd_notify {state}: {e}");
    }
}
