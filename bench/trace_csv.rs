//! MSR / SNIA block traces as the replay examples read them
//! (`Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`):
//! requests not sector-aligned, and empty ones, are left out.

use anyhow::{bail, Context, Result};

pub struct Req {
    pub write: bool,
    pub offset: u64,
    pub len: u64,
}

pub fn read_trace(path: &str) -> Result<Vec<Req>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 6 || f[0].eq_ignore_ascii_case("timestamp") {
            continue;
        }
        let write = match f[3] {
            "Write" => true,
            "Read" => false,
            t => bail!("{path}:{}: type {t:?}", i + 1),
        };
        let offset: u64 = f[4].parse().with_context(|| format!("{path}:{}", i + 1))?;
        let len: u64 = f[5].parse().with_context(|| format!("{path}:{}", i + 1))?;
        if len == 0 || !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            continue;
        }
        out.push(Req { write, offset, len });
    }
    Ok(out)
}

/// Distinct 4 KiB blocks the requests touch.
pub fn footprint_blocks(reqs: &[Req]) -> u64 {
    let blocks: std::collections::HashSet<u64> = reqs
        .iter()
        .flat_map(|r| r.offset / 4096..(r.offset + r.len).div_ceil(4096))
        .collect();
    blocks.len() as u64
}

/// An origin that holds every request: the largest end, in whole MiB.
pub fn origin_bytes_for(reqs: &[Req]) -> u64 {
    let end = reqs.iter().map(|r| r.offset + r.len).max().unwrap_or(0);
    end.div_ceil(1 << 20).max(1) << 20
}
