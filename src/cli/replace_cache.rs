//! `tiercache replace-cache OLD NEW`: a cache set member (failed, missing,
//! or retiring) is replaced by a new device, and the copies it held
//! (metadata, mirrored blocks) are rebuilt onto it online, with a progress
//! bar, while clients keep going. Through the daemon when one serves the
//! cache, else on the cache opened here (degraded if OLD cannot be found).

use anyhow::Result;

use super::exit::fail;
use super::progress::{self, Unit};
use super::registry::{self, Registry};
use super::target::Opened;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// The member to replace: its path as registered, or its index (0, 1, ...).
    old: String,
    /// The new device (its contents are replaced).
    new: String,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let entry = reg.resolve(a.name.name.as_deref())?;
    let paths = entry.cache_paths();
    if paths.len() < 2 {
        fail!(Usage,
            "cache '{}' has one cache device ({}), not a cache set: there is nothing to rebuild from",
            entry.name,
            entry.cache
        );
    }
    let member = match a.old.parse::<usize>() {
        Ok(i) if i < paths.len() => i,
        _ => {
            let old = registry::absolute(&a.old)?;
            match paths
                .iter()
                .position(|p| registry::same_file(p, &old) || *p == old)
            {
                Some(i) => i,
                None => fail!(
                    NotFound,
                    "{} is not a member of cache '{}' (members: {})",
                    a.old,
                    entry.name,
                    paths.join(", ")
                ),
            }
        }
    };
    let new = registry::absolute(&a.new)?;
    if let Some(other) = reg.list()?.into_iter().find(|e| e.uses(&new)) {
        fail!(Refused, "{new} is already used by cache '{}'", other.name);
    }
    let opened = Opened::open_with(reg, Some(&entry.name), true)?;
    let bar = progress::bar("rebuilding", 1, Unit::Bytes);
    let result = opened
        .target
        .replace_cache(member, &new, &mut progress::updater(&bar));
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    result?;
    // The entry as it is now: a failover recorded during the rebuild stays.
    reg.update(&entry.name, |e| {
        *e = e.with_cache_replaced(&paths[member], &new)
    })?;
    let status = opened.target.status()?;
    opened.finish()?;
    outln!(
        "cache '{}': member {member} ({}) replaced by {new}; the set is {} ({} mirrored blocks, {} dirty)",
        entry.name,
        paths[member],
        status.cache_set_state.as_deref().unwrap_or("?"),
        status.cache_members.first().map_or(0, |m| m.mirror_slots),
        status.cache_blocks_dirty
    );
    Ok(())
}
