//! Formatting a cache device, opening it (validation and journal replay),
//! dissolving it on detach, and the offline metadata check.

use std::sync::atomic::AtomicBool;

use super::origin::address::KeySpace;
use super::origin::{checks, Origins};
use super::table::lock::MetaLock;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros};

use super::clock::Clock;
use super::crash_log::{self, CrashLog, LogImage, Pending};
use super::format::{
    block_bytes_valid, checkpoint_page, decode_entries, decode_maps, parse_checkpoint_page,
    parse_journal_page, sectors_per_block, whole_sets, CheckpointData, CheckpointHeader, Layout,
    ParsedJournalPage, Superblock, VolumeEntry, ENTRIES_PER_CHECKPOINT_PAGE, FORMAT_VERSION,
    JOURNAL_OFFSET, MAX_BLOCK_BYTES, MIN_BLOCK_BYTES, PAGE_BYTES, SB_FLAG_ALLOW_VOLATILE_WRITEBACK,
    SB_FLAG_DISTRUST_CLEAN, SB_FLAG_FLUSH_ORDER, SB_FLAG_LOG_PLACEMENT, SEGMENT_BYTES,
    SUPERBLOCK_MAGIC,
};
use super::policy::PolicyKind;
use super::sectors::SectorSet;
use super::stats::Stats;
use super::table::groups::Groups;
use super::table::map::Table;
use super::table::segments::Geometry;
use super::{
    CreateOptions, Engine, EngineError, EngineResult, Meta, Mode, OpenOptions, Placement,
    WritebackOrder,
};
use crate::device::{AlignedBuf, DeviceRef};

/// Bytes of journal read per request during replay and checks.
const JOURNAL_READ_BYTES: u64 = 1 << 20;

pub(crate) fn check_block_bytes(block_bytes: u32) -> EngineResult<()> {
    if !block_bytes_valid(block_bytes as u64) {
        return Err(EngineError::Config(format!(
            "block size {block_bytes} is invalid: it must be a power of two from {MIN_BLOCK_BYTES} to {MAX_BLOCK_BYTES} bytes"
        )));
    }
    Ok(())
}

fn read_page(dev: &DeviceRef, offset: u64) -> EngineResult<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(PAGE_BYTES as usize);
    dev.read_at(&mut buf, offset)?;
    Ok(buf)
}

/// Both superblock copies, parsed (or why not).
pub(crate) fn read_superblocks(cache: &DeviceRef) -> EngineResult<[Result<Superblock, String>; 2]> {
    if cache.size_bytes() < 2 * PAGE_BYTES {
        return Ok([
            Err("device too small".into()),
            Err("device too small".into()),
        ]);
    }
    Ok([
        Superblock::parse(&read_page(cache, 0)?),
        Superblock::parse(&read_page(cache, PAGE_BYTES)?),
    ])
}

/// The current superblock: the valid copy with the highest generation.
/// The volumes the cache's current superblock records (volume 0 first).
pub fn recorded_volumes(cache: &DeviceRef) -> EngineResult<Vec<super::format::VolumeEntry>> {
    Ok(current_superblock(cache)?.without_removed().0.volume_list())
}

/// The registered name the cache on `cache` records (`scan`, `import`).
pub fn recorded_name(cache: &DeviceRef) -> EngineResult<Option<String>> {
    Ok(current_superblock(cache)?.name())
}

pub(crate) fn current_superblock(cache: &DeviceRef) -> EngineResult<Superblock> {
    let [a, b] = read_superblocks(cache)?;
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if a.generation.get() >= b.generation.get() {
            a
        } else {
            b
        }),
        (Ok(s), Err(e)) | (Err(e), Ok(s)) => {
            log::warn!(
                "{}: one superblock copy is invalid ({e}); using the other",
                cache.name()
            );
            Ok(s)
        }
        (Err(a), Err(b)) => Err(EngineError::NotACache {
            device: cache.name().into(),
            reason: if a == b {
                a
            } else {
                format!("copy 0: {a}; copy 1: {b}")
            },
        }),
    }
}

/// Formats `cache` for `origins` (volume `i`: `origins[i]`, with its
/// name).
pub(crate) fn format_cache(
    cache: &DeviceRef,
    origins: &[(String, DeviceRef)],
    opts: &CreateOptions,
    clock: &Clock,
) -> EngineResult<()> {
    check_create_options(cache, opts)?;
    let volumes = checks::new_volumes(origins, opts.block_bytes)?;
    let layout =
        Layout::compute(cache.size_bytes(), opts.block_bytes).map_err(EngineError::Config)?;
    if !opts.force {
        refuse_existing_cache(cache)?;
    }
    write_empty_metadata(cache, &layout)?;
    // 4. The superblock, both copies (generations 1 and 2).
    let mut sb = new_superblock(cache, &volumes, opts, &layout);
    sb.created_unix_secs = U64::new(clock.unix_secs());
    for generation in [1u64, 2] {
        sb.generation = U64::new(generation);
        sb.seal();
        cache.write_at(
            &AlignedBuf::from_slice(&sb.to_page()),
            (generation % 2) * PAGE_BYTES,
        )?;
    }
    cache.flush()?;
    Ok(())
}

/// The options a new cache is created with, against its devices.
fn check_create_options(cache: &DeviceRef, opts: &CreateOptions) -> EngineResult<()> {
    check_block_bytes(opts.block_bytes)?;
    if opts.mode.holds_dirty() && cache.is_volatile() && !opts.allow_data_loss {
        return Err(EngineError::VolatileWriteback {
            device: cache.name().into(),
            mode: opts.mode.name().into(),
        });
    }
    opts.writeback.validate().map_err(EngineError::Config)?;
    opts.admission.validate().map_err(EngineError::Config)?;
    Ok(())
}

/// Makes a cache set of `devs` (member i = `devs[i]`) for caches of
/// `block_bytes` blocks, `mirror_pct` percent of members 0 and 1 mirrored
/// (see `Layout::set_geometry`). Devices that hold a cache or a set
/// member are taken only with `force`. The set is then formatted as one
/// cache device (`Engine::create`).
pub fn make_cache_set(
    devs: Vec<DeviceRef>,
    block_bytes: u32,
    mirror_pct: u32,
    force: bool,
) -> EngineResult<DeviceRef> {
    let bytes: Vec<u64> = devs.iter().map(|d| d.size_bytes()).collect();
    let geometry =
        Layout::set_geometry(&bytes, block_bytes, mirror_pct).map_err(EngineError::Config)?;
    for d in &devs {
        if force {
            continue;
        }
        refuse_existing_cache(d)?;
        if let Ok(l) = crate::device::set::CacheSet::read_label(d)? {
            return Err(EngineError::Config(format!(
                "{} is member {} of a cache set already (create --wipe overwrites it)",
                d.name(),
                l.member_index
            )));
        }
    }
    let set_id = rand::random::<u64>() | 1;
    let set = crate::device::set::CacheSet::format(devs, geometry, set_id)?;
    Ok(std::sync::Arc::new(set))
}

