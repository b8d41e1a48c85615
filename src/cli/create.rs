//! `tiercache create`: format a cache device for an origin and register it.
//!
//! Everything that can be checked is checked before the first byte is
//! written: a refused create leaves both devices and the registry as they
//! were. Each device is claimed for this process before it is looked at
//! (device/claim.rs), so no daemon can be serving it while it is formatted.
//!
//! Three flags, three consents: `--force` replaces a registered cache of
//! the same name; `--wipe` formats cache devices that hold something (a
//! filesystem, a partition table, another cache: device/probe.rs);
//! `--lose-dirty-data` accepts losing the dirty blocks of the cache being
//! replaced or wiped, which would leave its origin stale.

use anyhow::{Context, Result};
use tiercache::device::probe::{erase, probe_device, Signature, TIERCACHE_CACHE};
use tiercache::device::{open_device, DeviceRef};
use tiercache::engine::format::Layout;
use tiercache::engine::{CreateOptions, Engine, Placement, WritebackSettings};

use super::exit::{classed, fail};
use super::registry::{self, Entry, Registry};
use super::units::{
    check_writeback, human_bytes, parse_block_size, parse_mode, parse_placement, parse_policy,
    parse_writeback_order,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The slow device to cache (file or block device); never written by
    /// create. Give it several times for one cache in front of several
    /// origins: each is a volume, served under its own name.
    #[arg(long, required = true)]
    origin: Vec<String>,
    /// The volumes' names, one per --origin in order (default vol0, vol1,
    /// ...): NBD export names (the empty name is the first volume).
    #[arg(long, value_name = "NAME")]
    volume: Vec<String>,
    /// The fast device that will hold the cache (its contents are
    /// replaced). Give it two or more times for a cache set: metadata and
    /// dirty data on two devices (surviving the loss of either), clean
    /// data on all of them.
    #[arg(long, required = true)]
    cache: Vec<String>,
    /// With several cache devices: the percentage of the first two
    /// devices' space that holds mirrored (dirty-capable) blocks; the rest
    /// of every device holds clean blocks only.
    #[arg(long, value_name = "PCT", default_value_t = 50)]
    mirror_share: u32,
    /// Name to register the cache under.
    #[arg(long, default_value = registry::DEFAULT_NAME)]
    name: String,
    /// writeback, writethrough, writearound, writeonly or passthrough.
    #[arg(long, default_value = "writeback")]
    mode: String,
    /// Cache block size: a power of two from 4K to 1M (4096, 4K, 64KiB, ...).
    #[arg(long, default_value = "4K")]
    block_size: String,
    /// Replacement policy: s3fifo (scan resistant), lru or fifo.
    #[arg(long, default_value = "s3fifo")]
    policy: String,
    /// Where new data goes on the cache device: log (in order through
    /// 1 MiB segments, reclaimed and discarded whole, whatever the
    /// client's offsets; writes that queue together go down as one) or
    /// in-place (any free slot; overwrites in place) [default: log].
    #[arg(long, value_name = "PLACEMENT")]
    placement: Option<String>,
    /// The order dirty data reaches the origin in: flush (the writes
    /// between two client flushes go as one group, group after group, so a
    /// lost cache leaves the origin as a crash of a real disk could) or
    /// address (cheapest order). Address is the default for every origin,
    /// rbd:// and nbd:// included: flush order writes every version a
    /// client flush separates, many more origin writes when clients flush
    /// often (docs/engine.md, "Ordered writeback").
    #[arg(long, value_name = "ORDER", default_value = "address")]
    writeback_order: String,
    /// Start background writeback above this percentage of dirty blocks [default: 50].
    #[arg(long, value_name = "PCT")]
    writeback_high: Option<u32>,
    /// Stop background writeback at this percentage [default: 25].
    #[arg(long, value_name = "PCT")]
    writeback_low: Option<u32>,
    /// Write back any block dirty for longer than this [default: 30]. Also
    /// --max-dirty-age: it bounds how stale the origin can be left if a
    /// single cache device is lost with its dirty data.
    #[arg(long, value_name = "SECS", visible_alias = "max-dirty-age")]
    writeback_age: Option<u32>,
    /// Write back everything once the origin has been idle this long
    /// (0: never) [default: 2].
    #[arg(long, value_name = "SECS")]
    writeback_idle: Option<u32>,
    /// Stop admitting new blocks after this many cache device errors
    /// (0: never); cached blocks are still served and written back.
    #[arg(long, value_name = "N", default_value_t = tiercache::engine::DEFAULT_CACHE_ERROR_LIMIT)]
    cache_error_limit: u64,
    /// Replace a registered cache of the same name. Its devices are
    /// formatted only if given again (then with --wipe), and a cache that
    /// holds dirty data is replaced only with --lose-dirty-data.
    #[arg(long)]
    force: bool,
    /// Format cache devices that hold something: a filesystem (ext2/3/4,
    /// XFS, btrfs, FAT, NTFS), swap, a partition table (MBR, GPT), LVM, md
    /// RAID, LUKS, bcache, or a tiercache cache or cache-set member.
    /// Without it, create says what it found and changes nothing.
    #[arg(long)]
    wipe: bool,
    /// Replace (--force) or wipe (--wipe) a cache that holds dirty data:
    /// blocks not yet written back, which are lost, leaving its origin
    /// stale. To keep them, run `tiercache flush` or `tiercache detach`
    /// on that cache first.
    #[arg(long)]
    lose_dirty_data: bool,
    /// Accept losing dirty data on a volatile cache device.
    #[arg(long)]
    allow_data_loss: bool,
    #[command(flatten)]
    admission: super::set_admission::AdmissionArgs,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let (opts, origin_paths, cache_paths) = checked_options(a)?;
    let names = volume_names(a)?;
    reg.prepare()?;
    let _lock = reg.lock(&a.name)?;
    if let Some(old) = check_registry(reg, a, &origin_paths, &cache_paths)? {
        refuse_losing_dirty_data(reg, a, &old)?;
    }
    let (origins, cache, layout) = open_devices(&origin_paths, &cache_paths, a, &opts)?;
    // Format (the engine refuses a device holding a cache unless told to
    // wipe it), shut down cleanly, register.
    let named = names.into_iter().zip(origins).collect();
    let engine = Engine::create_volumes(cache, named, &opts, &Default::default())
        .context("creating the cache")?;
    let volumes = engine.volumes();
    // Found again by its name if the registry is lost (scan, import).
    engine
        .record_name(&a.name)
        .context("recording the name on the cache device")?;
    remove_old_crash_log(reg, &a.name)?;
    let status = engine.status();
    engine.close().context("closing the new cache")?;
    let entry = Entry::new(&a.name, &origin_paths, &cache_paths);
    reg.add(&entry).with_context(|| {
        format!(
            "the cache on {} was created but could not be registered",
            entry.cache
        )
    })?;
    outln!(
        "created cache '{}': {} cached on {}",
        entry.name,
        entry.origin_paths().join(", "),
        entry.cache_paths().join(" + ")
    );
    if volumes.len() > 1 {
        for ((name, _, bytes), origin) in volumes.iter().zip(entry.origin_paths()) {
            outln!("  volume {name}: {origin} ({})", human_bytes(*bytes));
        }
    }
    if let Some(set) = engine_set_summary(&status) {
        outln!("  {set}");
    }
    outln!(
        "  mode {}, policy {}, placement {}, writeback order {}, block size {}, {} cache blocks ({}), volume {}",
        opts.mode.name(),
        opts.policy.name(),
        opts.placement.name(),
        opts.writeback_order.name(),
        human_bytes(opts.block_bytes.into()),
        layout.slot_count,
        human_bytes(layout.slot_count * u64::from(opts.block_bytes)),
        human_bytes(volumes.iter().map(|v| v.2).sum())
    );
    Ok(())
}

