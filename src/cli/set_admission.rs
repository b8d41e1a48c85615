//! `tiercache set-admission`: what may enter the cache (see
//! engine/admission.rs). The same options are taken by `create`.

use anyhow::Result;
use tiercache::device::parse_size;
use tiercache::engine::AdmissionSettings;

use super::exit::{classed, fail};
use super::registry::Registry;
use super::target::Opened;
use super::units::human_bytes;
use super::NameArg;

/// Admission options; unset ones keep their value (create: the default).
#[derive(clap::Args, Debug)]
pub struct AdmissionArgs {
    /// Once the cache is fuller than --selective-above, sequential streams
    /// longer than this go around it (0: off) [default at create: 4M].
    #[arg(long, value_name = "SIZE")]
    sequential_cutoff: Option<String>,
    /// When the cache is fuller than --selective-above, promote a read miss
    /// only after this many recent misses of the block (1: always) [default at create: 3].
    #[arg(long, value_name = "N")]
    promote_after: Option<u32>,
    /// Occupancy above which admission is selective (--sequential-cutoff,
    /// --promote-after) [default at create: 80].
    #[arg(long, value_name = "PCT")]
    selective_above: Option<u32>,
    /// Send new data around the cache while the cache device is slower
    /// than the origin: on or off [default at create: on].
    #[arg(long, value_name = "on|off")]
    guard: Option<String>,
}

impl AdmissionArgs {
    /// `base` with the options given applied, checked.
    pub fn apply(&self, base: AdmissionSettings) -> Result<AdmissionSettings> {
        let mut s = base;
        if let Some(c) = &self.sequential_cutoff {
            s.sequential_cutoff_bytes = parse_size(c).ok_or_else(|| {
                classed!(
                    Usage,
                    "sequential cutoff '{c}' is not a size (examples: 0, 512K, 4M)"
                )
            })?;
        }
        if let Some(n) = self.promote_after {
            s.promote_after = n;
        }
        if let Some(p) = self.selective_above {
            s.selective_above_pct = p;
        }
        if let Some(g) = &self.guard {
            s.guard = match g.as_str() {
                "on" => true,
                "off" => false,
                _ => fail!(Usage, "--guard takes on or off, not '{g}'"),
            };
        }
        s.validate().map_err(|e| classed!(Usage, "{e}"))?;
        Ok(s)
    }
}

/// One line describing admission settings.
pub fn describe(s: &AdmissionSettings) -> String {
    let cutoff = if s.sequential_cutoff_bytes == 0 {
        "no sequential cutoff".to_string()
    } else {
        format!(
            "streams over {} go around",
            human_bytes(s.sequential_cutoff_bytes)
        )
    };
    let promote = if s.promote_after <= 1 {
        "every read miss promoted".to_string()
    } else {
        format!("a read miss is promoted after {} misses", s.promote_after)
    };
    format!(
        "above {}% full: {cutoff}, {promote}; guard {}",
        s.selective_above_pct,
        if s.guard { "on" } else { "off" }
    )
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    admission: AdmissionArgs,
    #[command(flatten)]
    name: NameArg,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    // Options that are wrong whatever the current settings are refused
    // before the cache is opened.
    a.admission.apply(AdmissionSettings::default())?;
    let opened = Opened::open(reg, a.name.name.as_deref())?;
    let old = opened.target.status()?.admission_settings;
    let new = a.admission.apply(old)?;
    if new != old {
        opened.target.set_admission(new)?;
    }
    opened.finish()?;
    let verb = if new == old { "unchanged" } else { "now" };
    outln!(
        "cache '{}': admission {verb}: {}",
        opened.entry.name,
        describe(&new)
    );
    Ok(())
}
