//! `tiercache set-writeback`: change when background writeback runs.

use anyhow::Result;
use tiercache::engine::WritebackSettings;

use super::registry::Registry;
use super::target::Opened;
use super::units::check_writeback;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Start writing back above this percentage of dirty blocks.
    #[arg(long, value_name = "PCT")]
    high: Option<u32>,
    /// Stop writing back at this percentage.
    #[arg(long, value_name = "PCT")]
    low: Option<u32>,
    /// Write back any block dirty for longer than this many seconds (also
    /// --max-dirty-age: the most a lost single cache device can leave the
    /// origin behind).
    #[arg(long, value_name = "SECS", visible_alias = "max-dirty-age")]
    age: Option<u32>,
    /// Write back everything once the origin has been idle this many
    /// seconds (0: never).
    #[arg(long, value_name = "SECS")]
    idle: Option<u32>,
    #[command(flatten)]
    name: NameArg,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    // What can be refused without the current settings is refused before
    // the cache is opened.
    check_writeback(&WritebackSettings {
        high_pct: a.high.unwrap_or(100),
        low_pct: a.low.unwrap_or(0),
        max_age_secs: a.age.unwrap_or(1),
        idle_secs: a.idle.unwrap_or(0),
    })?;
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let old = opened.target.status()?.writeback;
    let new = WritebackSettings {
        high_pct: a.high.unwrap_or(old.high_pct),
        low_pct: a.low.unwrap_or(old.low_pct),
        max_age_secs: a.age.unwrap_or(old.max_age_secs),
        idle_secs: a.idle.unwrap_or(old.idle_secs),
    };
    if new != old {
        check_writeback(&new)?;
        opened.target.set_writeback(new)?;
    }
    opened.finish()?;
    let verb = if new == old { "unchanged" } else { "now" };
    outln!(
        "cache '{}': writeback {verb}: start at {}% dirty, stop at {}%, max age {} s, {}",
        opened.entry.name,
        new.high_pct,
        new.low_pct,
        new.max_age_secs,
        idle_text(new.idle_secs)
    );
    Ok(())
}

/// The idle drain setting, for people.
pub fn idle_text(idle_secs: u32) -> String {
    if idle_secs == 0 {
        "no drain when the origin is idle".into()
    } else {
        format!("drain after {idle_secs} s of an idle origin")
    }
}