/// A device that holds a cache is formatted only with `force`.
fn refuse_existing_cache(cache: &DeviceRef) -> EngineResult<()> {
    let Ok(sb) = current_superblock(cache) else {
        return Ok(());
    };
    let mode = Mode::from_u32(sb.mode.get()).map_or("unknown", |m| m.name());
    Err(EngineError::AlreadyACache {
        device: cache.name().into(),
        mode: mode.into(),
        dirty_hint: if sb.clean_shutdown.get() == 1 {
            "shut down cleanly"
        } else {
            "not shut down cleanly: it may hold dirty data"
        }
        .into(),
    })
}

/// Steps 1 to 3 of formatting: old superblocks invalidated, the journal
/// zeroed, an empty checkpoint in area 0, each made durable.
fn write_empty_metadata(cache: &DeviceRef, layout: &Layout) -> EngineResult<()> {
    // 1. Invalidate any old superblocks, so an interrupted create never
    //    leaves an older cache's superblock current.
    let zero = AlignedBuf::zeroed(2 * PAGE_BYTES as usize);
    cache.write_at(&zero, 0)?;
    cache.flush()?;
    // 2. Zero the journal: no page of an earlier cache may replay.
    let journal_bytes = layout.journal_pages * PAGE_BYTES;
    let chunk = AlignedBuf::zeroed(JOURNAL_READ_BYTES as usize);
    let mut done = 0;
    while done < journal_bytes {
        let n = (journal_bytes - done).min(JOURNAL_READ_BYTES);
        cache.write_at(&chunk[..n as usize], layout.journal_offset + done)?;
        done += n;
    }
    // 3. An empty checkpoint in area 0, generation 1.
    let empty = CheckpointData {
        entries: vec![0u64; layout.slot_count as usize],
        partial: Vec::new(),
        open_group: 0,
    };
    for page_index in 0..layout.checkpoint_pages {
        let page = checkpoint_page(layout, 1, page_index, &empty);
        cache.write_at(
            &AlignedBuf::from_slice(&page),
            layout.checkpoint_offset[0] + page_index * PAGE_BYTES,
        )?;
    }
    cache.flush()?;
    Ok(())
}

/// The superblock of a new cache (generation and seal not yet set).
fn new_superblock(
    cache: &DeviceRef,
    volumes: &[VolumeEntry],
    opts: &CreateOptions,
    layout: &Layout,
) -> Superblock {
    let w = opts.writeback;
    let mut sb = Superblock::new_zeroed();
    sb.magic = SUPERBLOCK_MAGIC;
    sb.version = U32::new(FORMAT_VERSION);
    sb.block_bytes = U32::new(opts.block_bytes);
    sb.cache_device_bytes = U64::new(cache.size_bytes());
    sb.set_volume_list(volumes);
    sb.slot_count = U64::new(layout.slot_count);
    sb.journal_offset = U64::new(layout.journal_offset);
    sb.journal_pages = U64::new(layout.journal_pages);
    sb.checkpoint_offset = [
        U64::new(layout.checkpoint_offset[0]),
        U64::new(layout.checkpoint_offset[1]),
    ];
    sb.checkpoint_pages = U64::new(layout.checkpoint_pages);
    sb.data_offset = U64::new(layout.data_offset);
    sb.checkpoint_area = U32::new(0);
    sb.mode = U32::new(opts.mode.to_u32());
    sb.checkpoint_generation = U64::new(1);
    sb.journal_replay_seq = U64::new(1);
    sb.clean_shutdown = U32::new(1);
    sb.policy = U32::new(opts.policy.to_u32());
    sb.writeback_high_pct = U32::new(w.high_pct);
    sb.writeback_low_pct = U32::new(w.low_pct);
    sb.writeback_max_age_secs = U32::new(w.max_age_secs);
    sb.writeback_idle_secs = U32::new(w.idle_secs);
    sb.cache_error_limit = U64::new(opts.cache_error_limit);
    sb.set_admission(&opts.admission);
    let mut flags = 0;
    if opts.allow_data_loss {
        flags |= SB_FLAG_ALLOW_VOLATILE_WRITEBACK;
    }
    if opts.placement == Placement::Log {
        flags |= SB_FLAG_LOG_PLACEMENT;
    }
    if opts.writeback_order == WritebackOrder::Flush {
        flags |= SB_FLAG_FLUSH_ORDER;
    }
    sb.flags = U32::new(flags);
    sb
}

/// What loading the metadata found.
pub(crate) struct Loaded {
    pub sb: Superblock,
    pub layout: Layout,
    pub table: Table,
    /// Writeback in flush order: the groups, as the checkpoint and the
    /// replayed records leave them (table/groups.rs).
    pub groups: Option<Groups>,
    /// Sequence number after the last replayed journal page.
    pub journal_end_seq: u64,
    pub pages_replayed: u64,
    pub records_replayed: u64,
    /// Why the replay ended at a page that is not blank or stale.
    pub tail_note: Option<String>,
}

fn corrupt(cache: &DeviceRef, what: impl Into<String>) -> EngineError {
    EngineError::Corrupt {
        device: cache.name().into(),
        what: what.into(),
    }
}

/// The layout a device of `device_bytes` must have, given the one
/// `recorded`: a pure function of the size and block size (`Layout::
/// compute`), or, for a cache that grew (`Layout::grown`), of the size and
/// where the data region begins (after the journal, on a block boundary).
fn expected_layout(recorded: &Layout, device_bytes: u64) -> Result<Layout, String> {
    let bs = recorded.block_bytes;
    if !recorded.is_grown() {
        return Layout::compute(device_bytes, bs);
    }
    let (j, d) = (recorded.journal_offset, recorded.data_offset);
    let journal_end = recorded
        .journal_pages
        .saturating_mul(PAGE_BYTES)
        .saturating_add(j);
    if j != JOURNAL_OFFSET
        || !(256..=65536).contains(&recorded.journal_pages)
        || d % bs as u64 != 0
        || d < journal_end
        || d > device_bytes
    {
        return Err(format!(
            "a grown layout with its journal at {j} ({} pages) and its data at {d} cannot be",
            recorded.journal_pages
        ));
    }
    Layout::grown(recorded, device_bytes).ok_or_else(|| {
        format!(
            "a grown layout of {} slots does not fit {device_bytes} bytes",
            recorded.slot_count
        )
    })
}

