//! The registry of named caches, so commands need no device arguments (as
//! casadm cache ids or LVM names).
//!
//! Layout of the state directory (mode 0755 at most: the daemon runs as
//! root and opens the devices the entries name, so no one else may write
//! here; `prepare` refuses a directory others can write):
//! - `caches/<name>.json`: one [`Entry`] per cache, written atomically
//!   (a temporary file of a name no other writer uses, fsync, rename)
//!   under `caches/.lock`, so writers never share a temporary file and a
//!   read-modify-write ([`Registry::update`]) never loses another's change.
//! - `<name>.lock`: held (flock) by whichever process uses the cache, so two
//!   commands never open the same cache at once. Mode 0600: a user who
//!   could open it could hold its lock and keep the cache from opening.
//! - `<name>.sock`: the control socket of the daemon serving the cache
//!   (`control.rs`); `<name>.nbd`: its NBD socket. Both 0600 (`socket.rs`).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::device::DeviceRef;
use crate::engine::crash_log::{self, effective_uid};
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
    /// A registry entry that parses but cannot be used: a name that is not
    /// its file's or not a valid name (it becomes the names of lock,
    /// socket and crash log files), a device path that is not absolute.
    #[error("registry file {} is not valid: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
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
    /// The state directory can be written by other users, who could then
    /// change which devices the daemon opens, or replace its sockets.
    #[error(
        "state directory {} belongs to uid {owner} with mode {mode:04o}: other users could \
         change the registry or replace the sockets in it; it must belong to root or to uid \
         {euid} and be writable by its owner only (chmod go-w {})",
        dir.display(),
        dir.display()
    )]
    NotPrivate {
        dir: PathBuf,
        owner: u32,
        mode: u32,
        euid: u32,
    },
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

/// Where crash logs go instead of `/dev/shm/tiercache-<uid>`: a directory
/// of this user's alone (the crash log checks it), e.g. a tmpfs of the
/// operator's choosing.
pub const CRASH_LOG_DIR_ENV: &str = "TIERCACHE_CRASH_LOG_DIR";

/// Makes `dir` and its missing parents, mode 0755 whatever the umask (a
/// umask of 0 would otherwise leave them writable by anyone).
fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
}

