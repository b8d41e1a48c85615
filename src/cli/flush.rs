//! `tiercache flush`: write all dirty data back to the origin.

use anyhow::Result;

use super::progress::{self, Unit};
use super::registry::Registry;
use super::target::{Opened, Target};
use super::units::human_bytes;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let written = flush_with_progress(&opened.target)?;
    let status = opened.target.status()?;
    opened.finish()?;
    println!(
        "cache '{}': flushed, {written} blocks ({}) written back; {} dirty",
        opened.entry.name,
        human_bytes(written * u64::from(status.block_bytes)),
        status.cache_blocks_dirty
    );
    Ok(())
}

/// Writes back all dirty data, with a progress bar when stderr is a
/// terminal. Returns the number of blocks written back.
pub fn flush_with_progress(target: &Target) -> Result<u64> {
    let before = target.status()?;
    // Nothing dirty: no bar to flash up.
    let bar = if before.cache_blocks_dirty > 0 {
        progress::bar("writing back", before.cache_blocks_dirty, Unit::Blocks)
    } else {
        None
    };
    let result = target.write_back_all(&mut progress::updater(&bar));
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    result?;
    Ok(target.status()?.stats.blocks_written_back - before.stats.blocks_written_back)
}
