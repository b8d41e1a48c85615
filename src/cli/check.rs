//! `tiercache check`: verify a cache device's metadata offline. Reads only:
//! every device is opened read-only under a shared lock (a cache a daemon
//! serves is refused, naming it), and nothing is written.
//! Exit code 0 when the metadata is intact, 5 (damaged) when damage was
//! found.

use anyhow::{Context, Result};
use tiercache::device::open_device_read_only;
use tiercache::engine::recovery::{self, CheckReport, CrashLogs};

use super::exit::fail;
use super::registry::{Lock, Registry};
use super::target::open_cache_read_only;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Name of a registered cache (default: the only registered cache).
    #[arg(long)]
    name: Option<String>,
    /// Check this cache device instead of a registered cache.
    #[arg(long, conflicts_with = "name")]
    cache: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let (label, cache_paths, origin_paths, crash_logs, _lock): (
        String,
        Vec<String>,
        Vec<String>,
        CrashLogs,
        Option<Lock>,
    ) = match &a.cache {
        // No name, so no known log: every log of this user's that belongs
        // to this cache device (by the identity in its header).
        Some(path) => (
            path.clone(),
            vec![path.clone()],
            Vec::new(),
            CrashLogs::Search(reg.crash_log_files()),
            None,
        ),
        None => {
            let entry = reg.resolve(a.name.as_deref())?;
            // Not while another command changes it.
            let lock = reg.lock(&entry.name)?;
            (
                format!("cache '{}' ({})", entry.name, entry.cache),
                entry.cache_paths(),
                entry.origin_paths(),
                CrashLogs::Known(reg.crash_log_path(&entry.name)),
                Some(lock),
            )
        }
    };
    let cache = open_cache_read_only(&cache_paths).context("cache")?;
    // The origins' sizes let the check compare them with the recorded
    // ones; a missing origin does not stop a metadata check.
    let origin_bytes: Vec<Option<u64>> = (origin_paths.iter())
        .map(|p| match open_device_read_only(p) {
            Ok(dev) => Some(dev.size_bytes()),
            Err(e) => {
                log::warn!("origin {p}: {e}; checking against the recorded origin size");
                None
            }
        })
        .collect();
    let spinner = super::progress::spinner("checking the metadata");
    let report = recovery::check_volumes(&cache, &origin_bytes, &crash_logs);
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    print_report(a.json, &label, &report)?;
    if !report.ok {
        let n = report
            .findings
            .iter()
            .filter(|f| f.starts_with("DAMAGE"))
            .count();
        fail!(
            Damaged,
            "{label}: metadata damage found ({n} findings marked DAMAGE)"
        );
    }
    Ok(())
}

/// The report as JSON (with its schema version) or for people.
fn print_report(json: bool, label: &str, report: &CheckReport) -> Result<()> {
    if json {
        #[derive(serde::Serialize)]
        struct CheckJson<'a> {
            schema_version: u32,
            #[serde(flatten)]
            report: &'a CheckReport,
        }
        let json = CheckJson {
            schema_version: super::list::SCHEMA_VERSION,
            report,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&json).context("encoding the report")?
        );
    } else {
        out!("{}", human(label, report));
    }
    Ok(())
}

fn human(label: &str, r: &CheckReport) -> String {
    let mut out = format!(
        "check of {label}: {}\n",
        if r.ok { "ok" } else { "DAMAGED" }
    );
    for f in &r.findings {
        out.push_str(&format!("  {f}\n"));
    }
    if let (Some(mode), Some(bs)) = (&r.mode, r.block_bytes) {
        let version = r
            .format_version
            .map_or(String::new(), |v| format!("format {v}, "));
        out.push_str(&format!(
            "  {version}mode {mode}, block size {bs}, blocks total {} used {} dirty {}\n",
            r.cache_blocks_total, r.cache_blocks_used, r.cache_blocks_dirty
        ));
    }
    if r.volumes.len() > 1 {
        for v in &r.volumes {
            out.push_str(&format!(
                "  volume {}: origin of {} bytes\n",
                v.name, v.origin_bytes
            ));
        }
    }
    if let Some(clean) = r.clean_shutdown {
        out.push_str(&format!(
            "  shut down cleanly: {}, journal pages to replay: {}\n",
            if clean { "yes" } else { "no" },
            r.journal_pages_to_replay
        ));
    }
    out
}
