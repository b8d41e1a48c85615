//! The stale map (docs/format.md, "The stale map"): which regions of each
//! origin may hold data only the cache has, kept in a small file in the
//! state directory, off the cache device. A cache device that dies with
//! the machine off takes its dirty map with it; this copy still names the
//! origin ranges that are stale then (`give-up-cache --forget`).
//!
//! The file is a superset of the truth at every durable point: before a
//! commit makes records durable (journal/commit.rs), a region that became
//! dirty since the file was last written is written to it, file and
//! directory fsynced. Regions that became clean are dropped from it
//! lazily (at most every `CLEARED_WRITE_MS`): a region marked that is
//! clean only costs the operator a range to check. Writes acknowledged
//! and lost with the device before any commit were never flushed (NBD
//! proto.md: only FLUSH makes writes durable), so the origin's older data
//! there is a state the client was allowed to see after a crash.
//!
//! The granularity is the heat map's: 1,024 regions a volume
//! (observe/heat.rs). If the file cannot be written, it is removed, so a
//! reader never takes a short list for a whole one; the next commit tries
//! again.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::observe::heat::DirtyRegions;

/// What the file says it is.
pub const FORMAT: &str = "tiercache-stale-map";
pub const VERSION: u32 = 1;

/// A region that became clean leaves the file at most this late.
const CLEARED_WRITE_MS: u64 = 10_000;

/// A map file is never larger (59 volumes of 1,024 ranges come to about
/// 2.5 MB).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// The file's contents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StaleMapFile {
    pub format: String,
    pub version: u32,
    /// Seconds since the epoch when it was written.
    pub written_unix_s: u64,
    pub block_bytes: u64,
    pub volumes: Vec<VolumeStale>,
}

/// One volume's regions holding dirty blocks, as byte ranges of its origin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeStale {
    pub volume: usize,
    pub origin_bytes: u64,
    pub region_bytes: u64,
    /// `[offset, length]` in bytes, ascending, adjacent regions merged.
    pub ranges: Vec<(u64, u64)>,
}

/// The map a cache keeps (under the commit lock).
pub(crate) struct StaleMap {
    path: PathBuf,
    block_bytes: u64,
    /// What the file holds now; `None` until it is first written (or
    /// after a write failed and the file was removed).
    written: Option<Vec<DirtyRegions>>,
    written_ms: u64,
}

impl StaleMap {
    pub(crate) fn new(path: PathBuf, block_bytes: u64) -> StaleMap {
        StaleMap {
            path,
            block_bytes,
            written: None,
            written_ms: 0,
        }
    }

    /// True if the file must be written before the next durable point
    /// (`now` has a dirty region the file lacks, or it was never written),
    /// or may be (regions became clean, and the last write is old).
    pub(crate) fn due(&self, now: &[DirtyRegions], now_ms: u64) -> bool {
        let Some(written) = &self.written else {
            return true;
        };
        let covered =
            written.len() >= now.len() && (now.iter().zip(written)).all(|(n, w)| w.covers(n));
        if !covered {
            return true;
        }
        written.as_slice() != now && now_ms.saturating_sub(self.written_ms) >= CLEARED_WRITE_MS
    }

    /// Writes `now` to the file: a new file, fsync, rename over the old
    /// one, fsync of the directory. On failure the file is removed (a
    /// reader then knows nothing rather than too little) and the error
    /// logged; the commit goes on: the cache's data is not at risk.
    pub(crate) fn write(&mut self, now: Vec<DirtyRegions>, now_ms: u64) {
        let contents = self.contents(&now);
        match write_file(&self.path, &contents) {
            Ok(()) => {
                self.written = Some(now);
                self.written_ms = now_ms;
            }
            Err(e) => {
                self.written = None;
                let gone = match std::fs::remove_file(&self.path) {
                    Ok(()) => "removed it".to_string(),
                    Err(r) if r.kind() == std::io::ErrorKind::NotFound => "none is left".into(),
                    Err(r) => format!("cannot remove the old one either ({r}): it may be short"),
                };
                log::error!(
                    "cannot write the stale map {}: {e}; {gone} (retried at the next commit)",
                    self.path.display()
                );
            }
        }
    }

