//! Reliability scenarios 6, 7 and 11 (the metadata loader):
//!
//! - **Metadata corruption.** Caches after a clean shutdown and after a
//!   dirty one (abandoned with dirty blocks and a journal to replay) get
//!   random bytes flipped in one metadata region per trial: superblock copy
//!   0 and 1 (the current and the older one), the superblock padding, the
//!   live journal pages and the unused ones, the current checkpoint area and
//!   the inactive one (regions from `Layout` and the current superblock).
//!   Open must refuse with a clear error or recover, and never serve wrong
//!   data: every block of an opened volume is compared with the model. The
//!   one loss that cannot be told from a crash is the last commit of a dirty
//!   journal, when the damage hits its pages: that commit may be rolled back,
//!   exactly as if the power had failed while it was written, and `check`
//!   says so. `check` (and `tiercache check` for a sample) names the damaged
//!   region; a refused open writes nothing.
//! - **Wrong origin.** A dirty cache given another origin (another device
//!   of the same size, another size, the same path holding another file) is
//!   refused by the engine and by the CLI, and neither device is written.
//! - **Loader fuzzing in the suite.** Seeded mutations of real metadata
//!   images go through `tiercache::engine::load_fuzz::exercise`, the body of
//!   the `metadata_load` fuzz target.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::fault::FaultDevice;
use tiercache::device::{fnv1a64, open_device};
use tiercache::engine::format::{parse_journal_page, Layout, Superblock, PAGE_BYTES};
use tiercache::engine::load_fuzz::{self, Outcome};
use tiercache::engine::recovery::check;
use tiercache::engine::{CreateOptions, Engine, EngineError, Mode, OpenOptions};

use common::SectorModel;

const BS: u64 = 4096;

// ---------------------------------------------------------------------------
// Metadata corruption
// ---------------------------------------------------------------------------

/// A cache image and what its volume must hold.
struct Base {
    label: String,
    cache: Vec<u8>,
    origin: Vec<u8>,
    layout: Layout,
    exact: SectorModel,
    /// `exact` with the last commit's writes still pending: what the volume
    /// may hold when that commit's journal pages are damaged.
    last_commit_lost: SectorModel,
}

fn write_random(engine: &Engine, model: &mut SectorModel, rng: &mut ChaCha8Rng) {
    let sectors = model.sectors();
    let n = if rng.gen_bool(0.7) {
        BS / 512
    } else {
        rng.gen_range(1..BS / 512)
    };
    let first = if n == BS / 512 {
        rng.gen_range(0..sectors / (BS / 512)) * (BS / 512)
    } else {
        rng.gen_range(0..=sectors - n)
    };
    let v = model.issue_write(first, n);
    engine
        .write(first * 512, &common::stamped(first, n, v), false)
        .unwrap();
}

/// `commits` flushes of a few writes each (with periodic writeback, so
/// there are clean blocks, evictions and a checkpoint once the journal is
/// half full), and a last commit; then a clean shutdown (after a few more
/// writes) or an abandoned engine.
fn build_base(
    clean: bool,
    slots: u64,
    origin_bytes: u64,
    commits: u64,
    last_commit_blocks: u64,
    seed: u64,
) -> Base {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cache_bytes = common::cache_bytes_for(slots, BS as u32);
    let (cache, cache_ref) = common::fault_dev("cache", cache_bytes, 0);
    let origin = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(origin_bytes),
        0,
    ));
    let opts = CreateOptions {
        writeback: common::held_writeback(),
        ..Default::default()
    };
    Engine::create(cache_ref.clone(), origin.clone(), &opts)
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(cache_ref, origin.clone(), &common::no_bg()).unwrap();
    let mut model = SectorModel::new(origin_bytes / 512);
    for i in 0..commits {
        for _ in 0..rng.gen_range(1..=3) {
            write_random(&engine, &mut model, &mut rng);
        }
        if i % 10 == 9 {
            engine.write_back_all(&mut |_, _| {}).unwrap();
        }
        engine.flush().unwrap();
        model.flush_done();
    }
    // The last commit: one write, or (`last_commit_blocks` > 254) enough
    // whole blocks that its records fill two journal pages.
    if last_commit_blocks == 1 {
        write_random(&engine, &mut model, &mut rng);
    } else {
        for b in 0..last_commit_blocks {
            let first = b * BS / 512;
            let v = model.issue_write(first, BS / 512);
            engine
                .write(first * 512, &common::stamped(first, BS / 512, v), false)
                .unwrap();
        }
    }
    let last_commit_lost = model.clone();
    engine.flush().unwrap();
    model.flush_done();
    let last_commit_lost = if clean {
        for _ in 0..3 {
            write_random(&engine, &mut model, &mut rng);
        }
        engine.close().unwrap();
        model.flush_done();
        model.clone()
    } else {
        assert!(engine.dirty_blocks() > 0);
        engine.abandon();
        last_commit_lost
    };
    Base {
        label: format!(
            "{} shutdown, {slots} slots",
            if clean { "clean" } else { "dirty" }
        ),
        cache: cache.snapshot_current(),
        origin: origin.snapshot_current(),
        layout: Layout::compute(cache_bytes, BS as u32).unwrap(),
        exact: model,
        last_commit_lost,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Checked metadata: damage must be refused, or recovered without loss.
    Checked,
    /// The pages of the last commit in the journal: as `Checked`, but that
    /// commit may be lost (damage there looks like a commit torn by a crash).
    LastCommit,
    /// Bytes nothing reads (padding, unused journal pages, the inactive
    /// checkpoint): no effect at all.
    Unused,
}

