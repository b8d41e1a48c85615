//! `tiercache status`: what a cache holds, what it has done, how it is set.

use anyhow::{Context, Result};
use serde::Serialize;
use tiercache::daemon::Frontends;
use tiercache::device::DeviceHealth;
use tiercache::engine::{Status, VolumeStatus};

use super::exit::classed;
use super::registry::Registry;
use super::target::Opened;
use super::units::{human_bytes, human_duration, percent};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `--json` output: the engine's status with the registered name, and
/// when a daemon serves the cache, what it serves on.
#[derive(Serialize)]
struct StatusJson<'a> {
    /// The version of this shape (`list::SCHEMA_VERSION`'s rule).
    schema_version: u32,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    frontends: Option<&'a Frontends>,
    #[serde(flatten)]
    status: &'a Status,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    // Looking writes nothing: a cache no daemon serves is opened read-only.
    let opened = Opened::open_read_only(reg, a.name.name.as_deref())?;
    let (status, frontends) = opened.target.status_and_frontends()?;
    opened.finish()?;
    if a.json {
        let json = StatusJson {
            schema_version: super::list::SCHEMA_VERSION,
            name: &opened.entry.name,
            frontends: frontends.as_ref(),
            status: &status,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&json).context("encoding status")?
        );
    } else {
        out!("{}", table(&opened.entry.name, &status));
        match &frontends {
            Some(f) => out!("{}", served_rows(f, &volume_sizes(&status))),
            // Counters live in memory; an offline status reads the cache
            // at rest, writing nothing.
            None => outln!("  (not served; read without writing, so I/O counters are zero; `tiercache serve` reports live ones)"),
        }
    }
    Ok(())
}

/// The volume named `name` (else the first) of a cache's status; an
/// unknown name is refused, naming the volumes there are.
pub fn volume<'a>(s: &'a Status, name: Option<&str>) -> Result<&'a VolumeStatus> {
    let found = match name {
        None => s.volumes.first(),
        Some(n) => s.volumes.iter().find(|v| v.name == n),
    };
    found.ok_or_else(|| {
        let names: Vec<&str> = s.volumes.iter().map(|v| v.name.as_str()).collect();
        classed!(
            NotFound,
            "no volume named '{}' in this cache (its volumes: {})",
            name.unwrap_or(""),
            names.join(", ")
        )
    })
}

/// Dirty blocks of volume `name`, or of the whole cache.
pub fn dirty_blocks(s: &Status, name: Option<&str>) -> Result<u64> {
    match name {
        Some(_) => Ok(volume(s, name)?.cache_blocks_dirty),
        None => Ok(s.cache_blocks_dirty),
    }
}

/// Every volume's size now, in order (a status from before volumes: the
/// one).
fn volume_sizes(s: &Status) -> Vec<u64> {
    match s.volumes.is_empty() {
        true => vec![s.volume_bytes],
        false => s.volumes.iter().map(|v| v.bytes).collect(),
    }
}

/// Where a daemon serves the cache, one row per front end; `volume_bytes`
/// are the volumes' sizes now.
fn served_rows(f: &Frontends, volume_bytes: &[u64]) -> String {
    let mut rows = Vec::new();
    if let Some(socket) = &f.nbd_socket {
        rows.push(format!("NBD on {socket}"));
    }
    if let Some(addr) = &f.nbd_tcp {
        rows.push(format!("NBD on TCP {addr}"));
    }
    if !f.nbd_exports.is_empty() {
        rows.push(format!(
            "NBD exports {} (the empty name is {})",
            f.nbd_exports.join(", "),
            f.nbd_exports[0]
        ));
    }
    if f.nbd_socket.is_some() || f.nbd_tcp.is_some() {
        rows.push(format!("NBD clients connected: {}", f.nbd_clients));
    }
    if !f.ublk_devices.is_empty() {
        rows.push(format!(
            "ublk {} (one per volume)",
            f.ublk_devices.join(", ")
        ));
    } else if let Some(dev) = &f.ublk_device {
        rows.push(format!("ublk {dev}"));
    }
    for (dev, bytes, now) in f.ublk_behind(volume_bytes) {
        rows.push(format!(
            "restart pending: {dev} keeps {}, the volume has {} \
             (Linux cannot resize a live ublk device; `systemctl restart` makes it anew)",
            human_bytes(bytes),
            human_bytes(now)
        ));
    }
    rows.iter()
        .map(|r| format!("  {:<KEY_WIDTH$} {r}\n", "served"))
        .collect()
}

