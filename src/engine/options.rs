//! What a cache is created and opened with: the options fixed at create
//! (mode, block size, policy, placement, writeback order) and those of one
//! open, and the writeback settings.

use serde::{Deserialize, Serialize};

use super::admission::AdmissionSettings;
use super::clock;
use super::modes::Mode;
use super::policy::PolicyKind;

/// Parameters fixed when a cache is created.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub mode: Mode,
    pub block_bytes: u32,
    pub policy: PolicyKind,
    pub writeback: WritebackSettings,
    /// Overwrite a cache device that already holds a cache.
    pub force: bool,
    /// Accept data loss: allow writeback/writeonly on a volatile cache.
    pub allow_data_loss: bool,
    /// Cache device errors after which no new blocks are admitted (0: never).
    pub cache_error_limit: u64,
    pub admission: AdmissionSettings,
    /// Where new data goes on the cache device.
    pub placement: Placement,
    /// The order dirty data reaches the origin in.
    pub writeback_order: WritebackOrder,
}

/// The order background writeback sends dirty data to the origin in: the
/// setting (`create`, a superblock flag, `status`). What each order does is
/// the `Order` it names (writeback/order/).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritebackOrder {
    /// Whatever order is cheapest (ascending addresses, oldest first, ...):
    /// a cache lost mid-writeback leaves the origin with a mix of old and
    /// new blocks no moment ever held.
    #[default]
    Address,
    /// Group by group: the writes between two client flushes reach the
    /// origin only after every earlier group is written and the origin
    /// flushed, so the origin alone always holds a state a crash of a real
    /// disk could have left (table/groups.rs, writeback/order/flush.rs).
    Flush,
}

impl WritebackOrder {
    pub const ALL: [WritebackOrder; 2] = [WritebackOrder::Address, WritebackOrder::Flush];

    pub fn name(self) -> &'static str {
        match self {
            WritebackOrder::Address => "address",
            WritebackOrder::Flush => "flush",
        }
    }

    pub fn parse(s: &str) -> Option<WritebackOrder> {
        WritebackOrder::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// Where new data goes on the cache device: the setting (`create`, a
/// superblock flag, `status`). What each placement does is the `Placer` it
/// names (placement/).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Into any free slot; a write to a block cached dirty overwrites its
    /// slot.
    #[default]
    InPlace,
    /// In order through 1 MiB segments (table/segments.rs), whatever the
    /// client's offsets; whole blocks are never overwritten in place, and
    /// segments are reclaimed and discarded whole (writeback/clean.rs).
    Log,
}

impl Placement {
    pub const ALL: [Placement; 2] = [Placement::InPlace, Placement::Log];

    pub fn name(self) -> &'static str {
        match self {
            Placement::InPlace => "in-place",
            Placement::Log => "log",
        }
    }

    pub fn parse(s: &str) -> Option<Placement> {
        Placement::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Default for `CreateOptions::cache_error_limit`.
pub const DEFAULT_CACHE_ERROR_LIMIT: u64 = 64;

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            mode: Mode::Writeback,
            block_bytes: 4096,
            policy: PolicyKind::default(),
            writeback: WritebackSettings::default(),
            force: false,
            allow_data_loss: false,
            cache_error_limit: DEFAULT_CACHE_ERROR_LIMIT,
            admission: AdmissionSettings::default(),
            placement: Placement::default(),
            writeback_order: WritebackOrder::default(),
        }
    }
}

/// When background writeback runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritebackSettings {
    /// Start writing back when this percentage of cache blocks is dirty.
    pub high_pct: u32,
    /// Stop when the dirty percentage falls to this.
    pub low_pct: u32,
    /// Write back any block dirty for longer than this.
    pub max_age_secs: u32,
    /// Write back everything once clients have left the origin alone this
    /// long (0: never).
    #[serde(default)]
    pub idle_secs: u32,
}

/// Longest writeback age: dirty-since stamps are 16-bit seconds, and ages
/// must stay below half their range to compare correctly.
pub const MAX_AGE_SECS: u32 = 32_767;

impl WritebackSettings {
    /// The rule every setter checks: low <= high <= 100, 1 s <= age <= MAX_AGE_SECS.
    pub fn validate(&self) -> Result<(), String> {
        if self.high_pct > 100 {
            return Err(format!(
                "writeback high watermark {}% is above 100%",
                self.high_pct
            ));
        }
        if self.low_pct > self.high_pct {
            return Err(format!(
                "writeback low watermark {}% is above the high watermark {}%",
                self.low_pct, self.high_pct
            ));
        }
        if self.max_age_secs == 0 {
            return Err("writeback age must be at least 1 second".into());
        }
        if self.idle_secs > MAX_AGE_SECS {
            return Err(format!(
                "writeback idle time {} s is above the maximum of {MAX_AGE_SECS} s",
                self.idle_secs
            ));
        }
        if self.max_age_secs > MAX_AGE_SECS {
            return Err(format!(
                "writeback age {} s is above the maximum of {MAX_AGE_SECS} s",
                self.max_age_secs
            ));
        }
        Ok(())
    }
}

impl Default for WritebackSettings {
    fn default() -> Self {
        WritebackSettings {
            high_pct: 50,
            low_pct: 25,
            max_age_secs: 30,
            idle_secs: 2,
        }
    }
}

/// Options for opening an existing cache.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Open even if the origin's identity does not match the recorded one.
    pub force: bool,
    /// The operator's word that the origin is the same device, grown
    /// (lvextend, a longer file, `rbd resize`): a larger origin is taken
    /// and its size recorded. Without it any other size is refused: some
    /// identities are weak (a loop device's major:minor, an NBD URI), and
    /// the size is then what tells another device from the right one.
    pub origin_grew: bool,
    /// Accept data loss on a volatile cache device in writeback mode.
    pub allow_data_loss: bool,
    /// Do not start the background writeback thread (tests drive it).
    pub no_background: bool,
    /// Drop every clean cached block: the origin may have changed under
    /// them while the cache had failed over (see io/failure.rs).
    pub distrust_clean: bool,
    /// Where to keep the crash log (`crash_log.rs`): a file in shared
    /// memory, one per cache. `None`: no log; a process that dies loses
    /// the writes it acknowledged since its last commit.
    pub crash_log: Option<std::path::PathBuf>,
    /// Where to keep the stale map (journal/stale_map.rs): a file off the
    /// cache device naming the origin regions that hold dirty data.
    /// `None`: none is kept.
    pub stale_map: Option<std::path::PathBuf>,
    /// The engine's time (clock.rs): real unless a test simulates it.
    pub clock: clock::Clock,
    /// Volumes this open adds, by name: the last origins given are new
    /// ones, appended to the cache's volumes. The superblock records them
    /// at the open's first write, before any request (`add-origin`).
    pub add_volumes: Vec<String>,
}