struct Region {
    name: String,
    /// What `check` must mention when it reports the damage.
    keyword: String,
    ranges: Vec<(usize, usize)>,
    kind: Kind,
}

fn superblocks(image: &[u8]) -> [Option<Superblock>; 2] {
    [0usize, 1].map(|c| Superblock::parse(&image[c * 4096..(c + 1) * 4096]).ok())
}

fn current_copy(image: &[u8]) -> usize {
    match superblocks(image) {
        [Some(a), Some(b)] => usize::from(b.generation.get() > a.generation.get()),
        [Some(_), None] => 0,
        [None, Some(_)] => 1,
        [None, None] => panic!("no valid superblock"),
    }
}

fn regions(base: &Base) -> Vec<Region> {
    let image = &base.cache;
    let layout = &base.layout;
    let cur = current_copy(image);
    let sb = superblocks(image)[cur].expect("current superblock");
    let page = |off: u64| (off as usize, (off + PAGE_BYTES) as usize);
    let mut out = Vec::new();
    for c in 0..2usize {
        out.push(Region {
            name: format!(
                "superblock copy {c} ({})",
                if c == cur { "current" } else { "older" }
            ),
            keyword: format!("superblock copy {c}"),
            ranges: vec![(c * 4096, c * 4096 + 256)],
            kind: Kind::Checked,
        });
    }
    out.push(Region {
        name: "superblock padding".into(),
        keyword: String::new(),
        ranges: vec![(256, 4096), (4096 + 256, 8192)],
        kind: Kind::Unused,
    });
    // The live journal: (page range, first page of its commit).
    let start = sb.journal_replay_seq.get();
    let mut live = Vec::new();
    let mut seq = start;
    while seq < start + layout.journal_pages {
        let (a, b) = page(layout.journal_page_offset(seq));
        match parse_journal_page(&image[a..b]) {
            Ok(p) if p.seq == seq => live.push(((a, b), p.commit_first_seq)),
            _ => break,
        }
        seq += 1;
    }
    let unused: Vec<(usize, usize)> = (0..layout.journal_pages)
        .map(|k| page(layout.journal_offset + k * PAGE_BYTES))
        .filter(|r| !live.iter().any(|(l, _)| l == r))
        .collect();
    if let Some(&(_, last_commit)) = live.last() {
        let (last, earlier): (Vec<_>, Vec<_>) =
            live.iter().partition(|(_, first)| *first == last_commit);
        out.push(Region {
            name: format!("journal, last commit ({} pages)", last.len()),
            keyword: "journal page".into(),
            ranges: last.iter().map(|(r, _)| *r).collect(),
            kind: Kind::LastCommit,
        });
        if !earlier.is_empty() {
            out.push(Region {
                name: format!("journal, {} earlier live pages", earlier.len()),
                keyword: "journal page".into(),
                ranges: earlier.iter().map(|(r, _)| *r).collect(),
                kind: Kind::Checked,
            });
        }
    }
    out.push(Region {
        name: "journal, unused pages".into(),
        keyword: String::new(),
        ranges: unused,
        kind: Kind::Unused,
    });
    let area = sb.checkpoint_area.get() as usize;
    for (a, kind, what) in [
        (area, Kind::Checked, "current"),
        (1 - area, Kind::Unused, "inactive"),
    ] {
        out.push(Region {
            name: format!("checkpoint area {a} ({what})"),
            keyword: format!("checkpoint area {a}"),
            ranges: (0..layout.checkpoint_pages)
                .map(|p| page(layout.checkpoint_offset[a] + p * PAGE_BYTES))
                .collect(),
            kind,
        });
    }
    out
}

#[derive(Default, Debug)]
struct Tally {
    trials: u64,
    bytes: u64,
    refused: u64,
    recovered: u64,
    last_commit_lost: u64,
    no_effect: u64,
    cli_checks: u64,
}

/// Flips 1..=4 random bytes of `region` in a copy of the image.
fn corrupt(image: &[u8], region: &Region, rng: &mut ChaCha8Rng) -> (Vec<u8>, u64) {
    let mut img = image.to_vec();
    let n = rng.gen_range(1..=4u64);
    for _ in 0..n {
        let (a, b) = region.ranges[rng.gen_range(0..region.ranges.len())];
        img[rng.gen_range(a..b)] ^= rng.gen_range(1..=255u8);
    }
    (img, n)
}

