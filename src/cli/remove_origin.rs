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
//! finishes by dropping the origin from the registry.
//!
//! Served, the daemon does it (`Engine::remove_volume_served`) while the
//! other volumes keep serving: the volume's requests are refused, its
//! data written back and its blocks dropped, its record marked removed
//! (the next open takes it out and moves the volumes after it down), its
//! export taken away and its origin let go. The registry then drops the
//! origin; a cut between the two is finished by running it again.

use anyhow::{bail, Context, Result};
use tiercache::device::{open_device, open_device_read_only};
use tiercache::engine::format::VolumeEntry;
use tiercache::engine::{recovery, Engine};

use std::path::Path;

use super::control::{self, Request, Response};
use super::exit::fail;
use super::progress::{self, Unit};
use super::registry::{same_file, Entry, Registry};
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
    let socket = reg.socket_path(&entry.name);
    if super::control::daemon_listening(&socket) {
        return remove_served(reg, &entry, &socket, volume);
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
            fail!(
                NotFound,
                "cache '{}' has no volume '{}' (its volumes: {})",
                entry.name,
                volume,
                names.join(", ")
            );
        };
        remove(reg, &entry, cache, v, volume)?;
        (v, "")
    };
    drop_from_registry(reg, &entry, v)?;
    outln!(
        "cache '{}': {how}volume {} removed; its origin {} stands alone, all its data on it",
        entry.name,
        volume,
        paths[v]
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

/// `remove-origin` of a served cache: the daemon takes the volume out,
/// then the registry drops its origin (the registry lists the volumes the
/// daemon serves, in their order). A volume the daemon no longer has while
/// the registry still lists one origin more (a run cut short after the
/// daemon's removal) is only dropped from the registry.
fn remove_served(reg: &Registry, entry: &Entry, socket: &Path, volume: &str) -> Result<()> {
    let status = |r: Response| r.status.context("the daemon sent no status");
    let before = status(control::call(socket, &Request::Status)?)?;
    let paths = entry.origin_paths();
    let served = |p: &String| (before.volumes.iter()).any(|v| same_file(p, &v.origin));
    let (i, how) = match before.volumes.iter().position(|v| v.name == volume) {
        Some(i) => {
            let request = Request::RemoveOrigin {
                volume: volume.to_string(),
            };
            let bar = progress::bar("writing back", 1, Unit::Blocks);
            let reply = control::call_with_progress(socket, &request, &mut progress::updater(&bar));
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            reply
                .with_context(|| format!("removing volume {volume} from cache '{}'", entry.name))?;
            (i, "")
        }
        None if paths.len() == before.volumes.len() + 1 => {
            match paths.iter().position(|p| !served(p)) {
                Some(i) => (i, "finished a remove-origin that was cut short: "),
                None => bail!(
                    "cache '{}': no origin of its registry entry is missing",
                    entry.name
                ),
            }
        }
        None => {
            let names: Vec<&str> = before.volumes.iter().map(|v| v.name.as_str()).collect();
            fail!(
                NotFound,
                "cache '{}' has no volume '{volume}' (its volumes: {})",
                entry.name,
                names.join(", ")
            )
        }
    };
    drop_from_registry(reg, entry, i)?;
    outln!(
        "cache '{}': {how}volume {volume} removed while served; its origin {} stands alone, \
         all its data on it",
        entry.name,
        paths[i]
    );
    Ok(())
}

/// The registry entry without its origin `v`.
fn drop_from_registry(reg: &Registry, entry: &Entry, v: usize) -> Result<()> {
    reg.update(&entry.name, |e| match v {
        0 => e.origin = e.more_origins.remove(0),
        _ => drop(e.more_origins.remove(v - 1)),
    })
    .context("dropping the origin from the registry")?;
    Ok(())
}
