//! `tiercache detach`: write everything back, dissolve the cache, forget it.

use anyhow::{Context, Result};

use super::flush::flush_with_progress;
use super::registry::Registry;
use super::target::Opened;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let entry = opened.entry.clone();
    // Written back here first for the progress bar; detach then finds
    // (almost) nothing left to do.
    let written = flush_with_progress(&opened.target)?;
    opened
        .target
        .detach()
        .with_context(|| format!("cache '{}'", entry.name))?;
    opened.finish()?;
    reg.remove(&entry.name).with_context(|| {
        format!(
            "cache '{}' was detached but its registry entry could not be removed",
            entry.name
        )
    })?;
    drop(opened);
    println!(
        "cache '{}' detached: {written} blocks written back",
        entry.name
    );
    println!(
        "the origin {} now stands alone and holds all data; {} no longer holds a cache",
        entry.origin, entry.cache
    );
    Ok(())
}
