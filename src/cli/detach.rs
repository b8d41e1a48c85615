//! `tiercache detach`: write everything back, dissolve the cache, forget it.
//! A served cache whose device is in use (a mounted or open ublk device, a
//! connected NBD client) is left alone unless `--force`.

use anyhow::{Context, Result};
use std::time::{Duration, Instant};

use tiercache::daemon::frontends::{teardown_refusal, CLIENT_LEAVE_WAIT};

use super::exit::fail;
use super::flush::flush_with_progress;
use super::registry::Registry;
use super::target::{Opened, Target};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Detach even while the served device is mounted, open or connected:
    /// its users then see every request fail.
    #[arg(long)]
    force: bool,
    /// Of a cache of several origins: detach this volume only, its origin
    /// left standing alone (`tiercache remove-origin --volume NAME`).
    #[arg(long, value_name = "NAME", conflicts_with = "force")]
    volume: Option<String>,
}

/// Why the served device must not go away now, checked before the write
/// back (the daemon checks again at the detach itself). NBD clients that
/// are disconnecting get a moment to be gone.
fn in_use(target: &Target) -> Result<Option<String>> {
    let t = Instant::now();
    loop {
        let Some(served) = target.status_and_frontends()?.1 else {
            return Ok(None);
        };
        let why = teardown_refusal(&served);
        if why.is_none() || served.nbd_clients == 0 || t.elapsed() >= CLIENT_LEAVE_WAIT {
            return Ok(why);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    if let Some(volume) = &a.volume {
        return super::remove_origin::remove_named(reg, a.name.name.as_deref(), volume);
    }
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let entry = opened.entry.clone();
    if !a.force {
        if let Some(why) = in_use(&opened.target)? {
            fail!(Refused, "refusing to detach cache '{}': {why}", entry.name);
        }
    }
    // Written back here first for the progress bar; detach then finds
    // (almost) nothing left to do.
    let written = flush_with_progress(&opened.target, None)?;
    opened
        .target
        .detach(a.force)
        .with_context(|| format!("cache '{}'", entry.name))?;
    opened.finish()?;
    reg.remove(&entry.name).with_context(|| {
        format!(
            "cache '{}' was detached but its registry entry could not be removed",
            entry.name
        )
    })?;
    drop(opened);
    outln!(
        "cache '{}' detached: {written} blocks written back",
        entry.name
    );
    let (origins, s) = match entry.more_origins.is_empty() {
        true => ("the origin", "s"),
        false => ("the origins", ""),
    };
    outln!(
        "{origins} {} now stand{s} alone and hold{s} all data; {} no longer holds a cache",
        entry.origin_paths().join(", "),
        entry.cache_paths().join(" + ")
    );
    Ok(())
}
