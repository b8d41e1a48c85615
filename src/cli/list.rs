//! `tiercache list`: one line per cache and per volume, as `lvs` and
//! `casadm -L` print them: chosen fields (`-o`), sorted (`-O`), in chosen
//! units, with or without headings, or as JSON with a schema version.
//! Served caches are asked through their daemons; the others are read in
//! place, read-only. A cache that cannot be read is listed with its state
//! and the reason on stderr: the other caches are still listed.

use anyhow::Result;
use serde::Serialize;
use tiercache::daemon::Frontends;
use tiercache::engine::Status;

use super::exit::{classed, fail};
use super::registry::{Entry, Registry};
use super::target::Opened;
use super::units::{human_bytes, percent_of};

/// The version of `--json`'s shape; raised when a field changes meaning
/// or goes (a new field does not raise it).
pub const SCHEMA_VERSION: u32 = 1;

/// Fields shown without `-o`.
const DEFAULT_FIELDS: &str = "name,type,mode,state,size,used%,dirty%,hit%,served,devices";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Fields to show, comma separated: name, type, mode, state, size,
    /// used, used%, dirty, dirty%, hit%, served, devices, block, policy;
    /// `+FIELD,...` adds to the defaults.
    #[arg(short = 'o', long = "options", value_name = "FIELDS", default_value = DEFAULT_FIELDS)]
    options: String,
    /// Sort by these fields, comma separated; `-FIELD` sorts descending.
    /// Volumes stay under their cache, sorted the same way.
    #[arg(
        short = 'O',
        long = "sort",
        value_name = "FIELDS",
        default_value = "name",
        allow_hyphen_values = true
    )]
    sort: String,
    /// Units of sizes: h (human, 1.5 GiB), b (bytes), k, m, g, t (KiB,
    /// MiB, GiB, TiB, two decimals, the unit in the heading).
    #[arg(long, default_value = "h", value_name = "UNIT")]
    units: String,
    /// Leave the heading line out.
    #[arg(long)]
    noheadings: bool,
    /// Separate fields with this string instead of aligning them.
    #[arg(long, value_name = "SEP")]
    separator: Option<String>,
    /// Print JSON (every field, sizes in bytes) instead of a table.
    #[arg(long)]
    json: bool,
}

/// One row: a cache, or a volume of one.
#[derive(Serialize, Clone, Debug)]
struct Row {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    mode: String,
    /// ok, degraded, rebuilding, stale (data lost with a failed cache
    /// device), no-admit (the cache error limit was reached), busy or
    /// unavailable (the cache could not be read: see `error`).
    state: String,
    size_bytes: Option<u64>,
    used_bytes: Option<u64>,
    used_percent: Option<f64>,
    dirty_bytes: Option<u64>,
    dirty_percent: Option<f64>,
    /// Read hits of all reads since the daemon started (a cache only).
    hit_percent: Option<f64>,
    /// What serves it: `nbd:SOCKET`, `tcp:ADDR`, `ublk:/dev/ublkbN`, or
    /// nothing (not served).
    served: Vec<String>,
    devices: Vec<String>,
    block_bytes: Option<u32>,
    policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    volumes: Vec<Row>,
}

#[derive(Serialize)]
struct ListJson<'a> {
    schema_version: u32,
    caches: &'a [Row],
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let units = Units::parse(&a.units)?;
    let fields = fields(&a.options)?;
    let sort = sort_keys(&a.sort)?;
    let mut rows: Vec<Row> = Vec::new();
    for entry in reg.list()? {
        rows.push(cache_row(reg, &entry));
    }
    sort_rows(&mut rows, &sort);
    if a.json {
        let json = ListJson {
            schema_version: SCHEMA_VERSION,
            caches: &rows,
        };
        outln!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let mut lines: Vec<Vec<String>> = Vec::new();
    if !a.noheadings {
        lines.push(fields.iter().map(|f| f.heading(units)).collect());
    }
    for row in &rows {
        lines.push(fields.iter().map(|f| f.value(row, units)).collect());
        for v in &row.volumes {
            lines.push(fields.iter().map(|f| f.value(v, units)).collect());
        }
    }
    out!("{}", render(&lines, a.separator.as_deref()));
    Ok(())
}

