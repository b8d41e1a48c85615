//! Who may talk to the daemon over its control socket, how many at once,
//! and for how long. The socket serves requests that drop dirty data
//! (`give-up-cache`) and open any path as root (`replace-cache`), so:
//!
//! - the socket file is 0600 (`socket.rs`), and each connection's peer
//!   credentials (`SO_PEERCRED`) must be root's or the daemon's own uid;
//!   anyone else is answered with an error, logged, and closed before a
//!   byte of theirs is read;
//! - at most `MAX_CONNECTIONS` connections are open at once, one thread
//!   each. When all are taken, the one idle longest (no whole request
//!   yet) is closed to make room, so idle connections never keep the
//!   owner's `tiercache status` out; only when every one is running a
//!   request is a newcomer refused ("busy");
//! - a connection must send its whole request within `REQUEST_TIMEOUT` of
//!   connecting (idle and slow senders are closed), and each write of an
//!   answer must progress within `WRITE_TIMEOUT` (a client that stops
//!   reading is dropped; the request it asked for carries on).

use std::io::{self, Read};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::class::{Class, Classed};
use super::control::{self, Response, MAX_REQUEST_BYTES};
use super::socket;

/// Connections open at once.
pub const MAX_CONNECTIONS: usize = 8;
/// From connect to the end of the request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a write of an answer may make no progress.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers one request line on its connection.
pub type Handler = Arc<dyn Fn(String, UnixStream) + Send + Sync>;

/// Accepts control connections on `listener`, in a thread of its own,
/// until the process ends.
pub fn start(listener: UnixListener, handler: Handler) -> io::Result<()> {
    let slots = Arc::new(Slots::default());
    std::thread::Builder::new()
        .name("tiercache-control".into())
        .spawn(move || accept_loop(listener, slots, handler))?;
    Ok(())
}

fn accept_loop(listener: UnixListener, slots: Arc<Slots>, handler: Handler) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, most likely: do not spin.
                log::warn!("control socket: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if let Err(why) = check_peer(&stream) {
            refuse(stream, Class::Refused, &why);
            continue;
        }
        let Some(id) = slots.admit(&stream) else {
            refuse(
                stream,
                Class::Busy,
                &format!(
                    "the daemon is busy: {MAX_CONNECTIONS} control requests are under way; \
                     try again when one ends"
                ),
            );
            continue;
        };
        let (mine, handler) = (slots.clone(), handler.clone());
        let spawned = std::thread::Builder::new()
            .name("tiercache-ctl".into())
            .spawn(move || {
                serve_one(stream, &mine, id, &handler);
                mine.release(id);
            });
        if let Err(e) = spawned {
            log::warn!("control socket: cannot start a thread for a connection: {e}");
            slots.release(id);
        }
    }
}

/// Root and the daemon's own user may use the socket; anyone else is
/// refused with a logged line.
fn check_peer(stream: &UnixStream) -> Result<(), String> {
    let peer = socket::peer(stream).map_err(|e| {
        log::warn!("control socket: refused a connection: its credentials: {e}");
        format!("cannot read your credentials: {e}")
    })?;
    let euid = crate::engine::crash_log::effective_uid();
    if peer.uid == 0 || peer.uid == euid {
        return Ok(());
    }
    log::warn!(
        "control socket: refused a connection from uid {} (pid {}): only root and uid {euid} \
         may use it",
        peer.uid,
        peer.pid
    );
    Err(format!(
        "permission denied: uid {} may not use this control socket (only root and uid {euid})",
        peer.uid
    ))
}

/// Sends `why` as an error answer, without waiting on the peer, and
/// closes the connection.
fn refuse(mut stream: UnixStream, class: Class, why: &str) {
    // A fresh connection's send buffer is empty: the line fits at once.
    let _ = stream.set_nonblocking(true);
    let _ = control::send(
        &mut stream,
        &Response::result(Err(Classed::new(class, why))),
    );
    let _ = stream.shutdown(Shutdown::Both);
}

fn serve_one(stream: UnixStream, slots: &Slots, id: u64, handler: &Handler) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let line = match read_request(&stream, Instant::now() + REQUEST_TIMEOUT) {
        Ok(line) => line,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return refuse(stream, Class::Usage, &e.to_string())
        }
        // A command's probe (is a daemon there?) connects and hangs up.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return,
        Err(e) => {
            log::info!("control socket: closed a connection: {e}");
            return;
        }
    };
    if !slots.set_busy(id) {
        return; // closed to make room after it was read: dropped
    }
    handler(line, stream);
}

