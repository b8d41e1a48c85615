//! Shared helpers for the engine tests.
#![allow(dead_code)]

use std::sync::Arc;

use tiercache::device::fault::FaultDevice;
use tiercache::device::DeviceRef;
use tiercache::engine::format::Layout;

/// Seeds read back from the environment, and seeded mutation.
pub mod mutation;
/// A cache and its origins as fault-injecting devices.
pub mod rig;

/// A cache device size holding about `slots` blocks of `block_bytes`.
pub fn cache_bytes_for(slots: u64, block_bytes: u32) -> u64 {
    Layout::device_bytes_for(block_bytes, slots)
}

pub fn fault_dev(name: &str, size: u64, seed: u64) -> (Arc<FaultDevice>, DeviceRef) {
    let d = Arc::new(FaultDevice::new(name, size, seed));
    let r: DeviceRef = d.clone();
    (d, r)
}

/// Deterministic content of one 512-byte sector at a given version
/// (version 0 is the origin's initial content).
pub fn sector_content(sector: u64, version: u64) -> [u8; 512] {
    let mut out = [0u8; 512];
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    let mut x = sector.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ version.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ 1;
    for chunk in out[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// Decodes (sector, version) from a sector and checks the whole sector.
pub fn decode_sector(data: &[u8]) -> Option<(u64, u64)> {
    let sector = u64::from_le_bytes(data[..8].try_into().ok()?);
    let version = u64::from_le_bytes(data[8..16].try_into().ok()?);
    (sector_content(sector, version)[..] == data[..512]).then_some((sector, version))
}

/// The current superblock of a cache image: the valid copy of highest
/// generation.
pub fn current_superblock(image: &[u8]) -> tiercache::engine::format::Superblock {
    (0..2)
        .filter_map(|c| {
            tiercache::engine::format::Superblock::parse(&image[c * 4096..(c + 1) * 4096]).ok()
        })
        .max_by_key(|sb| sb.generation.get())
        .expect("a valid superblock")
}

/// An origin image whose every sector holds version 0.
pub fn initial_origin(size: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    for (i, s) in v.chunks_mut(512).enumerate() {
        s.copy_from_slice(&sector_content(i as u64, 0));
    }
    v
}

// ---------------------------------------------------------------------------
// Reliability suite helpers (tests/reliability_*.rs): a per-sector model of
// which write versions may be on the volume, stamped writes, restarts from
// crash images, and the long-form switch.
// ---------------------------------------------------------------------------

use tiercache::engine::{Engine, OpenOptions};

/// True when the long form of the reliability suite is asked for
/// (`TIERCACHE_LONG=1`, as scripts/reliability.sh sets it).
pub fn long_form() -> bool {
    std::env::var("TIERCACHE_LONG").is_ok_and(|v| v == "1")
}

/// `short` in the CI form, `long` with `TIERCACHE_LONG=1`.
pub fn scaled(short: u64, long: u64) -> u64 {
    if long_form() {
        long
    } else {
        short
    }
}

/// Writeback that starts early (25% dirty) and writes back anything older
/// than a second: the crash tests want writeback under way at the crash.
pub fn eager_writeback() -> tiercache::engine::WritebackSettings {
    tiercache::engine::WritebackSettings {
        high_pct: 25,
        low_pct: 10,
        max_age_secs: 1,
        idle_secs: 0,
    }
}

/// Writeback held until a test asks for it: no watermark (100%), no age
/// within a test (an hour), no drain of an idle origin.
pub fn held_writeback() -> tiercache::engine::WritebackSettings {
    tiercache::engine::WritebackSettings {
        high_pct: 100,
        low_pct: 0,
        max_age_secs: 3600,
        idle_secs: 0,
    }
}

/// No background thread, and a clock of its own that stands still
/// (`tiercache::engine::clock`): what such an engine decides does not
/// depend on how fast the machine runs the test.
pub fn no_bg() -> OpenOptions {
    OpenOptions {
        no_background: true,
        clock: tiercache::engine::clock::Clock::sim(Default::default()),
        ..Default::default()
    }
}

/// `n` sectors from `first_sector`, each stamped with (sector, version).
pub fn stamped(first_sector: u64, n: u64, version: u64) -> Vec<u8> {
    (first_sector..first_sector + n)
        .flat_map(|s| sector_content(s, version))
        .collect()
}

/// A device rebuilt from a crash image, as after a restart. The name must
/// be the one the cache was created with (FaultDevice identities are derived
/// from names).
pub fn restart_dev(name: &str, image: Vec<u8>, seed: u64) -> (Arc<FaultDevice>, DeviceRef) {
    let d = Arc::new(FaultDevice::from_image(name, image, seed));
    let r: DeviceRef = d.clone();
    (d, r)
}

/// Origin `v`'s device name in a cache of several (FaultDevice identities
/// come from names): the first keeps the name of a cache of one.
pub fn origin_name(v: usize) -> String {
    if v == 0 {
        "origin".into()
    } else {
        format!("origin{v}")
    }
}

/// Origin devices on `switch`, volume `v` holding `images[v]`, named
/// `origin_name(v)` and seeded `seed_of(v)`.
pub fn switched_origins(
    images: impl IntoIterator<Item = Vec<u8>>,
    seed_of: impl Fn(u64) -> u64,
    switch: &tiercache::device::fault::CrashSwitch,
) -> Vec<Arc<FaultDevice>> {
    (images.into_iter().enumerate())
        .map(|(v, img)| {
            let dev = FaultDevice::from_image(&origin_name(v), img, seed_of(v as u64));
            Arc::new(dev.with_crash_switch(switch.clone()))
        })
        .collect()
}

/// `count` origins of `sectors` each on `switch`, volume `v`'s sectors
/// stamped as model sectors `v * sectors ..` (version 0), seeded from
/// `seed`: what the crash suites start from.
pub fn stamped_origins(
    count: u64,
    sectors: u64,
    seed: u64,
    switch: &tiercache::device::fault::CrashSwitch,
) -> Vec<Arc<FaultDevice>> {
    let images = (0..count).map(|v| stamped(v * sectors, sectors, 0));
    switched_origins(images, |v| seed ^ 0x55 ^ v, switch)
}

/// Reads the whole volume.
pub fn read_volume(engine: &Engine) -> Result<Vec<u8>, String> {
    engine
        .read(0, engine.volume_bytes())
        .map(|b| b.to_vec())
        .map_err(|e| format!("reading the volume: {e}"))
}

/// Every volume of the engine, one after the other (a model of several
/// volumes numbers their sectors so: volume `v`'s sector `s` is model
/// sector `v * its sectors + s`, when the volumes are of one size).
pub fn read_volumes(engine: &Engine) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for (name, base, bytes) in engine.volumes() {
        let data = engine
            .read(base, bytes)
            .map_err(|e| format!("reading volume {name}: {e}"))?;
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// Version marker of a trim: the sector may read as any version ever
/// written to it, or zeroes, until a later write is made durable.
pub const TRIMMED: u64 = u64::MAX;

/// Which versions each sector may hold after a crash, driven by the
/// operations a workload issued and the acknowledgements it got:
/// per sector, the last version known durable followed by every version
/// issued since. Version 0 is the origin's initial content.
#[derive(Clone)]
pub struct SectorModel {
    allowed: Vec<Vec<u64>>,
    /// (first sector, sector count) of version v at index v - 1.
    writes: Vec<(u64, u64)>,
}

impl SectorModel {
    pub fn new(sectors: u64) -> Self {
        SectorModel {
            allowed: vec![vec![0]; sectors as usize],
            writes: Vec::new(),
        }
    }

    pub fn sectors(&self) -> u64 {
        self.allowed.len() as u64
    }

    /// The version the next `issue_write` returns.
    pub fn next_version(&self) -> u64 {
        self.writes.len() as u64 + 1
    }

    /// A write of `n` sectors at `first` is about to be sent; returns its
    /// version (stamp the data with it).
    pub fn issue_write(&mut self, first: u64, n: u64) -> u64 {
        self.writes.push((first, n));
        let v = self.writes.len() as u64;
        for s in first..first + n {
            self.allowed[s as usize].push(v);
        }
        v
    }

    /// The write of version `v` (sent with FUA) completed: it is durable.
    pub fn fua_done(&mut self, v: u64) {
        let (first, n) = self.writes[v as usize - 1];
        for s in first..first + n {
            self.allowed[s as usize] = vec![v];
        }
    }

    /// A flush completed: every write sent before it is durable.
    pub fn flush_done(&mut self) {
        for a in &mut self.allowed {
            let last = *a.last().expect("never empty");
            if a.len() > 1 {
                *a = vec![last];
            }
        }
    }

    /// A trim of `n` sectors at `first` is about to be sent.
    pub fn issue_trim(&mut self, first: u64, n: u64) {
        for s in first..first + n {
            self.allowed[s as usize].push(TRIMMED);
        }
    }

    /// The only version `sector` may hold, if exactly one is allowed.
    pub fn settled(&self, sector: u64) -> Option<u64> {
        match self.allowed[sector as usize][..] {
            [v] if v != TRIMMED => Some(v),
            _ => None,
        }
    }

    /// True if `sector` was trimmed and not written durably since: its
    /// content is unspecified (NBD: no assumptions until written again).
    pub fn trimmed(&self, sector: u64) -> bool {
        self.allowed[sector as usize].contains(&TRIMMED)
    }

    fn ever_written(&self, sector: u64, version: u64) -> bool {
        version == 0
            || self
                .writes
                .get(version as usize - 1)
                .is_some_and(|&(first, n)| (first..first + n).contains(&sector))
    }

    /// Checks one sector's content.
    pub fn check_sector(&self, sector: u64, data: &[u8]) -> Result<(), String> {
        let allowed = &self.allowed[sector as usize];
        let trimmed = allowed.contains(&TRIMMED);
        if trimmed && data.iter().all(|&b| b == 0) {
            return Ok(());
        }
        let Some((stamped_sector, version)) = decode_sector(data) else {
            return Err(format!(
                "sector {sector} holds data never written to it (allowed versions {allowed:?})"
            ));
        };
        if stamped_sector != sector {
            return Err(format!(
                "sector {sector} holds sector {stamped_sector}'s data (version {version})"
            ));
        }
        if allowed.contains(&version) || (trimmed && self.ever_written(sector, version)) {
            return Ok(());
        }
        Err(format!(
            "sector {sector} holds version {version}, allowed {allowed:?}{}",
            if version < allowed[0] {
                " (a durable write was lost)"
            } else {
                ""
            }
        ))
    }

    /// Checks a whole volume image (sector `i` at byte `i * 512`). An
    /// image shorter or longer than the model fails: a volume left out
    /// must not pass unseen.
    pub fn verify(&self, volume: &[u8]) -> Result<(), String> {
        if volume.len() as u64 != self.sectors() * 512 {
            return Err(format!(
                "the image holds {} sectors, the model {}",
                volume.len() / 512,
                self.sectors()
            ));
        }
        for (s, data) in volume.chunks(512).enumerate() {
            self.check_sector(s as u64, data)?;
        }
        Ok(())
    }
}

/// The seed of a randomized test: `TIERCACHE_SEED` if set, else from the clock.
pub fn seed() -> u64 {
    mutation::seed("TIERCACHE_SEED")
}

/// Writes every dirty block back, detaches, and checks that the origin now
/// holds exactly `volume` (what the volume read before).
pub fn detach_and_compare(
    engine: &Engine,
    origin: &dyn tiercache::device::BlockDevice,
    volume: &[u8],
) -> Result<(), String> {
    engine
        .write_back_all(&mut |_, _| {})
        .map_err(|e| format!("write_back_all: {e}"))?;
    engine.detach().map_err(|e| format!("detach: {e}"))?;
    let mut back = vec![0u8; volume.len()];
    origin.read_at(&mut back, 0).unwrap();
    if back != volume {
        return Err("after writeback and detach the origin differs from the volume".into());
    }
    Ok(())
}

/// Engages the admission guard of a writeback engine whose cache device
/// writes slowly: both devices' write latencies are measured first
/// (writethrough writes both), then 4 KiB writes (blocks below 16,000 of
/// `block_bytes`) go on until the guard has seen the cache slower for long
/// enough. Fails after `limit`; returns how long the writes took.
pub fn engage_guard(
    e: &Engine,
    block_bytes: u64,
    limit: std::time::Duration,
) -> std::time::Duration {
    e.set_mode(tiercache::engine::Mode::Writethrough).unwrap();
    for k in 0..40u64 {
        e.write(k * 97 * block_bytes, &[3u8; 4096], false).unwrap();
    }
    e.set_mode(tiercache::engine::Mode::Writeback).unwrap();
    let t = std::time::Instant::now();
    let mut k = 0u64;
    while !e.status().guard_engaged {
        assert!(t.elapsed() < limit, "the guard never engaged");
        e.write((8000 + k % 1000 * 8) * block_bytes, &[4u8; 4096], false)
            .unwrap();
        k += 1;
    }
    t.elapsed()
}
