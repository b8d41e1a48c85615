//! `tiercache import CACHE... [--name NAME] [--origin PATH...]`: register
//! again a cache found on its devices (`tiercache scan`), as `casadm
//! --load` does: after the state directory was lost, or on another host.
//! Nothing on any device is written: the cache, dirty data included, is
//! exactly as it was, and the next `serve` (or command) opens it as any
//! registered cache.
//!
//! Its origins are the ones given (`--origin`, one per volume in order),
//! else the block devices whose identity and size match what the cache
//! recorded. Either way the cache is opened read-only before it is
//! registered, and that open refuses an origin that is not the recorded
//! one. The one write is outside the devices: the last daemon's crash log
//! is moved to where the new name's is looked for.
//!
//! `--boot NAME` is the unit's ExecCondition: NAME registered, or found on
//! a block device that records it (superblock `cache_name`) and imported;
//! else the unit is skipped.

use anyhow::{Context, Result};

use super::exit::fail;
use super::registry::{self, Entry, Registry};
use super::scan::{block_devices, found_on, Found};
use super::target::open_engine_read_only;
use super::units::human_bytes;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The cache device, or every member found of a cache set.
    #[arg(required_unless_present = "boot")]
    cache: Vec<String>,
    /// The name to register it under (default: the name the cache
    /// records, else tc0).
    #[arg(long)]
    name: Option<String>,
    /// For the unit's ExecCondition (tiercache@NAME): exit 0 if a cache
    /// NAME is registered, or is found recorded on a block device and
    /// imported; 1 (the unit is skipped, not failed) if neither; 255 (the
    /// unit fails) if it is found but cannot be imported.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["cache", "name", "origin"])]
    boot: Option<String>,
    /// Each volume's origin, in the order `tiercache scan` lists the
    /// volumes; without it, block devices are searched for the recorded
    /// identity and size.
    #[arg(long)]
    origin: Vec<String>,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    if let Some(name) = &a.boot {
        return boot(reg, a, name);
    }
    let mut caches = Vec::new();
    for c in &a.cache {
        caches.push(registry::absolute(c)?);
    }
    let found = one_cache(reg, &caches)?;
    let name = (a.name.clone())
        .or_else(|| found.name.clone())
        .unwrap_or_else(|| registry::DEFAULT_NAME.to_string());
    import(reg, a, caches, &found, &name)
}

/// `--boot NAME`: registered already, or found by its recorded name and
/// imported (systemd's ExecCondition: 0 start, 1 skip, 255 fail).
fn boot(reg: &Registry, a: &Args, name: &str) -> Result<()> {
    let exit = |code: u8, message: String| -> Result<()> {
        let notice = code == 1;
        Err(super::exit::ExitWith {
            code,
            message,
            notice,
        }
        .into())
    };
    registry::validate_name(name)?;
    if reg.get(name)?.is_some() {
        return Ok(());
    }
    let found: Vec<Found> = (found_on(reg, &block_devices()).into_iter())
        .filter(|f| f.name.as_deref() == Some(name) && f.registered_as.is_none())
        .collect();
    match found.as_slice() {
        [] => exit(
            1,
            format!(
                "no cache named '{name}' is registered or recorded on a block device: \
                 the unit is skipped (detached, or its devices are not here yet)"
            ),
        ),
        [f] => match import(reg, a, f.devices.clone(), f, name) {
            Ok(()) => Ok(()),
            Err(e) => exit(255, super::error_line(&e)),
        },
        _ => exit(
            255,
            format!("several caches on this machine record the name '{name}': import one by hand"),
        ),
    }
}

/// Registers the cache `found` on `caches` as `name`.
fn import(reg: &Registry, a: &Args, caches: Vec<String>, found: &Found, name: &str) -> Result<()> {
    registry::validate_name(name)?;
    if let Some(name) = &found.registered_as {
        fail!(
            Refused,
            "{} already belongs to the registered cache '{name}'",
            caches.join(", ")
        );
    }
    let origins = origins(a, found)?;
    reg.prepare()?;
    let _lock = reg.lock(name)?;
    if reg.get(name)?.is_some() {
        fail!(
            Refused,
            "a cache named '{name}' is already registered; import under another --name"
        );
    }
    for other in reg.list()? {
        if let Some(p) = origins.iter().find(|p| other.uses(p)) {
            fail!(
                Refused,
                "origin {p} is already used by cache '{}'",
                other.name
            );
        }
    }
    adopt_crash_log(reg, &caches, name)?;
    let entry = Entry::new(name, &origins, &caches);
    // The proof: the cache opens over these origins (identity, sizes),
    // read-only, before anything is registered.
    let engine = open_engine_read_only(reg, &entry)
        .with_context(|| format!("opening the cache on {}", caches.join(", ")))?;
    let status = engine.status();
    drop(engine);
    reg.add(&entry)?;
    outln!(
        "cache '{}' imported: {} over {} ({} mode); {} dirty blocks ({}) kept for writeback; \
         serve it with `tiercache serve --name {}` or `systemctl start tiercache@{}`",
        name,
        caches.join(", "),
        origins.join(", "),
        status.mode.name(),
        status.cache_blocks_dirty,
        human_bytes(status.cache_blocks_dirty * u64::from(status.block_bytes)),
        name,
        name
    );
    Ok(())
}

