//! `tiercache scan [DEVICES...]`: what tiercache caches the devices hold,
//! read from the devices themselves, as `blkid` or bcache's registration
//! reads labels: every block device of the machine when none are named.
//! A cache whose state directory was lost is found here, and `tiercache
//! import` registers it again (import.rs).
//!
//! Reads only: every device is opened read-only under a shared claim, and
//! one another process holds to write (a daemon serving it) is reported as
//! in use, not read.

use anyhow::Result;
use serde::Serialize;
use tiercache::device::set::CacheSet;
use tiercache::device::{open_device_read_only, DeviceError, DeviceRef};
use tiercache::engine::recovery::{self, CrashLogs};

use super::registry::{self, Entry, Registry};
use super::target::open_cache_read_only;
use super::units::human_bytes;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Devices or files to read; every block device when none are given.
    devices: Vec<String>,
    /// Print JSON (with a schema_version) instead of text.
    #[arg(long)]
    json: bool,
    /// For udev's IMPORT{program} (contrib/udev/60-tiercache.rules): of
    /// the one device named, print `TIERCACHE_NAME=NAME` if it holds a
    /// cache that records its name, else nothing; always exit 0.
    #[arg(long, conflicts_with = "json")]
    udev: bool,
}

/// A cache found on one device, or on the members of a cache set.
#[derive(Serialize, Debug, Clone)]
pub struct Found {
    /// Its device, or a cache set's members (every one found).
    pub devices: Vec<String>,
    /// A cache set: its identity and how many members it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_members: Option<usize>,
    pub format_version: Option<u32>,
    pub mode: Option<String>,
    pub block_bytes: Option<u32>,
    pub dirty_blocks: u64,
    pub dirty_bytes: u64,
    pub clean_shutdown: Option<bool>,
    /// Its metadata passed `check`'s tests.
    pub metadata_ok: bool,
    /// Each volume: name, origin size and origin identity (a hash of what
    /// names the device: a disk's WWID or serial, a file's inode).
    pub volumes: Vec<FoundVolume>,
    /// The name the cache records (the one it was registered under when
    /// last created or served; `import` takes it by default).
    pub name: Option<String>,
    /// The registered cache that names these devices, if any.
    pub registered_as: Option<String>,
}

#[derive(Serialize, Debug, Clone)]
pub struct FoundVolume {
    pub name: String,
    pub origin_bytes: u64,
    pub origin_identity: String,
}

/// What a device that holds no readable cache is.
#[derive(Serialize, Debug)]
struct Other {
    device: String,
    /// "in use" (another process holds it), "unreadable", or "no
    /// tiercache label".
    state: &'static str,
    why: String,
}

#[derive(Serialize)]
struct ScanJson<'a> {
    schema_version: u32,
    caches: &'a [Found],
    others: &'a [Other],
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let named = !a.devices.is_empty();
    let paths = match named {
        true => a.devices.clone(),
        false => block_devices(),
    };
    if a.udev {
        for p in &paths {
            if let Some(name) = udev_name(p) {
                outln!("TIERCACHE_NAME={name}");
            }
        }
        return Ok(());
    }
    let (found, others) = scan(reg, &paths);
    // Without names, devices that hold nothing are not news.
    let others: Vec<Other> = (others.into_iter())
        .filter(|o| named || o.state == "in use")
        .collect();
    if a.json {
        let json = ScanJson {
            schema_version: super::list::SCHEMA_VERSION,
            caches: &found,
            others: &others,
        };
        outln!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    for f in &found {
        out!("{}", describe(f));
    }
    for o in &others {
        outln!("{}: {} ({})", o.device, o.state, o.why);
    }
    if found.is_empty() {
        outln!("no tiercache cache found on {} device(s)", paths.len());
    }
    Ok(())
}

/// The name the cache on `path` records, for udev: the superblock alone
/// is read (two pages), as blkid reads a label, never the metadata behind
/// it: udev asks this of every device that appears, whoever plugged it in.
/// A set member has none (its name is in the set's superblock, across the
/// members).
fn udev_name(path: &str) -> Option<String> {
    let dev = open_device_read_only(path).ok()?;
    if let Ok(Ok(_)) = CacheSet::read_label(&dev) {
        return None;
    }
    recovery::recorded_name(&dev).ok().flatten()
}