/// One corrupted image: open, verify, check. Returns the outcome name.
fn trial(base: &Base, region: &Region, img: Vec<u8>, deep: bool) -> Result<&'static str, String> {
    let origin_bytes = base.origin.len() as u64;
    let (cache_dev, cache) = common::restart_dev("cache", img, 1);
    let (origin_dev, origin) = common::restart_dev("origin", base.origin.clone(), 2);
    let report = check(&cache, Some(origin_bytes));
    let names_it = report.findings.iter().any(|f| f.contains(&region.keyword));
    let engine = match Engine::open(cache.clone(), origin.clone(), &common::no_bg()) {
        Err(e) => {
            if region.kind == Kind::Unused {
                return Err(format!("damage to unused bytes made open refuse: {e}"));
            }
            if !matches!(
                e,
                EngineError::Corrupt { .. } | EngineError::NotACache { .. }
            ) {
                return Err(format!("refused with an unclear error: {e}"));
            }
            if report.ok || !names_it {
                return Err(format!(
                    "open refused ({e}) but check does not name '{}' as damaged: {:?}",
                    region.keyword, report.findings
                ));
            }
            if cache_dev.writes() + origin_dev.writes() != 0 {
                return Err("a refused open wrote a device".into());
            }
            return Ok("refused");
        }
        Ok(e) => e,
    };
    let volume = common::read_volume(&engine)?;
    let outcome = if base.exact.verify(&volume).is_ok() {
        if region.kind == Kind::Unused {
            if !report.ok {
                return Err(format!(
                    "check reports damage in unused bytes: {:?}",
                    report.findings
                ));
            }
            "no effect"
        } else {
            "recovered"
        }
    } else {
        match region.kind {
            Kind::LastCommit => {
                base.last_commit_lost
                    .verify(&volume)
                    .map_err(|e| format!("wrong data served: {e}"))?;
                "last commit lost"
            }
            _ => {
                let e = base.exact.verify(&volume).unwrap_err();
                return Err(format!("wrong data served: {e}"));
            }
        }
    };
    if region.kind != Kind::Unused && !names_it {
        return Err(format!(
            "opened ({outcome}) but check does not name '{}': {:?}",
            region.keyword, report.findings
        ));
    }
    if deep {
        common::detach_and_compare(&engine, &*origin, &volume)?;
    }
    Ok(outcome)
}