/// The one cache on `caches` (a device, or a set's members).
fn one_cache(reg: &Registry, caches: &[String]) -> Result<Found> {
    let mut found = found_on(reg, caches);
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => fail!(
            NotFound,
            "no tiercache cache on {} (tiercache scan {} says what is there)",
            caches.join(", "),
            caches.join(" ")
        ),
        n => fail!(
            Usage,
            "{} hold {n} caches; import one at a time",
            caches.join(", ")
        ),
    }
}

/// The origins: as given, else found by identity and size.
fn origins(a: &Args, found: &Found) -> Result<Vec<String>> {
    if !a.origin.is_empty() {
        if a.origin.len() != found.volumes.len() {
            fail!(
                Usage,
                "the cache has {} volume(s) ({}); give one --origin for each, in that order",
                found.volumes.len(),
                names(found)
            );
        }
        return a
            .origin
            .iter()
            .map(|o| Ok(registry::absolute(o)?))
            .collect();
    }
    let disks: Vec<(String, u64, u64)> = (block_devices().into_iter())
        .filter_map(|p| {
            let d = tiercache::device::open_device_read_only(&p).ok()?;
            Some((p, d.identity(), d.size_bytes()))
        })
        .collect();
    let mut out = Vec::new();
    for v in &found.volumes {
        let id = u64::from_str_radix(&v.origin_identity, 16).unwrap_or(0);
        let hit = disks
            .iter()
            .find(|(_, i, bytes)| *i == id && *bytes >= v.origin_bytes);
        match hit {
            Some((p, _, _)) => out.push(p.clone()),
            None => fail!(
                NotFound,
                "no block device here is volume {}'s origin (identity {}, {}): give it with \
                 --origin (a file origin is always given: its identity is its inode)",
                v.name,
                v.origin_identity,
                human_bytes(v.origin_bytes)
            ),
        }
    }
    Ok(out)
}

fn names(f: &Found) -> String {
    let names: Vec<&str> = f.volumes.iter().map(|v| v.name.as_str()).collect();
    names.join(", ")
}

/// A crash log the cache's last daemon left (under the name and state
/// directory it had) is moved to where this name's is looked for: it may
/// hold writes that daemon acknowledged but did not journal, and open
/// applies it only from there. The one write import makes, and not to a
/// device.
fn adopt_crash_log(reg: &Registry, caches: &[String], name: &str) -> Result<()> {
    use tiercache::engine::recovery;
    let cache = super::target::open_cache_read_only(caches)?;
    let found = recovery::crash_logs_of(&cache, &reg.crash_log_files())?;
    let recorded = recovery::recorded_name(&cache)?;
    drop(cache);
    let target = reg.crash_log_path(name);
    // Its own log already where this name's is looked for: nothing to move.
    if found.contains(&target) {
        return Ok(());
    }
    // A header names a cache by its creation second, origin identity and
    // size; a file origin's identity is its inode, which a deleted file's
    // successor may reuse, so two caches can match one log. The one this
    // state directory kept under the name the cache records is the
    // cache's own; else a match must be the only one.
    let own = recorded.map(|n| reg.crash_log_path(&n));
    let found = match (own, found.as_slice()) {
        (Some(own), _) if found.contains(&own) => own,
        (_, []) => return Ok(()),
        (_, [one]) => one.clone(),
        (_, several) => {
            let names: Vec<String> = several.iter().map(|p| p.display().to_string()).collect();
            fail!(
                Refused,
                "several crash logs match the cache ({}): move the one its last daemon \
                 wrote to {} and import again",
                names.join(", "),
                target.display()
            )
        }
    };
    if target.exists() {
        fail!(
            Refused,
            "the cache's crash log {} would replace {}, another cache's: import under another --name",
            found.display(),
            target.display()
        );
    }
    if let Some(dir) = target.parent() {
        use std::os::unix::fs::DirBuilderExt;
        // As the daemon makes it: its user's alone (crash_log.rs).
        (std::fs::DirBuilder::new().recursive(true).mode(0o700))
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::rename(&found, &target).with_context(|| {
        format!(
            "moving crash log {} to {}",
            found.display(),
            target.display()
        )
    })?;
    log::warn!(
        "took the cache's crash log {} as {}",
        found.display(),
        target.display()
    );
    Ok(())
}