/// The cache's row, its volumes under it; a cache that cannot be read is
/// a row with its state and error.
fn cache_row(reg: &Registry, entry: &Entry) -> Row {
    let looked = Opened::open_read_only(reg, Some(&entry.name)).and_then(|opened| {
        let got = opened.target.status_and_frontends()?;
        opened.finish()?;
        Ok(got)
    });
    match looked {
        Ok((status, frontends)) => rows_of(entry, &status, frontends.as_ref()),
        Err(e) => {
            let class = super::exit::class_of(&e);
            let line = super::error_line(&e);
            // The open's own context names the cache already, mostly.
            let named = format!("cache '{}'", entry.name);
            match line.starts_with(&named) {
                true => eprintln!("tiercache: warning: {line}"),
                false => eprintln!("tiercache: warning: {named}: {line}"),
            }
            let state = match class {
                tiercache::daemon::class::Class::Busy => "busy",
                _ => "unavailable",
            };
            Row {
                name: entry.name.clone(),
                kind: "cache",
                mode: "-".into(),
                state: state.into(),
                size_bytes: None,
                used_bytes: None,
                used_percent: None,
                dirty_bytes: None,
                dirty_percent: None,
                hit_percent: None,
                served: Vec::new(),
                devices: entry.cache_paths(),
                block_bytes: None,
                policy: None,
                error: Some(line),
                volumes: Vec::new(),
            }
        }
    }
}

fn rows_of(entry: &Entry, s: &Status, f: Option<&Frontends>) -> Row {
    let bs = u64::from(s.block_bytes);
    let total = s.cache_blocks_total;
    let pct = |part: u64| percent_of(part, total);
    let mut state = Vec::new();
    match s.cache_set_state.as_deref() {
        Some("degraded") => state.push("degraded"),
        Some("rebuilding") => state.push("rebuilding"),
        _ => {}
    }
    if s.stale_blocks > 0 {
        state.push("stale");
    }
    if !s.admitting {
        state.push("no-admit");
    }
    let volumes = (s.volumes.iter().enumerate())
        .map(|(v, vs)| Row {
            name: format!("{}/{}", entry.name, vs.name),
            kind: "volume",
            mode: vs.mode.name().into(),
            state: match vs.stale_blocks {
                0 => "ok".into(),
                _ => "stale".into(),
            },
            size_bytes: Some(vs.bytes),
            used_bytes: Some(vs.cache_blocks_used * bs),
            used_percent: pct(vs.cache_blocks_used),
            dirty_bytes: Some(vs.cache_blocks_dirty * bs),
            dirty_percent: pct(vs.cache_blocks_dirty),
            hit_percent: hit_percent(vs.read_hits, vs.read_misses),
            served: f.map_or_else(Vec::new, |f| served_volume(f, v, &vs.name)),
            devices: vec![vs.origin.clone()],
            block_bytes: Some(s.block_bytes),
            policy: None,
            error: None,
            volumes: Vec::new(),
        })
        .collect();
    Row {
        name: entry.name.clone(),
        kind: "cache",
        mode: s.mode.name().into(),
        state: if state.is_empty() {
            "ok".into()
        } else {
            state.join(",")
        },
        size_bytes: Some(total * bs),
        used_bytes: Some(s.cache_blocks_used * bs),
        used_percent: pct(s.cache_blocks_used),
        dirty_bytes: Some(s.cache_blocks_dirty * bs),
        dirty_percent: pct(s.cache_blocks_dirty),
        hit_percent: hit_percent(s.stats.read_hits, s.stats.read_misses),
        served: f.map_or_else(Vec::new, served_cache),
        devices: entry.cache_paths(),
        block_bytes: Some(s.block_bytes),
        policy: Some(s.policy.clone()),
        error: None,
        volumes,
    }
}

/// Where a daemon serves the cache: its sockets.
fn served_cache(f: &Frontends) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = &f.nbd_socket {
        out.push(format!("nbd:{s}"));
    }
    if let Some(a) = &f.nbd_tcp {
        out.push(format!("tcp:{a}"));
    }
    if out.is_empty() && (f.ublk_device.is_some() || !f.ublk_devices.is_empty()) {
        out.push("ublk".into());
    }
    out
}

