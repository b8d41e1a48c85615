//! A cache device and its origins as fault-injecting devices in memory,
//! for the engine tests of one cache and one or several origins
//! (tests/volumes.rs, tests/cache_grow.rs): made, opened, stopped by a
//! crash switch at a chosen write, or taken as a power loss leaves them.

use std::sync::Arc;

use tiercache::device::fault::{CrashSwitch, FaultDevice};
use tiercache::device::{BlockDevice, DeviceRef};
use tiercache::engine::format::Superblock;
use tiercache::engine::{CreateOptions, Engine, EngineError, Mode, OpenOptions};

const BS: u32 = 4096;

pub struct Rig {
    pub cache: Arc<FaultDevice>,
    pub origins: Vec<Arc<FaultDevice>>,
}

impl Rig {
    /// A cache of `slots` 4 KiB blocks (seeded 1) over `origins`.
    pub fn over(slots: u64, origins: Vec<FaultDevice>) -> Rig {
        let cache = FaultDevice::new("cache", super::cache_bytes_for(slots, BS), 1);
        Rig {
            cache: Arc::new(cache),
            origins: origins.into_iter().map(Arc::new).collect(),
        }
    }

    /// A cache of `slots` blocks over origins of `sizes` bytes (origin `v`
    /// named `o{v}`, seeded `2 + v`, its bytes all `0x10 + v`).
    pub fn new(slots: u64, sizes: &[u64]) -> Rig {
        let origins = (sizes.iter().enumerate())
            .map(|(v, &n)| {
                let image = vec![0x10 + v as u8; n as usize];
                FaultDevice::from_image(&format!("o{v}"), image, 2 + v as u64)
            })
            .collect();
        Rig::over(slots, origins)
    }

    pub fn origin_refs(&self) -> Vec<DeviceRef> {
        self.origins
            .iter()
            .map(|o| o.clone() as DeviceRef)
            .collect()
    }

    /// A new cache of the volumes `names` (volume `v` on origin `v`), in
    /// `mode`, opened without a background thread.
    pub fn create(&self, names: &[&str], mode: Mode) -> Result<Arc<Engine>, EngineError> {
        let opts = CreateOptions {
            mode,
            ..Default::default()
        };
        self.create_with(names, &opts)
    }

    /// `create` with every option given.
    pub fn create_with(
        &self,
        names: &[&str],
        opts: &CreateOptions,
    ) -> Result<Arc<Engine>, EngineError> {
        let named = (names.iter().map(|n| n.to_string()))
            .zip(self.origin_refs())
            .collect();
        Engine::create_volumes(self.cache.clone(), named, opts, &super::no_bg())
    }

    /// Opens the cache over every origin, without a background thread.
    pub fn open(&self) -> Result<Arc<Engine>, EngineError> {
        self.open_with(&super::no_bg())
    }

    pub fn open_with(&self, opts: &OpenOptions) -> Result<Arc<Engine>, EngineError> {
        Engine::open_volumes(self.cache.clone(), self.origin_refs(), opts)
    }

    /// `len` bytes of origin `v` at `at`, read from the device itself.
    pub fn origin_bytes(&self, v: usize, at: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len.next_multiple_of(512)];
        self.origins[v].read_at(&mut buf, at).unwrap();
        buf.truncate(len);
        buf
    }

    /// The devices as they are now (durable), each tripped by `switch`
    /// (the cache seeded 1, origin `v` `origin_seed(v)`).
    pub fn under(&self, switch: &CrashSwitch, origin_seed: impl Fn(usize) -> u64) -> Rig {
        self.each(1, origin_seed, |d| d.durable_image(), Some(switch))
    }

    /// The devices as a power loss leaves them (the cache seeded
    /// `cache_seed`, origin `v` `origin_seed(v)`).
    pub fn power_lost(&self, cache_seed: u64, origin_seed: impl Fn(usize) -> u64) -> Rig {
        self.each(cache_seed, origin_seed, |d| d.power_loss_image(), None)
    }

    /// The devices as a killed process leaves them (every write done, none
    /// lost; the cache seeded `cache_seed`, origin `v` `origin_seed(v)`).
    pub fn killed(&self, cache_seed: u64, origin_seed: impl Fn(usize) -> u64) -> Rig {
        self.each(cache_seed, origin_seed, |d| d.snapshot_current(), None)
    }

    /// Every device again, from the image `image` takes of it, with its
    /// name and the seed given.
    fn each(
        &self,
        cache_seed: u64,
        origin_seed: impl Fn(usize) -> u64,
        image: impl Fn(&FaultDevice) -> Vec<u8>,
        switch: Option<&CrashSwitch>,
    ) -> Rig {
        let again = |d: &FaultDevice, seed: u64| {
            let d = FaultDevice::from_image(d.name(), image(d), seed);
            Arc::new(match switch {
                Some(s) => d.with_crash_switch(s.clone()),
                None => d,
            })
        };
        Rig {
            cache: again(&self.cache, cache_seed),
            origins: (self.origins.iter().enumerate())
                .map(|(v, o)| again(o, origin_seed(v)))
                .collect(),
        }
    }

    /// The cache's current superblock.
    pub fn superblock(&self) -> Superblock {
        super::current_superblock(&self.cache.snapshot_current())
    }
}
