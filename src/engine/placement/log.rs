//! Log placement (`Placement::Log`): new data goes down in order through
//! whole segments of the data region, whatever the client's offsets. The
//! table hands out slots from the cursor (table/free.rs,
//! table/segments.rs); the cleaner keeps whole segments ahead of it and
//! discards the ones it frees (writeback/clean.rs).

use super::Placer;
use crate::engine::cache::Cache;
use crate::engine::table::Meta;
use crate::engine::Placement;

pub(crate) struct Log;

impl Placer for Log {
    fn setting(&self) -> Placement {
        Placement::Log
    }

    /// Not when the write covers whole blocks (`whole`) and admission lets
    /// it take new slots: those go to the cursor like new data (the old
    /// slots are freed once the new mapping is durable). Parts of blocks
    /// stay in place: a new slot would cost a read of the old one.
    fn overwrites_in_place(&self, whole: usize, admit: bool) -> bool {
        whole == 0 || !admit
    }

    /// Empties segments until each pool has its reserve of whole ones.
    fn clean_ahead(&self, c: &Cache) -> usize {
        c.clean_segments()
    }

    /// The segments the commit made whole are discarded on the cache
    /// device, then given back to the free bitmap.
    fn after_commit(&self, c: &Cache) {
        c.discard_freed_segments();
    }

    /// A pool is short of whole segments ahead of the cursor.
    fn needs_cleaning(&self, c: &Cache, m: &Meta) -> bool {
        c.short_pool(m).is_some()
    }
}
