//! Locks per request and their hold times, under load on every core
//! (docs/concurrency.md, "Scaling past two cores"). Built with the
//! `lockstat` feature, which counts every ranked lock (src/lockstat.rs):
//!
//!     cargo run --release --features lockstat --example lock_stats -- [--ops N] [--threads T]
//!
//! A writeback cache of 64 Ki 4 KiB blocks on a file in target/ (O_DIRECT,
//! the disk under test) over a file origin, all blocks written first.
//! Then, per workload, T threads each make N requests at random blocks,
//! and the table gives each lock rank's acquisitions per request, how
//! often a taker waited, the mean wait and the mean hold:
//! - `direct hit` / `direct write`: the ublk queue's path
//!   (`Volume::start_read` / `start_write`, the device I/O made by the
//!   caller with pread/pwrite, as the queue does with io_uring);
//! - `fast hit` / `fast write`: the NBD server's path (`Volume::read` /
//!   `write`, whose fast paths run on the calling thread).

#[path = "example_args.rs"]
mod example_args;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use example_args::{arg, next};
use tiercache::device::file::FileDevice;
use tiercache::device::AlignedBuf;
use tiercache::engine::async_engine::AsyncEngine;
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, Mode};
use tiercache::lockstat;
use tiercache::volume::{Dest, Direct, Start, Volume};

const BS: u64 = 4096;
const BLOCKS: u64 = 65_536;

#[derive(Clone, Copy)]
enum Work {
    DirectHit,
    DirectWrite,
    FastHit,
    FastWrite,
}

/// Makes a direct request's device I/O with pread or pwrite.
fn device_io<T>(d: &Direct<T>, buf: &mut [u8], write: bool) -> bool {
    d.pieces.iter().all(|p| {
        let b = &mut buf[p.buf.clone()];
        let at = p.at as libc::off_t;
        // SAFETY: `b` is a live slice of the length given.
        let n = unsafe {
            match write {
                true => libc::pwrite(d.fd, b.as_ptr().cast(), b.len(), at),
                false => libc::pread(d.fd, b.as_mut_ptr().cast(), b.len(), at),
            }
        };
        n == b.len() as isize
    })
}

fn one(vol: &AsyncEngine, rt: &tokio::runtime::Runtime, work: Work, at: u64, buf: &mut [u8]) {
    match work {
        Work::DirectHit => match vol.start_read(at, BS as u32) {
            Start::Direct(d) => {
                let ok = device_io(&d, buf, false);
                if let Some(later) = d.finish(ok, &[]) {
                    rt.block_on(later).expect("read");
                }
            }
            Start::Later(later) => drop(rt.block_on(later).expect("read")),
            // A locked block (the other thread's): read as a ublk queue
            // would, on a thread that may block, into `buf`.
            Start::Blocking(read) => {
                // SAFETY: `buf` outlives the Dest, untouched until the reply.
                let dest = unsafe { Dest::new(buf.as_mut_ptr(), buf.len(), || {}) };
                read(dest, Box::new(|_, r| r.expect("read")));
            }
            Start::Default => panic!("a file cache reads directly"),
        },
        Work::DirectWrite => match vol.start_write(at, buf, false) {
            Start::Direct(d) => {
                let ok = device_io(&d, buf, true);
                if let Some(later) = d.finish(ok, buf) {
                    rt.block_on(later).expect("write");
                }
            }
            Start::Later(later) => rt.block_on(later).expect("write"),
            Start::Blocking(never) => match never {},
            Start::Default => panic!("a file cache writes directly"),
        },
        Work::FastHit => drop(rt.block_on(vol.read(at, BS as u32)).expect("read")),
        Work::FastWrite => {
            let data = AlignedBuf::from_slice(buf);
            rt.block_on(vol.write(at, data, false)).expect("write")
        }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let ops = arg(&args, "--ops", 200_000)?;
    let threads = arg(&args, "--threads", 2)?;
    std::fs::create_dir_all("target")?;
    let dir = tempfile::tempdir_in("target")?;
    let cache_path = dir.path().join("cache");
    let origin_path = dir.path().join("origin");
    let cache_bytes = Layout::device_bytes_for(BS as u32, 2 * BLOCKS);
    std::fs::File::create(&cache_path)?.set_len(cache_bytes)?;
    std::fs::File::create(&origin_path)?.set_len(BLOCKS * BS)?;
    let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    let cache = Arc::new(FileDevice::open(&path(&cache_path))?);
    if !cache.is_direct() {
        bail!(
            "{}: no O_DIRECT here (tmpfs?): run from a checkout on a disk",
            path(&cache_path)
        );
    }
    let origin = Arc::new(FileDevice::open(&path(&origin_path))?);
    let opts = CreateOptions {
        mode: Mode::Writeback,
        ..Default::default()
    };
    let engine = Engine::create(cache, origin, &opts)?;
    let data = vec![0x5au8; BS as usize];
    for b in 0..BLOCKS {
        engine.write(b * BS, &data, false)?;
    }
    engine.flush()?;
    let rt = Arc::new(tokio::runtime::Runtime::new()?);
    println!(
        "{threads} threads, {ops} requests each, 4 KiB at random over {BLOCKS} cached blocks\n"
    );
    for (name, work) in [
        ("direct hit", Work::DirectHit),
        ("direct write", Work::DirectWrite),
        ("fast hit", Work::FastHit),
        ("fast write", Work::FastWrite),
    ] {
        let before = lockstat::snapshot();
        let t = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let (vol, rt) = (AsyncEngine::new(engine.clone()), rt.clone());
                std::thread::spawn(move || {
                    let _in = rt.enter();
                    let mut buf = AlignedBuf::zeroed(BS as usize);
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i + 1);
                    for _ in 0..ops {
                        one(&vol, &rt, work, (next(&mut x) % BLOCKS) * BS, &mut buf);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        let secs = t.elapsed().as_secs_f64();
        let requests = (threads * ops) as u64;
        let stats = lockstat::snapshot().since(&before);
        println!("## {name}: {:.0} requests/s\n", requests as f64 / secs);
        println!("{}", stats.table(requests));
    }
    engine.close()?;
    Ok(())
}
