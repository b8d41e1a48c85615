//! `tiercache top`: a cache's counters and their rates, refreshed once a
//! second in the terminal (plain ANSI: clear and redraw). `q` or Ctrl-C
//! ends it; `--count N` ends it after N screens (for scripts and tests,
//! which also get the screens one after another instead of redrawn).
//! `--json` prints each sample as one line of JSON instead (a stream, as
//! `iostat -o JSON` gives): counters, their rates, occupancy.

use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use tiercache::engine::Status;

use super::exit::fail;
use super::registry::Registry;
use super::target::Opened;
use super::units::{human_bytes, percent, percent_of};
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// Stop after this many screens.
    #[arg(long)]
    count: Option<u64>,
    /// Seconds between screens.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// One line of JSON per sample (schema_version 1) instead of screens.
    #[arg(long)]
    json: bool,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    if !(0.05..=3600.0).contains(&a.interval) {
        fail!(Usage, "--interval must be between 0.05 and 3600 seconds");
    }
    let opened = Opened::open_read_only(reg, a.name.name.as_deref())?;
    let live = matches!(opened.target, super::target::Target::Daemon(_));
    let redraw = !a.json && std::io::stdout().is_terminal();
    let keys = Keys::new();
    let mut prev: Option<(Instant, Status)> = None;
    let mut shown = 0u64;
    loop {
        let status = opened.target.status()?;
        let now = Instant::now();
        // Rates are over the time between the two status samples, taken
        // once here for every line of the screen.
        let before = prev
            .as_ref()
            .map(|(t, p)| (now.duration_since(*t).as_secs_f64().max(1e-3), p));
        let screen = match a.json {
            true => sample_json(&opened.entry.name, &status, before, live).to_string(),
            false => screen(&opened.entry.name, &status, before, live),
        };
        let mut out = std::io::stdout().lock();
        if redraw {
            // Home, clear the screen; raw mode wants \r\n.
            write!(out, "\x1b[H\x1b[2J{}", screen.replace('\n', "\r\n"))?;
        } else {
            writeln!(out, "{screen}")?;
        }
        out.flush()?;
        drop(out);
        shown += 1;
        prev = Some((now, status));
        if a.count.is_some_and(|n| shown >= n) {
            break;
        }
        if keys.wait_for_quit(Duration::from_secs_f64(a.interval)) {
            break;
        }
    }
    drop(keys);
    opened.finish()?;
    Ok(())
}

/// The status of the last screen and the seconds since it was taken.
type Before<'a> = Option<(f64, &'a Status)>;

/// One screen: the cache, then every counter with its rate since the last
/// screen.
fn screen(name: &str, s: &Status, prev: Before, live: bool) -> String {
    let mut out = format!(
        "tiercache top: '{name}' ({}, {} mode, {} policy){}\n\n",
        human_bytes(s.volume_bytes),
        s.mode.name(),
        s.policy,
        if live {
            ""
        } else {
            "  [not served: read without writing, counters zero]"
        }
    );
    out.push_str(&summary(s, prev));
    out.push_str(&counter_table(s, prev));
    if !s.mrc.points.is_empty() {
        let pts: Vec<String> = s
            .mrc
            .points
            .iter()
            .map(|p| format!("{}x {:.0}%", p.size_factor, p.hit_ratio * 100.0))
            .collect();
        out.push_str(&format!(
            "\n  hit ratio by cache size: {}\n",
            pts.join("  ")
        ));
    }
    out.push_str("\n  q or Ctrl-C quits\n");
    out
}

/// A sample as JSON: every counter's total and rate (null on the first
/// sample), the hit ratio over the interval and since open, occupancy.
fn sample_json(name: &str, s: &Status, prev: Before, live: bool) -> serde_json::Value {
    let st = &s.stats;
    let counters: serde_json::Map<String, serde_json::Value> = (counter_rates(s, prev).into_iter())
        .map(|(counter, v, rate)| {
            let json = serde_json::json!({ "total": v, "per_second": rate });
            (counter.to_string(), json)
        })
        .collect();
    let hit_percent = |(h, m): (u64, u64)| percent_of(h, h + m);
    serde_json::json!({
        "schema_version": super::list::SCHEMA_VERSION,
        "name": name,
        "served": live,
        "interval_secs": prev.map(|(dt, _)| dt),
        "hit_percent_interval": interval_reads(s, prev).and_then(hit_percent),
        "hit_percent": hit_percent((st.read_hits, st.read_misses)),
        "block_bytes": s.block_bytes,
        "cache_blocks_total": s.cache_blocks_total,
        "cache_blocks_used": s.cache_blocks_used,
        "cache_blocks_dirty": s.cache_blocks_dirty,
        "admission": s.admission,
        "counters": counters,
    })
}

