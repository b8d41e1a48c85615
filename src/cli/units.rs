//! Parsing and printing the values operators type and read: sizes, modes,
//! policies, percentages.

use super::exit::{classed, fail};
use anyhow::Result;
use tiercache::device::parse_size;
use tiercache::engine::format::{block_bytes_valid, MAX_BLOCK_BYTES, MIN_BLOCK_BYTES};
use tiercache::engine::policy::share::Sharing;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::{Mode, Placement, WritebackOrder, WritebackSettings};

/// A cache block size: `4096`, `4K`, `64KiB`, `1M`; a power of two from
/// 4 KiB to 1 MiB (the engine's limits).
pub fn parse_block_size(s: &str) -> Result<u32> {
    let bytes = parse_size(s).ok_or_else(|| {
        classed!(
            Usage,
            "block size '{s}' is not a size (examples: 4096, 4K, 64KiB, 1M)"
        )
    })?;
    if !block_bytes_valid(bytes) {
        let shown = if s.trim() == bytes.to_string() {
            format!("'{s}'")
        } else {
            format!("'{s}' ({bytes} bytes)")
        };
        fail!(
            Usage,
            "block size {shown} is invalid: it must be a power of two from {} to {}",
            human_bytes(MIN_BLOCK_BYTES.into()),
            human_bytes(MAX_BLOCK_BYTES.into())
        );
    }
    Ok(bytes as u32)
}

pub fn parse_mode(s: &str) -> Result<Mode> {
    one_of(s, "cache mode", Mode::parse(s), Mode::ALL.map(|m| m.name()))
}

pub fn parse_sharing(s: &str) -> Result<Sharing> {
    one_of(
        s,
        "sharing",
        Sharing::parse(s),
        Sharing::ALL.map(|k| k.name()),
    )
}

/// A share of the cache: `25`, `25%` or `12.5%` (thousandths, 0..=1000);
/// `none` is 0 (no minimum, no maximum).
pub fn parse_share(s: &str) -> Result<u16> {
    if s == "none" {
        return Ok(0);
    }
    let pct: f64 = (s.strip_suffix('%').unwrap_or(s).parse().ok())
        .filter(|p: &f64| (0.0..=100.0).contains(p))
        .ok_or_else(|| {
            classed!(
                Usage,
                "share '{s}' is not a percentage of the cache (0 to 100, or none)"
            )
        })?;
    Ok((pct * 10.0).round() as u16)
}

pub fn parse_policy(s: &str) -> Result<PolicyKind> {
    one_of(
        s,
        "replacement policy",
        PolicyKind::parse(s),
        PolicyKind::ALL.map(|p| p.name()),
    )
}

pub fn parse_placement(s: &str) -> Result<Placement> {
    one_of(
        s,
        "placement",
        Placement::parse(s),
        Placement::ALL.map(|p| p.name()),
    )
}

pub fn parse_writeback_order(s: &str) -> Result<WritebackOrder> {
    one_of(
        s,
        "writeback order",
        WritebackOrder::parse(s),
        WritebackOrder::ALL.map(|o| o.name()),
    )
}

/// `parsed`, or an error naming `s` and the `names` expected.
fn one_of<T, const N: usize>(
    s: &str,
    what: &str,
    parsed: Option<T>,
    names: [&str; N],
) -> Result<T> {
    parsed.ok_or_else(|| {
        classed!(
            Usage,
            "unknown {what} '{s}' (expected one of: {})",
            names.join(", ")
        )
    })
}

/// The engine's rule for writeback settings, checked before anything is
/// written.
pub fn check_writeback(w: &WritebackSettings) -> Result<()> {
    w.validate().map_err(|e| classed!(Usage, "{e}"))
}

pub use tiercache::units::human_bytes;

/// `part` as a percentage of `total` (none when there is no total).
pub fn percent_of(part: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| part as f64 * 100.0 / total as f64)
}

/// `part` as a percentage of `total`, or `-` when there is no total.
pub fn percent(part: u64, total: u64) -> String {
    percent_of(part, total).map_or_else(|| "-".into(), |p| format!("{p:.1}%"))
}

/// A duration for people: `12.3s`, `2m 10s`, `3h 5m`, `2d 4h`.
pub fn human_duration(secs: f64) -> String {
    if secs.is_nan() || secs < 60.0 {
        return format!("{:.1}s", secs.max(0.0));
    }
    let s = secs as u64;
    match s {
        0..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s / 60 % 60),
        _ => format!("{}d {}h", s / 86_400, s / 3600 % 24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(0.04), "0.0s");
        assert_eq!(human_duration(12.34), "12.3s");
        assert_eq!(human_duration(130.0), "2m 10s");
        assert_eq!(human_duration(3600.0 + 300.0), "1h 5m");
        assert_eq!(human_duration(2.0 * 86_400.0 + 4.0 * 3600.0), "2d 4h");
        assert_eq!(human_duration(f64::NAN), "0.0s");
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_block_size("4096").unwrap(), 4096);
        assert_eq!(parse_block_size("4K").unwrap(), 4096);
        assert_eq!(parse_block_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_block_size("1M").unwrap(), 1 << 20);
        for bad in ["3000", "2M", "2K", "0", "", "x", "99999999999999999999"] {
            assert!(parse_block_size(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse_block_size("2M").unwrap_err().to_string();
        assert!(
            e.contains("2097152 bytes") && e.contains("power of two"),
            "{e}"
        );
    }

    #[test]
    fn percents_print() {
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent_of(1, 4), Some(25.0));
        assert_eq!(percent_of(1, 0), None);
        assert_eq!(percent(1, 0), "-");
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("writethrough").unwrap(), Mode::Writethrough);
        let e = parse_mode("fast").unwrap_err().to_string();
        assert!(e.contains("writeback") && e.contains("'fast'"), "{e}");
    }
}