/// Validates the superblock against the device and derives the layout.
fn validate_superblock(cache: &DeviceRef, sb: &Superblock) -> EngineResult<Layout> {
    let bs = sb.block_bytes.get();
    check_block_bytes(bs).map_err(|e| corrupt(cache, format!("superblock: {e}")))?;
    if sb.cache_device_bytes.get() > cache.size_bytes() {
        return Err(corrupt(
            cache,
            format!(
                "superblock records a cache device of {} bytes but the device has {}",
                sb.cache_device_bytes.get(),
                cache.size_bytes()
            ),
        ));
    }
    let recorded = sb.layout();
    let layout = expected_layout(&recorded, sb.cache_device_bytes.get())
        .map_err(|e| corrupt(cache, format!("superblock: {e}")))?;
    if recorded != layout {
        return Err(corrupt(
            cache,
            format!("superblock layout {recorded:?} does not match the device ({layout:?})"),
        ));
    }
    if Mode::from_u32(sb.mode.get()).is_none() {
        return Err(corrupt(
            cache,
            format!("superblock: unknown mode {}", sb.mode.get()),
        ));
    }
    if PolicyKind::from_u32(sb.policy.get()).is_none() {
        return Err(corrupt(
            cache,
            format!("superblock: unknown policy {}", sb.policy.get()),
        ));
    }
    if let Err(e) = sb.admission().validate() {
        return Err(corrupt(
            cache,
            format!("superblock: admission settings: {e}"),
        ));
    }
    if sb.checkpoint_area.get() > 1 {
        return Err(corrupt(cache, "superblock: checkpoint area is not 0 or 1"));
    }
    // These grow by one per write and can never get near SEQ_MAX (2^62
    // journal pages is 146,000 years at a million commits a second); a
    // larger value is damage, and would overflow the arithmetic on them.
    for (what, value) in [
        ("generation", sb.generation.get()),
        ("checkpoint generation", sb.checkpoint_generation.get()),
        ("journal replay sequence", sb.journal_replay_seq.get()),
    ] {
        if value > SEQ_MAX {
            return Err(corrupt(
                cache,
                format!("superblock: {what} {value} is impossibly large"),
            ));
        }
    }
    Ok(layout)
}

/// Upper bound of superblock generations and journal sequence numbers.
const SEQ_MAX: u64 = 1 << 62;

/// A superblock copy that fails its checks without being erased (create
/// and detach write zeroes) was damaged after it was written: a superblock
/// lies in one 512-byte sector, which a power loss never tears. The damaged
/// copy may have been the newer one, naming a newer checkpoint; the valid
/// copy then leads to the state before that checkpoint, and the commits
/// since (the checkpoint's own records are in no journal page) would be
/// lost without a trace. The evidence: the checkpoint area the valid copy
/// does not name holds a complete checkpoint newer than the one it names.
/// Returns why the valid copy is out of date.
fn outdated_superblock(
    cache: &DeviceRef,
    sb: &Superblock,
    layout: &Layout,
) -> EngineResult<Option<String>> {
    let mut damaged = None;
    for copy in 0..2u64 {
        let page = read_page(cache, copy * PAGE_BYTES)?;
        match Superblock::parse(&page) {
            Err(e) if page.iter().any(|&b| b != 0) => damaged = Some((copy, e)),
            _ => {}
        }
    }
    let Some((copy, why)) = damaged else {
        return Ok(None);
    };
    let area = 1 - sb.checkpoint_area.get() as usize;
    let first = read_page(cache, layout.checkpoint_offset[area])?;
    let Ok((hdr, _)) = CheckpointHeader::read_from_prefix(&first) else {
        return Ok(None);
    };
    let newer = hdr.generation.get();
    if newer <= sb.checkpoint_generation.get() {
        return Ok(None);
    }
    for page_index in 0..layout.checkpoint_pages {
        let page = read_page(
            cache,
            layout.checkpoint_offset[area] + page_index * PAGE_BYTES,
        )?;
        if parse_checkpoint_page(&page, newer, page_index).is_err() {
            // Incomplete: its superblock was never written.
            return Ok(None);
        }
    }
    Ok(Some(format!(
        "superblock copy {copy} is damaged ({why}) and checkpoint area {area} holds a complete checkpoint (generation {newer}) newer than the one the valid copy names ({}): the valid copy is out of date, and loading it would lose the commits since",
        sb.checkpoint_generation.get()
    )))
}

/// The pages of the commit that starts at `seq`, if they are all intact
/// and lie before `end`.
fn whole_commit<'a>(
    seq: u64,
    end: u64,
    page_at: &impl Fn(u64) -> &'a [u8],
) -> Option<Vec<ParsedJournalPage>> {
    let first = parse_journal_page(page_at(seq)).ok()?;
    let n = first.commit_pages as u64;
    if first.seq != seq || first.commit_first_seq != seq || n == 0 || seq + n > end {
        return None;
    }
    let mut pages = vec![first];
    for k in 1..n {
        match parse_journal_page(page_at(seq + k)) {
            Ok(p)
                if p.seq == seq + k && p.commit_first_seq == seq && p.commit_pages as u64 == n =>
            {
                pages.push(p)
            }
            _ => return None,
        }
    }
    Some(pages)
}

/// Where `load` puts the damage it finds: listed and passed over (for
/// `check`), or, without a list, the first one is the error.
struct Damage<'a> {
    cache: &'a DeviceRef,
    list: Option<&'a mut Vec<String>>,
}

impl Damage<'_> {
    fn found(&mut self, what: String) -> EngineResult<()> {
        match self.list.as_deref_mut() {
            Some(list) => {
                list.push(what);
                Ok(())
            }
            None => Err(corrupt(self.cache, what)),
        }
    }
}

/// Loads the checkpoint and replays the journal. With `problems` given,
/// keeps going after damage and lists it (for `check`); otherwise the first
/// damage is an error.
/// `sizes` are the volumes' origin sizes, by index.
pub(crate) fn load(
    cache: &DeviceRef,
    sb: Superblock,
    sizes: &[u64],
    problems: Option<&mut Vec<String>>,
) -> EngineResult<Loaded> {
    let layout = validate_superblock(cache, &sb)?;
    let mut damage = Damage {
        cache,
        list: problems,
    };
    if let Some(why) = outdated_superblock(cache, &sb, &layout)? {
        damage.found(why)?;
    }
    let bs = layout.block_bytes as u64;
    let keys = KeySpace::new(bs, sizes.iter().map(|s| s / bs).collect());
    let mut table = read_checkpoint(cache, &sb, &layout, keys, &mut damage)?;
    if let Some(set) = cache.members() {
        table.set_dirty_slots(set.mirror_slots() as u32);
    }
    let mut groups = (sb.flags.get() & SB_FLAG_FLUSH_ORDER != 0)
        .then(|| Groups::new(sb.checkpoint_open_group.get(), &table));
    let ring = read_journal(cache, &layout)?;
    let start = sb.journal_replay_seq.get();
    let (seq, records_replayed) =
        replay(&ring, &layout, start, &mut table, &mut groups, &mut damage)?;
    let tail_note = check_journal_end(&ring, &layout, start, seq, &mut damage)?;
    Ok(Loaded {
        sb,
        layout,
        table,
        groups,
        journal_end_seq: seq,
        pages_replayed: seq - start,
        records_replayed,
        tail_note,
    })
}

