//! `tiercache give-up-cache --lose-dirty-data`: the operator's word that a
//! cache device (every copy of a cache set) is gone for good. Until then a
//! failing cache with dirty data returns errors and keeps the data, in case
//! the device answers again. Given up, the cache fails over to the origin;
//! the origin ranges its dirty blocks held are stale: reads of them fail
//! with an I/O error rather than return old bytes, `status` lists them, and
//! a write that covers a whole block makes it current again.
//!
//! A cache whose every device is gone (no such file or device: a dead SSD
//! the kernel dropped) cannot be opened, so its dirty map went with it.
//! The stale map the daemon kept in the state directory
//! (engine/journal/stale_map.rs) still names the origin regions that held
//! dirty data at its last commit; both the refusal and `--forget`, which
//! drops the registration, list them.

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
    /// drop its registration (the stale ranges are named from the stale
    /// map kept in the state directory).
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
pub(super) fn cache_devices_gone(entry: &Entry) -> bool {
    entry.cache_paths().iter().all(|p| device_gone(p))
}

/// A path that names no file or device any more.
pub(super) fn device_gone(path: &str) -> bool {
    matches!(
        tiercache::device::open_device_read_only(path),
        Err(DeviceError::Missing { .. })
    )
}

/// The cache's devices are gone: with `--forget`, it is dropped from the
/// registry (`forget`, which names the stale ranges); else the refusal
/// names them and says what is lost.
fn forget(reg: &Registry, entry: &Entry, forget: bool) -> Result<()> {
    if forget {
        return super::forget::drop_cache(reg, entry, entry.cache_paths());
    }
    outln!("{}", stale_ranges(reg, entry));
    fail!(
        Refused,
        "cache '{}': its cache device ({}) is gone with its dirty data; pass --forget as well \
         to drop the cache and leave its origins ({}) standing alone, stale in the ranges above",
        entry.name,
        entry.cache_paths().join(", "),
        entry.origin_paths().join(", ")
    );
}

/// What the stale map says of the origins: the ranges that held dirty
/// data at the cache's last commit (rounded out to regions), each origin
/// named; or why no range can be named.
pub(super) fn stale_ranges(reg: &Registry, entry: &Entry) -> String {
    use std::fmt::Write;
    use tiercache::engine::journal::stale_map::{self, ReadError};
    let path = reg.stale_map_path(&entry.name);
    let map = match stale_map::read(&path) {
        Ok(map) => map,
        Err(ReadError::Missing(_)) => {
            return "No stale map was kept for this cache, so which origin ranges are stale \
                    cannot be told: check the origins' filesystems (fsck) before use."
                .into()
        }
        Err(e) => {
            return format!(
                "{e}: which origin ranges are stale cannot be told: check the origins' \
                 filesystems (fsck) before use."
            )
        }
    };
    let origins = entry.origin_paths();
    let mut text = format!(
        "Stale origin ranges (offset+length in bytes; whole regions that held dirty data at the \
         cache's last commit, from {}):",
        path.display()
    );
    for v in &map.volumes {
        let origin = origins.get(v.volume).map_or("?", |s| s.as_str());
        let bytes: u64 = v.ranges.iter().map(|r| r.1).sum();
        let _ = write!(
            text,
            "\n  {origin}: {} in {} ranges (regions of {})",
            human_bytes(bytes),
            v.ranges.len(),
            human_bytes(v.region_bytes)
        );
        for (offset, len) in &v.ranges {
            let _ = write!(text, "\n    {offset}+{len}");
        }
    }
    text
}
