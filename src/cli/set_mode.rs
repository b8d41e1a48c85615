//! `tiercache set-mode MODE`: switch the cache mode of a cache.

use anyhow::Result;

use super::flush::flush_with_progress;
use super::registry::Registry;
use super::target::Opened;
use super::units::parse_mode;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// writeback, writethrough, writearound, writeonly or passthrough.
    mode: String,
    #[command(flatten)]
    name: NameArg,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let mode = parse_mode(&a.mode)?;
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let before = opened.target.status()?;
    if before.mode == mode {
        opened.finish()?;
        println!(
            "cache '{}': already in {} mode",
            opened.entry.name,
            mode.name()
        );
        return Ok(());
    }
    // The engine writes dirty data back itself when the new mode holds
    // none; doing it first here shows progress.
    let mut written = 0;
    if !mode.holds_dirty() && before.cache_blocks_dirty > 0 {
        written = flush_with_progress(&opened.target, None)?;
    }
    opened.target.set_mode(mode)?;
    opened.finish()?;
    let note = if written > 0 {
        format!(" ({written} dirty blocks written back first)")
    } else {
        String::new()
    };
    println!(
        "cache '{}': mode {} -> {}{note}",
        opened.entry.name,
        before.mode.name(),
        mode.name()
    );
    Ok(())
}