/// The current checkpoint as a table: entry pages, then sector-map pages.
fn read_checkpoint(
    cache: &DeviceRef,
    sb: &Superblock,
    layout: &Layout,
    keys: KeySpace,
    damage: &mut Damage,
) -> EngineResult<Table> {
    let area = sb.checkpoint_area.get() as usize;
    let generation = sb.checkpoint_generation.get();
    let slots = layout.slot_count as usize;
    let sectors = sectors_per_block(layout.block_bytes);
    let mut entries = Vec::with_capacity(slots + ENTRIES_PER_CHECKPOINT_PAGE);
    // Sector maps are compared with their slot's entry as they are read
    // (entry pages come first): only slots whose maps are not those of a
    // whole block are kept, so opening a big cache holds no per-slot maps.
    let mut partial = Vec::new();
    let mut map_slot = 0usize;
    let mut keep_map = |entries: &[u64], (v, d): (SectorSet, SectorSet)| {
        let entry = entries.get(map_slot).copied();
        if map_slot < slots && entry.is_some_and(|e| (v, d) != whole_sets(e, sectors)) {
            partial.push((map_slot as u32, v, d));
        }
        map_slot += 1;
    };
    let mut idx = 0u64;
    while idx < layout.checkpoint_pages {
        let n = (layout.checkpoint_pages - idx).min(JOURNAL_READ_BYTES / PAGE_BYTES);
        let mut buf = AlignedBuf::zeroed((n * PAGE_BYTES) as usize);
        cache.read_at(&mut buf, layout.checkpoint_offset[area] + idx * PAGE_BYTES)?;
        for k in 0..n {
            let page_index = idx + k;
            let page = &buf[(k * PAGE_BYTES) as usize..((k + 1) * PAGE_BYTES) as usize];
            let at = layout.checkpoint_offset[area] + page_index * PAGE_BYTES;
            let where_ = || format!("checkpoint area {area} page {page_index} (byte offset {at})");
            let payload = match parse_checkpoint_page(page, generation, page_index) {
                Ok(p) => p,
                Err(e) => {
                    damage.found(format!("{}: {e}", where_()))?;
                    &[0u8; PAGE_BYTES as usize][..]
                }
            };
            if page_index < layout.entry_pages() {
                entries.extend(decode_entries(payload));
                continue;
            }
            for pair in decode_maps(payload, layout.block_bytes) {
                match pair {
                    Ok(p) => keep_map(&entries, p),
                    Err(e) => {
                        damage.found(format!("{}: {e}", where_()))?;
                        keep_map(&entries, whole_sets(0, sectors));
                    }
                }
            }
        }
        idx += n;
    }
    entries.truncate(slots);
    let checkpoint = CheckpointData {
        entries,
        partial,
        open_group: sb.checkpoint_open_group.get(),
    };
    checkpoint_table(checkpoint, layout, keys, damage)
}

/// The table a checkpoint's contents make; an empty one, the damage
/// noted, if they do not make one.
fn checkpoint_table(
    checkpoint: CheckpointData,
    layout: &Layout,
    keys: KeySpace,
    damage: &mut Damage,
) -> EngineResult<Table> {
    let sectors = sectors_per_block(layout.block_bytes);
    match Table::from_checkpoint(checkpoint, keys.clone(), sectors) {
        Ok(t) => Ok(t),
        Err(e) => {
            damage.found(format!("checkpoint: {e}"))?;
            Ok(Table::new(layout.slot_count, keys, sectors))
        }
    }
}

/// The whole journal ring, read once.
fn read_journal(cache: &DeviceRef, layout: &Layout) -> EngineResult<AlignedBuf> {
    let ring_bytes = layout.journal_pages * PAGE_BYTES;
    let mut ring = AlignedBuf::zeroed(ring_bytes as usize);
    let mut off = 0u64;
    while off < ring_bytes {
        let n = (ring_bytes - off).min(JOURNAL_READ_BYTES);
        cache.read_at(
            &mut ring[off as usize..(off + n) as usize],
            layout.journal_offset + off,
        )?;
        off += n;
    }
    Ok(ring)
}

/// The page of sequence `seq` in the ring.
fn ring_page<'a>(ring: &'a [u8], layout: &Layout, seq: u64) -> &'a [u8] {
    let i = (seq % layout.journal_pages) as usize * PAGE_BYTES as usize;
    &ring[i..i + PAGE_BYTES as usize]
}

/// Applies the journal's whole commits from `start`, commit by commit: a
/// commit is applied only when all its pages are intact (a multi-record
/// change is never half replayed). Returns the sequence where replay ended
/// and the records applied.
fn replay(
    ring: &[u8],
    layout: &Layout,
    start: u64,
    table: &mut Table,
    groups: &mut Option<Groups>,
    damage: &mut Damage,
) -> EngineResult<(u64, u64)> {
    let page_at = |seq: u64| ring_page(ring, layout, seq);
    let mut seq = start;
    let mut records = 0u64;
    while let Some(commit) = whole_commit(seq, start + layout.journal_pages, &page_at) {
        for r in commit.iter().flat_map(|p| &p.records) {
            if let Err(e) = table.validate(r) {
                damage.found(format!("journal page {seq}: {e}"))?;
                return Ok((seq, records));
            }
            if let Some(g) = groups.as_mut() {
                g.note(table, r);
            }
            table.apply(r);
            records += 1;
        }
        seq += commit.len() as u64;
    }
    Ok((seq, records))
}