/// `tiercache check --cache FILE` on a corrupted image: exit 1 when the
/// engine's check reports damage, else 0; the region named whenever the
/// engine's check names it (as damage, an invalid copy or a note).
fn cli_check(dir: &Path, img: &[u8], region: &Region, origin_bytes: u64) -> Result<(), String> {
    let path = dir.join("corrupt-cache.img");
    std::fs::write(&path, img).unwrap();
    let (_, cache) = common::restart_dev("cache", img.to_vec(), 0);
    let report = check(&cache, Some(origin_bytes));
    let named =
        region.kind != Kind::Unused && report.findings.iter().any(|f| f.contains(&region.keyword));
    let out = tc(dir, &["check", "--cache", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let code = out.status.code();
    if named && !text.contains(&region.keyword) {
        return Err(format!(
            "tiercache check does not name '{}':\n{text}",
            region.keyword
        ));
    }
    if report.ok {
        (code == Some(0))
            .then_some(())
            .ok_or_else(|| format!("tiercache check exit {code:?} on intact metadata:\n{text}"))
    } else if code != Some(5) || !text.contains(&region.keyword) {
        Err(format!(
            "tiercache check exit {code:?}, expected 5 (damaged) naming '{}':\n{text}",
            region.keyword
        ))
    } else {
        Ok(())
    }
}

fn corruption_trials(base: &Base, trials_per_region: u64, seed: u64, cli_dir: &Path) -> Tally {
    let mut tally = Tally::default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for region in regions(base) {
        for t in 0..trials_per_region {
            let (img, n) = corrupt(&base.cache, &region, &mut rng);
            if t == 0 {
                cli_check(cli_dir, &img, &region, base.origin.len() as u64).unwrap_or_else(|e| {
                    panic!("{}: {}: {e}", base.label, region.name);
                });
                tally.cli_checks += 1;
            }
            let outcome = trial(base, &region, img, t % 8 == 0).unwrap_or_else(|e| {
                panic!(
                    "metadata corruption ({}), {} trial {t} (seed {seed}): {e}",
                    base.label, region.name
                )
            });
            tally.trials += 1;
            tally.bytes += n;
            match outcome {
                "refused" => tally.refused += 1,
                "recovered" => tally.recovered += 1,
                "last commit lost" => tally.last_commit_lost += 1,
                _ => tally.no_effect += 1,
            }
        }
    }
    eprintln!(
        "metadata corruption ({}): {} trials, {} bytes flipped: {} refused, {} recovered intact, {} lost only the last commit (damaged journal tail), {} no effect (unused bytes); {} checked with the CLI",
        base.label,
        tally.trials,
        tally.bytes,
        tally.refused,
        tally.recovered,
        tally.last_commit_lost,
        tally.no_effect,
        tally.cli_checks
    );
    tally
}

fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("reliability-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

#[test]
fn corrupted_metadata_is_refused_or_recovered_never_served_wrong() {
    let dir = scratch_dir();
    let per_region = common::scaled(50, 800);
    for (clean, seed) in [(true, 1u64), (false, 2)] {
        // 160 commits: the journal passes half full, so both checkpoint
        // areas and both superblock copies have been used.
        let base = build_base(clean, 24, 1 << 20, 160, 1, seed);
        corruption_trials(&base, per_region, seed, dir.path());
    }
}

/// A checkpoint of two entry pages, and (dirty) a last commit of two journal pages.
#[test]
fn corrupted_metadata_multi_page_checkpoint_and_commit() {
    let dir = scratch_dir();
    let per_region = common::scaled(8, 150);
    for (clean, seed) in [(true, 3u64), (false, 4)] {
        let base = build_base(clean, 600, 4 << 20, 140, 300, seed);
        assert_eq!(base.layout.entry_pages(), 2);
        if !clean {
            assert!(
                regions(&base)
                    .iter()
                    .any(|r| r.kind == Kind::LastCommit && r.ranges.len() == 2),
                "the last commit does not span two journal pages"
            );
        }
        corruption_trials(&base, per_region, seed, dir.path());
    }
}

// Regressions found by the corruption trials and the loader mutations.

/// A cache shut down cleanly with writes the shutdown's checkpoint alone
/// committed; returns (image, origin image, the writes' data).
fn closed_with_checkpoint_only_writes() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (cache, cache_ref) = common::fault_dev("cache", common::cache_bytes_for(24, 4096), 0);
    let origin = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(1 << 20),
        0,
    ));
    Engine::create(cache_ref.clone(), origin.clone(), &CreateOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let engine = Engine::open(cache_ref, origin.clone(), &common::no_bg()).unwrap();
    let data = common::stamped(0, 16, 1);
    engine.write(0, &data, false).unwrap();
    engine.close().unwrap();
    (cache.snapshot_current(), origin.snapshot_current(), data)
}

/// Fixed: damage to the current superblock copy made open fall back to the
/// older copy, which names the checkpoint before the last one, and serve
/// the volume as it was then: the writes the last checkpoint committed
/// were silently gone. Open now refuses (the inactive checkpoint area holds
/// a newer complete checkpoint), and `check` names the copy.
#[test]
fn damaged_current_superblock_is_refused_when_the_older_copy_is_out_of_date() {
    let (mut image, origin_img, data) = closed_with_checkpoint_only_writes();
    let cur = current_copy(&image);
    image[cur * 4096 + 20] ^= 0x10;
    let (cache_dev, cache) = common::restart_dev("cache", image.clone(), 0);
    let (_, origin) = common::restart_dev("origin", origin_img.clone(), 0);
    let err = Engine::open(cache.clone(), origin, &common::no_bg())
        .err()
        .expect("opened from an out-of-date superblock copy");
    assert!(
        err.to_string().contains("corrupted")
            && err
                .to_string()
                .contains(&format!("superblock copy {cur} is damaged")),
        "{err}"
    );
    assert_eq!(cache_dev.writes(), 0);
    let report = check(&cache, Some(1 << 20));
    assert!(!report.ok);
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.starts_with("DAMAGE") && f.contains("out of date")),
        "{:?}",
        report.findings
    );
    // Damage to the older copy is harmless: the current one is used.
    let mut image = closed_with_checkpoint_only_writes().0;
    image[(1 - cur) * 4096 + 20] ^= 0x10;
    let (_, cache) = common::restart_dev("cache", image, 0);
    let (_, origin) = common::restart_dev("origin", origin_img, 0);
    let engine = Engine::open(cache, origin, &common::no_bg()).unwrap();
    assert_eq!(engine.read(0, 16 * 512).unwrap()[..], data[..]);
}

/// Fixed: a superblock with a valid checksum but a journal replay sequence
/// near 2^64 overflowed the replay loop (a panic with overflow checks, a
/// wrong replay without). Such values are now refused as damage.
#[test]
fn impossibly_large_sequence_numbers_are_refused_not_a_panic() {
    let (image, origin_img, _) = closed_with_checkpoint_only_writes();
    for (field_offset, what) in [
        (120usize, "journal replay sequence"),
        (112, "checkpoint generation"),
        (16, "generation"),
    ] {
        let mut image = image.clone();
        for copy in 0..2 {
            let page = &mut image[copy * 4096..copy * 4096 + 4096];
            page[field_offset..field_offset + 8].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
            // Resealed: the damage passes the checksum.
            let crc = crc32c::crc32c(&page[..252]);
            page[252..256].copy_from_slice(&crc.to_le_bytes());
        }
        let (_, cache) = common::restart_dev("cache", image, 0);
        let (_, origin) = common::restart_dev("origin", origin_img.clone(), 0);
        let err = Engine::open(cache.clone(), origin, &common::no_bg())
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert!(err.to_string().contains(what), "{what}: {err}");
        assert!(!check(&cache, None).ok, "{what}");
    }
}

