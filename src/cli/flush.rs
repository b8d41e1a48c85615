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
    /// Of a cache of several origins: write back this volume's dirty data
    /// only (in flush order, every volume's: the groups span them).
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let written = flush_with_progress(&opened.target, a.volume.as_deref())?;
    let status = opened.target.status()?;
    opened.finish()?;
    let cache = format!("cache '{}'", opened.entry.name);
    let dirty = super::status::dirty_blocks(&status, a.volume.as_deref())?;
    let what = match &a.volume {
        Some(name) => format!("volume '{name}' of {cache}"),
        None => cache,
    };
    outln!(
        "{what}: flushed, {written} blocks ({}) written back; {dirty} dirty",
        human_bytes(written * u64::from(status.block_bytes)),
    );
    Ok(())
}

/// Writes back all dirty data (or `volume`'s), with a progress bar when
/// stderr is a terminal. Returns the number of blocks written back.
pub fn flush_with_progress(target: &Target, volume: Option<&str>) -> Result<u64> {
    let before = target.status()?;
    let dirty = super::status::dirty_blocks(&before, volume)?;
    // Nothing dirty: no bar to flash up.
    let bar = if dirty > 0 {
        progress::bar("writing back", dirty, Unit::Blocks)
    } else {
        None
    };
    let result = target.write_back(volume, &mut progress::updater(&bar));
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    result?;
    Ok(target.status()?.stats.blocks_written_back - before.stats.blocks_written_back)
}