/// Why the replay stopped at `seq`, checked against the rest of the ring;
/// returns a note for `check` when the page there is not blank or stale.
fn check_journal_end(
    ring: &[u8],
    layout: &Layout,
    start: u64,
    seq: u64,
    damage: &mut Damage,
) -> EngineResult<Option<String>> {
    let page_at = |s: u64| ring_page(ring, layout, s);
    let end = start + layout.journal_pages;
    // The replay stopped at `seq`. That is the torn tail of the last commit
    // unless a page of a LATER commit is valid: commits are sequential, so a
    // later commit means the commit holding `seq` had completed, and its
    // page was durable: it was damaged afterwards.
    // No valid page can claim a sequence at or past `end`: a commit
    // checkpoints before the journal passes half full. Such a page is
    // damage that a later commit would otherwise meet as a "later commit"
    // and refuse only then (the fuzzer found this).
    for later in seq..end {
        if let Ok(p) = parse_journal_page(page_at(later)) {
            if p.seq >= end {
                damage.found(format!(
                    "journal page at byte offset {} claims sequence {}, past the journal's end ({end})",
                    layout.journal_page_offset(later),
                    p.seq,
                ))?;
                break;
            }
            if p.seq == later && later > seq && p.commit_first_seq > seq {
                damage.found(format!(
                    "journal page {seq} (byte offset {}) is damaged but the later commit at page {later} is intact",
                    layout.journal_page_offset(seq)
                ))?;
                break;
            }
        }
    }
    // A page that fails its checks where the replay ended (the commit's
    // first page, or a later page of a commit whose first page is intact)
    // is the torn end of a commit cut by a power loss (never
    // acknowledged), or damage to the last commit (then lost): the two
    // cannot be told apart. Either way replay ends before that commit;
    // `check` says so.
    let failing = match parse_journal_page(page_at(seq)) {
        Err(e) => Some((seq, e)),
        Ok(p) if p.seq == seq && p.commit_first_seq == seq => (seq + 1
            ..(seq + p.commit_pages as u64).min(end))
            .find_map(|s| parse_journal_page(page_at(s)).err().map(|e| (s, e))),
        Ok(_) => None,
    };
    Ok(failing
        .filter(|(s, _)| page_at(*s).iter().any(|&b| b != 0))
        .map(|(s, e)| {
            format!(
                "journal page {s} (byte offset {}) fails its checks ({e}); replay ends before the \
                 commit at page {seq}: the torn end of a commit cut by a crash, or damage that \
                 loses the last commit",
                layout.journal_page_offset(s)
            )
        }))
}

/// The current superblock; of a cache set, after its metadata copies
/// were compared and mended up to the journal's end.
fn superblock_scrubbed(cache: &DeviceRef) -> EngineResult<Superblock> {
    if let Some(set) = cache.members() {
        set.set_meta_check(super::format::meta_page_intact);
    }
    let sb = current_superblock(cache)?;
    if let Some(set) = cache.members() {
        let journal_end = sb.journal_offset.get() + sb.journal_pages.get() * PAGE_BYTES;
        let range = 0..journal_end.min(set.meta_bytes());
        set.scrub_meta(range, sb.clean_shutdown.get() == 1);
    }
    Ok(sb)
}

/// Opens `cache` with `origins`, volume `i` on `origins[i]`.
pub(crate) fn open(
    cache: DeviceRef,
    origins: Vec<DeviceRef>,
    opts: &OpenOptions,
) -> EngineResult<Engine> {
    let (sb, gone) = superblock_to_open(&cache, &origins, opts)?;
    // The log is locked before anything is read: a second process opening
    // the same cache stops here.
    let (log, image) = match &opts.crash_log {
        Some(path) => {
            let (log, image) = CrashLog::open(path, crash_log::DEFAULT_CAPACITY)?;
            (Some(log), Some(image))
        }
        None => (None, None),
    };
    let sizes = sizes_with_removed(&sb, &origins);
    let mut loaded = load(&cache, sb, &sizes, None)?;
    let recovered = match image {
        Some(image) => match apply_crash_log(&cache, &origins, &mut loaded, image)? {
            Some(n) => n,
            None => {
                loaded = load(&cache, sb, &sizes, None)?;
                0
            }
        },
        None => 0,
    };
    finish_removals(&cache, &mut loaded, &gone)?;
    let sb = checks::take_sizes(settle_superblock(&cache, loaded.sb, opts)?, &origins, true)?;
    let distrust = opts.distrust_clean || sb.flags.get() & SB_FLAG_DISTRUST_CLEAN != 0;
    if distrust {
        let dropped = loaded.table.drop_clean();
        log::warn!(
            "{}: the cache had failed over after a device failure; dropped {dropped} clean cached blocks",
            cache.name()
        );
    }
    // Taking out a removed volume is made durable by the restart's
    // checkpoint, which holds the table with the keys moved down and the
    // superblock without the volume: one write decides.
    let clean = sb.clean_shutdown.get() == 1
        && loaded.pages_replayed == 0
        && recovered == 0
        && !distrust
        && gone.is_empty();
    note_recovery(cache.name(), &loaded, clean);
    let journal_end_seq = loaded.journal_end_seq;
    let engine = build_engine(cache, origins, sb, loaded, opts.clock.clone());
    if engine.cache.order.older_groups_pending(&engine.cache) {
        // The restart's checkpoint keeps no closed flush group: write them
        // back first (usually seconds of writes).
        if let Err(e) = engine.cache.order.write_back_closed(&engine.cache) {
            log::warn!(
                "{}: the flush groups closed before the crash could not be written back ({e}); \
                 their order is kept only until the next crash",
                engine.cache_device().name()
            );
        }
    }
    start_durable(&engine, clean, distrust, journal_end_seq, log, opts)?;
    engine.cache.follow_cache_set();
    engine.cache.cache_set_opened(!clean, !opts.no_background);
    engine
        .cache
        .stats
        .crash_log_records_recovered
        .store(recovered, std::sync::atomic::Ordering::Relaxed);
    Ok(engine)
}

/// The superblock an open loads with, checked against `origins` (the
/// volumes `opts` adds appended), and the volumes removed while served
/// that it takes out (`finish_removals`). With such volumes the
/// superblock keeps their records for the load (their keys are still
/// theirs); the origins are checked against the others.
fn superblock_to_open(
    cache: &DeviceRef,
    origins: &[DeviceRef],
    opts: &OpenOptions,
) -> EngineResult<(Superblock, Vec<usize>)> {
    let all = superblock_scrubbed(cache)?;
    let (live, gone) = all.without_removed();
    if !gone.is_empty() && !opts.add_volumes.is_empty() {
        return Err(EngineError::Config(
            "the cache holds a volume removed while it was served, which its next open takes \
             out: open it once (`tiercache status`), then add the origin"
                .into(),
        ));
    }
    let sb = checks::add_volumes(live, origins, &opts.add_volumes)?;
    checks::check_origins(&sb, origins, opts)?;
    Ok((if gone.is_empty() { sb } else { all }, gone))
}

/// Each volume's origin size, by index, for `load`: a volume's origin
/// device's (`origins`, in order), or, for one removed while served
/// (which has no device any more), the size it recorded.
fn sizes_with_removed(sb: &Superblock, origins: &[DeviceRef]) -> Vec<u64> {
    let mut live = origins.iter().map(|o| o.size_bytes());
    (sb.volume_list().iter())
        .map(|v| match v.removed {
            true => v.bytes,
            false => live.next().unwrap_or(v.bytes),
        })
        .collect()
}

