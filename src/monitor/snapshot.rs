//! `/api/snapshot`: what the dashboard draws, as one JSON object (format in
//! docs/observability.md). Everything comes from one `Taken` copy.

use serde::Serialize;

use super::sampler::Sample;
use super::Taken;
use crate::engine::observe::heat::HeatMap;
use crate::engine::observe::Mrc;
use crate::engine::Status;

#[derive(Serialize)]
struct Snapshot<'a> {
    name: &'a str,
    uptime_s: f64,
    status: &'a Status,
    /// Volume 0's heat map.
    heat: Heat<'a>,
    /// Every volume's, by index (`status.volumes` names them).
    heats: Vec<Heat<'a>>,
    latency: Vec<Quantiles>,
    mrc: &'a Mrc,
    history: &'a [Sample],
}

/// The LBA heat map: region i covers origin blocks
/// [i * region_blocks, (i + 1) * region_blocks).
#[derive(Serialize)]
struct Heat<'a> {
    region_blocks: u64,
    block_bytes: u32,
    cached: &'a [u32],
    dirty: &'a [u32],
    /// Accesses per second, recently (decayed).
    hot: Vec<f64>,
}

/// Percentiles of one latency histogram since the cache opened, seconds
/// (bucket upper bounds: log-linear, within 25%; `observe::latency`).
#[derive(Serialize)]
struct Quantiles {
    op: String,
    result: String,
    count: u64,
    p50_s: Option<f64>,
    p90_s: Option<f64>,
    p99_s: Option<f64>,
}

/// Volume `v`'s map, its rates rounded to hundredths.
fn heat<'a>(t: &'a Taken, map: &'a HeatMap, v: usize) -> Heat<'a> {
    let rates = t.heat_rate.get(v).map_or(&[][..], |r| &r[..]);
    Heat {
        region_blocks: map.region_blocks,
        block_bytes: map.block_bytes,
        cached: &map.cached,
        dirty: &map.dirty,
        hot: (0..map.cached.len())
            .map(|i| rates.get(i).map_or(0.0, |h| (h * 100.0).round() / 100.0))
            .collect(),
    }
}

pub fn render(t: &Taken) -> String {
    let o = &t.observations;
    let snap = Snapshot {
        name: &t.name,
        uptime_s: t.uptime_s,
        status: &t.status,
        heat: heat(t, &o.heats[0], 0),
        heats: (o.heats.iter().enumerate())
            .map(|(v, map)| heat(t, map, v))
            .collect(),
        latency: o
            .latency
            .requests
            .iter()
            .map(|(op, result, h)| Quantiles {
                op: op.clone(),
                result: result.clone(),
                count: h.count(),
                p50_s: h.quantile_s(0.5),
                p90_s: h.quantile_s(0.9),
                p99_s: h.quantile_s(0.99),
            })
            .collect(),
        mrc: &o.mrc,
        history: &t.history,
    };
    // Plain data with finite numbers: serialization cannot fail.
    serde_json::to_string(&snap).expect("encoding the snapshot")
}
