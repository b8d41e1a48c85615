//! `tiercache add-origin`: one more origin behind a registered cache, as a
//! volume of its own (docs/engine.md, "Volumes").
//!
//! Not served, the cache is opened with every origin it has and the new
//! one last; the open records the new volume in the superblock before
//! anything else (`OpenOptions::add_volumes`). Served, the daemon adds it
//! (`Engine::add_volume`, the superblock first) and serves it at once, the
//! other volumes serving on. Either way the registry then lists the
//! origin. A cut between the two leaves a cache that records one volume
//! more than the registry lists: every open refuses it, naming this
//! command, and a daemon that still runs serves it. Run again with the
//! same origin and name, it finds the volume recorded and finishes by
//! registering the origin. Nothing is written to the origin.

use anyhow::{bail, Context, Result};
use tiercache::device::{open_device, DeviceRef};
use tiercache::engine::format::volumes::default_name;
use tiercache::engine::{recovery, Engine, OpenOptions};

use super::control::{self, Request};
use super::exit::fail;
use super::registry::{self, Entry, Registry};
use super::units::{human_bytes, parse_mode};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// The slow device to put behind the cache (file or block device).
    #[arg(long)]
    origin: String,
    /// The new volume's name, its NBD export name (default volN, N its
    /// index).
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
    /// The new volume's own cache mode (default: the cache's).
    #[arg(long)]
    mode: Option<String>,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let mode = a.mode.as_deref().map(parse_mode).transpose()?;
    if a.origin.starts_with("ram:") {
        fail!(
            Usage,
            "origin '{}' is volatile: a RAM device cannot be an origin",
            a.origin
        );
    }
    reg.prepare()?;
    let entry = reg.resolve(a.name.name.as_deref())?;
    let path = registry::absolute(&a.origin)?;
    let name = a
        .volume
        .clone()
        .unwrap_or_else(|| default_name(entry.origin_paths().len()));
    let socket = reg.socket_path(&entry.name);
    if super::control::daemon_listening(&socket) {
        refuse_used(reg, &path)?;
        return add_served(reg, &entry, &socket, &path, &name, mode);
    }
    let _lock = reg.lock(&entry.name)?;
    refuse_used(reg, &path)?;
    let origin = open_device(&path).context("opening the new origin")?;
    let cache = entry
        .open_cache(false)
        .context("opening the cache device")?;
    let recorded = recovery::recorded_volumes(&cache)?;
    let finishing = recorded.len() == entry.origin_paths().len() + 1;
    let (bytes, how) = if finishing {
        let last = recorded.last().expect("a cache has a volume");
        if last.name != name || last.identity != origin.identity() {
            bail!(
                "cache '{}' records a volume '{}' that its registry entry lacks (an add-origin cut \
                 short): run add-origin again with that volume's origin and --volume {}",
                entry.name,
                last.name,
                last.name
            );
        }
        (last.bytes, "finished an add-origin that was cut short: ")
    } else {
        (add(reg, &entry, cache, origin, &name, mode)?, "")
    };
    reg.update(&entry.name, |e| e.more_origins.push(path.clone()))
        .context("registering the new origin")?;
    outln!(
        "cache '{}': {how}volume {name} added: {path} ({})",
        entry.name,
        human_bytes(bytes)
    );
    Ok(())
}

/// `add-origin` of a cache its daemon serves: the daemon adds and serves
/// the volume; then the registry lists the origin. A volume of this name
/// and origin that the daemon has already (a run cut short after the
/// daemon's add) is only registered.
fn add_served(
    reg: &Registry,
    entry: &Entry,
    socket: &std::path::Path,
    path: &str,
    name: &str,
    mode: Option<tiercache::engine::Mode>,
) -> Result<()> {
    let status =
        (control::call(socket, &Request::Status)?.status).context("the daemon sent no status")?;
    let had =
        (status.volumes.iter()).find(|v| v.name == name && registry::same_file(path, &v.origin));
    let (bytes, how) = match had {
        Some(v) => (v.bytes, "finished an add-origin that was cut short: "),
        None => {
            let request = Request::AddOrigin {
                origin: path.to_string(),
                volume: name.to_string(),
                mode,
            };
            let reply = control::call(socket, &request)
                .with_context(|| format!("adding volume {name} to cache '{}'", entry.name))?;
            let after = reply.status.context("the daemon sent no status")?;
            let added = after.volumes.iter().find(|v| v.name == name);
            (added.map_or(0, |v| v.bytes), "")
        }
    };
    reg.update(&entry.name, |e| e.more_origins.push(path.to_string()))
        .context("registering the new origin")?;
    let now = control::call(socket, &Request::Status)?.frontends;
    let device = now.and_then(|f| f.ublk_devices.last().cloned());
    outln!(
        "cache '{}': {how}volume {name} added while served: {path} ({}), {}",
        entry.name,
        human_bytes(bytes),
        device.map_or(format!("exported as {name}"), |d| format!("served as {d}"))
    );
    Ok(())
}

/// A device of a registered cache (this one's included) is not added.
fn refuse_used(reg: &Registry, path: &str) -> Result<()> {
    for other in reg.list()? {
        if other.uses(path) {
            fail!(
                Refused,
                "{path} is already a device of cache '{}'",
                other.name
            );
        }
    }
    Ok(())
}

/// Opens the cache with its origins and `origin` added as volume `name`,
/// gives it `mode`, and closes it; returns the new volume's size.
fn add(
    reg: &Registry,
    entry: &Entry,
    cache: DeviceRef,
    origin: DeviceRef,
    name: &str,
    mode: Option<tiercache::engine::Mode>,
) -> Result<u64> {
    let mut origins = super::target::open_origins(entry, open_device)?;
    let bytes = origin.size_bytes();
    origins.push(origin);
    let opts = OpenOptions {
        add_volumes: vec![name.to_string()],
        ..super::target::command_open_options(reg, entry)
    };
    let engine = Engine::open_volumes(cache, origins, &opts)
        .with_context(|| format!("adding volume {name} to cache '{}'", entry.name))?;
    registry::record_distrust(reg, entry, &engine)?;
    let v = engine.volumes().len() - 1;
    if let Some(mode) = mode {
        engine
            .set_volume_mode(v, mode)
            .with_context(|| format!("giving volume {name} {} mode", mode.name()))?;
    }
    engine.close().context("closing the cache")?;
    Ok(bytes)
}