/// Takes out the volumes removed while the cache was served (`gone`,
/// ascending: `VOLUME_REMOVED`): their blocks were written back and
/// dropped before the record was marked, so a block of theirs left in the
/// table can only be a clean copy a read placed as the volume went (it is
/// dropped); a dirty one is damage. The volumes after each move down one
/// place, their keys with them (`Table::without_volumes`), and the
/// superblock loses the records. Nothing is written here: the open's
/// restart checkpoint makes it durable, all at once.
fn finish_removals(cache: &DeviceRef, loaded: &mut Loaded, gone: &[usize]) -> EngineResult<()> {
    if gone.is_empty() {
        return Ok(());
    }
    if loaded.groups.is_some() {
        return Err(corrupt(
            cache,
            "a volume removed while served in a cache that writes back in flush order (never \
             done: its groups span every volume)",
        ));
    }
    let old = loaded.table.keys();
    let blocks = (0..old.volumes()).filter(|v| !gone.contains(v));
    let keys = KeySpace::new(
        loaded.layout.block_bytes as u64,
        blocks.map(|v| old.blocks(v)).collect(),
    );
    loaded.table = (loaded.table.without_volumes(gone, keys)).map_err(|e| corrupt(cache, e))?;
    let (live, _) = loaded.sb.without_removed();
    for v in gone {
        log::info!(
            "{}: volume {v}, removed while served, is taken out; the volumes after it move down",
            cache.name()
        );
    }
    loaded.sb = live;
    Ok(())
}

/// Logs what opening found: a damaged journal tail, and what recovery
/// replayed after an unclean shutdown.
fn note_recovery(cache: &str, loaded: &Loaded, clean: bool) {
    if let Some(note) = &loaded.tail_note {
        log::warn!("{cache}: {note}");
    }
    if !clean {
        log::info!(
            "{cache}: recovering after an unclean shutdown: replayed {} journal pages ({} records); {} blocks cached, {} dirty",
            loaded.pages_replayed,
            loaded.records_replayed,
            loaded.table.used(),
            loaded.table.dirty_count()
        );
    }
}

/// Makes the opened state durable before any request: a clean cache is
/// marked in use; a recovered one gets a checkpoint that restarts the
/// journal a full ring later. The crash log then starts empty at that
/// state.
fn start_durable(
    engine: &Engine,
    clean: bool,
    distrust: bool,
    journal_end_seq: u64,
    log: Option<CrashLog>,
    opts: &OpenOptions,
) -> EngineResult<()> {
    // Kept from the journal's first commit on (its checkpoint at open).
    if let Some(path) = &opts.stale_map {
        (engine.cache.journal).keep_stale_map(path.clone(), engine.cache.block_bytes);
    }
    engine
        .cache
        .start_journal(clean, distrust, journal_end_seq, log)
}

/// Refuses dirty modes on a volatile cache unless data loss was accepted
/// (now or at create), and records an acceptance given now.
fn settle_superblock(
    cache: &DeviceRef,
    mut sb: Superblock,
    opts: &OpenOptions,
) -> EngineResult<Superblock> {
    let mode = Mode::from_u32(sb.mode.get()).expect("validated");
    let allow = opts.allow_data_loss || sb.flags.get() & SB_FLAG_ALLOW_VOLATILE_WRITEBACK != 0;
    if mode.holds_dirty() && cache.is_volatile() && !allow {
        return Err(EngineError::VolatileWriteback {
            device: cache.name().into(),
            mode: mode.name().into(),
        });
    }
    if opts.allow_data_loss {
        sb.flags
            .set(sb.flags.get() | SB_FLAG_ALLOW_VOLATILE_WRITEBACK);
    }
    Ok(sb)
}

/// The engine over a loaded table: policy, free slots and settings from
/// the table and superblock; nothing written yet.
fn build_engine(
    cache: DeviceRef,
    origins: Vec<DeviceRef>,
    sb: Superblock,
    loaded: Loaded,
    clock: Clock,
) -> Engine {
    let layout = loaded.layout;
    let block_bytes = layout.block_bytes as u64;
    // A RAM cache takes a write at memory speed: nothing to gather (the
    // hand-over between threads would only cost).
    let gather = sb.flags.get() & SB_FLAG_LOG_PLACEMENT != 0 && !cache.is_volatile();
    let volumes = sb.volume_list();
    let names = volumes.iter().map(|v| v.name.clone());
    let keys = loaded.table.keys().clone();
    let origins = Origins::new(names.zip(origins).collect(), block_bytes, keys);
    for (o, v) in origins.iter().zip(&volumes) {
        o.swap_mode(sb.volume_mode(v).expect("validated"));
        o.share().set(v.share);
    }
    origins.set_sharing(sb.sharing());
    let keys = origins.key_space().clone();
    Engine {
        cache: super::cache::Cache {
            regions: layout.regions(),
            block_bytes,
            meta: MetaLock::new({
                let pool_slots = loaded.table.dirty_slots() as u64;
                let log = (sb.flags.get() & SB_FLAG_LOG_PLACEMENT != 0).then(|| {
                    Geometry::new(SEGMENT_BYTES, block_bytes, layout.data_offset, pool_slots)
                });
                let mut m = Meta::new(
                    loaded.table,
                    PolicyKind::from_u32(sb.policy.get()).expect("validated"),
                    log,
                );
                if let Some(g) = loaded.groups {
                    m.keep_groups(g);
                }
                m
            }),
            journal: super::journal::Journal::new(sb, loaded.journal_end_seq),
            stats: Stats::default(),
            admission: super::admission::Admission::new(sb.admission(), layout.slot_count)
                .with_clock(clock.clone()),
            placement: super::placement::of(if sb.flags.get() & SB_FLAG_LOG_PLACEMENT != 0 {
                Placement::Log
            } else {
                Placement::InPlace
            }),
            io: super::io::Io::new(cache, sb.cache_error_limit.get(), gather),
            origins,
            clock,
            bell: super::cache::Bell::default(),
            observe: super::observe::Observe::new(layout.slot_count, &keys),
            writeback: super::writeback::Writeback::new(sb.writeback()),
            order: super::writeback::order::of(if sb.flags.get() & SB_FLAG_FLUSH_ORDER != 0 {
                WritebackOrder::Flush
            } else {
                WritebackOrder::Address
            }),
            closed: AtomicBool::new(false),
            deferred: Default::default(),
        },
    }
}

/// Applies what a crash log adds to the loaded state (`crash_log.rs`): the
/// records a daemon that died had acknowledged but not journalled. Their
/// data reached the devices before the daemon died; both are flushed
/// first, so the checkpoint that open writes next may point at it. A log
/// that does not follow the loaded state is ignored, with a warning.
/// Returns how many records were applied, or `None` if one did not apply:
/// the table is then half changed and must be loaded again.
fn apply_crash_log(
    cache: &DeviceRef,
    origins: &[DeviceRef],
    loaded: &mut Loaded,
    image: Result<LogImage, String>,
) -> EngineResult<Option<u64>> {
    let applied = apply_crash_log_in_memory(cache.name(), loaded, image);
    if let Some(n) = applied.filter(|&n| n > 0) {
        origins.iter().try_for_each(|o| o.flush())?;
        cache.flush()?;
        log::warn!(
            "{}: applied {n} records from the crash log: writes the previous daemon acknowledged before it died",
            cache.name()
        );
    }
    Ok(applied)
}

