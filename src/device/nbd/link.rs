//! The device's connections and whether the server can be reached: which
//! connection a request takes, since when none is up, and the thread that
//! reconnects lost ones with backoff.
//!
//! A connection is lost at some moment (EOF, socket error, protocol
//! violation: conn.rs) and its requests in flight fail then. The link is
//! told (`lost`): once no connection is left up, the server is unreachable
//! since that moment (kept on the wall clock, for people, and on the
//! monotonic clock, for durations), and a reconnect is scheduled. Requests
//! never wait for a connect: while no connection is up they fail at once,
//! saying why. One thread per device (`run_reconnects`) makes the attempts,
//! one at a time, each connect and handshake step bounded by
//! [`RECONNECT_TIMEOUT`], spaced by [`Backoff`]. A reconnected export must
//! be the one the device was opened on (`export_changed`); if not, the
//! device stays unreachable, saying why, and keeps trying at the longest
//! interval (the right export may come back).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

use super::*;
use crate::device::DeviceHealth;

/// The reconnect schedule, the one place it is set: the first attempt
/// 100 ms after a loss, the wait doubling after each failed attempt up to
/// 5 s.
pub(super) struct Backoff;

impl Backoff {
    pub(super) const FIRST: Duration = Duration::from_millis(100);
    pub(super) const MAX: Duration = Duration::from_secs(5);

    /// The wait before the next attempt after `failed` failed attempts.
    pub(super) fn wait(failed: u32) -> Duration {
        Self::FIRST
            .saturating_mul(1 << failed.min(16))
            .min(Self::MAX)
    }
}

/// Bound on a reconnect attempt's connect and on each step of its
/// handshake: short, so a server that accepts but does not answer holds
/// the reconnect thread (and a device being closed) only that long.
pub(super) const RECONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Transmission flags a reconnected export must have as before: the device
/// chose what to send by them (writes, flushes, trims; several connections
/// only with multi-conn).
const FLAGS_RELIED_ON: u16 = FLAG_READ_ONLY | FLAG_SEND_FLUSH | FLAG_SEND_TRIM;

/// Why a reconnected export is not the one the device was opened on, if it
/// is not.
pub(super) fn export_changed(was: &ExportInfo, now: &ExportInfo, multi: bool) -> Option<String> {
    let relied = FLAGS_RELIED_ON | if multi { FLAG_CAN_MULTI_CONN } else { 0 };
    if now.size_bytes != was.size_bytes {
        return Some(format!(
            "the export's size changed from {} to {} bytes since it was opened: not the same export, not reconnecting",
            was.size_bytes, now.size_bytes
        ));
    }
    let (a, b) = (
        was.transmission_flags & relied,
        now.transmission_flags & relied,
    );
    if a != b {
        return Some(format!(
            "the export's flags changed from {a:#06x} to {b:#06x} since it was opened \
             (read-only, flush, trim, multi-conn bits): not reconnecting"
        ));
    }
    if now.payload_bytes_max < was.payload_bytes_max {
        return Some(format!(
            "the export's largest request shrank from {} to {} bytes since it was opened: not reconnecting",
            was.payload_bytes_max, now.payload_bytes_max
        ));
    }
    None
}

/// Since when no connection has been up.
#[derive(Clone, Copy)]
struct Outage {
    since_wall: SystemTime,
    since: Instant,
}

/// The next reconnect attempt, while some connection is down.
#[derive(Clone, Copy)]
struct Retry {
    at: Instant,
    /// Failed attempts since the loss.
    failed: u32,
}

struct LinkState {
    /// One per connection the device uses; a lost one stays until it is
    /// replaced. Never dropped under this lock: dropping a connection
    /// joins its reader thread, which may be waiting for the lock in
    /// `lost`.
    conns: Vec<Arc<Conn>>,
    outage: Option<Outage>,
    retry: Option<Retry>,
    last_error: Option<String>,
    attempts: u64,
    reconnects: u64,
    stopping: bool,
}

