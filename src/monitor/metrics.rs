//! The Prometheus metrics: OpenMetrics text through `prometheus-client`,
//! built at scrape time from one copy of the engine's state (`Taken`), so
//! the I/O path does no work for them. Names follow Prometheus' rules
//! (`tiercache_` prefix, base units in the name, `_total` on counters,
//! ratios 0..1) and every sample carries `cache="NAME"`. docs/observability.md
//! lists them beside node_exporter's bcache names.

use std::borrow::Cow;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::Taken;
use crate::engine::observe::latency::{bucket_upper_s, HistogramSnapshot};

/// The content type of `render`'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition of one copy of a cache's state.
pub fn render(taken: &Arc<Taken>) -> String {
    let mut registry = Registry::with_prefix_and_labels(
        "tiercache",
        [(Cow::Borrowed("cache"), Cow::Owned(taken.name.clone()))].into_iter(),
    );
    registry.register_collector(Box::new(Exposition(taken.clone())));
    let mut out = String::with_capacity(32 * 1024);
    // Writing to a String cannot fail, and every value is finite.
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("encoding metrics into a String");
    out
}

#[derive(Debug)]
struct Exposition(Arc<Taken>);

type Labels = Vec<(&'static str, String)>;

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    items: &[(Labels, f64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in items {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn histograms(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    items: &[(Labels, &HistogramSnapshot)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in items {
        let buckets: Vec<(f64, u64)> = h
            .counts
            .iter()
            .enumerate()
            .map(|(i, &c)| (bucket_upper_s(i), c))
            .collect();
        m.encode_family(labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum_s,
                h.count(),
                &buckets,
                None,
            )?;
    }
    Ok(())
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The cache's mode, policy and devices, as an info metric
/// (`tiercache_cache_info`: the info type adds `_info`).
fn encode_info(e: &mut DescriptorEncoder, s: &crate::engine::Status) -> std::fmt::Result {
    let info: Labels = vec![
        ("mode", s.mode.name().to_string()),
        ("policy", s.policy.clone()),
        ("placement", s.placement.name().to_string()),
        ("writeback_order", s.writeback_order.name().to_string()),
        ("origin", s.origin.clone()),
        ("cache_device", s.cache.clone()),
    ];
    let mut m = e.encode_descriptor(
        "cache",
        "The cache's mode, replacement policy and devices.",
        None,
        MetricType::Info,
    )?;
    m.encode_info(&info)
}

/// (name, help, value) of the volume's size, occupancy and rates.
fn occupancy_gauges(t: &Taken) -> Vec<(&'static str, &'static str, f64)> {
    let s = &t.status;
    let bs = u64::from(s.block_bytes);
    let total = s.cache_blocks_total;
    vec![
        (
            "volume_bytes",
            "Size of the cached volume.",
            s.volume_bytes as f64,
        ),
        ("block_bytes", "Cache block size.", bs as f64),
        (
            "cache_capacity_bytes",
            "Bytes the cache device holds for data.",
            (total * bs) as f64,
        ),
        (
            "cache_used_bytes",
            "Bytes of cache blocks in use (occupancy).",
            (s.cache_blocks_used * bs) as f64,
        ),
        (
            "cache_used_ratio",
            "Cache blocks in use over all cache blocks.",
            ratio(s.cache_blocks_used, total),
        ),
        (
            "dirty_bytes",
            "Bytes of dirty cache blocks: the writeback backlog.",
            (s.cache_blocks_dirty * bs) as f64,
        ),
        (
            "dirty_ratio",
            "Dirty cache blocks over all cache blocks.",
            ratio(s.cache_blocks_dirty, total),
        ),
        (
            "partial_blocks",
            "Cached blocks holding only some of their sectors.",
            s.partial_blocks as f64,
        ),
    ]
}

/// (name, help, value) of the placement's and writeback order's state,
/// the metadata's memory, the hit ratio and the writeback rate.
fn activity_gauges(t: &Taken) -> Vec<(&'static str, &'static str, f64)> {
    let s = &t.status;
    let bs = u64::from(s.block_bytes);
    vec![
        (
            "free_segments",
            "Log placement: whole free segments ahead of the write cursor.",
            s.free_segments as f64,
        ),
        (
            "flush_groups_pending",
            "Writeback in flush order: closed groups not yet all on the origin.",
            s.flush_groups.map_or(0, |g| g.closed_pending) as f64,
        ),
        (
            "flush_group_shadow_bytes",
            "Writeback in flush order: cache bytes holding older versions kept for their groups.",
            (s.flush_groups.map_or(0, |g| g.shadows) * bs) as f64,
        ),
        (
            "metadata_memory_bytes",
            "Heap bytes of the in-memory metadata.",
            s.metadata_bytes as f64,
        ),
        (
            "read_hit_ratio",
            "Blocks read from the cache over blocks read, since the cache opened.",
            ratio(s.stats.read_hits, s.stats.read_hits + s.stats.read_misses),
        ),
        (
            "writeback_rate_bytes_per_second",
            "Bytes written back per second over the last sampling interval.",
            t.latest.as_ref().map_or(0.0, |l| l.writeback_bytes_per_s),
        ),
    ]
}

/// (name, help, value) of the settings and states shown as gauges.
fn setting_gauges(s: &crate::engine::Status) -> Vec<(&'static str, &'static str, f64)> {
    let wb = &s.writeback;
    let flag = |b: bool| f64::from(u8::from(b));
    vec![
        (
            "writeback_high_watermark_ratio",
            "Dirty share at which background writeback starts.",
            f64::from(wb.high_pct) / 100.0,
        ),
        (
            "writeback_low_watermark_ratio",
            "Dirty share at which background writeback stops.",
            f64::from(wb.low_pct) / 100.0,
        ),
        (
            "writeback_max_age_seconds",
            "Dirty blocks older than this are written back.",
            f64::from(wb.max_age_secs),
        ),
        (
            "admitting",
            "1 while new blocks may enter the cache, 0 after too many cache errors.",
            flag(s.admitting),
        ),
        (
            "guard_engaged",
            "1 while the admission guard sends new data around a slow cache device.",
            flag(s.guard_engaged),
        ),
        (
            "cache_error_limit",
            "Cache device errors after which no new blocks are admitted (0: never).",
            s.cache_error_limit as f64,
        ),
    ]
}

/// Request and device latency histograms.
fn encode_latency(e: &mut DescriptorEncoder, t: &Taken) -> std::fmt::Result {
    let latency = &t.observations.latency;
    let req: Vec<(Labels, &HistogramSnapshot)> = latency
        .requests
        .iter()
        .map(|(op, kind, h)| (vec![("op", op.clone()), ("result", kind.clone())], h))
        .collect();
    histograms(
        e,
        "request_duration_seconds",
        "Request latency by operation (requests, not blocks); result=origin when the request made an origin request, else cache.",
        &req,
    )?;
    let dev: Vec<(Labels, &HistogramSnapshot)> = latency
        .devices
        .iter()
        .map(|(d, op, h)| (vec![("device", d.clone()), ("op", op.clone())], h))
        .collect();
    histograms(
        e,
        "device_duration_seconds",
        "Latency of the cache and origin devices' reads and writes.",
        &dev,
    )
}

/// The sampled miss-ratio curve: a point per cache size, and the sampler.
fn encode_mrc(e: &mut DescriptorEncoder, t: &Taken) -> std::fmt::Result {
    let mrc = &t.observations.mrc;
    let bs = u64::from(t.status.block_bytes);
    let points = |f: &dyn Fn(&crate::engine::observe::MrcPoint) -> f64| -> Vec<(Labels, f64)> {
        mrc.points
            .iter()
            .map(|p| (vec![("size_ratio", p.size_factor.to_string())], f(p)))
            .collect()
    };
    gauges(
        e,
        "mrc_hit_ratio",
        "Estimated LRU hit ratio of a cache size_ratio times this one's size (sampled miss-ratio curve).",
        &points(&|p| p.hit_ratio),
    )?;
    gauges(
        e,
        "mrc_size_bytes",
        "Cache size of each point of the miss-ratio curve.",
        &points(&|p| (p.size_blocks * bs) as f64),
    )?;
    for (name, help, v) in [
        (
            "mrc_sample_ratio",
            "Fraction of blocks the miss-ratio curve samples.",
            mrc.sample_rate,
        ),
        (
            "mrc_tracked_blocks",
            "Blocks the miss-ratio sampler tracks.",
            mrc.tracked_blocks as f64,
        ),
        (
            "mrc_memory_bytes",
            "Heap bytes of the miss-ratio sampler.",
            mrc.memory_bytes as f64,
        ),
    ] {
        gauge(e, name, help, v)?;
    }
    Ok(())
}

/// (name, help, the value of a member).
type MemberGauge = (
    &'static str,
    &'static str,
    fn(&crate::device::set::MemberStatus) -> f64,
);

/// The gauges of each cache-set member.
fn member_gauges() -> [MemberGauge; 9] {
    use crate::device::set::MemberState;
    [
        (
            "cache_member_healthy",
            "1 while the cache set member holds current copies.",
            |m| (m.state == MemberState::Healthy) as u8 as f64,
        ),
        (
            "cache_member_failed",
            "1 once the member failed (or was missing at open).",
            |m| (m.state == MemberState::Failed) as u8 as f64,
        ),
        (
            "cache_member_rebuilding",
            "1 while a replacement is being filled.",
            |m| (m.state == MemberState::Rebuilding) as u8 as f64,
        ),
        (
            "cache_member_used_blocks",
            "Blocks the member holds (its copies of mirrored ones and its own).",
            |m| m.used_blocks as f64,
        ),
        (
            "cache_member_dirty_blocks",
            "Dirty blocks the member holds a copy of.",
            |m| m.dirty_blocks as f64,
        ),
        ("cache_member_errors", "I/O errors of the member.", |m| {
            m.errors as f64
        }),
        (
            "cache_member_damaged_blocks",
            "Checksum errors: blocks and metadata pages the member returned damaged (served \
             from another copy or the origin instead).",
            |m| m.bad_blocks as f64,
        ),
        (
            "cache_member_checksum_errors_recent",
            "Checksum errors within the last 10 minutes; 10 fail the member.",
            |m| m.checksum_errors_recent as f64,
        ),
        (
            "cache_member_rebuild_done_bytes",
            "Bytes a rebuild has copied onto the member.",
            |m| m.rebuild_done_bytes as f64,
        ),
    ]
}

/// A cache set's members, one labelled series each (`member`, `device`):
/// state, used and dirty blocks, errors and checksum errors (all, and
/// within the window that fails a member); and the dirty
/// blocks with one copy left, and the stale origin blocks of a cache given
/// up.
fn encode_members(e: &mut DescriptorEncoder, s: &crate::engine::Status) -> std::fmt::Result {
    gauge(
        e,
        "dirty_at_risk_blocks",
        "Dirty blocks with one copy left (a degraded cache set).",
        s.dirty_at_risk as f64,
    )?;
    gauge(
        e,
        "stale_origin_blocks",
        "Origin blocks whose data was lost with a failed cache device (reads of them fail).",
        s.stale_blocks as f64,
    )?;
    if s.cache_members.is_empty() {
        return Ok(());
    }
    use crate::device::set::MemberStatus as M;
    let series = |f: fn(&M) -> f64| -> Vec<(Labels, f64)> {
        s.cache_members
            .iter()
            .map(|m| {
                let labels = vec![
                    ("member", m.index.to_string()),
                    ("device", m.device.clone()),
                ];
                (labels, f(m))
            })
            .collect()
    };
    for (name, help, f) in member_gauges() {
        gauges(e, name, help, &series(f))?;
    }
    Ok(())
}

/// (name, help, the value of a volume).
type VolumeGauge = (
    &'static str,
    &'static str,
    fn(&crate::engine::VolumeStatus) -> f64,
);

/// The gauges of each volume.
fn volume_gauges() -> [VolumeGauge; 6] {
    [
        (
            "volume_size_bytes",
            "Size of the volume (its origin's).",
            |v| v.bytes as f64,
        ),
        (
            "volume_cached_blocks",
            "Cache blocks holding the volume's data.",
            |v| v.cache_blocks_used as f64,
        ),
        (
            "volume_dirty_blocks",
            "Cache blocks holding the volume's data not yet written back.",
            |v| v.cache_blocks_dirty as f64,
        ),
        (
            "volume_share_floor_blocks",
            "Cache blocks eviction leaves the volume (its minimum share or its curve part).",
            |v| v.share_floor_blocks as f64,
        ),
        (
            "volume_stale_origin_blocks",
            "Blocks of the volume's origin whose data was lost with a failed cache device.",
            |v| v.stale_blocks as f64,
        ),
        (
            "volume_origin_reachable",
            "1 while the volume's origin can be reached, 0 during an outage.",
            |v| {
                f64::from(u8::from(
                    v.origin_health.as_ref().is_none_or(|h| h.reachable),
                ))
            },
        ),
    ]
}

/// Each volume (origin) of the cache, one labelled series each (`volume`,
/// `origin`; the mode gauge also `mode`).
fn encode_volumes(e: &mut DescriptorEncoder, s: &crate::engine::Status) -> std::fmt::Result {
    let labels = |v: &crate::engine::VolumeStatus| -> Labels {
        vec![("volume", v.name.clone()), ("origin", v.origin.clone())]
    };
    for (name, help, f) in volume_gauges() {
        let series: Vec<(Labels, f64)> = s.volumes.iter().map(|v| (labels(v), f(v))).collect();
        gauges(e, name, help, &series)?;
    }
    let modes: Vec<(Labels, f64)> = (s.volumes.iter())
        .map(|v| {
            let mut l = labels(v);
            l.push(("mode", v.mode.name().to_string()));
            (l, 1.0)
        })
        .collect();
    gauges(
        e,
        "volume_mode",
        "The volume's cache mode (label mode).",
        &modes,
    )
}

/// Whether the origin can be reached (an origin without connections, a
/// local device, always can) and its reconnects.
fn encode_origin(e: &mut DescriptorEncoder, s: &crate::engine::Status) -> std::fmt::Result {
    let h = s
        .origin_health
        .clone()
        .unwrap_or(crate::device::DeviceHealth {
            reachable: true,
            ..Default::default()
        });
    gauge(
        e,
        "origin_reachable",
        "1 while the origin can be reached (an NBD origin: a connection is up), 0 during an outage.",
        f64::from(u8::from(h.reachable)),
    )?;
    gauge(
        e,
        "origin_unreachable_seconds",
        "How long the origin has been unreachable (0 while it is reachable).",
        h.unreachable_s.unwrap_or(0.0),
    )?;
    counter(
        e,
        "origin_reconnect_attempts",
        "Attempts to reconnect to an NBD origin since the cache opened.",
        h.reconnect_attempts,
    )?;
    counter(
        e,
        "origin_reconnects",
        "Reconnect attempts that brought every lost connection to the origin back.",
        h.reconnects,
    )
}

impl Collector for Exposition {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let t = &self.0;
        let s = &t.status;
        let e = &mut e;
        encode_info(e, s)?;
        // Every counter of `status`, under its own name.
        for (name, help, v) in s.stats.counters() {
            counter(e, name, help, v)?;
        }
        counter(
            e,
            "written_back_bytes",
            "Bytes of dirty blocks written back to the origin.",
            s.stats.blocks_written_back * u64::from(s.block_bytes),
        )?;
        for (name, help, v) in occupancy_gauges(t)
            .into_iter()
            .chain(activity_gauges(t))
            .chain(setting_gauges(s))
        {
            gauge(e, name, help, v)?;
        }
        encode_latency(e, t)?;
        encode_mrc(e, t)?;
        encode_volumes(e, s)?;
        encode_members(e, s)?;
        encode_origin(e, s)?;
        gauge(
            e,
            "monitor_uptime_seconds",
            "Seconds since the metrics endpoint started.",
            t.uptime_s,
        )
    }
}