/// What serves volume `v` (named `name`): its ublk device, or its NBD
/// export.
fn served_volume(f: &Frontends, v: usize, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    match (f.ublk_devices.get(v), &f.ublk_device) {
        (Some(d), _) => out.push(format!("ublk:{d}")),
        (None, Some(d)) if v == 0 => out.push(format!("ublk:{d}")),
        _ => {}
    }
    if f.nbd_socket.is_some() || f.nbd_tcp.is_some() {
        match v {
            0 => out.push(format!("export:{name} (and the empty name)")),
            _ => out.push(format!("export:{name}")),
        }
    }
    out
}

/// Units of sizes in the table.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Units {
    Human,
    Bytes,
    /// A power of 1024 and its name.
    Scaled(u32, &'static str),
}

impl Units {
    fn parse(s: &str) -> Result<Units> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "h" => Units::Human,
            "b" => Units::Bytes,
            "k" => Units::Scaled(1, "KiB"),
            "m" => Units::Scaled(2, "MiB"),
            "g" => Units::Scaled(3, "GiB"),
            "t" => Units::Scaled(4, "TiB"),
            _ => fail!(Usage, "--units takes h, b, k, m, g or t, not '{s}'"),
        })
    }

    fn show(self, bytes: Option<u64>) -> String {
        let Some(n) = bytes else {
            return "-".into();
        };
        match self {
            Units::Human => human_bytes(n),
            Units::Bytes => n.to_string(),
            Units::Scaled(p, _) => format!("{:.2}", n as f64 / 1024f64.powi(p as i32)),
        }
    }
}

/// A field of the table.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Field {
    Name,
    Type,
    Mode,
    State,
    Size,
    Used,
    UsedPct,
    Dirty,
    DirtyPct,
    HitPct,
    Served,
    Devices,
    Block,
    Policy,
}

const FIELDS: [(&str, Field); 14] = [
    ("name", Field::Name),
    ("type", Field::Type),
    ("mode", Field::Mode),
    ("state", Field::State),
    ("size", Field::Size),
    ("used", Field::Used),
    ("used%", Field::UsedPct),
    ("dirty", Field::Dirty),
    ("dirty%", Field::DirtyPct),
    ("hit%", Field::HitPct),
    ("served", Field::Served),
    ("devices", Field::Devices),
    ("block", Field::Block),
    ("policy", Field::Policy),
];

impl Field {
    fn parse(s: &str) -> Result<Field> {
        let s = s.trim().to_ascii_lowercase();
        (FIELDS.iter().find(|(n, _)| *n == s))
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                let names: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
                classed!(Usage, "unknown field '{s}' (fields: {})", names.join(", "))
            })
    }

    fn name(self) -> &'static str {
        FIELDS
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("?", |(n, _)| n)
    }

    fn is_size(self) -> bool {
        matches!(self, Field::Size | Field::Used | Field::Dirty)
    }

    fn heading(self, units: Units) -> String {
        let name = self.name().to_ascii_uppercase();
        match (self.is_size(), units) {
            (true, Units::Bytes) => format!("{name}(B)"),
            (true, Units::Scaled(_, u)) => format!("{name}({u})"),
            _ => name,
        }
    }

    fn value(self, r: &Row, units: Units) -> String {
        let pct = |p: Option<f64>| p.map_or("-".into(), |p| format!("{p:.1}"));
        let list = |l: &[String]| match l.is_empty() {
            true => "-".to_string(),
            false => l.join(","),
        };
        match self {
            Field::Name => r.name.clone(),
            Field::Type => r.kind.into(),
            Field::Mode => r.mode.clone(),
            Field::State => r.state.clone(),
            Field::Size => units.show(r.size_bytes),
            Field::Used => units.show(r.used_bytes),
            Field::UsedPct => pct(r.used_percent),
            Field::Dirty => units.show(r.dirty_bytes),
            Field::DirtyPct => pct(r.dirty_percent),
            Field::HitPct => pct(r.hit_percent),
            Field::Served => list(&r.served),
            Field::Devices => list(&r.devices),
            Field::Block => r.block_bytes.map_or("-".into(), |b| human_bytes(b.into())),
            Field::Policy => r.policy.clone().unwrap_or_else(|| "-".into()),
        }
    }

    /// The sort key of `r` for this field: numbers by value, the rest as
    /// text.
    fn key(self, r: &Row) -> Key {
        let num = |v: Option<f64>| Key::Num(v.unwrap_or(-1.0));
        match self {
            Field::Size => num(r.size_bytes.map(|b| b as f64)),
            Field::Used => num(r.used_bytes.map(|b| b as f64)),
            Field::Dirty => num(r.dirty_bytes.map(|b| b as f64)),
            Field::UsedPct => num(r.used_percent),
            Field::DirtyPct => num(r.dirty_percent),
            Field::HitPct => num(r.hit_percent),
            Field::Block => num(r.block_bytes.map(f64::from)),
            f => Key::Text(f.value(r, Units::Bytes)),
        }
    }
}

