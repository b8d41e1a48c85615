//! The registry of named caches, so commands need no device arguments (as
//! casadm cache ids or LVM names).
//!
//! Layout of the state directory:
//! - `caches/<name>.json`: one [`Entry`] per cache, written atomically
//!   (temporary file, fsync, rename).
//! - `<name>.lock`: held (flock) by whichever process uses the cache, so two
//!   commands never open the same cache at once.
//! - `<name>.sock`: the control socket of the daemon serving the cache
//!   (`control.rs`); `<name>.nbd`: its NBD socket.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::device::DeviceRef;
use crate::engine::Engine;

/// Errors of the registry. Messages name the file and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A file or directory of the state directory could not be used.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The state directory exists but cannot be written.
    #[error("state directory {} is not writable", dir.display())]
    NotWritable {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A registry entry is not valid JSON for an [`Entry`].
    #[error("registry file {} is not valid", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// An entry could not be encoded (not expected: entries are plain data).
    #[error("encoding registry entry")]
    Encode(#[source] serde_json::Error),
    /// No cache of that name; `registered` lists the ones there are.
    #[error("{}", unknown_message(name, registered, dir))]
    Unknown {
        name: String,
        registered: Vec<String>,
        dir: PathBuf,
    },
    /// No name given and no cache registered.
    #[error("no cache; run tiercache create (state directory {})", dir.display())]
    Empty { dir: PathBuf },
    /// No name given and several caches registered.
    #[error("several caches are registered ({}); pick one with --name", names.join(", "))]
    Ambiguous { names: Vec<String> },
    /// Another process holds the cache's lock.
    #[error("cache '{name}' is in use by another tiercache process (lock {})", lock.display())]
    InUse { name: String, lock: PathBuf },
    /// A name that cannot be a file name.
    #[error("invalid cache name '{0}': use 1 to {NAME_MAX_BYTES} letters, digits, '-', '_' or '.', not starting with '.' or '-'")]
    InvalidName(String),
    /// A path that is not UTF-8 (entries are JSON strings).
    #[error("path {} is not valid UTF-8", .0.display())]
    NotUtf8(PathBuf),
}

fn unknown_message(name: &str, registered: &[String], dir: &Path) -> String {
    if registered.is_empty() {
        format!(
            "no cache named '{name}': no cache is registered in {}; run tiercache create",
            dir.display()
        )
    } else {
        format!(
            "no cache named '{name}'; registered: {}",
            registered.join(", ")
        )
    }
}

type Result<T> = std::result::Result<T, RegistryError>;

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError {
    let path = path.to_path_buf();
    move |source| RegistryError::Io { what, path, source }
}

/// The name `create` uses when none is given.
pub const DEFAULT_NAME: &str = "tc0";

/// Longest cache name accepted; names become file names.
const NAME_MAX_BYTES: usize = 64;

/// One registered cache.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Absolute path of the origin device (symlinks such as
    /// /dev/disk/by-id/... are kept, not resolved).
    pub origin: String,
    /// Absolute path of the cache device (of a cache set: its member 0
    /// at create; the members are found by their labels, in any order).
    pub cache: String,
    /// A cache set's other members (absolute paths); empty for one device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_caches: Vec<String>,
    /// When the cache was created, RFC 3339 UTC.
    pub created: String,
    /// The cache failed over after a device failure: the next open drops
    /// its clean blocks (the origin changed under them), then clears this.
    #[serde(default)]
    pub distrust_clean: bool,
}

impl Entry {
    /// Every cache device of the entry.
    pub fn cache_paths(&self) -> Vec<String> {
        std::iter::once(self.cache.clone())
            .chain(self.more_caches.iter().cloned())
            .collect()
    }

    /// Opens the cache device, or the cache set of several: see
    /// [`open_cache`].
    pub fn open_cache(&self, allow_missing: bool) -> crate::device::DeviceResult<DeviceRef> {
        open_cache(&self.cache_paths(), allow_missing)
    }

    /// The entry with member path `old` replaced by `new`.
    pub fn with_cache_replaced(&self, old: &str, new: &str) -> Entry {
        let swap = |p: &String| {
            if same_file(p, old) || p == old {
                new.to_string()
            } else {
                p.clone()
            }
        };
        Entry {
            cache: swap(&self.cache),
            more_caches: self.more_caches.iter().map(swap).collect(),
            ..self.clone()
        }
    }
}