/// The table part of `apply_crash_log`: the log's records applied to
/// `loaded`, nothing read or written on a device.
fn apply_crash_log_in_memory(
    cache: &str,
    loaded: &mut Loaded,
    image: Result<LogImage, String>,
) -> Option<u64> {
    let image = match image {
        Ok(image) => image,
        Err(why) => {
            log::debug!("{cache}: no crash log to apply: {why}");
            return Some(0);
        }
    };
    let at = crash_log::Point {
        checkpoint_generation: loaded.sb.checkpoint_generation.get(),
        journal_seq: loaded.journal_end_seq,
    };
    let records = match image.pending(&crash_log::Identity::of(&loaded.sb), at) {
        Pending::Apply(records) => records,
        Pending::Ignore(why) => {
            log::warn!(
                "{cache}: crash log not applied ({why}); writes acknowledged after the last commit of the process that wrote it may be lost"
            );
            return Some(0);
        }
    };
    for (i, r) in records.iter().enumerate() {
        if let Err(e) = loaded.table.validate(r) {
            log::error!(
                "{cache}: crash log record {i} of {} does not apply ({e}); the log is ignored",
                records.len()
            );
            return None;
        }
        if let Some(g) = loaded.groups.as_mut() {
            g.note(&loaded.table, r);
        }
        loaded.table.apply(r);
    }
    Some(records.len() as u64)
}

/// Opens a cache only to look at it (`status` of a cache no daemon
/// serves): the state a writing open would reach (checkpoint, journal and
/// crash log applied, distrusted clean blocks dropped), built in memory.
/// Nothing is written or flushed: no superblock generation, no restart
/// checkpoint, no cache-set scrub or label, and the crash log is read, not
/// taken. The engine is closed from the start, so every operation but
/// looking (`status`, `dirty_blocks`) is refused.
pub(crate) fn open_read_only(
    cache: DeviceRef,
    origins: Vec<DeviceRef>,
    opts: &OpenOptions,
) -> EngineResult<Engine> {
    let sb = current_superblock(&cache)?;
    let (live, gone) = sb.without_removed();
    checks::check_origins(&live, &origins, opts)?;
    let sizes = sizes_with_removed(&sb, &origins);
    let mut loaded = load(&cache, sb, &sizes, None)?;
    let mut recovered = 0;
    if let Some(path) = &opts.crash_log {
        // As the writing open reads it: never through a symlink, never a
        // FIFO or a device, never more than a log's bytes.
        let image = crash_log::read_file(path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|bytes| LogImage::parse(&bytes));
        match apply_crash_log_in_memory(cache.name(), &mut loaded, image) {
            Some(n) => recovered = n,
            None => loaded = load(&cache, sb, &sizes, None)?,
        }
    }
    finish_removals(&cache, &mut loaded, &gone)?;
    if opts.distrust_clean || sb.flags.get() & SB_FLAG_DISTRUST_CLEAN != 0 {
        loaded.table.drop_clean();
    }
    let sb = checks::take_sizes(loaded.sb, &origins, false)?;
    let engine = build_engine(cache, origins, sb, loaded, opts.clock.clone());
    (engine.cache.closed).store(true, std::sync::atomic::Ordering::Release);
    engine
        .cache
        .stats
        .crash_log_records_recovered
        .store(recovered, std::sync::atomic::Ordering::Relaxed);
    Ok(engine)
}

/// Dissolves a fully written-back cache: both superblock copies first
/// describe the final clean state, then are zeroed. A crash at any point
/// leaves either that clean cache or no cache.
pub(crate) fn wipe(engine: &Engine) -> EngineResult<()> {
    engine.cache.checkpoint_now(true)?;
    engine.cache.update_superblock(|_| {})?;
    engine.remove_crash_log();
    let zero = AlignedBuf::zeroed(PAGE_BYTES as usize);
    for copy in 0..2u64 {
        engine.cache.meta_write(&zero, copy * PAGE_BYTES)?;
        engine.cache.cache_flush()?;
    }
    Ok(())
}

/// Which crash log `check` reads.
pub enum CrashLogs {
    /// None.
    None,
    /// The named cache's log (there may be no such file).
    Known(std::path::PathBuf),
    /// Of these files, the logs whose header names this cache (for a
    /// device given without a name). Others are skipped: they belong to
    /// other caches, or are not logs.
    Search(Vec<std::path::PathBuf>),
}

/// Of `files`, the crash logs whose headers name the cache on `cache`
/// (`import` takes a found cache's log under its new name: a log is found
/// by the name it was registered under, and it may hold writes the last
/// daemon acknowledged but did not journal).
pub fn crash_logs_of(
    cache: &DeviceRef,
    files: &[std::path::PathBuf],
) -> EngineResult<Vec<std::path::PathBuf>> {
    let ours = crash_log::Identity::of(&current_superblock(cache)?);
    Ok(files.iter().filter(|p| log_of(p, &ours)).cloned().collect())
}

/// True if the file at `path` is a crash log whose header names the cache
/// `ours`.
fn log_of(path: &std::path::Path, ours: &crash_log::Identity) -> bool {
    crash_log::read_file(path)
        .ok()
        .and_then(|b| LogImage::parse(&b).ok())
        .is_some_and(|img| img.identity.same_cache(ours))
}

/// What the crash logs `logs` hold for the loaded state, for `check`. The
/// records a log would add are applied to `loaded`'s table, as open would,
/// so a record that does not fit is caught here too.
fn crash_log_notes(loaded: &mut Loaded, logs: &CrashLogs) -> Vec<String> {
    match logs {
        CrashLogs::None => Vec::new(),
        CrashLogs::Known(path) => crash_log_note(loaded, path).into_iter().collect(),
        CrashLogs::Search(files) => {
            let ours = crash_log::Identity::of(&loaded.sb);
            let notes: Vec<String> = files
                .iter()
                .filter(|p| log_of(p, &ours))
                .filter_map(|p| crash_log_note(loaded, p))
                // One log at most applies to a state.
                .take(1)
                .collect();
            if notes.is_empty() {
                vec![format!(
                    "note: no crash log of this cache among {} crash log files searched",
                    files.len()
                )]
            } else {
                notes
            }
        }
    }
}

