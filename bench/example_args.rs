//! What the in-process benchmark examples (`engine_ops`, `cache_stream`)
//! share: a numeric `--name N` argument and the block sequence they draw.

use anyhow::{bail, Result};

/// The number after `name` in `args`, or `default` when `name` is absent.
pub fn arg(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) => Ok(v),
            None => bail!("{name} needs a number"),
        },
    }
}

/// xorshift64: the same block sequence in every build.
pub fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}