impl LinkState {
    /// Connections up.
    fn up(&self) -> usize {
        self.conns.iter().filter(|c| !c.is_dead()).count()
    }
}

pub(super) struct Link {
    /// The device's name, for messages.
    name: String,
    uri: NbdUri,
    tls: Option<TlsConnector>,
    /// What the first connection's handshake found; later ones must agree.
    expected: OnceLock<ExportInfo>,
    state: Mutex<LinkState>,
    /// Wakes the reconnect thread: a connection lost, or the device closing.
    wake: Condvar,
    next_conn: AtomicUsize,
    /// Write commands (write, trim) that ended, replied to or failed
    /// (`NbdDevice::flush` says why).
    pub(super) writes_ended: AtomicU64,
    /// `writes_ended` as read before the last successful flush was sent.
    pub(super) flushed_through: AtomicU64,
    /// `BlockDevice::loss_epoch`: bumped at every connection lost (not
    /// closed on purpose) and every failed flush.
    pub(super) loss_epoch: AtomicU64,
}

impl Link {
    pub(super) fn new(name: String, uri: NbdUri, tls: Option<TlsConnector>) -> Link {
        Link {
            name,
            uri,
            tls,
            expected: OnceLock::new(),
            state: Mutex::new(
                Rank::NbdLink,
                LinkState {
                    conns: Vec::new(),
                    outage: None,
                    retry: None,
                    last_error: None,
                    attempts: 0,
                    reconnects: 0,
                    stopping: false,
                },
            ),
            wake: Condvar::new(),
            next_conn: AtomicUsize::new(0),
            writes_ended: AtomicU64::new(0),
            flushed_through: AtomicU64::new(0),
            loss_epoch: AtomicU64::new(0),
        }
    }

    pub(super) fn uri(&self) -> &NbdUri {
        &self.uri
    }

    /// Opens a connection that reports its loss to this link. The first
    /// one opened sets what later ones must agree with.
    pub(super) fn open(self: &Arc<Self>, timeout: Duration) -> io::Result<(Conn, ExportInfo)> {
        let weak = Arc::downgrade(self);
        let on_lost: LostHook = Box::new(move |reason| {
            if let Some(link) = weak.upgrade() {
                link.lost(reason);
            }
        });
        let (conn, info) = Conn::open(&self.uri, self.tls.as_ref(), timeout, on_lost)?;
        let _ = self.expected.set(info);
        Ok((conn, info))
    }

    /// Adds a connection opened at `NbdDevice::connect`.
    pub(super) fn add(&self, conn: Conn) {
        self.state.lock().conns.push(Arc::new(conn));
    }

    pub(super) fn connection_count(&self) -> usize {
        self.state.lock().conns.len()
    }

