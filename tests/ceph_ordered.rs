//! Writeback in flush order over a real Ceph RBD image (issue 23): the
//! LSVD test of `tests/ordered_writeback.rs` with the daemon, a real
//! `kill -9` and Ceph as the origin.
//!
//! Per case: an image of sector-stamped version 0 in the single-node
//! cluster (`common/ceph.rs`); `tiercache create --writeback-order flush`
//! on it as `rbd://`, with a small cache file and eager writeback;
//! `tiercache serve`. A writer (tiercache's own NBD client) writes
//! sector-stamped data in groups, each ended by an NBD FLUSH, and records
//! the groups. Meanwhile `status --json` is polled; at a moment drawn from
//! the seed (in some cases: the first poll after it that finds a closed
//! group partly written back) the daemon is killed with SIGKILL. The
//! cache file is deleted; `rbd export` reads the image, and the origin
//! alone must pass the cut rule (`common/cut.rs`) at a group no older
//! than `flush_groups.done` of the last status read before the kill.
//!
//! librbd's cache in the daemon is, by seed, Ceph's default (writearound:
//! each write goes to the OSD as it is made, so a kill leaves part of a
//! group there) or a writeback cache that holds data until a flush
//! (`HOLDING_CACHE`: only what tiercache flushed is in Ceph).
//!
//! CI form: 2 cases (4-7 s beside the cluster's ~16 s up and down: 20-24 s
//! in all on the 2-core machines); long form (`TIERCACHE_LONG=1`): 12
//! (~45 s). A failure prints its seed;
//! `TIERCACHE_SEED=N cargo test --test ceph_ordered` runs that case alone
//! with the same workload, cache settings and kill plan (the moment of the
//! kill against the writer is timing, not replayed bit for bit).

#[path = "common/ceph.rs"]
mod ceph;
mod common;
#[path = "common/cut.rs"]
mod cut;
#[path = "common/daemon.rs"]
mod daemon;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ceph::Cluster;
use cut::FlushGroups;
use daemon::{cli_ok_in, wait_for_socket, KillOnDrop, BIN};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::device::nbd::NbdDevice;
use tiercache::device::BlockDevice;

const IMAGE_BYTES: u64 = 16 << 20;
const SECTORS: u64 = IMAGE_BYTES / 512;
/// Half the writes land in the first MiB: blocks rewritten in later groups
/// before their group reached the origin (older versions kept).
const HOT_SECTORS: u64 = (1 << 20) / 512;
/// The cache holds this many 4 KiB blocks: an eighth of the image.
const CACHE_BLOCKS: u64 = 512;
/// Longest a case waits for writeback caught mid-group before killing
/// anyway.
const AIM_LIMIT: Duration = Duration::from_secs(10);

/// What a seed decides.
#[derive(Debug)]
struct Plan {
    /// librbd holds written data until a flush (else Ceph's default).
    holding_cache: bool,
    /// The kill comes at the first poll after `kill_after_ms` that finds a
    /// closed group partly written back (else at the first poll after it).
    aim_mid_group: bool,
    kill_after_ms: u64,
    /// Writes per group: 1 to this.
    group_writes_max: u64,
}

impl Plan {
    fn draw(rng: &mut ChaCha8Rng) -> Plan {
        Plan {
            holding_cache: rng.gen_bool(0.5),
            aim_mid_group: rng.gen_bool(0.6),
            kill_after_ms: rng.gen_range(500..4000),
            group_writes_max: [4, 16, 64][rng.gen_range(0..3)],
        }
    }
}

/// The writer's counters, read by the test while it runs.
#[derive(Default)]
struct Progress {
    /// NBD FLUSH requests sent (the engine closes at most one group each).
    flushes_sent: AtomicU64,
    writes_acknowledged: AtomicU64,
}

