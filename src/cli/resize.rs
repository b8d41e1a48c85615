//! `tiercache resize [--volume NAME]`: take an origin that grew (lvextend,
//! a longer file, `rbd resize`) as the volume's new size.
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
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
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
            true => println!("{what}: {}, unchanged", human_bytes(v.bytes)),
            false => println!(
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
        println!(
            "{dev} keeps its old size until the daemon restarts (Linux cannot resize a live \
             ublk device): systemctl restart tiercache@{}",
            opened.entry.name
        );
    }
    Ok(())
}
