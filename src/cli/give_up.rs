//! `tiercache give-up-cache --lose-dirty-data`: the operator's word that a
//! cache device (every copy of a cache set) is gone for good. Until then a
//! failing cache with dirty data returns errors and keeps the data, in case
//! the device answers again. Given up, the cache fails over to the origin;
//! the origin ranges its dirty blocks held are stale: reads of them fail
//! with an I/O error rather than return old bytes, `status` lists them, and
//! a write that covers a whole block makes it current again.
//!
//! A cache whose every device is gone (no such file or device: a dead SSD
//! the kernel dropped) cannot be opened, so its dirty map went with it and
//! which origin ranges are stale cannot be told. `--forget`, given as
//! well, drops its registration then: the origins stand alone, and any of
//! their ranges may be stale (the message says how many blocks were dirty
//! when the registry last knew, and to check the filesystems).

use anyhow::Result;
use tiercache::daemon::control;
use tiercache::device::DeviceError;

use super::exit::fail;
use super::registry::{Entry, Registry};
use super::target::Opened;
use super::units::human_bytes;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Required: the dirty data on the cache device is lost.
    #[arg(long)]
    lose_dirty_data: bool,
    /// With --lose-dirty-data, for a cache whose devices are all gone:
    /// drop its registration (the stale ranges cannot be named: the map
    /// of them was on the lost device).
    #[arg(long, requires = "lose_dirty_data")]
    forget: bool,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    if !a.lose_dirty_data {
        fail!(
            Refused,
            "giving the cache up loses every dirty block on it; pass --lose-dirty-data if the \
             device is gone for good (a device that answers again loses nothing: its dirty \
             data is written back)"
        );
    }
    let entry = reg.resolve(a.name.name.as_deref())?;
    // A daemon serving it still holds its devices open: it gives up.
    let served = control::daemon_listening(&reg.socket_path(&entry.name));
    if !served && cache_devices_gone(&entry) {
        return forget(reg, &entry, a.forget);
    }
    let opened = Opened::open(reg, Some(&entry.name))?;
    opened.target.give_up_cache()?;
    let st = opened.target.status()?;
    opened.finish()?;
    outln!(
        "cache '{}': given up; {} origin blocks ({}) are stale and reads of them fail:",
        opened.entry.name,
        st.stale_blocks,
        human_bytes(st.stale_blocks * u64::from(st.block_bytes))
    );
    for (offset, len) in st.stale_ranges.iter().take(32) {
        outln!("  {offset}+{len}");
    }
    if st.stale_ranges.len() > 32 {
        outln!(
            "  ... ({} ranges in all: status --json lists them)",
            st.stale_ranges.len()
        );
    }
    Ok(())
}

/// True if no device of the cache can be found (each path is missing, or
/// names no device any more).
fn cache_devices_gone(entry: &Entry) -> bool {
    (entry.cache_paths().iter()).all(|p| {
        matches!(
            tiercache::device::open_device_read_only(p),
            Err(DeviceError::Missing { .. })
        )
    })
}

/// The cache's devices are gone: with `--forget`, its registration is
/// dropped, under its lock; else the refusal says what is lost and how.
fn forget(reg: &Registry, entry: &Entry, forget: bool) -> Result<()> {
    let devices = entry.cache_paths().join(", ");
    let origins = entry.origin_paths().join(", ");
    if !forget {
        fail!(
            Refused,
            "cache '{}': its cache device ({devices}) is gone, and with it the map of which \
             origin ranges are stale; pass --forget as well to drop the cache and leave its \
             origins ({origins}) standing alone, stale wherever it held dirty data",
            entry.name
        );
    }
    let _lock = reg.lock(&entry.name)?;
    reg.remove(&entry.name)?;
    outln!(
        "cache '{}' forgotten: its cache device ({devices}) is gone with its dirty data. \
         The origins ({origins}) stand alone; any of their ranges the cache held dirty is \
         stale and which ones cannot be told: check their filesystems (fsck) before use",
        entry.name
    );
    Ok(())
}