/// Every counter: its name, its total and its rate since the last sample
/// (none on the first).
fn counter_rates(s: &Status, prev: Before) -> Vec<(&'static str, u64, Option<f64>)> {
    let before = prev.map(|(dt, p)| (dt, p.stats.counters()));
    (s.stats.counters().into_iter().enumerate())
        .map(|(i, (name, _, v))| {
            let rate = (before.as_ref()).map(|(dt, b)| v.saturating_sub(b[i].2) as f64 / dt);
            (name, v, rate)
        })
        .collect()
}

/// Blocks read from the cache and missed since the last sample.
fn interval_reads(s: &Status, prev: Before) -> Option<(u64, u64)> {
    let (_, p) = prev?;
    Some((
        s.stats.read_hits.saturating_sub(p.stats.read_hits),
        s.stats.read_misses.saturating_sub(p.stats.read_misses),
    ))
}

/// Request rates, hit ratio, occupancy, writeback rate and admission.
fn summary(s: &Status, prev: Before) -> String {
    let st = &s.stats;
    let rate = |now: u64, was: fn(&Status) -> u64| -> Option<f64> {
        let (dt, p) = prev?;
        Some(now.saturating_sub(was(p)) as f64 / dt)
    };
    let fmt_rate = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.0}/s"));
    let mut out = format!(
        "  requests   read {}  write {}  flush {}\n",
        fmt_rate(rate(st.read_requests, |p| p.stats.read_requests)),
        fmt_rate(rate(st.write_requests, |p| p.stats.write_requests)),
        fmt_rate(rate(st.flush_requests, |p| p.stats.flush_requests)),
    );
    let interval_hits = interval_reads(s, prev).map(|(h, m)| percent(h, h + m));
    out.push_str(&format!(
        "  hit ratio  {} now, {} since open\n",
        interval_hits.unwrap_or_else(|| "-".into()),
        percent(st.read_hits, st.read_hits + st.read_misses)
    ));
    let bs = u64::from(s.block_bytes);
    out.push_str(&format!(
        "  cache      used {} ({})  dirty {} ({})\n",
        human_bytes(s.cache_blocks_used * bs),
        percent(s.cache_blocks_used, s.cache_blocks_total),
        human_bytes(s.cache_blocks_dirty * bs),
        percent(s.cache_blocks_dirty, s.cache_blocks_total)
    ));
    let wb = rate(st.blocks_written_back, |p| p.stats.blocks_written_back);
    out.push_str(&format!(
        "  writeback  {}/s\n",
        wb.map_or_else(|| "-".into(), |r| human_bytes((r * bs as f64) as u64))
    ));
    out.push_str(&format!("  admission  {}\n\n", s.admission));
    out
}

/// Every counter, its total and its rate since the last screen.
fn counter_table(s: &Status, prev: Before) -> String {
    let mut out = format!("  {:<22} {:>14} {:>12}\n", "counter", "total", "per second");
    for (name, v, r) in counter_rates(s, prev) {
        out.push_str(&format!(
            "  {name:<22} {v:>14} {:>12}\n",
            r.map_or_else(|| "-".into(), |r| format!("{r:.0}"))
        ));
    }
    out
}

/// Keys from a terminal on stdin, read without echo or line buffering
/// (restored on drop); without a terminal, only the interval passes.
struct Keys {
    saved: Option<libc::termios>,
}

impl Keys {
    fn new() -> Keys {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Keys { saved: None };
        }
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a termios we own.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return Keys { saved: None };
            }
            let saved = t;
            // No echo, no line editing, and Ctrl-C arrives as a byte (so
            // the terminal is restored before we leave).
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return Keys { saved: None };
            }
            Keys { saved: Some(saved) }
        }
    }

    /// Waits `d`; true if q, Q or Ctrl-C was pressed meanwhile.
    fn wait_for_quit(&self, d: Duration) -> bool {
        if self.saved.is_none() {
            std::thread::sleep(d);
            return false;
        }
        let end = Instant::now() + d;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut pfd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one pollfd we own.
            let n =
                unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n <= 0 {
                continue;
            }
            let mut b = [0u8; 16];
            match std::io::stdin().lock().read(&mut b) {
                Ok(0) => return true, // the terminal went away
                Ok(k) if b[..k].iter().any(|&c| matches!(c, b'q' | b'Q' | 3)) => return true,
                _ => {}
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Some(t) = self.saved {
            // SAFETY: restores the settings read in `new`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        }
    }
}