/// Opens (creating) a lock file, mode 0600: whoever can open a file can
/// flock it, and so keep the cache (or the registry) from being used.
fn open_lock_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if file.metadata()?.permissions().mode() & 0o077 != 0 {
        // Made by an older tiercache, which left the mode to the umask.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// A temporary file name in the registry that no other writer uses: this
/// process's id and a counter.
fn unique_tmp_name(stem: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".{stem}.{}.{n}.tmp", std::process::id())
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
    /// /dev/disk/by-id/... are kept, not resolved); of a cache of several
    /// origins, volume 0's.
    pub origin: String,
    /// The origins of volumes 1, 2, ... in order (a cache of several
    /// origins, engine/origin/address.rs); empty for one origin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_origins: Vec<String>,
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
    /// A new entry for cache `name` over `origins` (volume 0's first) and
    /// `caches` (a set's members), created now. Both lists are non-empty.
    pub fn new(name: &str, origins: &[String], caches: &[String]) -> Entry {
        Entry {
            name: name.to_string(),
            origin: origins[0].clone(),
            more_origins: origins[1..].to_vec(),
            cache: caches[0].clone(),
            more_caches: caches[1..].to_vec(),
            created: now_rfc3339(),
            distrust_clean: false,
        }
    }

    /// True if `path` names one of the entry's devices (after resolving
    /// symlinks: `same_file`).
    pub fn uses(&self, path: &str) -> bool {
        self.device_paths().iter().any(|d| same_file(path, d))
    }

    /// Every origin of the entry, volume 0's first.
    pub fn origin_paths(&self) -> Vec<String> {
        std::iter::once(self.origin.clone())
            .chain(self.more_origins.iter().cloned())
            .collect()
    }

    /// Every device of the entry: origins, then cache devices.
    pub fn device_paths(&self) -> Vec<String> {
        let mut all = self.origin_paths();
        all.extend(self.cache_paths());
        all
    }

    /// Every cache device of the entry.
    pub fn cache_paths(&self) -> Vec<String> {
        std::iter::once(self.cache.clone())
            .chain(self.more_caches.iter().cloned())
            .collect()
    }

    /// Opens the cache device, or the cache set of several: see
    /// [`open_cache`].
    pub fn open_cache(&self, allow_missing: bool) -> crate::device::DeviceResult<DeviceRef> {
        open_cache(
            &self.cache_paths(),
            allow_missing,
            crate::device::open_device,
        )
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

/// Opens one cache device, or the cache set of `paths` (two or more), each
/// with `open` (`open_device`, or `open_device_read_only` to look): a
/// member that cannot be opened is left out, and the set opens degraded
/// without it if another member's label names it failed, or if
/// `allow_missing`; else the refusal says why (`set::open_paths`).
pub fn open_cache(
    paths: &[String],
    allow_missing: bool,
    open: impl Fn(&str) -> crate::device::DeviceResult<DeviceRef>,
) -> crate::device::DeviceResult<DeviceRef> {
    if let [one] = paths {
        return open(one);
    }
    let set = crate::device::set::open_paths(paths, allow_missing, open)?;
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

    /// Where the cache's stale map lives (engine/journal/stale_map.rs): in
    /// the state directory, on a disk, since it must outlive the machine.
    pub fn stale_map_path(&self, name: &str) -> PathBuf {
        self.dir.join("stale-maps").join(format!("{name}.json"))
    }

    /// Where the cache's crash log lives (engine/journal/crash_log.rs): shared
    /// memory, which outlives a killed daemon but not the machine, and is
    /// never written back to a disk; a directory per user (mode 0700, its
    /// owner checked when the log is opened). Named after this state
    /// directory too, so two state directories' caches of one name never
    /// share it. `TIERCACHE_CRASH_LOG_DIR` names another directory; where
    /// /dev/shm is missing, `<state-dir>/crash-logs/`.
    pub fn crash_log_path(&self, name: &str) -> PathBuf {
        match Self::shared_crash_log_dir() {
            Some(dir) => dir.join(self.crash_log_file_name(name)),
            None => self.dir.join("crash-logs").join(format!("{name}.crashlog")),
        }
    }

    /// The name of the cache's crash log in a directory shared by state
    /// directories: a hash of this state directory's path, and the name.
    pub fn crash_log_file_name(&self, name: &str) -> String {
        let state = fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in state.as_os_str().as_encoded_bytes() {
            hash = (hash ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
        format!("{hash:016x}-{name}.crashlog")
    }

    /// This user's directory of crash logs shared by state directories:
    /// `TIERCACHE_CRASH_LOG_DIR`, else `/dev/shm/tiercache-<euid>` if there
    /// is shared memory.
    fn shared_crash_log_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os(CRASH_LOG_DIR_ENV).filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(dir));
        }
        let shm = Path::new("/dev/shm");
        let uid = effective_uid();
        shm.is_dir().then(|| shm.join(format!("tiercache-{uid}")))
    }

    /// Every crash log file this user's caches may have left: in the shared
    /// directory (any state directory's), and in this state directory
    /// (where /dev/shm is missing; the top level is where older versions
    /// kept them). For `check --cache DEV`, which knows no name. Only
    /// regular files, and only from a shared directory that is this
    /// user's alone: another user's files are not read.
    pub fn crash_log_files(&self) -> Vec<PathBuf> {
        let shared = Self::shared_crash_log_dir().filter(|d| private_dir(d));
        let mut files: Vec<PathBuf> = shared
            .into_iter()
            .chain([self.dir.join("crash-logs"), self.dir.clone()])
            .filter_map(|d| fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "crashlog"))
            .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file()))
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
        // An entry names devices that root opens: not from a directory
        // that others may write.
        for d in [&self.dir, &self.caches_dir()] {
            if d.exists() {
                check_not_shared(d)?;
            }
        }
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
    /// and by no one else, so `create` finds out before it formats a
    /// device.
    pub fn prepare(&self) -> Result<()> {
        let dir = self.caches_dir();
        make_dir(&dir).map_err(io_err("cannot create state directory", &dir))?;
        for d in [&self.dir, &dir] {
            check_not_shared(d)?;
        }
        let probe = dir.join(unique_tmp_name("write-test"));
        File::create_new(&probe).map_err(|source| RegistryError::NotWritable {
            dir: dir.clone(),
            source,
        })?;
        let _ = fs::remove_file(&probe);
        Ok(())
    }

    /// Holds the registry's lock (`caches/.lock`) until dropped: its
    /// writers take turns, so a read-modify-write sees the last write.
    fn write_lock(&self) -> Result<File> {
        let path = self.caches_dir().join(".lock");
        let file = open_lock_file(&path).map_err(io_err("cannot open lock file", &path))?;
        file.lock().map_err(io_err("cannot lock", &path))?;
        Ok(file)
    }

    /// Writes `entry` with the registry's lock held: a temporary file of
    /// its own, fsync, rename, fsync of the directory.
    fn write_locked(&self, entry: &Entry) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.entry_path(&entry.name);
        let tmp = self.caches_dir().join(unique_tmp_name(&entry.name));
        let mut json = serde_json::to_string_pretty(entry).map_err(RegistryError::Encode)?;
        json.push('\n');
        let write = || -> std::io::Result<()> {
            let mut f = File::options()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)?;
            f.write_all(json.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename is durable once the directory is.
            File::open(self.caches_dir())?.sync_all()
        };
        let result = write().map_err(io_err("writing", &path));
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Writes an entry (replacing one of the same name).
    pub fn add(&self, entry: &Entry) -> Result<()> {
        self.prepare()?;
        let _lock = self.write_lock()?;
        self.write_locked(entry)
    }

    /// Changes the entry `name` as it is now (read under the registry's
    /// lock), not as some earlier reader saw it; returns the entry
    /// written, or `None` if there is no such entry (it was removed).
    pub fn update(&self, name: &str, change: impl FnOnce(&mut Entry)) -> Result<Option<Entry>> {
        self.prepare()?;
        let _lock = self.write_lock()?;
        let Some(mut entry) = self.get(name)? else {
            return Ok(None);
        };
        change(&mut entry);
        self.write_locked(&entry)?;
        Ok(Some(entry))
    }

    pub fn remove(&self, name: &str) -> Result<()> {
        let _lock = self.write_lock()?;
        let path = self.entry_path(name);
        fs::remove_file(&path).map_err(io_err("removing", &path))?;
        if let Ok(d) = File::open(self.caches_dir()) {
            let _ = d.sync_all();
        }
        // A cache no longer registered names no stale range: detach wrote
        // its dirty data back, give-up-cache --forget told what it lost.
        let _ = fs::remove_file(self.stale_map_path(name));
        Ok(())
    }

    /// Takes the cache's lock without waiting: another process using the
    /// same cache is an error, not something to queue behind.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        make_dir(&self.dir).map_err(io_err("cannot create state directory", &self.dir))?;
        let path = self.dir.join(format!("{name}.lock"));
        let file = open_lock_file(&path).map_err(io_err("cannot open lock file", &path))?;
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