/// Every cache on `paths`: one per device, a cache set once for all its
/// members found; and what the other devices are.
fn scan(reg: &Registry, paths: &[String]) -> (Vec<Found>, Vec<Other>) {
    // Read once for every cache found.
    let known = Known {
        entries: reg.list().unwrap_or_default(),
        crash_logs: reg.crash_log_files(),
    };
    let mut found = Vec::new();
    let mut others = Vec::new();
    // set id -> (members' paths, member count)
    let mut sets: Vec<(u64, Vec<String>, usize)> = Vec::new();
    for p in paths {
        let dev = match open_device_read_only(p) {
            Ok(d) => d,
            Err(e) => {
                let state = match e {
                    DeviceError::InUse { .. } => "in use",
                    _ => "unreadable",
                };
                others.push(Other {
                    device: p.clone(),
                    state,
                    why: e.to_string(),
                });
                continue;
            }
        };
        if let Ok(Ok(label)) = CacheSet::read_label(&dev) {
            match sets.iter_mut().find(|(id, _, _)| *id == label.set_id) {
                Some((_, members, _)) => members.push(p.clone()),
                None => sets.push((label.set_id, vec![p.clone()], label.member_count())),
            }
            continue;
        }
        match inspect(&known, &dev, vec![p.clone()]) {
            Some(f) => found.push(f),
            None => others.push(Other {
                device: p.clone(),
                state: "no tiercache label",
                why: "neither a cache's superblock nor a cache set's label".into(),
            }),
        }
    }
    for (id, members, count) in sets {
        match open_cache_read_only(&members) {
            Ok(set) => {
                if let Some(mut f) = inspect(&known, &set, members) {
                    f.set_id = Some(format!("{id:016x}"));
                    f.set_members = Some(count);
                    found.push(f);
                }
            }
            Err(e) => others.push(Other {
                device: members.join(", "),
                state: "unreadable",
                why: format!(
                    "cache set {id:016x} ({count} members): {}",
                    super::error_line(&e)
                ),
            }),
        }
    }
    (found, others)
}

/// What the state directory knows, for `inspect`.
struct Known {
    entries: Vec<Entry>,
    crash_logs: Vec<std::path::PathBuf>,
}

/// The cache on `dev` (`devices` name it), if it holds one.
fn inspect(known: &Known, dev: &DeviceRef, devices: Vec<String>) -> Option<Found> {
    let recorded = recovery::recorded_volumes(dev).ok()?;
    let report = recovery::check_volumes(dev, &[], &CrashLogs::Search(known.crash_logs.clone()));
    let bs = u64::from(report.block_bytes.unwrap_or(0));
    let registered_as = (known.entries.iter())
        .find(|e| {
            let theirs = e.cache_paths();
            devices
                .iter()
                .any(|d| theirs.iter().any(|t| registry::same_file(d, t)))
        })
        .map(|e| e.name.clone());
    Some(Found {
        name: recovery::recorded_name(dev).ok().flatten(),
        devices,
        set_id: None,
        set_members: None,
        format_version: report.format_version,
        mode: report.mode.clone(),
        block_bytes: report.block_bytes,
        dirty_blocks: report.cache_blocks_dirty,
        dirty_bytes: report.cache_blocks_dirty * bs,
        clean_shutdown: report.clean_shutdown,
        metadata_ok: report.ok,
        volumes: (recorded.iter())
            .map(|v| FoundVolume {
                name: v.name.clone(),
                origin_bytes: v.bytes,
                origin_identity: format!("{:016x}", v.identity),
            })
            .collect(),
        registered_as,
    })
}

/// A found cache, for people.
fn describe(f: &Found) -> String {
    let what = match (&f.set_id, f.set_members) {
        (Some(id), Some(n)) => format!("cache set {id} ({} of {n} members here)", f.devices.len()),
        _ => "cache".to_string(),
    };
    let named = f.name.as_ref().map_or(String::new(), |n| format!(" '{n}'"));
    let mut out = format!(
        "{}: tiercache {what}{named}, format {}, {} mode, {} blocks; {} dirty ({} blocks); shut down cleanly: {}; metadata {}\n",
        f.devices.join(", "),
        f.format_version.map_or("?".into(), |v| v.to_string()),
        f.mode.as_deref().unwrap_or("?"),
        human_bytes(u64::from(f.block_bytes.unwrap_or(0))),
        human_bytes(f.dirty_bytes),
        f.dirty_blocks,
        f.clean_shutdown.map_or("?", |c| if c { "yes" } else { "no" }),
        if f.metadata_ok { "ok" } else { "DAMAGED (tiercache check --cache DEV)" },
    );
    for v in &f.volumes {
        out.push_str(&format!(
            "  volume {}: origin of {}, identity {}\n",
            v.name,
            human_bytes(v.origin_bytes),
            v.origin_identity
        ));
    }
    match &f.registered_as {
        Some(name) => out.push_str(&format!("  registered as '{name}'\n")),
        None => out.push_str(&format!(
            "  not registered: tiercache import {} [--origin ORIGIN ...]{}\n",
            f.devices.join(" "),
            if f.name.is_some() {
                ""
            } else {
                " [--name NAME]"
            }
        )),
    }
    out
}

/// Every block device of the machine (/sys/class/block): disks,
/// partitions, loop, dm and md devices; empty ones (a loop device with
/// no file) are left out.
pub fn block_devices() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/class/block") else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .flatten()
        .filter(|e| {
            let size = std::fs::read_to_string(e.path().join("size")).unwrap_or_default();
            size.trim().parse::<u64>().is_ok_and(|sectors| sectors > 0)
        })
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    names.sort();
    names
}

/// The scan of `paths`, for import: every cache found.
pub fn found_on(reg: &Registry, paths: &[String]) -> Vec<Found> {
    scan(reg, paths).0
}
