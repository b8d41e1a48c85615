//! `tiercache set-policy NAME`: switch the replacement policy, live.

use anyhow::Result;

use super::registry::Registry;
use super::target::Opened;
use super::units::parse_policy;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// s3fifo (scan resistant), lru or fifo.
    policy: String,
    #[command(flatten)]
    name: NameArg,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let policy = parse_policy(&a.policy)?;
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let before = opened.target.status()?.policy;
    if before != policy.name() {
        opened.target.set_policy(policy)?;
    }
    opened.finish()?;
    outln!(
        "cache '{}': policy {before} -> {}",
        opened.entry.name,
        policy.name()
    );
    Ok(())
}
