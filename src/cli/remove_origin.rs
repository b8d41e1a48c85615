//! `tiercache remove-origin --volume NAME`: take one origin out of a cache
//! of several (docs/engine.md, "Volumes"), leaving it standing alone.
//!
//! The cache is opened with its origins; the volume's dirty blocks are
//! written back and its blocks dropped, then one checkpoint without it is
//! made current together with the superblock's volume list
//! (`Engine::remove_volume`): the volumes after it move down one place.
//! The registry then drops the origin. A cut between the two leaves a cache
//! that records one volume fewer than the registry lists, which every open
//! refuses, naming this command: run again, it finds the volume gone and
//! finishes by dropping the origin from the registry. The cache must not
//! be served meanwhile.

use anyhow::{bail, Context, Result};
use tiercache::device::{open_device, open_device_read_only};
use tiercache::engine::format::VolumeEntry;
use tiercache::engine::{recovery, Engine};

use super::progress::{self, Unit};
use super::registry::{Entry, Registry};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// The volume to take out (its dirty data is written back first).
    #[arg(long, value_name = "NAME")]
    volume: String,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    remove_named(reg, a.name.name.as_deref(), &a.volume)
}

/// Takes volume `volume` out of cache `name` (also `detach --volume`).
pub fn remove_named(reg: &Registry, name: Option<&str>, volume: &str) -> Result<()> {
    let entry = reg.resolve(name)?;
    if super::control::daemon_listening(&reg.socket_path(&entry.name)) {
        bail!(
            "cache '{}' is served: stop its daemon (systemctl stop tiercache@{}), remove the \
             origin, start it again; removing one while served is not there yet",
            entry.name,
            entry.name
        );
    }
    let _lock = reg.lock(&entry.name)?;
    let paths = entry.origin_paths();
    let cache = entry
        .open_cache(false)
        .context("opening the cache device")?;
    let recorded = recovery::recorded_volumes(&cache)?;
    let (v, how) = if recorded.len() + 1 == paths.len() {
        drop(cache);
        (
            removed_already(&entry, &recorded, volume)?,
            "finished a remove-origin that was cut short: ",
        )
    } else {
        let Some(v) = recorded.iter().position(|r| r.name == volume) else {
            let names: Vec<&str> = recorded.iter().map(|r| r.name.as_str()).collect();
            bail!(
                "cache '{}' has no volume '{}' (its volumes: {})",
                entry.name,
                volume,
                names.join(", ")
            );
        };
        remove(reg, &entry, cache, v, volume)?;
        (v, "")
    };
    reg.update(&entry.name, |e| match v {
        0 => e.origin = e.more_origins.remove(0),
        _ => drop(e.more_origins.remove(v - 1)),
    })
    .context("dropping the origin from the registry")?;
    println!(
        "cache '{}': {how}volume {} removed; its origin {} stands alone, all its data on it",
        entry.name, volume, paths[v]
    );
    Ok(())
}

/// Opens the cache with its origins and takes volume `v` out.
fn remove(
    reg: &Registry,
    entry: &Entry,
    cache: tiercache::device::DeviceRef,
    v: usize,
    name: &str,
) -> Result<()> {
    let origins = super::target::open_origins(entry, open_device)?;
    let opts = super::target::command_open_options(reg, entry);
    let engine = Engine::open_volumes(cache, origins, &opts)
        .with_context(|| format!("opening cache '{}'", entry.name))?;
    super::registry::record_distrust(reg, entry, &engine)?;
    let bar = progress::bar("writing back", 1, Unit::Blocks);
    let removed = engine.remove_volume(v, &mut progress::updater(&bar));
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    removed.with_context(|| format!("removing volume {name} from cache '{}'", entry.name))
}

/// A remove-origin cut short: the cache no longer records volume `name`;
/// the registry's origin it dropped is the first one whose device is not
/// the recorded volume at its place.
fn removed_already(entry: &Entry, recorded: &[VolumeEntry], name: &str) -> Result<usize> {
    if recorded.iter().any(|r| r.name == name) {
        bail!(
            "cache '{}' records one volume fewer than its registry entry lists (a remove-origin \
             cut short), and volume '{name}' is still one of them: run remove-origin again with \
             the volume that was being removed",
            entry.name
        );
    }
    let paths = entry.origin_paths();
    for (i, p) in paths.iter().enumerate() {
        let same = recorded
            .get(i)
            .is_some_and(|r| open_device_read_only(p).is_ok_and(|d| d.identity() == r.identity));
        if !same {
            return Ok(i);
        }
    }
    bail!(
        "cache '{}': no origin of its registry entry is missing from the cache",
        entry.name
    )
}