/// What the crash log at `path` holds for the loaded state, for `check`.
fn crash_log_note(loaded: &mut Loaded, path: &std::path::Path) -> Option<String> {
    let bytes = crash_log::read_file(path).ok()?;
    let image = match LogImage::parse(&bytes) {
        Ok(image) => image,
        Err(e) => {
            return Some(format!(
                "note: crash log {}: unusable, would be ignored ({e})",
                path.display()
            ))
        }
    };
    let at = crash_log::Point {
        checkpoint_generation: loaded.sb.checkpoint_generation.get(),
        journal_seq: loaded.journal_end_seq,
    };
    Some(match image.pending(&crash_log::Identity::of(&loaded.sb), at) {
        Pending::Apply([]) => format!("note: crash log {}: nothing to add", path.display()),
        Pending::Apply(records) => match records.iter().enumerate().try_for_each(|(i, r)| {
            loaded.table.validate(r).map_err(|e| format!("record {i}: {e}"))?;
            loaded.table.apply(r);
            Ok::<(), String>(())
        }) {
            Err(e) => format!(
                "note: crash log {}: unusable, would be ignored ({e})",
                path.display()
            ),
            Ok(()) => format!(
            "note: crash log {}: {} records the last daemon acknowledged but did not journal; the next open applies them",
            path.display(),
            records.len()
        ),
        },
        Pending::Ignore(why) => format!(
            "note: crash log {}: would be ignored ({why})",
            path.display()
        ),
    })
}

/// The result of an offline metadata check.
#[derive(Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub ok: bool,
    pub findings: Vec<String>,
    /// The on-disk format version the superblock carries.
    pub format_version: Option<u32>,
    pub mode: Option<String>,
    pub block_bytes: Option<u32>,
    pub cache_blocks_total: u64,
    pub cache_blocks_used: u64,
    pub cache_blocks_dirty: u64,
    pub clean_shutdown: Option<bool>,
    pub journal_pages_to_replay: u64,
    /// The volumes the superblock records: name and origin bytes.
    #[serde(default)]
    pub volumes: Vec<CheckedVolume>,
}

/// A volume as `check` found it recorded.
#[derive(Debug, Default, serde::Serialize)]
pub struct CheckedVolume {
    pub name: String,
    pub origin_bytes: u64,
}

/// What each superblock copy holds.
fn superblock_copies(cache: &DeviceRef) -> Vec<String> {
    match read_superblocks(cache) {
        Ok(copies) => copies
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                Ok(sb) => format!(
                    "superblock copy {i}: valid, generation {}",
                    sb.generation.get()
                ),
                Err(e) => format!("superblock copy {i}: INVALID ({e})"),
            })
            .collect(),
        Err(e) => vec![format!("cannot read superblocks: {e}")],
    }
}

/// An origin that shrank is damage; one that grew, a note (`check_origin`).
/// `whose`: "origin", or "volume NAME's origin".
fn origin_size_finding(whose: &str, recorded: u64, now: u64) -> Option<String> {
    if now < recorded {
        Some(format!(
            "DAMAGE: {whose} has {now} bytes but the cache records {recorded}: it shrank"
        ))
    } else if now > recorded {
        Some(format!(
            "{whose} has {now} bytes, the cache records {recorded}: an open takes it only on \
             the word that it grew (`tiercache serve --origin-grew`)"
        ))
    } else {
        None
    }
}

/// Checks the metadata without writing anything. `origin_bytes` is the
/// origin's size if known (else the recorded size is used).
pub fn check(cache: &DeviceRef, origin_bytes: Option<u64>) -> CheckReport {
    check_with_crash_log(cache, origin_bytes, &CrashLogs::None)
}

/// `check`, also saying what the crash logs `logs` would add at the next
/// open (a note, never damage: the log is not metadata on disk).
pub fn check_with_crash_log(
    cache: &DeviceRef,
    origin_bytes: Option<u64>,
    logs: &CrashLogs,
) -> CheckReport {
    check_volumes(cache, &[origin_bytes], logs)
}

/// Each volume's size for `check`'s load: its origin's as given (in the
/// order of the volumes not removed), else the recorded one; what differs
/// from the record, and each volume removed while served, is noted.
fn checked_sizes(
    volumes: &[super::format::VolumeEntry],
    origin_bytes: &[Option<u64>],
    findings: &mut Vec<String>,
) -> Vec<u64> {
    let mut given = origin_bytes.iter();
    let mut sizes = Vec::with_capacity(volumes.len());
    for v in volumes {
        if v.removed {
            findings.push(format!(
                "note: volume {} was removed while served; the next open takes its record out",
                v.name
            ));
            sizes.push(v.bytes);
            continue;
        }
        let now = given.next().copied().flatten().unwrap_or(v.bytes);
        let whose = match volumes.len() {
            1 => "origin".to_string(),
            _ => format!("volume {}'s origin", v.name),
        };
        findings.extend(origin_size_finding(&whose, v.bytes, now));
        sizes.push(now);
    }
    sizes
}

/// `check_with_crash_log` for a cache of several origins: `origin_bytes[v]`
/// is volume `v`'s origin's size if known (missing or `None`: the recorded
/// size is used).
pub fn check_volumes(
    cache: &DeviceRef,
    origin_bytes: &[Option<u64>],
    logs: &CrashLogs,
) -> CheckReport {
    let mut findings = superblock_copies(cache);
    let mut report = CheckReport::default();
    let sb = match current_superblock(cache) {
        Ok(sb) => sb,
        Err(e) => {
            findings.push(format!("DAMAGE: {e}"));
            report.findings = findings;
            return report;
        }
    };
    report.format_version = Some(sb.version.get());
    report.mode = Mode::from_u32(sb.mode.get()).map(|m| m.name().to_string());
    report.block_bytes = Some(sb.block_bytes.get());
    report.clean_shutdown = Some(sb.clean_shutdown.get() == 1);
    let volumes = sb.volume_list();
    let (live, gone) = sb.without_removed();
    let live_count = volumes.len() - gone.len();
    if origin_bytes.len() > 1 && origin_bytes.len() != live_count {
        findings.push(format!(
            "DAMAGE: the cache holds {live_count} volumes, but {} origins were given",
            origin_bytes.len()
        ));
    }
    let sizes = checked_sizes(&volumes, origin_bytes, &mut findings);
    report.volumes = (live.volume_list().into_iter())
        .map(|v| CheckedVolume {
            name: v.name,
            origin_bytes: v.bytes,
        })
        .collect();
    let mut problems = Vec::new();
    match load(cache, sb, &sizes, Some(&mut problems)) {
        Ok(mut l) => {
            report.cache_blocks_total = l.layout.slot_count;
            report.cache_blocks_used = l.table.used();
            report.cache_blocks_dirty = l.table.dirty_count();
            report.journal_pages_to_replay = l.pages_replayed;
            findings.extend(crash_log_notes(&mut l, logs));
            findings.extend(l.tail_note.clone().map(|n| format!("note: {n}")));
            if let Err(e) = finish_removals(cache, &mut l, &gone) {
                problems.push(e.to_string());
            }
        }
        Err(e) => problems.push(e.to_string()),
    }
    report.ok = problems.is_empty() && !findings.iter().any(|f| f.starts_with("DAMAGE"));
    findings.extend(problems.into_iter().map(|p| format!("DAMAGE: {p}")));
    report.findings = findings;
    report
}
