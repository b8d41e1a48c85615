//! In-place placement (`Placement::InPlace`): new data goes into any free
//! slot (the table's lowest first, adjacent runs for multi-block stores),
//! and a write to a block cached dirty overwrites its slot. Nothing to do
//! in the background or after a commit.

use super::Placer;
use crate::engine::cache::Cache;
use crate::engine::table::Meta;
use crate::engine::Placement;

pub(crate) struct InPlace;

impl Placer for InPlace {
    fn setting(&self) -> Placement {
        Placement::InPlace
    }

    fn overwrites_in_place(&self, _whole: usize, _admit: bool) -> bool {
        true
    }

    fn clean_ahead(&self, _: &Cache) -> usize {
        0
    }

    fn after_commit(&self, _: &Cache) {}

    fn needs_cleaning(&self, _: &Cache, _: &Meta) -> bool {
        false
    }
}
