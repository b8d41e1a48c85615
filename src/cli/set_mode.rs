//! `tiercache set-mode MODE`: switch the cache mode of a cache, or of one
//! of its volumes (`--volume`).

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
    /// Of a cache of several origins: switch this volume only (the others
    /// keep their modes). Without it every volume gets the mode.
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let mode = parse_mode(&a.mode)?;
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let before = opened.target.status()?;
    let volume = a.volume.as_deref();
    let (what, old, dirty) = match volume {
        Some(name) => {
            let v = super::status::volume(&before, Some(name))?;
            let what = format!("volume '{name}' of cache '{}'", opened.entry.name);
            (what, v.mode, v.cache_blocks_dirty)
        }
        None => {
            let what = format!("cache '{}'", opened.entry.name);
            (what, before.mode, before.cache_blocks_dirty)
        }
    };
    let all_there = before.volumes.iter().all(|v| v.mode == mode);
    if old == mode && (volume.is_some() || all_there) {
        opened.finish()?;
        outln!("{what}: already in {} mode", mode.name());
        return Ok(());
    }
    // The engine writes dirty data back itself when the new mode holds
    // none; doing it first here shows progress.
    let mut written = 0;
    if !mode.holds_dirty() && dirty > 0 {
        written = flush_with_progress(&opened.target, volume)?;
    }
    opened.target.set_mode(volume, mode)?;
    opened.finish()?;
    let note = if written > 0 {
        format!(" ({written} dirty blocks written back first)")
    } else {
        String::new()
    };
    outln!("{what}: mode {} -> {}{note}", old.name(), mode.name());
    Ok(())
}
