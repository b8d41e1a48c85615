//! `tiercache give-up-cache --lose-dirty-data`: the operator's word that a
//! cache device (every copy of a cache set) is gone for good. Until then a
//! failing cache with dirty data returns errors and keeps the data, in case
//! the device answers again. Given up, the cache fails over to the origin;
//! the origin ranges its dirty blocks held are stale: reads of them fail
//! with an I/O error rather than return old bytes, `status` lists them, and
//! a write that covers a whole block makes it current again.

use anyhow::Result;

use super::exit::fail;
use super::registry::Registry;
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
    let opened = Opened::open(reg, a.name.name.as_deref())?;
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
