//! A request as the engine sees it, and what it learns on its way: its
//! per-block segments, its plan (resolved once) and its blocks' lookups.
//! The steps that build and fill it are in `pipeline.rs`.

use std::ops::Range;

use super::admission::Decision;
use super::modes::WriteRoute;
use super::sectors::SectorRun;
use super::{EngineResult, Mode};

/// What the mode and admission make of one request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub mode: Mode,
    /// Where a write goes.
    pub route: WriteRoute,
    /// Read misses may be promoted (before admission's say, per block).
    pub promote: bool,
    pub admission: Decision,
}

impl Plan {
    /// New blocks may enter the cache for this request.
    pub fn admits(&self) -> bool {
        self.admission.admits()
    }
}

/// Who asks for a read, which decides what a miss may promote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadKind {
    /// A client's read: the mode and admission decide.
    Client,
    /// NBD_CMD_CACHE: promotes in every mode but passthrough; admission
    /// still decides.
    Prefetch,
    /// `warm`: the operator asked for this range in the cache, so it is
    /// admitted whatever the sequential cutoff, promotion count or guard
    /// say (not while admission is stopped after cache errors).
    Warm,
}

/// A request's segments: one a block it touches, in order; held inline
/// (no allocation) for a request of up to two blocks.
pub(crate) type Segs = smallvec::SmallVec<[Segment; 2]>;

/// What `Cache::lookup` found of each segment, held inline as `Segs`.
pub(crate) type Lookup = smallvec::SmallVec<[Option<Cached>; 2]>;

/// A client request at the engine's door: validated and split into
/// segments once, resolved once (`Cache::resolve`: the mode, admission's
/// decision and everything that counts the request), and the policy told
/// about its cached blocks once. A fast path that gives up hands it on
/// (`Fast::Pending`) to the blocking path, which takes the block locks and
/// carries on with what was already decided and counted.
#[derive(Debug)]
pub struct Request {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) segs: Segs,
    pub(crate) write: bool,
    pub(crate) fua: bool,
    pub(crate) kind: ReadKind,
    /// Set by the first `resolve`.
    pub(crate) plan: Option<Plan>,
    /// The policy has been told about the cached blocks (`lookup`).
    pub(crate) policy_told: bool,
}

impl Request {
    /// The first and last block (`None` for an empty request).
    pub(crate) fn blocks(&self) -> Option<(u64, u64)> {
        Some((self.segs.first()?.block, self.segs.last()?.block))
    }
}

/// What a fast path made of a request: done, or handed on unfinished
/// (nothing of it done, whatever it resolved carried along).
#[derive(Debug)]
pub enum Fast<T> {
    Done(EngineResult<T>),
    Pending(Request),
}

/// The part of a request that falls in one cache block.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub block: u64,
    /// Offset within the block.
    pub in_block: u64,
    /// Range within the request's buffer.
    pub buf: Range<usize>,
}

impl Segment {
    pub fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    /// The block's sectors this segment covers.
    pub fn run(&self) -> SectorRun {
        SectorRun::of_bytes(self.in_block, self.len())
    }
}

/// A segment's block as the table holds it, seen under the block's lock.
pub(crate) use super::table::map::Cached;

/// The runs of adjacent blocks among `kept` (block, its offset in a
/// buffer that holds adjacent blocks adjacently), in ascending block
/// order: (first block, its offset, how many). A read's promotion's
/// runs (`read_misses`, io/submitted.rs).
pub(crate) fn block_runs(kept: impl IntoIterator<Item = (u64, usize)>) -> Vec<(u64, usize, usize)> {
    let mut runs: Vec<(u64, usize, usize)> = Vec::new();
    for (block, at) in kept {
        match runs.last_mut() {
            Some((first, _, n)) if *first + *n as u64 == block => *n += 1,
            _ => runs.push((block, at, 1)),
        }
    }
    runs
}

/// How many leading lookups, starting with `cached[0]`, are hits in adjacent
/// slots (slot, slot + 1, ...) that satisfy `also`: one device I/O covers
/// them all. 0 if `cached[0]` is no such hit.
pub(crate) fn adjacent_slots(cached: &[Option<Cached>], also: impl Fn(&Cached) -> bool) -> usize {
    let Some(Some(first)) = cached.first() else {
        return 0;
    };
    cached
        .iter()
        .enumerate()
        .take_while(|&(k, c)| matches!(c, Some(h) if h.slot == first.slot + k as u32 && also(h)))
        .count()
}
