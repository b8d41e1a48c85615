//! The rule writeback in flush order promises (docs/engine.md, "Ordered
//! writeback"), checked on an origin image the LSVD way: for some group c,
//! every write of the groups before c is there (the last version of each
//! sector they wrote), none of a group after c is, and each sector group c
//! wrote holds the older version or one of c's. Writes are sector-stamped
//! (`common::stamped`: every sector names itself and its version; version
//! 0 is the origin's initial content).
//!
//! Included with `#[path]` beside `mod common` by `ordered_writeback.rs`
//! (in-process) and `ceph_ordered.rs` (over NBD, on a Ceph RBD image).
#![allow(dead_code)]

use crate::common::decode_sector;

/// The writes of each client group, in order, and where the engine's
/// groups began.
pub struct FlushGroups {
    /// Sectors of the image checked (from sector 0).
    pub sectors: u64,
    /// The sector the stamp of the image's sector 0 names (`of_sectors`:
    /// one origin's part of the writes to a cache of several).
    pub first_stamp: u64,
    /// Per group: (first sector, sectors, version) of each write. The last
    /// group is the one open (no flush has ended it).
    pub writes: Vec<Vec<(u64, u64, u64)>>,
    /// Per group, the engine's open group when it started (a lower bound
    /// does: it only makes the check weaker).
    pub engine_group: Vec<u64>,
}

impl FlushGroups {
    /// No write yet: one open group, the engine's group 0.
    pub fn new(sectors: u64) -> FlushGroups {
        FlushGroups {
            sectors,
            first_stamp: 0,
            writes: vec![Vec::new()],
            engine_group: vec![0],
        }
    }

    /// The writes to sectors `first..first + sectors` alone, in the same
    /// groups, renumbered from 0 for an image of those sectors alone: one
    /// origin's part of the writes to a cache of several (a write never
    /// spans two origins).
    pub fn of_sectors(&self, first: u64, sectors: u64) -> FlushGroups {
        let end = first + sectors;
        let writes = (self.writes.iter())
            .map(|g| {
                let inside = g.iter().filter(|&&(f, n, _)| f < end && f + n > first);
                inside
                    .map(|&(f, n, v)| {
                        assert!(f >= first && f + n <= end, "a write spans two origins");
                        (f - first, n, v)
                    })
                    .collect()
            })
            .collect();
        FlushGroups {
            sectors,
            first_stamp: self.first_stamp + first,
            writes,
            engine_group: self.engine_group.clone(),
        }
    }

    /// A write of the open group (sent, whatever its reply: a write that
    /// failed may still be there in part, like any other of its group).
    pub fn write(&mut self, first: u64, n: u64, version: u64) {
        assert!(
            first + n <= self.sectors,
            "write beyond the checked sectors"
        );
        self.writes.last_mut().unwrap().push((first, n, version));
    }

    /// A flush was acknowledged: the next writes form a new group, which
    /// starts in the engine's group `engine_open`.
    pub fn flushed(&mut self, engine_open: u64) {
        self.writes.push(Vec::new());
        self.engine_group.push(engine_open);
    }

    /// Groups ended by a flush.
    pub fn closed(&self) -> usize {
        self.writes.len() - 1
    }

    /// The origin matches the state "cut at c": per sector, the last
    /// version of the groups before c, or any version group c wrote.
    pub fn check_cut(&self, origin: &[u8], c: usize) -> Result<(), String> {
        let sectors = self.sectors as usize;
        let mut last = vec![0u64; sectors];
        for g in &self.writes[..c] {
            for &(first, n, v) in g {
                for s in first..first + n {
                    last[s as usize] = v;
                }
            }
        }
        let mut in_c: Vec<Vec<u64>> = vec![Vec::new(); sectors];
        for &(first, n, v) in &self.writes[c] {
            for s in first..first + n {
                in_c[s as usize].push(v);
            }
        }
        if origin.len() < sectors * 512 {
            return Err(format!(
                "the origin holds {} bytes, fewer than the {sectors} sectors written",
                origin.len()
            ));
        }
        for s in 0..sectors {
            let data = &origin[s * 512..(s + 1) * 512];
            let Some((sector, v)) = decode_sector(data) else {
                return Err(format!("sector {s} holds bytes no write put there"));
            };
            if sector != self.first_stamp + s as u64 {
                let own = self.first_stamp + s as u64;
                return Err(format!(
                    "sector {s} (stamped {own}) holds sector {sector}'s data"
                ));
            }
            if v != last[s] && !in_c[s].contains(&v) {
                return Err(format!(
                    "sector {s} holds v{v}; a cut at group {c} allows v{} or {:?}",
                    last[s], in_c[s]
                ));
            }
        }
        Ok(())
    }

    /// The first group c whose cut the origin matches, from the first
    /// group not known to be on the origin: the engine's groups below
    /// `done` are (a lower bound: what its status said before the end).
    pub fn check(&self, origin: &[u8], done: u64) -> Result<usize, String> {
        let from = self.known_on_origin(done);
        let mut why = Vec::new();
        for c in from..self.writes.len() {
            match self.check_cut(origin, c) {
                Ok(()) => return Ok(c),
                Err(e) => why.push(format!("cut at group {c}: {e}")),
            }
        }
        Err(format!(
            "no cut from group {from} (engine groups below {done} were on the origin) matches \
             the origin:\n  {}",
            why.join("\n  ")
        ))
    }

    /// The latest cut the origin matches, from `c` (one it matches): the
    /// group the origin reached.
    pub fn reached_cut(&self, origin: &[u8], mut c: usize) -> usize {
        while c + 1 < self.writes.len() && self.check_cut(origin, c + 1).is_ok() {
            c += 1;
        }
        c
    }

    /// Of the sectors group `c` wrote, (those holding one of its versions
    /// on the origin, all of them): how much of the cut's group is there.
    pub fn reached(&self, origin: &[u8], c: usize) -> (u64, u64) {
        let Some(writes) = self.writes.get(c) else {
            return (0, 0);
        };
        let mut version_of = std::collections::BTreeMap::new();
        for &(first, n, v) in writes {
            for s in first..first + n {
                version_of.entry(s).or_insert_with(Vec::new).push(v);
            }
        }
        let there = version_of
            .iter()
            .filter(|(&s, vs)| {
                let data = &origin[s as usize * 512..(s as usize + 1) * 512];
                decode_sector(data).is_some_and(|(_, v)| vs.contains(&v))
            })
            .count();
        (there as u64, version_of.len() as u64)
    }

    /// The client groups known to be on the origin when the engine's
    /// groups below `done` are. Group k is on the origin once the engine's
    /// groups below the one group k+1 started in are (`write_back_all`
    /// may split a group: it is on the origin once all its parts are).
    pub fn known_on_origin(&self, done: u64) -> usize {
        (1..self.writes.len())
            .take_while(|&k| self.engine_group[k] <= done)
            .count()
    }
}