    fn contents(&self, now: &[DirtyRegions]) -> StaleMapFile {
        let b = self.block_bytes;
        StaleMapFile {
            format: FORMAT.into(),
            version: VERSION,
            written_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            block_bytes: b,
            volumes: (now.iter().enumerate())
                .map(|(v, d)| VolumeStale {
                    volume: v,
                    origin_bytes: d.volume_blocks * b,
                    region_bytes: d.region_blocks * b,
                    ranges: (d.block_runs().into_iter())
                        .map(|(first, n)| (first * b, n * b))
                        .collect(),
                })
                .collect(),
        }
    }
}

fn write_file(path: &Path, map: &StaleMapFile) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let mut json = serde_json::to_vec(map).map_err(std::io::Error::other)?;
    json.push(b'\n');
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        // A new file (O_EXCL: never through a link someone left), then a
        // rename, which replaces a link rather than follows it.
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    };
    let r = write();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Why a stale map cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// There is none (the cache never held dirty data since it was kept,
    /// or it was made by a release without it).
    #[error("no stale map at {0}")]
    Missing(PathBuf),
    /// It is there but unusable (not a regular file, too large, not the
    /// format).
    #[error("the stale map {path} is unusable: {reason}")]
    Unusable { path: PathBuf, reason: String },
}

/// Reads a stale map: never through a symlink, never a FIFO or a device,
/// never more than `MAX_FILE_BYTES`.
pub fn read(path: &Path) -> Result<StaleMapFile, ReadError> {
    let unusable = |reason: String| ReadError::Unusable {
        path: path.to_path_buf(),
        reason,
    };
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let f = match f {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReadError::Missing(path.to_path_buf()))
        }
        Err(e) => return Err(unusable(e.to_string())),
    };
    let meta = f.metadata().map_err(|e| unusable(e.to_string()))?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return Err(unusable("not a regular file of at most 4 MiB".into()));
    }
    let mut bytes = Vec::new();
    (f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)).map_err(|e| unusable(e.to_string()))?;
    let map: StaleMapFile = serde_json::from_slice(&bytes).map_err(|e| unusable(e.to_string()))?;
    if map.format != FORMAT || map.version != VERSION {
        return Err(unusable(format!(
            "format {} version {}, not {FORMAT} version {VERSION}",
            map.format, map.version
        )));
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::observe::heat::REGIONS;

    fn regions(region_blocks: u64, dirty: &[usize]) -> DirtyRegions {
        let mut bits = [0u64; REGIONS / 64];
        for &r in dirty {
            bits[r / 64] |= 1 << (r % 64);
        }
        DirtyRegions {
            region_blocks,
            volume_blocks: region_blocks * REGIONS as u64 - 3,
            bits,
        }
    }

    #[test]
    fn new_dirty_regions_are_due_at_once_cleared_ones_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("maps").join("c.json");
        let mut map = StaleMap::new(path.clone(), 4096);
        assert!(map.due(&[regions(4, &[])], 0), "never written");
        map.write(vec![regions(4, &[1, 2, 3, 1023])], 0);
        assert!(!map.due(&[regions(4, &[1, 2, 3, 1023])], 1));
        assert!(map.due(&[regions(4, &[1, 5])], 1), "region 5 is new");
        assert!(!map.due(&[regions(4, &[1])], 1), "only cleared: not yet");
        assert!(map.due(&[regions(4, &[1])], CLEARED_WRITE_MS));
        assert!(map.due(&[regions(8, &[1])], 1), "the volume was cut again");
        let back = read(&path).unwrap();
        assert_eq!(back.volumes.len(), 1);
        let v = &back.volumes[0];
        assert_eq!(v.region_bytes, 4 * 4096);
        // Regions 1-3 merge; the last one ends at the volume's end.
        assert_eq!(
            v.ranges,
            vec![(4 * 4096, 3 * 4 * 4096), (1023 * 4 * 4096, 4096)]
        );
    }

    #[test]
    fn a_file_that_cannot_be_written_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        let mut map = StaleMap::new(path.clone(), 4096);
        map.write(vec![regions(4, &[7])], 0);
        assert!(read(&path).is_ok());
        // The temporary file's place is taken by a directory: the write fails.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("x"), b"x").unwrap();
        map.write(vec![regions(4, &[7, 8])], 1);
        assert!(matches!(read(&path), Err(ReadError::Missing(_))));
        assert!(map.due(&[regions(4, &[])], 2), "unwritten: due again");
    }

    #[test]
    fn bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(&path, b"{\"format\":\"x\"}").unwrap();
        assert!(matches!(read(&path), Err(ReadError::Unusable { .. })));
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        assert!(matches!(read(&path), Err(ReadError::Unusable { .. })));
    }
}