/// True if `dir` is a directory (not a symlink) of this user's that no one
/// else may write in (as the crash log checks it).
fn private_dir(dir: &Path) -> bool {
    fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && crash_log::owned_privately(&m))
}

/// Refuses a state directory that others may write (sticky or not: the
/// registry's files are replaced by rename).
fn check_not_shared(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(dir).map_err(io_err("checking", dir))?;
    let euid = effective_uid();
    if (m.uid() != 0 && m.uid() != euid) || m.mode() & 0o022 != 0 {
        return Err(RegistryError::NotPrivate {
            dir: dir.to_path_buf(),
            owner: m.uid(),
            mode: m.mode() & 0o7777,
            euid,
        });
    }
    Ok(())
}

fn read_entry(path: &Path) -> Result<Entry> {
    let text = fs::read_to_string(path).map_err(io_err("reading", path))?;
    parse_entry(&text, path)
}

/// The entry in `text`, the contents of `path` (`caches/<name>.json`):
/// its name must be that file's, and valid, and its devices absolute
/// paths or URIs. Before this check (an invariant of
/// fuzz/fuzz_targets/registry_entry.rs) any name was taken:
/// `{"name": "../../x", ...}` made `serve` create its lock file outside the
/// state directory.
pub(crate) fn parse_entry(text: &str, path: &Path) -> Result<Entry> {
    let entry: Entry = serde_json::from_str(text).map_err(|source| RegistryError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |why: String| RegistryError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if entry.name != stem || validate_name(&entry.name).is_err() {
        return Err(invalid(format!(
            "it names the cache '{}', not '{stem}'",
            entry.name.escape_debug()
        )));
    }
    for device in &entry.device_paths() {
        if !device.starts_with('/') && !crate::device::is_network_spec(device) {
            return Err(invalid(format!(
                "device '{}' is not an absolute path or a URI",
                device.escape_debug()
            )));
        }
    }
    Ok(entry)
}

/// After `entry`'s cache opened: clears a distrust mark the open has acted
/// on, and makes the engine set it again if the cache fails over.
pub fn record_distrust(reg: &Registry, entry: &Entry, engine: &Engine) -> Result<()> {
    if entry.distrust_clean {
        reg.update(&entry.name, |e| e.distrust_clean = false)?;
    }
    let dir = reg.dir().to_path_buf();
    let name = entry.name.clone();
    engine.on_failover(Box::new(move || {
        record_failover(&Registry::new(dir.clone()), &name)
    }));
    Ok(())
}

/// The failover hook's work: marks the cache's entry as it is now (a
/// `replace-cache` since the open has changed it) to distrust its clean
/// blocks at the next open. Never writes back an older copy of the entry.
pub fn record_failover(reg: &Registry, name: &str) {
    match reg.update(name, |e| e.distrust_clean = true) {
        Ok(Some(_)) => {}
        Ok(None) => {
            log::warn!("cache '{name}' failed over but is no longer registered: nothing to record")
        }
        Err(e) => log::error!("could not record the failover in the registry: {e}"),
    }
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
    if crate::device::is_network_spec(path) {
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

    /// An entry's name becomes file names and its devices are opened by
    /// root: one not named as its file, or with a relative device, is
    /// refused, saying why (an invariant of the registry_entry fuzz body).
    #[test]
    fn entries_are_checked() {
        let path = Path::new("/state/caches/tc0.json");
        let entry = |name: &str, origin: &str| {
            format!(r#"{{"name":"{name}","origin":"{origin}","cache":"/c","created":"x"}}"#)
        };
        assert!(parse_entry(&entry("tc0", "/dev/a"), path).is_ok());
        assert!(parse_entry(&entry("tc0", "nbd://h/e"), path).is_ok());
        for (text, says) in [
            (entry("../../x", "/dev/a"), "names the cache '../../x'"),
            (entry("tc1", "/dev/a"), "not 'tc0'"),
            (
                entry("tc0", "dev/a"),
                "device 'dev/a' is not an absolute path",
            ),
            (entry("tc0", "nds://h/e"), "not an absolute path or a URI"),
        ] {
            let e = parse_entry(&text, path).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

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
