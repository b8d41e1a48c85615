//! Replays a block trace through the engine in-process, one request at a
//! time, on RAM devices: no NBD, no emulated disk, no timing. What it
//! measures is what the engine's policy and admission make of the trace:
//! origin reads and writes, hits, against the compulsory misses. Seconds
//! instead of the minutes of `bench/run --trace`, so a policy change can be
//! judged on the real engine, not only in `bench/trace/sim.py`.
//!
//!     /usr/bin/python3 bench/trace/tracetool.py gen --preset scans -o scans.csv
//!     cargo run --release --example engine_replay -- scans.csv --cache 0.25 \
//!         --policies s3fifo,lru --admit-all
//!
//! The trace is MSR / SNIA CSV (`Timestamp,Hostname,DiskNumber,Type,Offset,
//! Size,ResponseTime`); offsets are used as they are, the origin is as large
//! as the largest request end. `--cache F` sizes the cache at F times the
//! footprint (distinct 4 KiB blocks touched). Background writeback runs
//! between requests as the background thread would (`background_tick` every
//! `--tick` requests). `--placements in-place,log` runs every policy with
//! each placement (table/segments.rs): the log placement's cleaner evicts in
//! log order, so its origin reads show what that costs in hits.
//! `--orders address,flush` runs each with each writeback order, and
//! `--flush-every N` sends a client flush after every N writes (as a file
//! system's journal commits do; traces carry no flushes): what writeback in
//! flush order (writeback/order/flush.rs) costs in origin writes and flushes,
//! and the most cache blocks its older versions took.

use std::collections::HashSet;
use std::sync::Arc;

#[path = "trace_csv.rs"]
mod trace_csv;

use anyhow::{bail, Result};
use tiercache::device::ram::RamDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::format::Layout;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::{
    AdmissionSettings, CreateOptions, Engine, Mode, OpenOptions, Placement, WritebackOrder,
};
use trace_csv::{footprint_blocks, origin_bytes_for, read_trace};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first().filter(|a| !a.starts_with("--")) else {
        bail!("usage: engine_replay TRACE.csv [--cache 0.25] [--policies s3fifo,lru] [--admit-all] [--mode writeback] [--tick 32] [--placements in-place,log] [--orders address,flush] [--flush-every 0]");
    };
    let reqs = read_trace(path)?;
    let ratio: f64 = arg(&args, "--cache").map_or(Ok(0.25), |v| v.parse())?;
    let tick: usize = arg(&args, "--tick").map_or(Ok(32), |v| v.parse())?;
    let admit_all = args.iter().any(|a| a == "--admit-all");
    let mode = match arg(&args, "--mode").as_deref() {
        None | Some("writeback") => Mode::Writeback,
        Some("writethrough") => Mode::Writethrough,
        Some("writearound") => Mode::Writearound,
        Some(m) => bail!("mode {m}"),
    };
    let policies = arg(&args, "--policies").unwrap_or_else(|| "s3fifo,lru".into());
    let placements = arg(&args, "--placements").unwrap_or_else(|| "in-place".into());
    let orders = arg(&args, "--orders").unwrap_or_else(|| "address".into());
    let flush_every: usize = arg(&args, "--flush-every").map_or(Ok(0), |v| v.parse())?;
    let origin_bytes = origin_bytes_for(&reqs);
    let footprint = footprint_blocks(&reqs);
    let slots = ((footprint as f64 * ratio) as u64).max(64);
    // A read of a never-touched sector must go to the origin: the bound.
    let mut touched: HashSet<u64> = HashSet::new();
    let mut compulsory = 0u64;
    for r in &reqs {
        let sectors = r.offset / 512..(r.offset + r.len) / 512;
        if !r.write && sectors.clone().any(|s| !touched.contains(&s)) {
            compulsory += 1;
        }
        touched.extend(sectors);
    }
    println!(
        "{path}: {} requests, footprint {} blocks, cache {slots} blocks ({ratio}x), {mode:?}, admission {}; compulsory read misses {compulsory}",
        reqs.len(),
        footprint,
        if admit_all { "admits everything" } else { "default" }
    );
    println!("| policy | origin reads | origin writes (after the run) | origin writes incl. flush | origin writes per 1000 writes | read hits | read misses | x LRU reads | groups written back | older versions kept (peak) |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let client_writes = reqs.iter().filter(|r| r.write).count().max(1) as f64;
    let mut lru_reads = None;
    let runs: Vec<(&str, &str, &str)> = orders
        .split(',')
        .flat_map(|o| placements.split(',').map(move |p| (o, p)))
        .flat_map(|(o, p)| policies.split(',').map(move |name| (o, p, name)))
        .collect();
    for (order_name, placement_name, name) in runs {
        let Some(writeback_order) = WritebackOrder::parse(order_name) else {
            bail!("writeback order {order_name}: address or flush");
        };
        let Some(kind) = PolicyKind::parse(name) else {
            bail!("policy {name}: lru, fifo or s3fifo");
        };
        let Some(placement) = Placement::parse(placement_name) else {
            bail!("placement {placement_name}: in-place or log");
        };
        let cache: DeviceRef = Arc::new(RamDevice::new(
            "cache",
            Layout::device_bytes_for(4096, slots),
        ));
        let origin: DeviceRef = Arc::new(RamDevice::new("origin", origin_bytes));
        let mut admission = AdmissionSettings::default();
        if admit_all {
            admission.sequential_cutoff_bytes = 0;
            admission.promote_after = 1;
            admission.guard = false;
        }
        let opts = CreateOptions {
            mode,
            policy: kind,
            placement,
            writeback_order,
            admission,
            allow_data_loss: true,
            ..Default::default()
        };
        Engine::create(cache.clone(), origin.clone(), &opts)?.close()?;
        let engine = Engine::open(
            cache,
            origin,
            &OpenOptions {
                no_background: true,
                allow_data_loss: true,
                ..Default::default()
            },
        )?;
        let mut writes = 0;
        for (i, r) in reqs.iter().enumerate() {
            if r.write {
                engine.write(r.offset, &vec![0xa5u8; r.len as usize], false)?;
                writes += 1;
                if flush_every > 0 && writes % flush_every == 0 {
                    engine.flush()?;
                }
            } else {
                engine.read(r.offset, r.len)?;
            }
            if i % tick == tick - 1 {
                engine.background_tick();
            }
        }
        let status = engine.status();
        let during = status.stats;
        let peak = status.flush_groups.map_or(0, |g| g.shadow_peak);
        engine.write_back_all(&mut |_, _| {})?;
        let after = engine.status().stats;
        engine.close()?;
        let x = match lru_reads {
            Some(l) => format!("{:.3}", during.origin_reads as f64 / l as f64),
            None => "-".into(),
        };
        if kind == PolicyKind::Lru
            && placement == Placement::InPlace
            && writeback_order == WritebackOrder::Address
        {
            lru_reads = Some(during.origin_reads);
        }
        println!(
            "| {name}, {placement_name}, {order_name} order | {} | {} | {} | {:.0} | {} | {} | {x} | {} | {peak} |",
            during.origin_reads,
            during.origin_writes,
            after.origin_writes,
            during.origin_writes as f64 * 1000.0 / client_writes,
            during.read_hits,
            during.read_misses,
            during.groups_written_back,
        );
    }
    Ok(())
}
