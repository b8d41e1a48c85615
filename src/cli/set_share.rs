//! `tiercache set-share`: how the volumes of one cache share it
//! (docs/engine.md, "Sharing"): one ranking of every block (`global`, the
//! default) or floors from the miss-ratio curves (`curve`), and a volume's
//! guaranteed minimum and maximum share.

use anyhow::Result;
use tiercache::engine::policy::share::{pct, ShareChange};
use tiercache::engine::{Status, VolumeStatus};

use super::exit::fail;
use super::registry::Registry;
use super::target::Opened;
use super::units::{parse_share, parse_sharing};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// global (one ranking of every volume's blocks) or curve (each
    /// volume's floor set from the miss-ratio curves, every 10 s).
    #[arg(long)]
    sharing: Option<String>,
    /// The volume whose --min or --max this sets.
    #[arg(long, value_name = "NAME")]
    volume: Option<String>,
    /// Its guaranteed share of the cache, a percentage (none: 0).
    #[arg(long, value_name = "PCT")]
    min: Option<String>,
    /// The most of the cache it may hold, a percentage (none: no limit).
    #[arg(long, value_name = "PCT")]
    max: Option<String>,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let change = ShareChange {
        sharing: a.sharing.as_deref().map(parse_sharing).transpose()?,
        volume: a.volume.clone(),
        min_permille: a.min.as_deref().map(parse_share).transpose()?,
        max_permille: a.max.as_deref().map(parse_share).transpose()?,
    };
    if change == ShareChange::default() {
        fail!(
            Usage,
            "nothing to change: give --sharing, or --volume with --min or --max"
        );
    }
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    opened.target.set_share(&change)?;
    let after = opened.target.status()?;
    opened.finish()?;
    out!("{}", shares_lines(&opened.entry.name, &after));
    Ok(())
}

/// The volumes' shares as `set-share` and `status` print them.
pub fn shares_lines(cache: &str, s: &Status) -> String {
    let mut out = format!("cache '{cache}': sharing {}\n", s.sharing.name());
    for v in &s.volumes {
        out += &format!("  {:<12} {}\n", v.name, share_line(v, s.cache_blocks_total));
    }
    out
}

/// One volume's share: its minimum, maximum, floor and what it holds.
pub fn share_line(v: &VolumeStatus, total: u64) -> String {
    let limit = |permille: u16| match permille {
        0 => "none".to_string(),
        p => format!("{}%", pct(p)),
    };
    let of = |blocks: u64| 100.0 * blocks as f64 / total.max(1) as f64;
    format!(
        "min {}, max {}, floor {:.1}%, holds {:.1}%",
        limit(v.share.min_permille),
        limit(v.share.max_permille),
        of(v.share_floor_blocks),
        of(v.cache_blocks_used)
    )
}
