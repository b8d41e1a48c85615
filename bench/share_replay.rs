//! Replays two block traces at once through one cache of two volumes,
//! in-process on RAM devices, once per way of sharing the cache
//! (policy/share.rs): `global` (one ranking of every block), `fixed`
//! (each volume's minimum and maximum its fixed part: half each unless
//! `--fixed 30` gives the first 30%), and `curve` (floors from the
//! volumes' miss-ratio curves, split again every 10 s of the replay's
//! clock). What it measures is origin requests: reads while the traces
//! run, and writes once everything is written back.
//!
//!     /usr/bin/python3 bench/trace/tracetool.py gen --preset scans -o a.csv
//!     /usr/bin/python3 bench/trace/tracetool.py gen --seed 2 -o b.csv
//!     cargo run --release --example share_replay -- a.csv b.csv --cache 0.1
//!
//! The two traces interleave evenly (request i of a trace of n at i / n).
//! The replay's clock advances `--gap-us` (2000) a request, and the
//! background's work runs every `--tick` (32) requests. `--cache F` sizes
//! the cache at F times both footprints (distinct 4 KiB blocks touched).

#[path = "trace_csv.rs"]
mod trace_csv;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use tiercache::device::ram::RamDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::clock::{Clock, SimClock};
use tiercache::engine::format::Layout;
use tiercache::engine::policy::share::{Share, Sharing};
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::{AdmissionSettings, CreateOptions, Engine, Mode, OpenOptions};
use trace_csv::{footprint_blocks, origin_bytes_for, read_trace, Req};

fn arg(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

/// What one run is given.
struct Run<'a> {
    traces: [&'a [Req]; 2],
    slots: u64,
    policy: PolicyKind,
    sharing: &'a str,
    /// The first volume's fixed part, in thousandths.
    fixed_permille: u16,
    gap: Duration,
    tick: usize,
}

/// The two traces' requests, interleaved evenly: (volume, request).
fn interleaved(traces: [&[Req]; 2]) -> Vec<(usize, &Req)> {
    let [a, b] = traces;
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        // Request i of a is due at i / |a|; take the earlier.
        let a_first = j >= b.len() || (i < a.len() && i * b.len() <= j * a.len());
        if a_first {
            out.push((0, &a[i]));
            i += 1;
        } else {
            out.push((1, &b[j]));
            j += 1;
        }
    }
    out
}

/// A new cache of two volumes for `run`, shared as it says.
fn engine_for(run: &Run, clock: &SimClock) -> Result<Arc<Engine>> {
    let cache: DeviceRef = Arc::new(RamDevice::new(
        "cache",
        Layout::device_bytes_for(4096, run.slots),
    ));
    let named = (run.traces.iter().enumerate())
        .map(|(v, t)| {
            let dev = RamDevice::new(&format!("origin{v}"), origin_bytes_for(t));
            (format!("vol{v}"), Arc::new(dev) as DeviceRef)
        })
        .collect();
    let opts = CreateOptions {
        mode: Mode::Writeback,
        policy: run.policy,
        // Every miss admitted: the comparison is of sharing, not admission.
        admission: AdmissionSettings {
            sequential_cutoff_bytes: 0,
            promote_after: 1,
            guard: false,
            ..Default::default()
        },
        allow_data_loss: true,
        ..Default::default()
    };
    let open = OpenOptions {
        no_background: true,
        allow_data_loss: true,
        clock: Clock::sim(clock.clone()),
        ..Default::default()
    };
    let engine = Engine::create_volumes(cache, named, &opts, &open)?;
    match run.sharing {
        "global" => {}
        "fixed" => {
            for (v, permille) in [run.fixed_permille, 1000 - run.fixed_permille]
                .into_iter()
                .enumerate()
            {
                let share = Share {
                    min_permille: permille,
                    max_permille: permille,
                };
                engine.set_share(v, share)?;
            }
        }
        "curve" => engine.set_sharing(Sharing::Curve)?,
        s => bail!("sharing {s}: global, fixed or curve"),
    }
    Ok(engine)
}

/// Replays `run`; prints its row.
fn replay(run: &Run) -> Result<()> {
    let clock = SimClock::new();
    let engine = engine_for(run, &clock)?;
    let bases: Vec<u64> = engine.volumes().iter().map(|v| v.1).collect();
    for (i, (v, r)) in interleaved(run.traces).into_iter().enumerate() {
        let at = bases[v] + r.offset;
        if r.write {
            engine.write(at, &vec![0xa5u8; r.len as usize], false)?;
        } else {
            engine.read(at, r.len)?;
        }
        clock.advance(run.gap);
        if i % run.tick == run.tick - 1 {
            engine.background_tick();
        }
    }
    let status = engine.status();
    let during = status.stats;
    engine.write_back_all(&mut |_, _| {})?;
    let after = engine.status().stats;
    engine.close()?;
    let held: Vec<String> = (status.volumes.iter())
        .map(|v| {
            let pct = |n: u64| 100.0 * n as f64 / status.cache_blocks_total as f64;
            format!(
                "{:.0}% (floor {:.0}%)",
                pct(v.cache_blocks_used),
                pct(v.share_floor_blocks)
            )
        })
        .collect();
    println!(
        "| {}, {} | {} | {} | {} | {} | {} |",
        run.sharing,
        run.policy.name(),
        during.origin_reads,
        after.origin_writes,
        during.origin_reads + after.origin_writes,
        during.read_hits,
        held.join(" / "),
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(a), Some(b)) = (args.first(), args.get(1)) else {
        bail!("usage: share_replay A.csv B.csv [--cache 0.1] [--policies s3fifo,lru] [--sharings global,fixed,curve] [--fixed 50] [--tick 32] [--gap-us 2000]");
    };
    let (ta, tb) = (read_trace(a)?, read_trace(b)?);
    let ratio: f64 = arg(&args, "--cache").map_or(Ok(0.1), |v| v.parse())?;
    let fixed: f64 = arg(&args, "--fixed").map_or(Ok(50.0), |v| v.parse())?;
    let tick: usize = arg(&args, "--tick").map_or(Ok(32), |v| v.parse())?;
    let gap_us: u64 = arg(&args, "--gap-us").map_or(Ok(2000), |v| v.parse())?;
    let policies = arg(&args, "--policies").unwrap_or_else(|| "s3fifo,lru".into());
    let sharings = arg(&args, "--sharings").unwrap_or_else(|| "global,fixed,curve".into());
    let footprints = [footprint_blocks(&ta), footprint_blocks(&tb)];
    let slots = (((footprints[0] + footprints[1]) as f64 * ratio) as u64).max(64);
    println!(
        "{a} ({} requests, footprint {} blocks) beside {b} ({} requests, footprint {} blocks); \
         cache {slots} blocks ({ratio}x both footprints), writeback, every miss admitted",
        ta.len(),
        footprints[0],
        tb.len(),
        footprints[1]
    );
    println!("| sharing, policy | origin reads | origin writes (after writeback) | origin requests | read hits | cache held at the end (vol0 / vol1) |");
    println!("|---|--:|--:|--:|--:|---|");
    for policy in policies.split(',') {
        let Some(policy) = PolicyKind::parse(policy) else {
            bail!("policy {policy}: lru, fifo or s3fifo");
        };
        for sharing in sharings.split(',') {
            replay(&Run {
                traces: [&ta, &tb],
                slots,
                policy,
                sharing,
                fixed_permille: (fixed * 10.0).round() as u16,
                gap: Duration::from_micros(gap_us),
                tick,
            })?;
        }
    }
    Ok(())
}
