//! Cache modes. Reads are common to all modes (see `engine/io.rs`); each
//! mode's write path lives in its own file.
//!
//! | mode         | read miss promotes | writes go to            | dirty data |
//! |--------------|--------------------|-------------------------|------------|
//! | writeback    | yes                | cache                   | yes        |
//! | writethrough | yes                | origin, then cache      | no         |
//! | writearound  | yes                | origin; cache invalidated | no       |
//! | writeonly    | no                 | cache (as dm-writecache) | yes       |
//! | passthrough  | no (reads origin)  | origin; cache invalidated | no       |

pub mod passthrough;
pub mod writearound;
pub mod writeback;
pub mod writeonly;
pub mod writethrough;

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
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