/// The same for the second page of a last commit of two: the first page is
/// intact, replay ends before the commit, and `check` names the page that
/// failed. Found by the long form's corruption trials (dirty shutdown,
/// seed 4, trial 0 of "journal, last commit (2 pages)"): open lost the
/// last commit, as it should, and `check` said nothing of the journal.
#[test]
fn check_names_a_damaged_later_page_of_the_last_commit() {
    let base = build_base(false, 600, 4 << 20, 140, 300, 4);
    let last = regions(&base)
        .into_iter()
        .find(|r| r.kind == Kind::LastCommit && r.ranges.len() == 2)
        .expect("a last commit of two pages");
    for (i, range) in last.ranges.iter().enumerate().rev() {
        let mut image = base.cache.clone();
        image[range.0 + 40] ^= 0x01;
        let (_, cache) = common::restart_dev("cache", image, 0);
        let report = check(&cache, Some(4 << 20));
        assert!(report.ok, "page {i}: {:?}", report.findings);
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.starts_with("note: journal page")
                    && f.contains("fails its checks")
                    && f.contains("replay ends before the commit")),
            "page {i}: {:?}",
            report.findings
        );
    }
}

/// Damage to the last page of the journal cannot be told from a commit torn
/// by a crash, so replay ends before it (the last commit is lost); `check`
/// now says so instead of nothing.
#[test]
fn check_names_a_damaged_last_journal_page() {
    let base = build_base(false, 24, 1 << 20, 3, 1, 9);
    let last = regions(&base)
        .into_iter()
        .find(|r| r.kind == Kind::LastCommit)
        .expect("a last commit");
    let mut image = base.cache.clone();
    image[last.ranges[0].0 + 40] ^= 0x01;
    let (_, cache) = common::restart_dev("cache", image, 0);
    let report = check(&cache, Some(1 << 20));
    assert!(report.ok, "{:?}", report.findings);
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.starts_with("note: journal page") && f.contains("fails its checks")),
        "{:?}",
        report.findings
    );
}

// ---------------------------------------------------------------------------
// Wrong origin
// ---------------------------------------------------------------------------

use daemon::cli_in as tc;

fn file_hash(path: &Path) -> u64 {
    fnv1a64(&std::fs::read(path).expect("read file"))
}

/// A crashed writeback cache holding dirty data for a FaultDevice origin.
fn dirty_fault_cache() -> (Vec<u8>, Vec<u8>) {
    let origin_bytes = 1 << 20;
    let (cache, cache_ref) = common::fault_dev("cache", common::cache_bytes_for(24, 4096), 0);
    let origin = Arc::new(FaultDevice::from_image(
        "origin",
        common::initial_origin(origin_bytes),
        0,
    ));
    let engine = Engine::create(cache_ref, origin.clone(), &CreateOptions::default()).unwrap();
    engine.write(0, &common::stamped(0, 64, 1), false).unwrap();
    engine.flush().unwrap();
    assert!(engine.dirty_blocks() > 0);
    engine.abandon();
    (cache.snapshot_current(), origin.snapshot_current())
}

#[test]
fn dirty_cache_refuses_another_origin_and_writes_nothing() {
    let (cache_img, origin_img) = dirty_fault_cache();
    let size = origin_img.len() as u64;
    let cases: Vec<(&str, Arc<FaultDevice>)> = vec![
        (
            "another device of the same size",
            Arc::new(FaultDevice::from_image(
                "another-origin",
                origin_img.clone(),
                0,
            )),
        ),
        (
            "the same device grown, not said so",
            Arc::new(FaultDevice::new("origin", size * 2, 0)),
        ),
        (
            "the same device shrunk",
            Arc::new(FaultDevice::new("origin", size / 2, 0)),
        ),
    ];
    for (what, other) in cases {
        let other_before = other.snapshot_current();
        let (cache_dev, cache) = common::restart_dev("cache", cache_img.clone(), 0);
        for opts in [OpenOptions::default(), common::no_bg()] {
            let err = Engine::open(cache.clone(), other.clone(), &opts)
                .err()
                .unwrap_or_else(|| panic!("{what}: opened"));
            assert!(
                matches!(err, EngineError::OriginMismatch { .. })
                    && err.to_string().contains("origin mismatch"),
                "{what}: {err}"
            );
        }
        assert_eq!(
            cache_dev.writes() + other.writes(),
            0,
            "{what}: a device was written"
        );
        assert!(
            cache_dev.snapshot_current() == cache_img,
            "{what}: cache changed"
        );
        assert!(
            other.snapshot_current() == other_before,
            "{what}: origin changed"
        );
    }
    // The right origin still opens, with the dirty data.
    let (_, cache) = common::restart_dev("cache", cache_img, 0);
    let (_, origin) = common::restart_dev("origin", origin_img, 0);
    let engine = Engine::open(cache, origin, &common::no_bg()).unwrap();
    assert!(engine.dirty_blocks() > 0);
    assert_eq!(
        engine.read(0, 64 * 512).unwrap()[..],
        common::stamped(0, 64, 1)[..]
    );
}