/// Writes stamped sectors in groups, each ended by a flush, until a
/// request fails (the daemon is gone); returns the groups. Every group
/// takes at least one write, so the engine closes a group at each flush
/// and its group k is the writer's group k (checked against `status`).
fn write_groups(uri: &str, seed: u64, plan_max: u64, progress: &Progress) -> FlushGroups {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5752_4954);
    let mut groups = FlushGroups::new(SECTORS);
    let dev = NbdDevice::connect(uri, 1).unwrap_or_else(|e| panic!("connect to {uri}: {e}"));
    let mut version = 0;
    loop {
        for _ in 0..rng.gen_range(1..=plan_max) {
            let (first, n) = if rng.gen_bool(0.5) {
                // 4 KiB blocks, aligned.
                let n = 8 * rng.gen_range(1..=3);
                let span = if rng.gen_bool(0.5) {
                    HOT_SECTORS
                } else {
                    SECTORS
                };
                (rng.gen_range(0..span / 8 - 3) * 8, n)
            } else {
                // Sectors, unaligned.
                let n = rng.gen_range(1..=24);
                let span = if rng.gen_bool(0.5) {
                    HOT_SECTORS
                } else {
                    SECTORS
                };
                (rng.gen_range(0..=span - n), n)
            };
            version += 1;
            groups.write(first, n, version);
            if dev
                .write_at(&common::stamped(first, n, version), first * 512)
                .is_err()
            {
                return groups;
            }
            progress.writes_acknowledged.fetch_add(1, Ordering::SeqCst);
        }
        progress.flushes_sent.fetch_add(1, Ordering::SeqCst);
        if dev.flush().is_err() {
            return groups;
        }
        let k = groups.closed() as u64 + 1;
        groups.flushed(k);
        if rng.gen_bool(0.2) {
            // A pause: writeback catches up, and groups end on the origin.
            std::thread::sleep(Duration::from_micros(rng.gen_range(100..3000)));
        }
    }
}

/// `flush_groups` and the writeback counters of one `status --json`.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    open: u64,
    done: u64,
    closed_pending: u64,
    blocks_written_back: u64,
    shadows_written_back: u64,
}

fn status(state: &Path) -> Seen {
    let out = cli_ok_in(state, &["status", "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"));
    let g = &v["flush_groups"];
    let n = |x: &serde_json::Value| {
        x.as_u64()
            .unwrap_or_else(|| panic!("status --json lacks a field: {out}"))
    };
    Seen {
        open: n(&g["open"]),
        done: n(&g["done"]),
        closed_pending: n(&g["closed_pending"]),
        blocks_written_back: n(&v["stats"]["blocks_written_back"]),
        shadows_written_back: n(&v["stats"]["shadows_written_back"]),
    }
}

/// What one case reached.
struct Outcome {
    /// Groups the writer closed with a flush.
    closed: usize,
    /// `flush_groups.done` of the last status before the kill.
    done: u64,
    /// The latest cut the origin matched.
    cut: usize,
    /// Some but not all of the cut group's sectors hold its data: the
    /// kill came in the middle of that group's writeback.
    cut_partial: bool,
    /// The kill came while a closed group was partly written back.
    mid_group: bool,
    shadows_written_back: u64,
}

