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
        return direct_ops(engine, ops, rounds);
    }
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..rounds {
        let t = Instant::now();
        for _ in 0..ops {
            let b = next(&mut x) % BLOCKS;
            match engine.try_read_hits(b * BS, BS) {
                Fast::Done(r) => drop(r?),
                Fast::Pending(_) => bail!("block {b} was not a hit"),
            }
        }
        reads.push(t.elapsed().as_nanos() as f64 / ops as f64);
        let t = Instant::now();
        for _ in 0..ops {
            let b = next(&mut x) % BLOCKS;
            match engine.try_write_cached(b * BS, &data, false) {
                Fast::Done(r) => r?,
                Fast::Pending(_) => bail!("block {b} was not written in place"),
            }
        }
        writes.push(t.elapsed().as_nanos() as f64 / ops as f64);
        println!(
            "round {round}: read hit {:.0} ns, write in place {:.0} ns",
            reads[round as usize], writes[round as usize]
        );
    }
    println!(
        "median of {rounds} rounds of {ops}: read hit {:.0} ns, write in place {:.0} ns",
        median(&mut reads),
        median(&mut writes)
    );
    engine.close()?;
    Ok(())
}

/// `--direct 1`: the rounds through the ublk queue's direct path.
fn direct_ops(engine: Arc<Engine>, ops: u64, rounds: u64) -> Result<()> {
    let volume = AsyncEngine::new(engine.clone());
    let data = vec![0x5au8; BS as usize];
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..rounds {
        let t = Instant::now();
        for _ in 0..ops {
            let b = next(&mut x) % BLOCKS;
            match volume.start_read(b * BS, BS as u32) {
                Start::Direct(d) => {
                    if d.finish(true, &data).is_some() {
                        bail!("block {b}: the direct read was not finished");
                    }
                }
                _ => bail!("block {b} was not a direct hit"),
            }
        }
        reads.push(t.elapsed().as_nanos() as f64 / ops as f64);
        let t = Instant::now();
        for _ in 0..ops {
            let b = next(&mut x) % BLOCKS;
            match volume.start_write(b * BS, &data, false) {
                Start::Direct(d) => {
                    if d.finish(true, &data).is_some() {
                        bail!("block {b}: the direct write was not finished");
                    }
                }
                _ => bail!("block {b} was not a direct write"),
            }
        }
        writes.push(t.elapsed().as_nanos() as f64 / ops as f64);
        println!(
            "round {round}: direct read hit {:.0} ns, direct write in place {:.0} ns",
            reads[round as usize], writes[round as usize]
        );
    }
    println!(
        "median of {rounds} rounds of {ops}: direct read hit {:.0} ns, direct write in place {:.0} ns",
        median(&mut reads),
        median(&mut writes)
    );
    drop(volume);
    engine.close()?;
    Ok(())
}