/// The miss-ratio curve in one line: the hit ratio a cache of each size
/// would have had (sampled; LRU).
fn size_curve(m: &tiercache::engine::observe::Mrc) -> String {
    if m.points.is_empty() {
        return "no requests yet".into();
    }
    let pts: Vec<String> = m
        .points
        .iter()
        .map(|p| {
            let f = if p.size_factor < 1.0 {
                format!("1/{}x", (1.0 / p.size_factor).round())
            } else {
                format!("{}x", p.size_factor)
            };
            format!("{f} {:.0}%", p.hit_ratio * 100.0)
        })
        .collect();
    format!(
        "hit ratio by cache size: {} ({:.2}% of blocks sampled)",
        pts.join("  "),
        m.sample_rate * 100.0
    )
}

/// Lines of the human-readable status: (label, value).
type Rows = Vec<(&'static str, String)>;

/// A cache set's state and members: one row each.
fn set_rows(s: &Status) -> Rows {
    let Some(state) = &s.cache_set_state else {
        return Vec::new();
    };
    let mut rows = vec![(
        "cache set",
        match state.as_str() {
            "whole" => "whole: metadata and dirty data on two devices".to_string(),
            other => format!(
                "{}: AT RISK: {} dirty blocks ({}) have one copy left; replace the failed device \
                 with `tiercache replace-cache OLD NEW`",
                other.to_uppercase(),
                s.dirty_at_risk,
                human_bytes(s.dirty_at_risk * u64::from(s.block_bytes))
            ),
        },
    )];
    rows.extend(s.cache_members.iter().map(|m| ("  member", member_row(m))));
    rows
}

/// A member's row: state, size, what it holds (nothing the set reads once
/// failed), its I/O errors and checksum errors, a rebuild's progress, and
/// why it failed.
fn member_row(m: &tiercache::device::set::MemberStatus) -> String {
    use tiercache::device::set::MemberState;
    let holds = match m.state {
        MemberState::Failed => "holds nothing the set reads".to_string(),
        _ => format!(
            "used {} of {} blocks, dirty {}",
            m.used_blocks,
            m.mirror_slots + m.own_slots,
            m.dirty_blocks
        ),
    };
    let rebuild = if m.rebuild_total_bytes > 0 {
        format!(
            "  rebuilt {} of {} ({})",
            human_bytes(m.rebuild_done_bytes),
            human_bytes(m.rebuild_total_bytes),
            percent(m.rebuild_done_bytes, m.rebuild_total_bytes)
        )
    } else {
        String::new()
    };
    let why = m
        .failure
        .as_ref()
        .map_or(String::new(), |why| format!("; failed: {why}"));
    format!(
        "{} {}: {}, {}; {holds}, errors {}, checksum errors {}{}{rebuild}{why}",
        m.index,
        m.device,
        m.state.name(),
        human_bytes(m.bytes),
        m.errors,
        m.bad_blocks,
        recent_checksum_errors(m),
    )
}

/// " (N in the last 10 min)": a member's checksum errors within the
/// window of the rule that fails it (`device/set/health.rs`).
fn recent_checksum_errors(m: &tiercache::device::set::MemberStatus) -> String {
    use tiercache::device::set::health::{CHECKSUM_ERRORS_MAX, CHECKSUM_WINDOW};
    if m.checksum_errors_recent == 0 {
        return String::new();
    }
    format!(
        " ({} in the last {} min; {CHECKSUM_ERRORS_MAX} fail a member)",
        m.checksum_errors_recent,
        CHECKSUM_WINDOW.as_secs() / 60
    )
}

/// Where new data goes; with the log placement, the free segments.
fn placement(s: &Status) -> String {
    match s.placement {
        tiercache::engine::Placement::Log => format!(
            "log ({} free segments ahead of the write cursor)",
            s.free_segments
        ),
        p => p.name().to_string(),
    }
}

/// The order of writeback; in flush order, its groups and what the order
/// costs in cache blocks.
fn writeback_order(s: &Status) -> String {
    match s.flush_groups {
        Some(g) => format!(
            "flush (group {} open, groups below {} on the origin, {} closed pending; {} older versions kept, peak {})",
            g.open, g.done, g.closed_pending, g.shadows, g.shadow_peak
        ),
        None => s.writeback_order.name().to_string(),
    }
}

/// Whether an origin behind connections (an NBD export) can be reached:
/// since when not, why, and the reconnects.
fn origin_connection(h: &DeviceHealth) -> String {
    let mut parts = Vec::new();
    match (h.reachable, h.unreachable_since_unix_s) {
        (false, since) => parts.push(format!(
            "UNREACHABLE{}{}",
            since.map_or(String::new(), |t| format!(
                " since {}",
                tiercache::daemon::registry::rfc3339(t)
                    .replace('T', " ")
                    .replace('Z', " UTC")
            )),
            h.unreachable_s
                .map_or(String::new(), |d| format!(" ({})", human_duration(d)))
        )),
        (true, _) => parts.push(format!(
            "up ({} of {} connections)",
            h.connections_up, h.connections
        )),
    }
    let troubled = !h.reachable || h.reconnect_attempts > 0;
    if let Some(e) = h.last_error.as_deref().filter(|_| troubled) {
        parts.push(format!("last error: {e}"));
    }
    if troubled {
        let next = h
            .next_attempt_s
            .map_or(String::new(), |s| format!(", next in {s:.1}s"));
        parts.push(format!(
            "reconnect attempts {} ({} succeeded){next}",
            h.reconnect_attempts, h.reconnects
        ));
    }
    parts.join("; ")
}

/// The devices, the mode and how full the cache is.
fn volume_rows(s: &Status) -> Rows {
    let mut rows = origin_rows(s);
    rows.push(("cache", s.cache.clone()));
    rows.extend(set_rows(s));
    rows.extend([
        ("mode", mode(s)),
        ("policy", s.policy.clone()),
        ("placement", placement(s)),
        ("writeback order", writeback_order(s)),
        ("block size", human_bytes(s.block_bytes.into())),
        (
            "volume size",
            human_bytes(s.volumes.iter().map(|v| v.bytes).sum()),
        ),
        (
            "cache blocks",
            format!(
                "total {}  used {} ({})  dirty {} ({})",
                s.cache_blocks_total,
                s.cache_blocks_used,
                percent(s.cache_blocks_used, s.cache_blocks_total),
                s.cache_blocks_dirty,
                percent(s.cache_blocks_dirty, s.cache_blocks_total)
            ),
        ),
        (
            "partial",
            format!("{} blocks hold only some sectors", s.partial_blocks),
        ),
    ]);
    rows
}

/// The cache mode, or each volume's when they differ.
fn mode(s: &Status) -> String {
    if s.volumes.iter().all(|v| v.mode == s.mode) {
        return s.mode.name().to_string();
    }
    let each: Vec<String> = (s.volumes.iter())
        .map(|v| format!("{} {}", v.name, v.mode.name()))
        .collect();
    format!("per volume: {}", each.join(", "))
}

/// The origin, or with several, a row per volume: its name (the NBD export
/// it is served as), origin, size and what the cache holds of it.
fn origin_rows(s: &Status) -> Rows {
    let mut rows = Vec::new();
    if s.volumes.len() <= 1 {
        rows.push((
            "origin",
            format!("{} ({})", s.origin, human_bytes(s.volume_bytes)),
        ));
        rows.extend((s.origin_health.as_ref()).map(|h| ("  connection", origin_connection(h))));
        return rows;
    }
    for v in &s.volumes {
        let stale = match v.stale_blocks {
            0 => String::new(),
            n => format!(", {n} blocks STALE on the origin"),
        };
        rows.push((
            "volume",
            format!(
                "{}: {} ({}), {} mode, {} blocks cached, {} dirty{stale}",
                v.name,
                v.origin,
                human_bytes(v.bytes),
                v.mode.name(),
                v.cache_blocks_used,
                v.cache_blocks_dirty
            ),
        ));
        rows.extend((v.origin_health.as_ref()).map(|h| ("  connection", origin_connection(h))));
        rows.push((
            "  share",
            super::set_share::share_line(v, s.cache_blocks_total),
        ));
        rows.extend((v.mrc.as_ref()).map(|m| ("  size curve", size_curve(m))));
    }
    rows.push(("sharing", s.sharing.name().to_string()));
    rows
}

/// What the requests did.
fn traffic_rows(s: &Status) -> Rows {
    let st = &s.stats;
    let reads = st.read_hits + st.read_misses;
    vec![
        (
            "reads",
            format!(
                "hits {}  misses {}  hit ratio {}",
                st.read_hits,
                st.read_misses,
                percent(st.read_hits, reads)
            ),
        ),
        (
            "writes",
            format!("hits {}  misses {}", st.write_hits, st.write_misses),
        ),
        ("promotions", st.promotions.to_string()),
        ("demotions", st.demotions.to_string()),
        ("written back", format!("{} blocks", st.blocks_written_back)),
        (
            "origin I/O",
            format!("reads {}  writes {}", st.origin_reads, st.origin_writes),
        ),
        ("bypassed", format!("{} I/Os", st.bypassed_ios)),
        (
            "errors",
            format!("cache {}  origin {}", st.cache_errors, st.origin_errors),
        ),
    ]
}

/// What may enter the cache, and what was kept out.
fn admission_rows(s: &Status) -> Rows {
    let st = &s.stats;
    vec![
        ("admission", s.admission.clone()),
        (
            "  rules",
            format!(
                "{}{}",
                super::set_admission::describe(&s.admission_settings),
                if s.guard_engaged {
                    " (ENGAGED: the cache device is slower than the origin)"
                } else {
                    ""
                }
            ),
        ),
        (
            "  kept out",
            format!(
                "sequential {}  guard {}  not promoted yet {}",
                st.sequential_bypasses, st.guard_bypasses, st.cold_bypasses
            ),
        ),
    ]
}

/// The miss-ratio curve, the crash log, memory and writeback settings.
fn state_rows(s: &Status) -> Rows {
    vec![
        ("size curve", size_curve(&s.mrc)),
        (
            "crash log",
            match &s.crash_log {
                Some(l) => format!(
                    "{} records not yet journalled (of {}), {}",
                    l.records_pending, l.capacity_records, l.path
                ),
                None => "none (a daemon that dies loses writes since the last commit)".into(),
            },
        ),
        (
            "metadata memory",
            format!(
                "{} ({:.1} B per cache block)",
                human_bytes(s.metadata_bytes),
                s.metadata_bytes as f64 / s.cache_blocks_total.max(1) as f64
            ),
        ),
        (
            "writeback",
            format!(
                "start at {}% dirty, stop at {}%, max age {} s, {}",
                s.writeback.high_pct,
                s.writeback.low_pct,
                s.writeback.max_age_secs,
                super::set_writeback::idle_text(s.writeback.idle_secs)
            ),
        ),
    ]
}

/// The width of the status table's first column: its longest key
/// ("writeback order", "metadata memory"), so every value starts in one
/// column.
const KEY_WIDTH: usize = 15;

/// The human-readable status, one fact per line.
pub fn table(name: &str, s: &Status) -> String {
    let rows = [
        volume_rows(s),
        traffic_rows(s),
        admission_rows(s),
        state_rows(s),
    ];
    let mut out = format!("cache '{name}'\n");
    for (k, v) in rows.into_iter().flatten() {
        out.push_str(&format!("  {k:<KEY_WIDTH$} {v}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origin_connection_says_since_when_and_why() {
        let down = DeviceHealth {
            reachable: false,
            unreachable_since_unix_s: Some(1_795_642_803), // 2026-11-25 21:40:03 UTC
            unreachable_s: Some(130.4),
            last_error: Some("connection lost: server closed the connection".into()),
            connections_up: 0,
            connections: 1,
            reconnect_attempts: 7,
            reconnects: 0,
            next_attempt_s: Some(1.62),
        };
        assert_eq!(
            origin_connection(&down),
            "UNREACHABLE since 2026-11-25 21:40:03 UTC (2m 10s); \
             last error: connection lost: server closed the connection; \
             reconnect attempts 7 (0 succeeded), next in 1.6s"
        );
        let fine = DeviceHealth {
            reachable: true,
            connections_up: 2,
            connections: 2,
            ..DeviceHealth::default()
        };
        assert_eq!(origin_connection(&fine), "up (2 of 2 connections)");
        let back = DeviceHealth {
            reconnect_attempts: 3,
            reconnects: 1,
            last_error: Some("connection lost: x".into()),
            ..fine
        };
        assert_eq!(
            origin_connection(&back),
            "up (2 of 2 connections); last error: connection lost: x; reconnect attempts 3 (1 succeeded)"
        );
    }
}
