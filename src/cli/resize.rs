//! `tiercache resize [--volume NAME]`: take an origin that grew (lvextend,
//! a longer file, `rbd resize`) as the volume's new size. `tiercache
//! resize --cache`: take a cache device that grew the same way, served or
//! not (`Engine::grow_cache`); one that shrank is refused.
//!
//! Served, the daemon measures the origins again and takes a larger one
//! online (`Engine::grow_named`): NBD connections made from then on see
//! the new size; a ublk device keeps its size until the daemon restarts
//! (`status` says a restart is pending). Not served, the cache is opened
//! with the operator's word that its origins grew (`origin_grew`): every
//! grown origin is taken then, since an open must match every origin. An
//! origin that shrank is refused either way, and nothing changes.

use anyhow::Result;

use super::registry::Registry;
use super::target::Opened;
use super::units::human_bytes;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Of a cache of several origins: this volume's origin only (without
    /// it, every volume's). A cache no daemon serves takes every grown
    /// origin at its open.
    #[arg(long, value_name = "NAME", conflicts_with = "cache")]
    volume: Option<String>,
    /// The cache device grew, not an origin: its new space becomes cache
    /// blocks (the checkpoint areas move to its end). Online when served.
    #[arg(long)]
    cache: bool,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    if a.cache {
        return grow_cache(reg, a);
    }
    let mut recorded = Vec::new();
    let opened = Opened::open_grown(reg, a.name.name.as_deref(), &mut recorded)?;
    let (before, frontends) = opened.target.status_and_frontends()?;
    // Offline, the open took the new sizes: what the cache had recorded
    // is the size before.
    let was: Vec<(String, u64)> = match recorded.is_empty() {
        true => (before.volumes.iter())
            .map(|v| (v.name.clone(), v.bytes))
            .collect(),
        false => recorded.into_iter().map(|v| (v.name, v.bytes)).collect(),
    };
    if let Some(name) = &a.volume {
        super::status::volume(&before, Some(name))?;
    }
    let after = opened.target.resize(a.volume.as_deref())?;
    opened.finish()?;
    for v in &after.volumes {
        if a.volume.as_ref().is_some_and(|n| *n != v.name) {
            continue;
        }
        let old = was
            .iter()
            .find(|(n, _)| *n == v.name)
            .map_or(v.bytes, |w| w.1);
        let what = format!("volume '{}' of cache '{}'", v.name, opened.entry.name);
        match old == v.bytes {
            true => outln!("{what}: {}, unchanged", human_bytes(v.bytes)),
            false => outln!(
                "{what}: {} -> {} ({} -> {} bytes)",
                human_bytes(old),
                human_bytes(v.bytes),
                old,
                v.bytes
            ),
        }
    }
    let sizes: Vec<u64> = after.volumes.iter().map(|v| v.bytes).collect();
    let behind = frontends.as_ref().map(|f| f.ublk_behind(&sizes));
    for (dev, _, _) in behind.unwrap_or_default() {
        outln!(
            "{dev} keeps its old size until the daemon restarts (Linux cannot resize a live \
             ublk device): systemctl restart tiercache@{}",
            opened.entry.name
        );
    }
    Ok(())
}

/// `resize --cache`: the cache device measured again and its new space
/// taken, by the daemon that serves it or here.
fn grow_cache(reg: &Registry, a: &Args) -> Result<()> {
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let before = opened.target.status()?;
    let after = opened.target.resize_cache()?;
    opened.finish()?;
    let bytes = |s: &tiercache::engine::Status| s.cache_blocks_total * u64::from(s.block_bytes);
    let what = format!("cache '{}' on {}", opened.entry.name, after.cache);
    match before.cache_blocks_total == after.cache_blocks_total {
        true => outln!(
            "{what}: {} in {} blocks, unchanged",
            human_bytes(bytes(&after)),
            after.cache_blocks_total
        ),
        false => outln!(
            "{what}: {} -> {} ({} -> {} blocks of {})",
            human_bytes(bytes(&before)),
            human_bytes(bytes(&after)),
            before.cache_blocks_total,
            after.cache_blocks_total,
            human_bytes(u64::from(after.block_bytes))
        ),
    }
    Ok(())
}
