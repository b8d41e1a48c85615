//! Cache modes. A mode is resolved into a write route and a read rule in
//! one place (`engine/pipeline.rs`, with admission); reads are common to
//! all modes (`engine/read.rs`); each write route lives in its own file,
//! named by where the route sends writes (`write_cache.rs`,
//! `write_through.rs`, `write_around.rs`). "Writeback" alone names the mode
//! and the work of writing dirty blocks back (`engine/writeback/`).
//!
//! | mode         | read miss promotes | writes go to (route)                  | dirty data |
//! |--------------|--------------------|---------------------------------------|------------|
//! | writeback    | yes                | cache (`write_cache.rs`)              | yes        |
//! | writethrough | yes                | origin, then cache (`write_through.rs`) | no       |
//! | writearound  | yes                | origin; cache invalidated (`write_around.rs`) | no |
//! | writeonly    | no                 | cache, as dm-writecache (`write_cache.rs`) | yes   |
//! | passthrough  | no (reads origin)  | origin; cache invalidated (`write_around.rs`) | no |
//!
//! Passthrough keeps the blocks still cached valid (writes drop the copies
//! they touch, committed first), so the cache is warm again when another
//! mode is switched on. The one exception to "reads the origin": while a
//! switch to passthrough is still writing dirty blocks back, reads of those
//! blocks are served from the cache, the only current copy.

pub mod write_around;
pub mod write_cache;
pub mod write_through;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Writeback,
    Writethrough,
    Writearound,
    Writeonly,
    Passthrough,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Writeback,
        Mode::Writethrough,
        Mode::Writearound,
        Mode::Writeonly,
        Mode::Passthrough,
    ];

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Writeback => "writeback",
            Mode::Writethrough => "writethrough",
            Mode::Writearound => "writearound",
            Mode::Writeonly => "writeonly",
            Mode::Passthrough => "passthrough",
        }
    }

    pub fn to_u32(self) -> u32 {
        match self {
            Mode::Writeback => 1,
            Mode::Writethrough => 2,
            Mode::Writearound => 3,
            Mode::Writeonly => 4,
            Mode::Passthrough => 5,
        }
    }

    pub fn from_u32(v: u32) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.to_u32() == v)
    }

    /// Writes stay in the cache as dirty data.
    pub fn holds_dirty(self) -> bool {
        matches!(self, Mode::Writeback | Mode::Writeonly)
    }

    /// A read miss copies the block into the cache.
    pub fn promotes_reads(self) -> bool {
        matches!(
            self,
            Mode::Writeback | Mode::Writethrough | Mode::Writearound
        )
    }

    /// Reads are served from cached blocks.
    pub fn reads_cache(self) -> bool {
        self != Mode::Passthrough
    }

    /// Where a write goes in this mode, before admission has its say.
    pub fn write_route(self) -> WriteRoute {
        match self {
            Mode::Writeback | Mode::Writeonly => WriteRoute::Cache,
            Mode::Writethrough => WriteRoute::Through,
            Mode::Writearound | Mode::Passthrough => WriteRoute::Around,
        }
    }
}

/// Where a write goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteRoute {
    /// Into the cache as dirty data.
    Cache,
    /// To the origin, then a clean copy into the cache.
    Through,
    /// To the origin only; cached copies of its blocks are dropped first.
    Around,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