/// A crash log left by an earlier cache of this name (a daemon killed,
/// then the cache recreated with --force) must never meet the new one.
/// Nor may its stale map name the old cache's ranges as the new one's.
fn remove_old_crash_log(reg: &Registry, name: &str) -> Result<()> {
    for (what, path) in [
        ("crash log", reg.crash_log_path(name)),
        ("stale map", reg.stale_map_path(name)),
    ] {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                anyhow::bail!("removing the old {what} {}: {e}", path.display())
            }
            _ => {}
        }
    }
    Ok(())
}

/// What a cache set's members hold, for the create message.
fn engine_set_summary(status: &tiercache::engine::Status) -> Option<String> {
    let m = &status.cache_members;
    if m.is_empty() {
        return None;
    }
    Some(format!(
        "cache set of {} devices: {} mirrored blocks (dirty data, two copies), {} clean-only blocks ({})",
        m.len(),
        m[0].mirror_slots,
        m.iter().map(|x| x.own_slots).sum::<u64>(),
        m.iter()
            .map(|x| format!("{}: {}", x.device, x.own_slots))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The volumes' names: `--volume` once per `--origin`, or the defaults;
/// checked as the engine will (here, before any device is wiped).
fn volume_names(a: &Args) -> Result<Vec<String>> {
    use tiercache::engine::format::volumes::{default_name, names_valid};
    let names = if a.volume.is_empty() {
        (0..a.origin.len()).map(default_name).collect()
    } else if a.volume.len() == a.origin.len() {
        a.volume.clone()
    } else {
        fail!(Usage,
            "{} --volume names for {} --origin devices: name every volume, in the order of the origins, or none",
            a.volume.len(),
            a.origin.len()
        );
    };
    names_valid(&names).map_err(|e| classed!(Usage, "{e}"))?;
    Ok(names)
}

/// The arguments, checked: the cache's options and the devices' absolute
/// paths (not RAM devices, no file twice).
fn checked_options(a: &Args) -> Result<(CreateOptions, Vec<String>, Vec<String>)> {
    registry::validate_name(&a.name)?;
    let defaults = WritebackSettings::default();
    let writeback = WritebackSettings {
        high_pct: a.writeback_high.unwrap_or(defaults.high_pct),
        low_pct: a.writeback_low.unwrap_or(defaults.low_pct),
        max_age_secs: a.writeback_age.unwrap_or(defaults.max_age_secs),
        idle_secs: a.writeback_idle.unwrap_or(defaults.idle_secs),
    };
    check_writeback(&writeback)?;
    let writeback_order = parse_writeback_order(&a.writeback_order)?;
    let opts = CreateOptions {
        mode: parse_mode(&a.mode)?,
        block_bytes: parse_block_size(&a.block_size)?,
        policy: parse_policy(&a.policy)?,
        placement: match &a.placement {
            Some(p) => parse_placement(p)?,
            None => Placement::Log,
        },
        writeback_order,
        writeback,
        admission: a.admission.apply(Default::default())?,
        // The devices were probed (`refuse_signatures`): what the engine
        // would refuse, a device holding a cache, is known to be wanted.
        force: a.wipe,
        allow_data_loss: a.allow_data_loss,
        cache_error_limit: a.cache_error_limit,
    };
    let specs = a.cache.iter().map(|c| ("cache", c));
    for (role, spec) in specs.chain(a.origin.iter().map(|o| ("origin", o))) {
        if spec.starts_with("ram:") {
            fail!(Usage,
                "{role} device '{spec}' is volatile: a RAM device does not outlive this command; RAM devices are for `tiercache serve`"
            );
        }
    }
    if a.cache.len() > tiercache::device::set::MAX_MEMBERS {
        fail!(
            Usage,
            "{} cache devices given; a cache set has at most {}",
            a.cache.len(),
            tiercache::device::set::MAX_MEMBERS
        );
    }
    let mut origin_paths: Vec<String> = Vec::new();
    for o in &a.origin {
        let p = registry::absolute(o)?;
        if let Some(q) = origin_paths.iter().find(|q| registry::same_file(q, &p)) {
            fail!(Usage, "origin {p} is given twice (as {q})");
        }
        origin_paths.push(p);
    }
    let mut cache_paths: Vec<String> = Vec::new();
    for c in &a.cache {
        let p = registry::absolute(c)?;
        if let Some(o) = origin_paths.iter().find(|o| registry::same_file(o, &p)) {
            fail!(Usage, "origin and cache are the same device ({o})");
        }
        if let Some(q) = cache_paths.iter().find(|q| registry::same_file(q, &p)) {
            fail!(Usage, "cache device {p} is given twice (as {q})");
        }
        cache_paths.push(p);
    }
    Ok((opts, origin_paths, cache_paths))
}

/// The name is free (or `--force` replaces it) and neither device belongs
/// to another registered cache. The caller holds the name's lock. Returns
/// the registered cache `--force` replaces.
fn check_registry(
    reg: &Registry,
    a: &Args,
    origin_paths: &[String],
    cache_paths: &[String],
) -> Result<Option<Entry>> {
    let old = reg.get(&a.name)?;
    if let Some(old) = &old {
        if !a.force {
            fail!(Refused,
                "a cache named '{}' is already registered (origin {}, cache {}); choose another --name, or pass --force to replace it",
                old.name,
                old.origin,
                old.cache
            );
        }
    }
    for other in reg.list()?.iter().filter(|e| e.name != a.name) {
        let caches = cache_paths.iter().map(|c| ("cache", c.as_str()));
        let origins = origin_paths.iter().map(|o| ("origin", o.as_str()));
        for (role, path) in caches.chain(origins) {
            if other.uses(path) {
                fail!(
                    Refused,
                    "{role} device {path} is already used by cache '{}'; detach that cache first",
                    other.name
                );
            }
        }
    }
    Ok(old)
}

/// `--force` replaces the registered cache `old`: refused if it holds
/// dirty data, unless `--lose-dirty-data`. Its dirty blocks are counted
/// as the next open would find them (journal and crash log applied), by
/// a read-only open that writes nothing and lets go of the devices before
/// they are claimed to be formatted.
fn refuse_losing_dirty_data(reg: &Registry, a: &Args, old: &Entry) -> Result<()> {
    if a.lose_dirty_data {
        return Ok(());
    }
    let dirty = match super::target::open_engine_read_only(reg, old) {
        Ok(engine) => engine.status(),
        // Served or changed by another process: no flag makes that right.
        Err(e) if super::claims::in_use(&e) => {
            return Err(e.context(format!(
                "cache '{}' cannot be replaced while it is in use",
                old.name
            )))
        }
        Err(e) => {
            return Err(e.context(format!(
                "cannot tell whether cache '{}' holds dirty data; pass --lose-dirty-data to \
                 replace it anyway",
                old.name
            )))
        }
    };
    if dirty.cache_blocks_dirty == 0 {
        return Ok(());
    }
    fail!(
        Refused,
        "cache '{}' holds {} dirty blocks ({}) not yet written back to its origin {}: \
         replacing it would lose them and leave the origin stale; run `tiercache flush --name {}` \
         (or `tiercache detach --name {}`) first, or pass --lose-dirty-data to accept the loss",
        old.name,
        dirty.cache_blocks_dirty,
        human_bytes(dirty.cache_blocks_dirty * u64::from(dirty.block_bytes)),
        old.origin_paths().join(", "),
        old.name,
        old.name
    )
}

/// The devices open and claimed, none the same as another, the cache
/// devices holding nothing that is not to be wiped, and their sizes fit a
/// cache; several cache devices become a cache set (formatted here: the
/// engine formats the set as one device next).
fn open_devices(
    origin_paths: &[String],
    cache_paths: &[String],
    a: &Args,
    opts: &CreateOptions,
) -> Result<(Vec<DeviceRef>, DeviceRef, Layout)> {
    let block_bytes = opts.block_bytes;
    let origins = open_origins(origin_paths, block_bytes)?;
    let mut caches = Vec::with_capacity(cache_paths.len());
    for p in cache_paths {
        let cache = open_device(p).with_context(|| format!("cache {p}"))?;
        let same = |o: &&DeviceRef| o.identity() != 0 && o.identity() == cache.identity();
        if let Some(o) = origins.iter().find(same) {
            fail!(
                Usage,
                "origin {} and cache {p} are the same device",
                o.name()
            );
        }
        let found = refuse_signatures(&cache, a)?;
        caches.push((cache, found));
    }
    // The sizes fit a cache, before anything is erased.
    let bytes: Vec<u64> = caches.iter().map(|(c, _)| c.size_bytes()).collect();
    match bytes.as_slice() {
        [one] => Layout::compute(*one, block_bytes).map(|_| ()),
        more => Layout::set_geometry(more, block_bytes, a.mirror_share).map(|_| ()),
    }
    .map_err(|e| classed!(Usage, "{e}"))
    .context("cache")?;
    let mut caches = erase_signatures(caches)?;
    let cache = if caches.len() == 1 {
        caches.remove(0)
    } else {
        tiercache::engine::recovery::make_cache_set(caches, block_bytes, a.mirror_share, a.wipe)
            .context("making the cache set")?
    };
    let layout = Layout::compute(cache.size_bytes(), block_bytes)
        .map_err(|e| classed!(Usage, "{e}"))
        .with_context(|| format!("cache {}", cache.name()))?;
    Ok((origins, cache, layout))
}

/// The origins open and claimed, each holding at least one cache block, no
/// device twice (by identity: two paths to one disk).
fn open_origins(paths: &[String], block_bytes: u32) -> Result<Vec<DeviceRef>> {
    let mut origins: Vec<DeviceRef> = Vec::with_capacity(paths.len());
    let context = |p: &str| match paths.len() {
        1 => "origin".to_string(),
        _ => format!("origin {p}"),
    };
    for p in paths {
        let origin = open_device(p).with_context(|| context(p))?;
        if origin.size_bytes() < u64::from(block_bytes) {
            fail!(
                Usage,
                "origin {p} ({}) is smaller than one cache block ({})",
                human_bytes(origin.size_bytes()),
                human_bytes(block_bytes.into())
            );
        }
        let same = |o: &&DeviceRef| o.identity() != 0 && o.identity() == origin.identity();
        if let Some(o) = origins.iter().find(same) {
            fail!(Usage, "origins {} and {p} are the same device", o.name());
        }
        origins.push(origin);
    }
    Ok(origins)
}

/// Everything is checked: what `--wipe` was given for goes, all of it.
fn erase_signatures(caches: Vec<(DeviceRef, Vec<Signature>)>) -> Result<Vec<DeviceRef>> {
    caches
        .into_iter()
        .map(|(cache, found)| {
            if !found.is_empty() {
                let names: Vec<&str> = found.iter().map(|s| s.what.as_str()).collect();
                log::warn!("{}: wiping {}", cache.name(), names.join(", "));
                erase(cache.as_ref(), &found)
                    .with_context(|| format!("wiping {}", cache.name()))?;
            }
            Ok(cache)
        })
        .collect()
}

/// A cache device that holds something (device/probe.rs) is formatted only
/// with `--wipe`; a tiercache cache with dirty blocks also needs
/// `--lose-dirty-data`. Returns what is to be erased.
fn refuse_signatures(cache: &DeviceRef, a: &Args) -> Result<Vec<Signature>> {
    let found =
        probe_device(cache.as_ref()).with_context(|| format!("reading {}", cache.name()))?;
    if found.is_empty() {
        return Ok(found);
    }
    // What `check` finds of a tiercache cache: its mode and dirty blocks.
    let ours = found
        .iter()
        .any(|s| s.what == TIERCACHE_CACHE)
        .then(|| tiercache::engine::recovery::check(cache, None))
        .filter(|r| r.mode.is_some());
    let what: Vec<String> = found
        .iter()
        .map(|s| match &ours {
            Some(r) if s.what == TIERCACHE_CACHE => format!(
                "{} (mode {}, {} dirty blocks; signature at byte {})",
                s.what,
                r.mode.as_deref().unwrap_or("?"),
                r.cache_blocks_dirty,
                s.offset
            ),
            _ => s.to_string(),
        })
        .collect();
    if !a.wipe {
        fail!(
            Refused,
            "cache device {} already holds {}; create would destroy it: pass --wipe to format \
             it anyway",
            cache.name(),
            what.join(" and ")
        );
    }
    let dirty = ours.map_or(0, |r| r.cache_blocks_dirty);
    if dirty > 0 && !a.lose_dirty_data {
        fail!(
            Refused,
            "cache device {} holds a tiercache cache with {dirty} dirty blocks not yet written \
             back to its origin: wiping it would lose them; flush or detach that cache first, or \
             pass --lose-dirty-data to accept the loss",
            cache.name()
        );
    }
    Ok(found)
}
