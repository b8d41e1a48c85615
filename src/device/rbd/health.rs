//! Whether the cluster answers, as the image's requests find it.
//!
//! librbd keeps its own connections to the monitors and OSDs and retries
//! on its own; what the device sees is a request that fails with
//! ETIMEDOUT after `rados_osd_op_timeout` (a stopped OSD, a partition) or
//! with a connection error. From such a failure until a request succeeds
//! again the image is unreachable: `health` says since when and why, and
//! `is_reachable` is false until `PROBE_EVERY` has passed since the last
//! failure, then true again until a request fails (the engine's writeback
//! waits while the origin is unreachable, so without that probe nothing
//! would find out that it is back; the one writeback thread sends it, and
//! its failure, after at most the request timeout, starts the wait over).

use std::time::{Duration, Instant, SystemTime};

use crate::device::DeviceHealth;
use crate::sync::{Mutex, Rank};

/// While unreachable, how long after a failure `is_reachable` lets
/// requests through again.
const PROBE_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    /// Since when requests fail as if the cluster were gone.
    outage: Option<(SystemTime, Instant)>,
    /// When the last request of the outage failed.
    failed_at: Option<Instant>,
    last_error: Option<String>,
    failures: u64,
    recoveries: u64,
}

pub(super) struct Health {
    state: Mutex<State>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            state: Mutex::new(Rank::Device, State::default()),
        }
    }
}

/// True for the errors that mean the cluster did not answer (rather than
/// refusing the request).
pub(super) fn is_unreachable_errno(errno: i32) -> bool {
    matches!(
        errno,
        // ESHUTDOWN is also Ceph's EBLOCKLISTED.
        libc::ETIMEDOUT | libc::ENOTCONN | libc::ECONNREFUSED | libc::ESHUTDOWN
    )
}

impl Health {
    /// A request failed with `errno` (`why` for people).
    pub(super) fn failed(&self, errno: i32, why: &str) {
        if !is_unreachable_errno(errno) {
            return;
        }
        let mut st = self.state.lock();
        let now = Instant::now();
        if st.outage.is_none() {
            st.outage = Some((SystemTime::now(), now));
            log::warn!("{why}: the cluster is not answering; requests fail until it does");
        }
        st.failed_at = Some(now);
        st.failures += 1;
        st.last_error = Some(why.to_string());
    }

    /// A request succeeded: the outage, if any, is over.
    pub(super) fn succeeded(&self) {
        let mut st = self.state.lock();
        if let Some((_, since)) = st.outage.take() {
            st.recoveries += 1;
            st.failed_at = None;
            log::warn!(
                "the cluster answers again after {:.1} s",
                since.elapsed().as_secs_f64()
            );
        }
    }

    pub(super) fn is_reachable(&self) -> bool {
        let st = self.state.lock();
        st.outage.is_none() || st.failed_at.is_none_or(|t| t.elapsed() >= PROBE_EVERY)
    }

    pub(super) fn report(&self) -> DeviceHealth {
        let st = self.state.lock();
        let reachable = st.outage.is_none();
        DeviceHealth {
            reachable,
            unreachable_since_unix_s: st.outage.map(|(wall, _)| {
                wall.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            }),
            unreachable_s: st.outage.map(|(_, t)| t.elapsed().as_secs_f64()),
            last_error: st.last_error.clone(),
            connections_up: reachable as u32,
            connections: 1,
            reconnect_attempts: st.failures,
            reconnects: st.recoveries,
            next_attempt_s: st
                .failed_at
                .filter(|_| !reachable)
                .map(|t| PROBE_EVERY.saturating_sub(t.elapsed()).as_secs_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_makes_it_unreachable_until_a_request_succeeds() {
        let h = Health::default();
        assert!(h.is_reachable());
        h.failed(libc::EINVAL, "write: EINVAL");
        assert!(h.report().reachable, "a refused request says nothing");
        h.failed(libc::ETIMEDOUT, "write: timed out");
        let r = h.report();
        assert!(!r.reachable && r.unreachable_since_unix_s.is_some());
        assert!(!h.is_reachable(), "no probe yet");
        h.succeeded();
        assert!(h.is_reachable() && h.report().reachable);
        assert_eq!(h.report().reconnects, 1);
    }
}