/// An origin that grew under a crashed writeback cache (lvextend, a
/// longer file, `rbd resize`): without the operator's word
/// (`origin_grew`) every open refuses it, writing nothing (a loop device
/// or an NBD URI is told from another only by its size); `check` notes it.
/// Told, a read-only open takes the new size and writes nothing; the open
/// takes it, keeps the dirty data, caches the new blocks like any other
/// and writes the size down, so a crash after it reopens at the new size
/// with no word needed. The old size afterwards is a shrink, refused
/// without a write, told or not.
#[test]
fn a_grown_origin_is_taken_at_open() {
    let (cache_img, origin_img) = dirty_fault_cache();
    let size = origin_img.len() as u64;
    let mut grown_img = origin_img.clone();
    grown_img.resize(2 * size as usize, 0);
    let (cache_dev, cache) = common::restart_dev("cache", cache_img.clone(), 0);
    let (origin_dev, origin) = common::restart_dev("origin", grown_img, 0);

    let grew = |o: OpenOptions| OpenOptions {
        origin_grew: true,
        ..o
    };
    for opts in [OpenOptions::default(), common::no_bg()] {
        let err = Engine::open(cache.clone(), origin.clone(), &opts)
            .err()
            .expect("a larger origin opened untold");
        assert!(err.to_string().contains("--origin-grew"), "{err}");
        let err = Engine::open_read_only(cache.clone(), origin.clone(), &opts)
            .err()
            .expect("a larger origin opened read-only untold");
        assert!(err.to_string().contains("--origin-grew"), "{err}");
    }
    let ro = Engine::open_read_only(cache.clone(), origin.clone(), &grew(OpenOptions::default()))
        .unwrap();
    assert_eq!(ro.volume_bytes(), 2 * size);
    drop(ro);
    let report = check(&cache, Some(2 * size));
    assert!(report.ok, "{:?}", report.findings);
    assert_eq!(report.format_version, Some(2));
    assert!(
        report.findings.iter().any(|f| f.contains("--origin-grew")),
        "{:?}",
        report.findings
    );
    assert_eq!(cache_dev.writes() + origin_dev.writes(), 0, "a look wrote");

    let engine = Engine::open(cache, origin, &grew(common::no_bg())).unwrap();
    assert_eq!(engine.volume_bytes(), 2 * size);
    assert!(engine.dirty_blocks() > 0);
    assert_eq!(
        engine.read(0, 64 * 512).unwrap()[..],
        common::stamped(0, 64, 1)[..]
    );
    // The old partial-free end and the new half take writes like any block.
    let at = size + 3 * 4096;
    let new_data = common::stamped(at / 512, 16, 2);
    engine.write(at, &new_data, false).unwrap();
    engine.flush().unwrap();
    assert_eq!(
        engine.read(at, new_data.len() as u64).unwrap()[..],
        new_data[..]
    );
    engine.abandon();
    drop(engine);

    let cache_img = cache_dev.snapshot_current();
    let (_, cache) = common::restart_dev("cache", cache_img.clone(), 0);
    let (_, origin) = common::restart_dev("origin", origin_dev.snapshot_current(), 0);
    let engine = Engine::open(cache, origin, &common::no_bg()).unwrap();
    assert_eq!(engine.volume_bytes(), 2 * size);
    assert_eq!(
        engine.read(0, 64 * 512).unwrap()[..],
        common::stamped(0, 64, 1)[..]
    );
    assert_eq!(
        engine.read(at, new_data.len() as u64).unwrap()[..],
        new_data[..]
    );
    engine.abandon();
    drop(engine);

    // Given its old size back, the origin shrank: refused, nothing written.
    let (cache_dev, cache) = common::restart_dev("cache", cache_img.clone(), 0);
    let (origin_dev, origin) = common::restart_dev("origin", origin_img, 0);
    let err = Engine::open(cache.clone(), origin, &grew(common::no_bg()))
        .err()
        .expect("a shrunk origin opened");
    assert!(
        matches!(err, EngineError::OriginMismatch { .. }) && err.to_string().contains("shrink"),
        "{err}"
    );
    assert_eq!(
        cache_dev.writes() + origin_dev.writes(),
        0,
        "a refused open wrote"
    );
    let report = check(&cache, Some(size));
    assert!(!report.ok, "{:?}", report.findings);
}

