//! `tiercache forget`: drop a cache from the registry when a device it
//! needs is gone, an origin most of all. `detach` writes the dirty data
//! back and cannot without the origin; every other command fails to open
//! the cache. Forget writes nothing to any device: a cache device that is
//! still there keeps its data (`scan` shows it, and `import` brings the
//! cache back if its origin returns).

use anyhow::Result;
use tiercache::daemon::control;

use super::exit::fail;
use super::give_up;
use super::registry::{Entry, Registry};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Required: the operator's word that the missing devices are gone
    /// for good, and what only they held with them.
    #[arg(long)]
    devices_gone: bool,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let entry = reg.resolve(a.name.name.as_deref())?;
    if control::daemon_listening(&reg.socket_path(&entry.name)) {
        fail!(
            Busy,
            "cache '{}' is served by a daemon: stop it first (systemctl stop tiercache@{})",
            entry.name,
            entry.name
        );
    }
    let missing: Vec<String> = (entry.origin_paths().into_iter())
        .chain(entry.cache_paths())
        .filter(|p| give_up::device_gone(p))
        .collect();
    if missing.is_empty() {
        fail!(
            Refused,
            "cache '{}' has every device it needs: `tiercache detach` writes its dirty data back \
             and dissolves it (forget is for a cache whose devices are gone)",
            entry.name
        );
    }
    if !a.devices_gone {
        fail!(
            Refused,
            "cache '{}': {} cannot be found; pass --devices-gone to drop the cache from the \
             registry (nothing is written to any device)",
            entry.name,
            missing.join(", ")
        );
    }
    drop_cache(reg, &entry, missing)
}

/// Drops `entry` (whose `missing` devices are gone) from the registry,
/// under its lock, and says what is left: the stale ranges if the cache
/// device went, else where the cache still is.
pub(super) fn drop_cache(reg: &Registry, entry: &Entry, missing: Vec<String>) -> Result<()> {
    let _lock = reg.lock(&entry.name)?;
    let cache_gone = give_up::cache_devices_gone(entry);
    let stale = cache_gone.then(|| give_up::stale_ranges(reg, entry));
    reg.remove(&entry.name)?;
    outln!(
        "cache '{}' forgotten; nothing was written. Gone: {}.",
        entry.name,
        missing.join(", ")
    );
    match stale {
        Some(stale) => outln!(
            "The origins ({}) stand alone.\n{stale}",
            entry.origin_paths().join(", ")
        ),
        None => say_what_remains(entry),
    }
    Ok(())
}

fn say_what_remains(entry: &Entry) {
    let caches = entry.cache_paths().join(" ");
    outln!(
        "The cache device ({caches}) still holds the cache, with any dirty data its origin \
         lacks: `tiercache scan {caches}` shows it; `tiercache import {caches} --origin ...` \
         brings it back if the origin returns; `tiercache create --force ...` reuses the \
         device (and loses that data)."
    );
}
