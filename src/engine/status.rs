//! What `status` reports of a cache, and what the engine shows beyond it
//! (`Engine::status` and `Engine::observations` fill them).

use serde::{Deserialize, Serialize};

use super::admission::AdmissionSettings;
use super::modes::Mode;
use super::options::{Placement, WritebackOrder, WritebackSettings};
use super::policy::share::{Share, Sharing};
use super::stats::StatsSnapshot;
use super::{observe, table};

/// What the engine shows beyond `status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Observations {
    /// Every volume's heat map, by volume index.
    pub heats: Vec<observe::heat::HeatMap>,
    pub latency: observe::latency::LatencySnapshot,
    pub mrc: observe::Mrc,
}

/// The crash log as `status` reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CrashLogStatus {
    pub path: String,
    /// Records a daemon that died now would leave for the next open.
    pub records_pending: u64,
    pub capacity_records: u64,
}

/// What `status` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub state: String,
    pub mode: Mode,
    pub policy: String,
    /// Where new data goes on the cache device.
    #[serde(default)]
    pub placement: Placement,
    /// The order dirty data reaches the origin in.
    #[serde(default)]
    pub writeback_order: WritebackOrder,
    /// Writeback in flush order: its groups and the older versions kept.
    #[serde(default)]
    pub flush_groups: Option<table::groups::GroupCounts>,
    /// Log placement: whole free segments (1 MiB each) ready for the
    /// cursor, in every pool.
    #[serde(default)]
    pub free_segments: u64,
    /// Log placement: slots handed out outside the cursor since open (no
    /// segment was whole: the data went wherever a slot was free).
    #[serde(default)]
    pub scattered_slots: u64,
    pub block_bytes: u32,
    pub volume_bytes: u64,
    pub origin: String,
    /// Whether the origin can be reached, for an origin behind connections
    /// (an NBD export: `BlockDevice::health`); `None` for a local one.
    #[serde(default)]
    pub origin_health: Option<crate::device::DeviceHealth>,
    pub cache: String,
    pub cache_blocks_total: u64,
    pub cache_blocks_used: u64,
    pub cache_blocks_dirty: u64,
    pub writeback: WritebackSettings,
    /// False once the cache error limit was reached: no new blocks enter
    /// the cache (see `admission`).
    pub admitting: bool,
    /// Why the cache admits blocks or not, for people.
    pub admission: String,
    pub cache_error_limit: u64,
    /// Heap bytes of the in-memory metadata: table, block index, policy
    /// list, dirty stamps, free lists and records not yet journalled.
    #[serde(default)]
    pub metadata_bytes: u64,
    /// Cached blocks of which only some sectors hold data, or some but not
    /// all are dirty (they keep sector maps).
    #[serde(default)]
    pub partial_blocks: u64,
    /// The crash log (`crash_log.rs`): its file and the records in it not
    /// yet journalled; `None` when the cache runs without one.
    #[serde(default)]
    pub crash_log: Option<CrashLogStatus>,
    pub admission_settings: AdmissionSettings,
    /// Estimated hit ratios of caches from 1/8 to 8 times this one's size.
    #[serde(default)]
    pub mrc: observe::Mrc,
    /// The admission guard sends new data around the cache (its device is
    /// slower than the origin).
    pub guard_engaged: bool,
    /// A cache set's members (empty for one cache device).
    #[serde(default)]
    pub cache_members: Vec<crate::device::members::MemberStatus>,
    /// A cache set's state: "whole", "degraded" or "rebuilding".
    #[serde(default)]
    pub cache_set_state: Option<String>,
    /// Dirty blocks with one copy left (a degraded cache set; on one
    /// cache device every dirty block has one copy and this stays 0).
    #[serde(default)]
    pub dirty_at_risk: u64,
    /// Origin byte ranges (offset, bytes) whose data was lost with a
    /// failed cache device: reads of them fail (engine/origin/stale.rs).
    #[serde(default)]
    pub stale_ranges: Vec<(u64, u64)>,
    #[serde(default)]
    pub stale_blocks: u64,
    /// Each volume (origin) of the cache; the fields above that name one
    /// origin (`origin`, `volume_bytes`, `stale_ranges`) are volume 0's.
    #[serde(default)]
    pub volumes: Vec<VolumeStatus>,
    /// How the volumes share the cache.
    #[serde(default)]
    pub sharing: Sharing,
    pub stats: StatsSnapshot,
}

/// One volume as `status` reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeStatus {
    /// Its name: the NBD export name it is served under.
    pub name: String,
    /// Its origin device.
    pub origin: String,
    pub bytes: u64,
    /// Its cache mode (`set-mode --volume`; else the cache's).
    pub mode: Mode,
    #[serde(default)]
    pub origin_health: Option<crate::device::DeviceHealth>,
    pub cache_blocks_used: u64,
    pub cache_blocks_dirty: u64,
    /// Its origin's stale byte ranges (offset, bytes) and blocks.
    #[serde(default)]
    pub stale_ranges: Vec<(u64, u64)>,
    #[serde(default)]
    pub stale_blocks: u64,
    /// Its share setting, and the blocks eviction leaves it whatever else
    /// goes (its minimum, or the curve split's part: policy/share.rs).
    #[serde(default)]
    pub share: Share,
    #[serde(default)]
    pub share_floor_blocks: u64,
    /// Its own miss-ratio curve (a cache of several volumes).
    #[serde(default)]
    pub mrc: Option<observe::Mrc>,
    /// Blocks its reads found in the cache, and missed, since it opened.
    #[serde(default)]
    pub read_hits: u64,
    #[serde(default)]
    pub read_misses: u64,
}
