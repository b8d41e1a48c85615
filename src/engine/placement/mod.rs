//! Where new data goes on the cache device, one file per placement, each a
//! `Placer` (docs/engine.md, "Placement"):
//!
//! - `in_place.rs`: any free slot; dirty blocks are overwritten in place;
//! - `log.rs`: in order through whole segments (the table's free slots,
//!   table/segments.rs), which the cleaner keeps free ahead of the cursor
//!   (writeback/clean.rs).
//!
//! The engine holds the placement its superblock names (`of`, at open);
//! the write path, the background and the commit ask it through the trait
//! and never test which one it is. A new placement is a file implementing
//! `Placer`, a `Placement` setting (options.rs, a superblock flag) and its
//! line in `of`.

mod in_place;
mod log;

use super::cache::Cache;
use super::options::Placement;
use super::table::Meta;

/// What the cache does that depends on its placement. The methods are
/// handed the `Cache` they work on, whose steps they use.
pub(crate) trait Placer: Send + Sync {
    /// The setting this placement is (`create --placement`, the superblock
    /// flag, `status`).
    fn setting(&self) -> Placement;

    /// A write into cached dirty or empty sectors may overwrite its slots
    /// in place. `whole`: how many of its blocks from the first are whole
    /// ones; `admit`: admission lets it take new slots.
    fn overwrites_in_place(&self, whole: usize, admit: bool) -> bool;

    /// The background's work ahead of new data, before it keeps its
    /// reserve of free slots (run.rs, `keep_reserve`). Returns how many
    /// segments it freed: while it frees any, no reserve of single slots
    /// is kept.
    fn clean_ahead(&self, c: &Cache) -> usize;

    /// After every commit (journal/commit.rs): what the releases it made
    /// durable let the placement do.
    fn after_commit(&self, c: &Cache);

    /// Slots were just taken (table/slots.rs, `alloc_slots`, under the
    /// table's lock `m`): whether the background must wake to free space
    /// ahead of new data now.
    fn needs_cleaning(&self, c: &Cache, m: &Meta) -> bool;
}

/// The placement a cache created with `setting` puts new data by.
pub(crate) fn of(setting: Placement) -> &'static dyn Placer {
    match setting {
        Placement::InPlace => &in_place::InPlace,
        Placement::Log => &log::Log,
    }
}