/// The request line (without its newline), read by `deadline`.
pub(super) fn read_request(mut s: &UnixStream, deadline: Instant) -> io::Result<String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out())
            }
            Err(e) => return Err(e),
        };
        let end = chunk[..n].iter().position(|&b| b == b'\n');
        line.extend_from_slice(&chunk[..end.unwrap_or(n)]);
        if line.len() as u64 > MAX_REQUEST_BYTES {
            let why = format!("request longer than {MAX_REQUEST_BYTES} bytes");
            return Err(io::Error::new(io::ErrorKind::InvalidData, why));
        }
        if end.is_some() || (n == 0 && !line.is_empty()) {
            break;
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed the connection before a request",
            ));
        }
    }
    String::from_utf8(line)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "request is not UTF-8"))
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no whole request within {} s", REQUEST_TIMEOUT.as_secs()),
    )
}

/// The open connections. A leaf lock, outside the engine's ranks: nothing
/// is taken under it, and no I/O waits under it (a shutdown does not).
#[derive(Default)]
struct Slots {
    open: parking_lot::Mutex<Vec<Slot>>,
    next_id: AtomicU64,
}

struct Slot {
    id: u64,
    since: Instant,
    /// Its request was read and is being answered: never closed for room.
    busy: bool,
    /// A handle on the connection, to close it for room.
    stream: UnixStream,
}

impl Slots {
    /// A slot for a new connection, closing the one idle longest if all
    /// are taken; `None` if every slot is busy.
    fn admit(&self, stream: &UnixStream) -> Option<u64> {
        let handle = stream.try_clone().ok()?;
        let mut open = self.open.lock();
        if open.len() >= MAX_CONNECTIONS {
            let idle = (0..open.len())
                .filter(|&i| !open[i].busy)
                .min_by_key(|&i| open[i].since)?;
            let evicted = open.swap_remove(idle);
            // Its thread's read returns at once and the thread ends.
            let _ = evicted.stream.shutdown(Shutdown::Both);
            log::info!(
                "control socket: {MAX_CONNECTIONS} connections open; closed the one idle longest"
            );
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.push(Slot {
            id,
            since: Instant::now(),
            busy: false,
            stream: handle,
        });
        Some(id)
    }

    /// Marks the connection as answering its request; false if it was
    /// closed for room meanwhile.
    fn set_busy(&self, id: u64) -> bool {
        let mut open = self.open.lock();
        match open.iter_mut().find(|s| s.id == id) {
            Some(s) => {
                s.busy = true;
                true
            }
            None => false,
        }
    }

    fn release(&self, id: u64) {
        self.open.lock().retain(|s| s.id != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn a_request_line_is_read_whole_or_refused() {
        let (mut a, b) = pair();
        a.write_all(b"{\"op\":\"status\"}\nrest").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(read_request(&b, deadline).unwrap(), "{\"op\":\"status\"}");
        let (mut a, b) = pair();
        a.write_all(&vec![b'x'; MAX_REQUEST_BYTES as usize + 10])
            .unwrap_or(());
        let e = read_request(&b, deadline).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn a_slow_sender_times_out_at_the_deadline() {
        let (mut a, b) = pair();
        a.write_all(b"{\"op\"").unwrap();
        let t = Instant::now();
        let e = read_request(&b, t + Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    /// A full house of idle connections makes room for a newcomer; a full
    /// house of busy ones refuses it.
    #[test]
    fn idle_connections_make_room_busy_ones_do_not() {
        let slots = Slots::default();
        let mut peers = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let (a, b) = pair();
            ids.push(slots.admit(&b).unwrap());
            peers.push((a, b));
        }
        let (_a, b) = pair();
        let newcomer = slots.admit(&b).expect("room made");
        assert!(!slots.set_busy(ids[0]), "the oldest idle one was closed");
        let mut buf = [0u8; 1];
        assert_eq!((&peers[0].0).read(&mut buf).unwrap(), 0, "closed");
        assert!(slots.set_busy(newcomer));
        for &id in &ids[1..] {
            assert!(slots.set_busy(id));
        }
        let (_c, d) = pair();
        assert!(slots.admit(&d).is_none(), "all busy: refused");
        slots.release(ids[1]);
        assert!(slots.admit(&d).is_some());
    }
}