    /// A live connection, round robin over the live ones; an error at once
    /// (no waiting for a connect) while none is up.
    pub(super) fn pick(&self) -> io::Result<Arc<Conn>> {
        let st = self.state.lock();
        let n = st.conns.len();
        let start = self.next_conn.fetch_add(1, Ordering::Relaxed);
        for k in 0..n {
            let c = &st.conns[(start + k) % n];
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        Err(unreachable_error(&st, Instant::now()))
    }

    /// A connection was lost: records the outage once none is up, and
    /// schedules a reconnect.
    fn lost(&self, reason: &str) {
        let mut st = self.state.lock();
        if st.stopping {
            return;
        }
        // Before anything can be sent on a new connection: a flush there
        // must not pass for covering writes this one carried.
        self.loss_epoch.fetch_add(1, Ordering::AcqRel);
        let now = Instant::now();
        st.last_error = Some(format!("connection lost: {reason}"));
        if st.retry.is_none() {
            st.retry = Some(Retry {
                at: now + Backoff::wait(0),
                failed: 0,
            });
        }
        if st.outage.is_none() && st.conns.iter().all(|c| c.is_dead()) {
            st.outage = Some(Outage {
                since_wall: SystemTime::now(),
                since: now,
            });
            // A server that went away may have lost its volatile cache
            // (its host crashed), and with it writes it acknowledged but no
            // flush covered; the flush after a reconnect cannot tell.
            let unflushed = self
                .writes_ended
                .load(Ordering::Acquire)
                .saturating_sub(self.flushed_through.load(Ordering::Acquire));
            let at_risk = match unflushed {
                0 => String::new(),
                n => format!(
                    "; {n} write commands it acknowledged were not flushed yet: \
                     if the server lost its cache, they are lost"
                ),
            };
            log::warn!(
                "{}: the NBD server is unreachable ({reason}); requests fail until it is back; \
                 reconnecting every {:?} to {:?}{at_risk}",
                self.name,
                Backoff::FIRST,
                Backoff::MAX
            );
        }
        drop(st);
        self.wake.notify_all();
    }

    /// The reconnect thread's life: waits for a due attempt, makes it,
    /// until `stop`.
    pub(super) fn run_reconnects(self: &Arc<Self>) {
        loop {
            let down: Vec<usize> = {
                let mut st = self.state.lock();
                loop {
                    if st.stopping {
                        return;
                    }
                    let now = Instant::now();
                    match st.retry {
                        None => self.wake.wait(&mut st),
                        Some(r) if r.at > now => {
                            self.wake.wait_for(&mut st, r.at - now);
                        }
                        Some(_) => break,
                    }
                }
                st.attempts += 1;
                (0..st.conns.len())
                    .filter(|&i| st.conns[i].is_dead())
                    .collect()
            };
            let multi = self.connection_count() > 1;
            let mut opened = Vec::new();
            let mut failure = None;
            for i in down {
                match self.open_same_export(multi) {
                    Ok(c) => opened.push((i, Arc::new(c))),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            // Dropped here, outside the lock.
            let replaced = self.install(opened, failure);
            drop(replaced);
        }
    }

    /// One connection of a reconnect attempt, refused unless it serves the
    /// export the device was opened on.
    fn open_same_export(self: &Arc<Self>, multi: bool) -> Result<Conn, String> {
        let (conn, info) = self
            .open(RECONNECT_TIMEOUT)
            .map_err(|e| format!("reconnecting: {e}"))?;
        let expected = self.expected.get().expect("set by the first connection");
        match export_changed(expected, &info, multi) {
            // `conn` is closed on the way out (NBD_CMD_DISC).
            Some(why) => Err(why),
            None => Ok(conn),
        }
    }

    /// Puts an attempt's new connections in place of lost ones and
    /// schedules the next attempt if one is still down. Returns the
    /// connections replaced, for the caller to drop outside the lock.
    fn install(&self, opened: Vec<(usize, Arc<Conn>)>, failure: Option<String>) -> Vec<Arc<Conn>> {
        let mut st = self.state.lock();
        let now = Instant::now();
        let mut replaced = Vec::with_capacity(opened.len());
        let reopened = opened.len();
        for (i, c) in opened {
            replaced.push(std::mem::replace(&mut st.conns[i], c));
        }
        let up = st.up();
        if up > 0 {
            if let Some(o) = st.outage.take() {
                log::warn!(
                    "{}: the NBD server is reachable again after {:.1} s ({} reconnect attempts so far)",
                    self.name,
                    (now - o.since).as_secs_f64(),
                    st.attempts
                );
            }
        }
        if reopened > 0 && failure.is_none() {
            st.reconnects += 1;
        }
        if let Some(why) = failure {
            // A new reason is worth a line; the same one again is not.
            if st.last_error.as_deref() != Some(why.as_str()) {
                log::warn!("{}: {why}", self.name);
            } else {
                log::debug!("{}: {why}", self.name);
            }
            st.last_error = Some(why);
        }
        // A connection lost meanwhile (even a new one) is still down.
        st.retry = if up < st.conns.len() {
            let failed = st.retry.map_or(0, |r| r.failed).saturating_add(1);
            Some(Retry {
                at: now + Backoff::wait(failed),
                failed,
            })
        } else {
            None
        };
        replaced
    }

    /// Connections up now.
    pub(super) fn connections_up(&self) -> usize {
        self.state.lock().up()
    }

    /// The health `status` shows, as of now.
    pub(super) fn health(&self) -> DeviceHealth {
        let st = self.state.lock();
        let now = Instant::now();
        let up = st.up();
        DeviceHealth {
            // A connection marks itself dead before its reader records the
            // loss (`lost`, under this lock): until then the device is
            // still shown reachable, so an unreachable one always says
            // since when and why.
            reachable: up > 0 || st.outage.is_none(),
            unreachable_since_unix_s: st.outage.map(|o| {
                o.since_wall
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            }),
            unreachable_s: st.outage.map(|o| (now - o.since).as_secs_f64()),
            last_error: st.last_error.clone(),
            connections_up: up as u32,
            connections: st.conns.len() as u32,
            reconnect_attempts: st.attempts,
            reconnects: st.reconnects,
            next_attempt_s: st
                .retry
                .map(|r| r.at.saturating_duration_since(now).as_secs_f64()),
        }
    }

    /// Tells the reconnect thread to end (after the attempt under way, if
    /// any) and losses to be ignored: the device is closing.
    pub(super) fn stop(&self) {
        self.state.lock().stopping = true;
        self.wake.notify_all();
    }

    /// The connections, taken out for the device to close outside the
    /// lock.
    pub(super) fn take_conns(&self) -> Vec<Arc<Conn>> {
        std::mem::take(&mut self.state.lock().conns)
    }
}

/// The error of a request made while no connection is up.
fn unreachable_error(st: &LinkState, now: Instant) -> io::Error {
    let how_long = match st.outage {
        Some(o) => format!(" for {:.1} s", (now - o.since).as_secs_f64()),
        None => String::new(),
    };
    let why = st.last_error.as_deref().unwrap_or("connection lost");
    let next = match st.retry {
        Some(r) => format!(
            "; next reconnect attempt in {:.1} s",
            r.at.saturating_duration_since(now).as_secs_f64()
        ),
        None => String::new(),
    };
    io::Error::new(
        io::ErrorKind::NotConnected,
        format!("the NBD server is unreachable{how_long}: {why}{next}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_100_ms_to_5_s() {
        let waits: Vec<u64> = (0..8)
            .map(|n| Backoff::wait(n).as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(Backoff::wait(u32::MAX), Backoff::MAX);
    }

    #[test]
    fn a_different_export_is_refused() {
        let was = ExportInfo {
            size_bytes: 1 << 20,
            transmission_flags: FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN,
            payload_bytes_max: 1 << 20,
        };
        assert_eq!(export_changed(&was, &was, true), None);
        let bigger = ExportInfo {
            size_bytes: 2 << 20,
            ..was
        };
        let why = export_changed(&was, &bigger, false).unwrap();
        assert!(
            why.contains("size changed from 1048576 to 2097152"),
            "{why}"
        );
        let read_only = ExportInfo {
            transmission_flags: was.transmission_flags | FLAG_READ_ONLY,
            ..was
        };
        assert!(export_changed(&was, &read_only, false).is_some());
        // Multi-conn matters only to a device with several connections.
        let single = ExportInfo {
            transmission_flags: FLAG_SEND_FLUSH,
            ..was
        };
        assert_eq!(export_changed(&was, &single, false), None);
        assert!(export_changed(&was, &single, true).is_some());
        let smaller_payload = ExportInfo {
            payload_bytes_max: 64 << 10,
            ..was
        };
        assert!(export_changed(&was, &smaller_payload, false).is_some());
    }
}