/// Opens one cache device, or the cache set of `paths` (two or more): a
/// member that cannot be opened is left out, and the set opens degraded
/// without it if another member's label names it failed, or if
/// `allow_missing`; else the refusal says why (`set::open_paths`).
pub fn open_cache(paths: &[String], allow_missing: bool) -> crate::device::DeviceResult<DeviceRef> {
    if let [one] = paths {
        return crate::device::open_device(one);
    }
    let set = crate::device::set::open_paths(paths, allow_missing, crate::device::open_device)?;
    Ok(std::sync::Arc::new(set))
}

/// The state directory.
pub struct Registry {
    dir: PathBuf,
}

/// Exclusive use of one cache by this process; released on drop.
pub struct Lock {
    _file: File,
}

impl Registry {
    pub fn new(dir: PathBuf) -> Registry {
        Registry { dir }
    }

    fn caches_dir(&self) -> PathBuf {
        self.dir.join("caches")
    }

    fn entry_path(&self, name: &str) -> PathBuf {
        self.caches_dir().join(format!("{name}.json"))
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Where `tiercache serve` listens for commands for this cache.
    pub fn socket_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.sock"))
    }

    /// Where the cache's crash log lives (engine/journal/crash_log.rs): shared
    /// memory, which outlives a killed daemon but not the machine, and is
    /// never written back to a disk; a directory per user (mode 0700).
    /// Named after this state directory too, so two state directories'
    /// caches of one name never share it.
    /// Falls back to the state directory where /dev/shm is missing.
    pub fn crash_log_path(&self, name: &str) -> PathBuf {
        let Some(shm) = Self::shm_dir() else {
            return self.dir.join(format!("{name}.crashlog"));
        };
        let dir = fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in dir.as_os_str().as_encoded_bytes() {
            hash = (hash ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
        shm.join(format!("{hash:016x}-{name}.crashlog"))
    }

    /// This user's directory of crash logs in shared memory, if there is
    /// shared memory.
    fn shm_dir() -> Option<PathBuf> {
        let shm = Path::new("/dev/shm");
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        shm.is_dir().then(|| shm.join(format!("tiercache-{uid}")))
    }

    /// Every crash log file this user's caches may have left: in shared
    /// memory (any state directory's), and in this state directory (where
    /// /dev/shm is missing). For `check --cache DEV`, which knows no name.
    pub fn crash_log_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = Self::shm_dir()
            .into_iter()
            .chain([self.dir.clone()])
            .filter_map(|d| fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "crashlog"))
            .collect();
        files.sort();
        files
    }

