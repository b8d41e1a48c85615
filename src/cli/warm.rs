//! `tiercache warm`: promote a range of the volume into the cache ahead of
//! use, whatever admission would say (the sequential cutoff, promotion
//! after N misses, the guard). Through the daemon when one serves the
//! cache, else on the cache opened here.

use anyhow::Result;
use tiercache::device::parse_size;

use super::exit::fail;
use super::progress::{self, Unit};
use super::registry::Registry;
use super::target::Opened;
use super::units::human_bytes;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Where the range starts in the volume (a multiple of 512; e.g. 1G).
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    offset: u64,
    /// How much to promote (default: to the end of the volume).
    #[arg(long, value_parser = parse_bytes)]
    length: Option<u64>,
    /// Of a cache of several origins: the volume to warm (default: the
    /// first).
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
}

fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).ok_or_else(|| format!("'{s}' is not a size (examples: 4096, 64K, 32M, 1G)"))
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let before = opened.target.status()?;
    if !a.offset.is_multiple_of(512) || a.length.is_some_and(|l| !l.is_multiple_of(512)) {
        fail!(Usage, "--offset and --length must be multiples of 512");
    }
    let volume_bytes = super::status::volume(&before, a.volume.as_deref())?.bytes;
    if a.offset >= volume_bytes {
        fail!(
            Usage,
            "--offset {} is at or past the end of the volume ({})",
            a.offset,
            human_bytes(volume_bytes)
        );
    }
    let length = a.length.unwrap_or(u64::MAX).min(volume_bytes - a.offset);
    let bar = progress::bar("warming", length, Unit::Bytes);
    let result = opened.target.warm(
        a.volume.as_deref(),
        a.offset,
        length,
        &mut progress::updater(&bar),
    );
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    result?;
    let after = opened.target.status()?;
    opened.finish()?;
    let promoted = after.stats.promotions - before.stats.promotions;
    outln!(
        "cache '{}': warmed {} at offset {}: {promoted} blocks ({}) promoted; {} of {} cache blocks used",
        opened.entry.name,
        human_bytes(length),
        human_bytes(a.offset),
        human_bytes(promoted * u64::from(after.block_bytes)),
        after.cache_blocks_used,
        after.cache_blocks_total
    );
    if length > after.cache_blocks_total * u64::from(after.block_bytes) {
        outln!("  (the range is larger than the cache: only its most recently read part stays)");
    }
    Ok(())
}
