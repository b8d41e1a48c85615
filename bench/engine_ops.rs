//! The engine's own cost per request, without a front end: 4 KiB read hits
//! and in-place 4 KiB writes through the NBD server's fast paths
//! (`try_read_hits`, `try_write_cached`), on RAM devices, one thread.
//! For side-by-side runs of two builds (docs/benchmarks.md, issue 21):
//!
//!     cargo run --release --example engine_ops -- [--ops N] [--rounds R] [--direct 1]
//!
//! Prints nanoseconds per request for each round and the median.
//!
//! `--direct 1` measures the ublk queue's direct path instead
//! (`Volume::start_read`/`start_write` answering `Start::Direct`, then
//! `Direct::finish`, engine/io/direct.rs): the cache is a file (the path
//! needs a plain file or block device) in the system's temporary
//! directory, and the device I/O the queue would make in between is left
//! out, so the numbers are the engine's own work a request on that path.

#[path = "example_args.rs"]
mod example_args;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use example_args::{arg, next};
use tiercache::device::file::FileDevice;
use tiercache::device::ram::RamDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::async_engine::AsyncEngine;
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, Fast, OpenOptions};
use tiercache::volume::{Start, Volume};

const BS: u64 = 4096;
/// Blocks written first, then read and rewritten at random.
const BLOCKS: u64 = 32_768;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let ops = arg(&args, "--ops", 1_000_000)?;
    let rounds = arg(&args, "--rounds", 5)?;
    let direct = arg(&args, "--direct", 0)? != 0;
    let cache_bytes = Layout::device_bytes_for(BS as u32, 2 * BLOCKS);
    let file = std::env::temp_dir().join(format!("engine_ops-{}.cache", std::process::id()));
    let cache: DeviceRef = match direct {
        false => Arc::new(RamDevice::new("cache", cache_bytes)),
        true => {
            std::fs::File::create(&file)?.set_len(cache_bytes)?;
            let dev = FileDevice::open(file.to_str().expect("a UTF-8 temporary path"));
            std::fs::remove_file(&file)?;
            Arc::new(dev?)
        }
    };
    let origin: DeviceRef = Arc::new(RamDevice::new("origin", 4 * BLOCKS * BS));
    let opts = CreateOptions {
        allow_data_loss: true,
        ..Default::default()
    };
    Engine::create(cache.clone(), origin.clone(), &opts)?.close()?;
    let open = OpenOptions {
        no_background: true,
        allow_data_loss: true,
        ..Default::default()
    };
    let engine = Engine::open(cache, origin, &open)?;
    let data = vec![0x5au8; BS as usize];
    for b in 0..BLOCKS {
        engine.write(b * BS, &data, false)?;
    }
    engine.flush()?;
    if direct {
        let volume = AsyncEngine::new(engine.clone());
        timed(
            ops,
            rounds,
            "direct ",
            |at| finish(volume.start_read(at, BS as u32), &data, "hit"),
            |at| finish(volume.start_write(at, &data, false), &data, "write"),
        )?;
    } else {
        timed(
            ops,
            rounds,
            "",
            |at| match engine.try_read_hits(at, BS) {
                Fast::Done(r) => r.map(drop).map_err(Into::into),
                Fast::Pending(_) => bail!("not a hit"),
            },
            |at| match engine.try_write_cached(at, &data, false) {
                Fast::Done(r) => r.map_err(Into::into),
                Fast::Pending(_) => bail!("not written in place"),
            },
        )?;
    }
    engine.close()?;
    Ok(())
}

/// Finishes a request the direct path started (`data`: its buffer, as
/// the ublk queue passes it), its device I/O left out.
fn finish<T, B>(start: Start<T, B>, data: &[u8], what: &str) -> Result<()> {
    let Start::Direct(d) = start else {
        bail!("not a direct {what}");
    };
    if d.finish(true, data).is_some() {
        bail!("the direct {what} was not finished");
    }
    Ok(())
}

/// `rounds` rounds of `ops` reads, then `ops` writes, each of a random
/// block (`read` and `write` take its offset); prints each round's ns a
/// request and the medians.
fn timed(
    ops: u64,
    rounds: u64,
    label: &str,
    mut read: impl FnMut(u64) -> Result<()>,
    mut write: impl FnMut(u64) -> Result<()>,
) -> Result<()> {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..rounds as usize {
        reads.push(one_round(ops, &mut x, &mut read)?);
        writes.push(one_round(ops, &mut x, &mut write)?);
        println!(
            "round {round}: {label}read hit {:.0} ns, {label}write in place {:.0} ns",
            reads[round], writes[round]
        );
    }
    println!(
        "median of {rounds} rounds of {ops}: {label}read hit {:.0} ns, {label}write in place {:.0} ns",
        median(&mut reads),
        median(&mut writes)
    );
    Ok(())
}

/// `ops` requests of `f` at random blocks: ns a request.
fn one_round(ops: u64, x: &mut u64, f: &mut impl FnMut(u64) -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..ops {
        let b = next(x) % BLOCKS;
        f(b * BS).map_err(|e| anyhow::anyhow!("block {b}: {e}"))?;
    }
    Ok(t.elapsed().as_nanos() as f64 / ops as f64)
}