    /// All registered caches, sorted by name. A missing state directory
    /// means no caches.
    pub fn list(&self) -> Result<Vec<Entry>> {
        let dir = self.caches_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("reading", &dir)(e)),
        };
        let mut entries = Vec::new();
        for item in rd {
            let path = item.map_err(io_err("reading", &dir))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            entries.push(read_entry(&path)?);
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    pub fn get(&self, name: &str) -> Result<Option<Entry>> {
        let path = self.entry_path(name);
        if !path.exists() {
            return Ok(None);
        }
        read_entry(&path).map(Some)
    }

    /// The cache a command acts on: the one named, or else the only one.
    pub fn resolve(&self, name: Option<&str>) -> Result<Entry> {
        if let Some(name) = name {
            validate_name(name)?;
            if let Some(e) = self.get(name)? {
                return Ok(e);
            }
            return Err(RegistryError::Unknown {
                name: name.to_string(),
                registered: self.names()?,
                dir: self.dir.clone(),
            });
        }
        let mut all = self.list()?;
        match all.len() {
            0 => Err(RegistryError::Empty {
                dir: self.dir.clone(),
            }),
            1 => Ok(all.remove(0)),
            _ => Err(RegistryError::Ambiguous {
                names: all.into_iter().map(|e| e.name).collect(),
            }),
        }
    }

    fn names(&self) -> Result<Vec<String>> {
        Ok(self.list()?.into_iter().map(|e| e.name).collect())
    }

    /// Creates the state directory if needed and checks it can be written,
    /// so `create` finds out before it formats a device.
    pub fn prepare(&self) -> Result<()> {
        let dir = self.caches_dir();
        fs::create_dir_all(&dir).map_err(io_err("cannot create state directory", &dir))?;
        let probe = dir.join(".write-test");
        File::create(&probe).map_err(|source| RegistryError::NotWritable {
            dir: dir.clone(),
            source,
        })?;
        let _ = fs::remove_file(&probe);
        Ok(())
    }

    /// Writes an entry (replacing one of the same name).
    pub fn add(&self, entry: &Entry) -> Result<()> {
        self.prepare()?;
        let path = self.entry_path(&entry.name);
        let tmp = self.caches_dir().join(format!(".{}.json.tmp", entry.name));
        let mut json = serde_json::to_string_pretty(entry).map_err(RegistryError::Encode)?;
        json.push('\n');
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(json.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename is durable once the directory is.
            File::open(self.caches_dir())?.sync_all()
        };
        write().map_err(io_err("writing", &path))
    }

    pub fn remove(&self, name: &str) -> Result<()> {
        let path = self.entry_path(name);
        fs::remove_file(&path).map_err(io_err("removing", &path))?;
        if let Ok(d) = File::open(self.caches_dir()) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Takes the cache's lock without waiting: another process using the
    /// same cache is an error, not something to queue behind.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        fs::create_dir_all(&self.dir)
            .map_err(io_err("cannot create state directory", &self.dir))?;
        let path = self.dir.join(format!("{name}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("cannot open lock file", &path))?;
        match file.try_lock() {
            Ok(()) => Ok(Lock { _file: file }),
            Err(fs::TryLockError::WouldBlock) => Err(RegistryError::InUse {
                name: name.to_string(),
                lock: path,
            }),
            Err(fs::TryLockError::Error(e)) => Err(io_err("cannot lock", &path)(e)),
        }
    }
}

fn read_entry(path: &Path) -> Result<Entry> {
    let text = fs::read_to_string(path).map_err(io_err("reading", path))?;
    serde_json::from_str(&text).map_err(|source| RegistryError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

/// After `entry`'s cache opened: clears a distrust mark the open has acted
/// on, and makes the engine set it again if the cache fails over.
pub fn record_distrust(reg: &Registry, entry: &Entry, engine: &Engine) -> Result<()> {
    if entry.distrust_clean {
        reg.add(&Entry {
            distrust_clean: false,
            ..entry.clone()
        })?;
    }
    let dir = reg.dir().to_path_buf();
    let marked = Entry {
        distrust_clean: true,
        ..entry.clone()
    };
    engine.on_failover(Box::new(move || {
        if let Err(e) = Registry::new(dir.clone()).add(&marked) {
            log::error!("could not record the failover in the registry: {e}");
        }
    }));
    Ok(())
}

/// Names become file names: letters, digits, '-', '_' and '.', not starting
/// with '.' or '-'.
pub fn validate_name(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty()
        || name.len() > NAME_MAX_BYTES
        || name.starts_with(['.', '-'])
        || !name.chars().all(ok_char)
    {
        return Err(RegistryError::InvalidName(name.to_string()));
    }
    Ok(())
}

/// `path` made absolute against the current directory, symlinks kept. NBD
/// URIs (`nbd://`, `nbd+unix://`, ...) and RBD URIs (`rbd://`) are device
/// specs, not paths, and are kept as given.
pub fn absolute(path: &str) -> Result<String> {
    if path.starts_with("nbd://")
        || path.starts_with("nbd+")
        || path.starts_with("nbds")
        || path.starts_with("rbd://")
    {
        return Ok(path.to_string());
    }
    let abs = std::path::absolute(path).map_err(io_err("resolving path", Path::new(path)))?;
    abs.into_os_string()
        .into_string()
        .map_err(|p| RegistryError::NotUtf8(p.into()))
}

/// True if two paths name the same file (after resolving symlinks).
pub fn same_file(a: &str, b: &str) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The current time as RFC 3339 UTC, without a date library.
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `unix_secs` as RFC 3339 UTC.
pub fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's days_from_civil inverse ("civil_from_days").
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn names() {
        for good in ["tc0", "fast-db", "a.b_c"] {
            validate_name(good).unwrap();
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