/// Real files: the path the cache was created with now names another file
/// (same size, or another size), and another file is given directly; the
/// engine and every CLI command that opens the cache refuse, and no file
/// changes.
#[test]
fn dirty_cache_refuses_another_origin_file_engine_and_cli() {
    let dir = scratch_dir();
    let state = dir.path().join("state");
    let p = |n: &str| -> PathBuf { dir.path().join(n) };
    let origin_bytes = 4u64 << 20;
    let filled = |path: &Path, size: u64, salt: u8| {
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ salt | 1).collect();
        std::fs::write(path, data).unwrap();
    };
    let (origin, cache) = (p("origin.img"), p("cache.img"));
    filled(&origin, origin_bytes, 0);
    tiercache::device::file::create_file(&cache, 8 << 20).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let out = tc(
        &state,
        &["create", "--origin", &s(&origin), "--cache", &s(&cache)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Dirty data, then a crash.
    let engine = Engine::open(
        open_device(&s(&cache)).unwrap(),
        open_device(&s(&origin)).unwrap(),
        &common::no_bg(),
    )
    .unwrap();
    engine.write(0, &vec![0x5A; 1 << 20], false).unwrap();
    engine.flush().unwrap();
    assert!(engine.dirty_blocks() > 0);
    engine.abandon();
    drop(engine);

    // Same size, another file (a copy of the origin: same bytes, another inode).
    let copy = p("copy.img");
    std::fs::copy(&origin, &copy).unwrap();
    let bigger = p("bigger.img");
    filled(&bigger, origin_bytes * 2, 3);
    for (what, other) in [("a copy of the origin", &copy), ("a bigger file", &bigger)] {
        let err = Engine::open(
            open_device(&s(&cache)).unwrap(),
            open_device(&s(other)).unwrap(),
            &OpenOptions::default(),
        )
        .err()
        .unwrap_or_else(|| panic!("{what}: engine opened"));
        assert!(err.to_string().contains("origin mismatch"), "{what}: {err}");
    }
    // The registered path now names another file.
    let saved = p("saved-origin.img");
    std::fs::rename(&origin, &saved).unwrap();
    for (what, other) in [("a copy of the origin", &copy), ("a bigger file", &bigger)] {
        std::fs::copy(other, &origin).unwrap();
        let files = [&origin, &cache, &copy, &bigger];
        let hashes = || files.iter().map(|f| file_hash(f)).collect::<Vec<_>>();
        let before = hashes();
        for args in [
            vec!["status"],
            vec!["flush"],
            vec!["set-mode", "writethrough"],
            vec!["detach"],
        ] {
            let out = tc(&state, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            // 7: refused for safety (tiercache --help).
            assert_eq!(out.status.code(), Some(7), "{what}: {args:?}: {err}");
            assert!(err.contains("origin mismatch"), "{what}: {args:?}: {err}");
        }
        assert_eq!(hashes(), before, "{what}: a refused command wrote a file");
        std::fs::remove_file(&origin).unwrap();
    }
    // The real origin back: the dirty data is still there.
    std::fs::rename(&saved, &origin).unwrap();
    let out = tc(&state, &["detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = std::fs::File::open(&origin).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5A), "dirty data lost");
}

// ---------------------------------------------------------------------------
// The metadata loader under seeded mutation (the fuzz target's body)
// ---------------------------------------------------------------------------

/// Real metadata of the fuzz harness's device: fresh, dirty with a
/// journal, clean after a shutdown, after a checkpoint, in another mode.
fn seed_images() -> Vec<(&'static str, Vec<u8>)> {
    let origin_bytes = 256 << 10;
    let fresh = || {
        let (cache, cache_ref) = common::fault_dev("cache", load_fuzz::DEVICE_BYTES, 0);
        let origin = Arc::new(FaultDevice::from_image(
            "origin",
            common::initial_origin(origin_bytes),
            0,
        ));
        (cache, cache_ref, origin)
    };
    let mut out = Vec::new();
    for (name, mode, commits, clean) in [
        ("created", Mode::Writeback, 0u64, true),
        ("dirty-journal", Mode::Writeback, 6, false),
        ("clean-shutdown", Mode::Writeback, 6, true),
        ("checkpointed", Mode::Writeback, 140, false),
        ("writethrough-journal", Mode::Writethrough, 5, false),
        ("partial-journal", Mode::Writeback, 9, false),
        ("partial-checkpointed", Mode::Writeback, 150, true),
    ] {
        let (cache, cache_ref, origin) = fresh();
        let opts = CreateOptions {
            mode,
            ..Default::default()
        };
        let engine = Engine::create(cache_ref, origin, &opts).unwrap();
        let partial = name.starts_with("partial");
        for c in 0..commits {
            let block = c * 7 % 64;
            if partial {
                // Sub-block writes and reads: run records, sector maps.
                let sector = block * 8 + c % 8;
                engine
                    .write(sector * 512, &common::stamped(sector, 1, c + 1), false)
                    .unwrap();
                if c % 3 == 0 {
                    engine.read((block + 1) % 64 * BS, 1024).unwrap();
                }
            } else {
                engine
                    .write(block * BS, &common::stamped(block * 8, 8, c + 1), false)
                    .unwrap();
            }
            if c % 4 == 3 {
                engine.write_back_all(&mut |_, _| {}).unwrap();
            }
            engine.flush().unwrap();
        }
        if clean {
            engine.close().unwrap();
        } else {
            engine.abandon();
        }
        out.push((name, cache.snapshot_current()));
    }
    out
}

fn mutate(input: &mut Vec<u8>, rng: &mut ChaCha8Rng) {
    const INTERESTING: [u64; 10] = [
        0,
        1,
        2,
        255,
        4096,
        65_536,
        u32::MAX as u64,
        i64::MAX as u64,
        u64::MAX - 1,
        u64::MAX,
    ];
    // Mostly reseal, so mutations get past the checksums.
    input[0] = if rng.gen_bool(0.8) { 0x0F } else { rng.gen() };
    for _ in 0..rng.gen_range(1..=4) {
        let len = input.len();
        if len < 16 {
            break;
        }
        match rng.gen_range(0..10u32) {
            0..=3 => input[rng.gen_range(1..len)] ^= 1 << rng.gen_range(0..8),
            4..=5 => input[rng.gen_range(1..len)] = rng.gen(),
            6..=7 if len > 9 => {
                let at = rng.gen_range(1..len - 8);
                let v = INTERESTING[rng.gen_range(0..INTERESTING.len())];
                let v = if rng.gen_bool(0.5) {
                    v
                } else {
                    v.wrapping_add(rng.gen_range(0..4))
                };
                input[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            8 => input.truncate(rng.gen_range(1..=len)),
            _ => {
                // Copy a slice over another place (a page to another slot).
                let from = rng.gen_range(1..len);
                let n = rng.gen_range(1..=(len - from).min(512));
                let to = rng.gen_range(1..len);
                let chunk = input[from..from + n].to_vec();
                let n = n.min(len - to);
                input[to..to + n].copy_from_slice(&chunk[..n]);
            }
        }
    }
}

#[test]
fn metadata_loader_survives_mutated_images() {
    let seeds: Vec<Vec<u8>> = seed_images()
        .into_iter()
        .map(|(_, img)| load_fuzz::input_from_image(&img, 0x0F))
        .collect();
    for s in &seeds {
        assert_eq!(load_fuzz::exercise(s), Outcome::Opened, "an unmutated seed");
    }
    let runs = common::scaled(3000, 60_000);
    let (mut refused, mut opened, mut origin_not_tried) = (0u64, 0u64, 0u64);
    for i in 0..runs {
        let mut rng = ChaCha8Rng::seed_from_u64(i);
        let mut input = seeds[rng.gen_range(0..seeds.len())].clone();
        mutate(&mut input, &mut rng);
        let r = std::panic::catch_unwind(|| load_fuzz::exercise(&input));
        match r {
            Ok(Outcome::Refused) => refused += 1,
            Ok(Outcome::Opened) => opened += 1,
            Ok(Outcome::OriginNotTried) => origin_not_tried += 1,
            Err(_) => {
                let path =
                    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("metadata_load-{i}"));
                std::fs::write(&path, &input).unwrap();
                panic!(
                    "the metadata loader failed on mutation {i}; input saved to {} (replay with the fuzz target)",
                    path.display()
                );
            }
        }
    }
    eprintln!(
        "metadata loader: {runs} mutated images: {refused} refused, {opened} opened and used, {origin_not_tried} with an origin size not tried"
    );
}

/// Regenerates fuzz/seeds/metadata_load from real images:
/// `cargo test --test reliability_metadata -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/metadata_load");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, img) in seed_images() {
        let input = load_fuzz::input_from_image(
            &img,
            load_fuzz::FLAG_RESEAL_SUPERBLOCKS
                | load_fuzz::FLAG_RESEAL_CHECKPOINTS
                | load_fuzz::FLAG_RESEAL_JOURNAL
                | load_fuzz::FLAG_USE_VOLUME,
        );
        std::fs::write(dir.join(name), &input).unwrap();
        eprintln!("{name}: {} bytes", input.len());
    }
}

/// Inputs on which the fuzzer once found a loader bug
/// (fuzz/regressions/metadata_load/, named after the bug) must now pass.
#[test]
fn metadata_loader_fuzz_regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/metadata_load");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let r = std::panic::catch_unwind(|| load_fuzz::exercise(&input));
        assert!(r.is_ok(), "the loader fails on {}", path.display());
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
    eprintln!("metadata loader: {n} fuzz regression inputs pass");
}
