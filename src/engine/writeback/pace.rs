//! How writeback shares the origin with clients (`Pace`), and how a pass
//! that meets only busy blocks waits (`wait_if_stalled`): what the
//! background (run.rs), the origins' lanes (lanes.rs) and each writeback
//! order (order/) share, below all of them.

use std::time::Duration;

use crate::engine::{EngineError, EngineResult};

/// How a round of writeback shares the origin with clients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pace {
    /// As fast as it can (flush, mode switches, a quiet origin).
    Full,
    /// About this share of the origin's time while clients keep it busy.
    Share(f64),
    /// The origin is idle: full speed, stopping when a client comes back.
    Drain,
}

/// A pass of `write_back_all` that wrote nothing back met busy blocks
/// (foreground I/O holds them): it waits a little, and gives up after
/// 10,000 such passes in a row. `progressed` resets the count.
pub(crate) fn wait_if_stalled(stalled: &mut u32, progressed: bool) -> EngineResult<()> {
    if progressed {
        *stalled = 0;
        return Ok(());
    }
    *stalled += 1;
    if *stalled > 10_000 {
        return Err(EngineError::Config(
            "flush made no progress: blocks stayed busy".into(),
        ));
    }
    std::thread::sleep(Duration::from_millis(1));
    Ok(())
}