#[derive(PartialEq, PartialOrd)]
enum Key {
    Num(f64),
    Text(String),
}

/// `-o`: the fields, or the defaults and more (`+a,b`).
fn fields(spec: &str) -> Result<Vec<Field>> {
    let (base, more) = match spec.strip_prefix('+') {
        Some(more) => (DEFAULT_FIELDS, more),
        None => (spec, ""),
    };
    let all = base.split(',').chain(more.split(','));
    all.filter(|s| !s.trim().is_empty())
        .map(Field::parse)
        .collect()
}

/// `-O`: (field, descending).
fn sort_keys(spec: &str) -> Result<Vec<(Field, bool)>> {
    (spec.split(',').filter(|s| !s.trim().is_empty()))
        .map(|s| {
            let s = s.trim();
            match s.strip_prefix('-') {
                Some(f) => Ok((Field::parse(f)?, true)),
                None => Ok((Field::parse(s.strip_prefix('+').unwrap_or(s))?, false)),
            }
        })
        .collect()
}

fn sort_rows(rows: &mut [Row], keys: &[(Field, bool)]) {
    let order = |a: &Row, b: &Row| {
        for (f, desc) in keys {
            let o = f
                .key(a)
                .partial_cmp(&f.key(b))
                .unwrap_or(std::cmp::Ordering::Equal);
            let o = if *desc { o.reverse() } else { o };
            if o != std::cmp::Ordering::Equal {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    };
    rows.sort_by(order);
    for r in rows.iter_mut() {
        r.volumes.sort_by(order);
    }
}

/// The lines, each field joined by `separator`, or aligned in columns
/// (two spaces apart) without one.
fn render(lines: &[Vec<String>], separator: Option<&str>) -> String {
    if let Some(sep) = separator {
        return lines.iter().map(|l| l.join(sep) + "\n").collect();
    }
    let cols = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in lines {
        let cells: Vec<String> = (l.iter().zip(&widths))
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Blocks read from the cache over blocks read, in percent (none before
/// the first read).
fn hit_percent(hits: u64, misses: u64) -> Option<f64> {
    percent_of(hits, hits + misses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_sort_keys_parse() {
        assert_eq!(fields("name,size").unwrap(), vec![Field::Name, Field::Size]);
        let more = fields("+block").unwrap();
        assert_eq!(more.last(), Some(&Field::Block));
        assert_eq!(more.len(), DEFAULT_FIELDS.split(',').count() + 1);
        assert!(fields("name,colour").is_err());
        assert_eq!(
            sort_keys("-dirty%,name").unwrap(),
            vec![(Field::DirtyPct, true), (Field::Name, false)]
        );
        assert!(Units::parse("x").is_err());
        assert_eq!(Units::Scaled(3, "GiB").show(Some(3 << 29)), "1.50");
        assert_eq!(Units::Bytes.show(None), "-");
    }

    #[test]
    fn columns_align_and_separators_join() {
        let lines = vec![
            vec!["NAME".to_string(), "SIZE".to_string()],
            vec!["a-long-name".to_string(), "1".to_string()],
        ];
        assert_eq!(render(&lines, None), "NAME         SIZE\na-long-name  1\n");
        assert_eq!(render(&lines, Some(";")), "NAME;SIZE\na-long-name;1\n");
    }
}