fn case(cluster: &Cluster, seed: u64) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let plan = Plan::draw(&mut rng);
    eprintln!(
        "ceph_ordered: seed {seed}: {plan:?} (replay: TIERCACHE_SEED={seed} cargo test --test \
         ceph_ordered)"
    );
    let work = ceph::workdir("ceph-ordered-");
    let dir = work.path();
    let image = format!("ordered-{seed}");
    cluster.import(&image, &common::initial_origin(IMAGE_BYTES), dir);

    let state = dir.join("state");
    let cache = dir.join("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(common::cache_bytes_for(CACHE_BLOCKS, 4096))
        .unwrap();
    // Eager writeback (common::eager_writeback): under way from 25% dirty
    // or a second's age, so the kill often finds it mid-group.
    cli_ok_in(
        &state,
        &[
            "create",
            "--origin",
            &cluster.uri(&image),
            "--cache",
            cache.to_str().unwrap(),
            "--mode",
            "writeback",
            "--writeback-order",
            "flush",
            "--writeback-high",
            "25",
            "--writeback-low",
            "10",
            "--writeback-age",
            "1",
            "--writeback-idle",
            "0",
        ],
    );
    let mut serve_cmd = Command::new(BIN);
    serve_cmd
        .arg("serve")
        .env("TIERCACHE_STATE_DIR", &state)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap());
    if plan.holding_cache {
        serve_cmd.env("CEPH_ARGS", ceph::holding_cache_args());
    }
    let mut serve = KillOnDrop(serve_cmd.spawn().unwrap());
    let sock = state.join("tc0.nbd");
    wait_for_socket(&sock);
    wait_for_socket(&state.join("tc0.sock"));
    let uri = format!("nbd+unix:///?socket={}", sock.display());

    let progress = Arc::new(Progress::default());
    let writer = {
        let progress = progress.clone();
        let max = plan.group_writes_max;
        std::thread::spawn(move || write_groups(&uri, seed, max, &progress))
    };
    let started = Instant::now();
    let kill_after = Duration::from_millis(plan.kill_after_ms);
    let mut last = Seen::default();
    let mut mid_group;
    loop {
        let seen = status(&state);
        // The engine closed no group the writer did not end with a flush
        // (read after the status: the count only grows). So the writer's
        // group k starts in the engine's group k or an earlier one, and
        // `done` read as the writer's groups never claims too much.
        let sent = progress.flushes_sent.load(Ordering::SeqCst);
        assert!(
            seen.open <= sent,
            "seed {seed}: the engine's open group is {} after {sent} flushes",
            seen.open
        );
        mid_group = seen.closed_pending > 0 && seen.blocks_written_back > last.blocks_written_back;
        last = seen;
        let due = started.elapsed() >= kill_after;
        if due && (mid_group || !plan.aim_mid_group || started.elapsed() >= kill_after + AIM_LIMIT)
        {
            break;
        }
        assert!(
            !writer.is_finished(),
            "seed {seed}: the writer stopped before the kill: {}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..20)));
    }
    serve.kill().unwrap();
    serve.wait().unwrap();
    let groups = writer.join().expect("the writer panicked");
    let writes = progress.writes_acknowledged.load(Ordering::SeqCst);

    // The cache device is gone: the origin alone.
    std::fs::remove_file(&cache).unwrap();
    let origin = cluster.export(&image, &dir.join("export.bin"));
    let cut = groups.check(&origin, last.done).unwrap_or_else(|e| {
        panic!(
            "seed {seed} ({plan:?}): {writes} writes in {} closed groups; the origin alone \
             breaks the rule: {e}\nreplay: TIERCACHE_SEED={seed} cargo test --test ceph_ordered",
            groups.closed()
        )
    });
    let cut = groups.reached_cut(&origin, cut);
    let (there, wrote) = groups.reached(&origin, cut);
    eprintln!(
        "ceph_ordered: seed {seed}: {writes} writes, {} groups closed, {} done at the last \
         status ({} pending, {} blocks written back), killed {:.1} s in{}; the origin is cut \
         at group {cut}, {there} of its {wrote} sectors there",
        groups.closed(),
        last.done,
        last.closed_pending,
        last.blocks_written_back,
        started.elapsed().as_secs_f64(),
        if mid_group { " mid-group" } else { "" },
    );
    Outcome {
        closed: groups.closed(),
        done: last.done,
        cut,
        cut_partial: there > 0 && there < wrote,
        mid_group,
        shadows_written_back: last.shadows_written_back,
    }
}

#[test]
fn a_killed_daemon_without_its_cache_leaves_a_consistent_image() {
    ceph::need_ceph();
    let replay = std::env::var("TIERCACHE_SEED").ok().map(|s| {
        s.parse::<u64>()
            .unwrap_or_else(|_| panic!("TIERCACHE_SEED must be a number, not {s:?}"))
    });
    let seeds: Vec<u64> = match replay {
        Some(seed) => vec![seed],
        None => {
            let base = common::seed();
            (0..common::scaled(2, 12)).map(|i| base + i).collect()
        }
    };
    let t0 = Instant::now();
    let cluster = Cluster::up();
    let cluster_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let outcomes: Vec<Outcome> = seeds.iter().map(|&seed| case(&cluster, seed)).collect();
    let cases_s = t1.elapsed().as_secs_f64();
    let mid = outcomes.iter().filter(|o| o.mid_group).count();
    let done: u64 = outcomes.iter().map(|o| o.done).sum();
    let past_done = outcomes.iter().filter(|o| o.cut as u64 > o.done).count();
    let partial = outcomes.iter().filter(|o| o.cut_partial).count();
    eprintln!(
        "ceph_ordered: {} cases in {cases_s:.1} s (cluster up in {cluster_s:.1} s): {} groups \
         closed, {done} known on the origin at the kill, {past_done} cut past that, {mid} \
         killed mid-group, {partial} with part of the cut group on the origin, {} older \
         versions written back",
        outcomes.len(),
        outcomes.iter().map(|o| o.closed).sum::<usize>(),
        outcomes.iter().map(|o| o.shadows_written_back).sum::<u64>(),
    );
    // Writeback ran before the kills: the rule was tested on groups that
    // reached Ceph, not on an untouched image.
    assert!(
        outcomes.iter().any(|o| o.done > 0),
        "no group reached the origin before any kill"
    );
}
