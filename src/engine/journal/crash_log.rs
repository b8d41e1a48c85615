//! The crash log: every record not yet in the journal, mirrored into a
//! shared-memory file, so that a daemon that dies (kill -9, a panic, the
//! OOM killer) loses no acknowledged write.
//!
//! A write is acknowledged once its data is on the cache device and its
//! record is applied in memory; the record reaches the journal with the
//! next commit (FLUSH, FUA, or the background's, at least once a second).
//! If the process dies in between, the data is on the device but nothing
//! on disk points at it. The machine is still up, though, and a client
//! (the kernel NBD client with a dead-connection timeout, ublk's user
//! recovery) reissues its requests to the next daemon and then flushes
//! there: without this log the flush would succeed over writes the dead
//! daemon acknowledged and lost. A power loss is different: the log is in
//! RAM and goes with it, and the journal alone decides, as always.
//!
//! Fault model: the process may stop between any two instructions; memory
//! it stored to a shared mapping stays (the kernel owns the pages). A
//! reboot loses the file (tmpfs), and the boot id in the header rejects a
//! log that survived one anyway. Single writer: every change happens under
//! the engine's metadata lock.
//!
//! The file (`open`): in a directory of this user's alone (0700, owner
//! checked: its name is predictable, another user may have made it),
//! opened relative to that directory without following a symlink, a
//! plain file of this user's with one name; allocated whole at open and
//! never punched, so a full tmpfs is an error at start and never a
//! SIGBUS on a store (`clear`).
//!
//! Layout (all little-endian u64 words; the file is `HEADER_BYTES` plus
//! `capacity` records of 16 bytes in the on-disk record encoding):
//!
//! | word | field |
//! |---|---|
//! | 0 | magic `TCCRLOG1` |
//! | 1 | version (1) |
//! | 2, 3 | boot id (the 16 bytes of /proc/sys/kernel/random/boot_id) |
//! | 4..8 | cache identity: creation time, origin identity, slot count, block bytes |
//! | 8 | capacity in records |
//! | 9 | state: 0 valid, 1 invalid (records were dropped or a commit failed) |
//! | 10, 11 | durable point: checkpoint generation, next journal sequence |
//! | 12, 13 | head, tail: records `[head, tail)` are not known durable |
//! | 14 | a commit is in flight (0 or 1) |
//! | 15, 16 | its target point |
//! | 17 | its end: records `[head, upto)` are in it |
//!
//! Protocol (docs/format.md, "The crash log"):
//! - append: the record is stored at `tail % capacity`, then `tail` is
//!   published (release).
//! - a commit starts: the target point and `upto = tail` are stored, then
//!   the in-flight flag.
//! - it succeeds: the durable point becomes the target, `head = upto`,
//!   then the flag is cleared. Recovery checks the in-flight target first,
//!   so a stop between these stores is read correctly.
//! - it fails, or the ring is full: the state becomes invalid until a
//!   later commit covers every record (a commit that starts while invalid
//!   empties the ring: all records then are in its batch).
//!
//! Recovery loads the checkpoint and replays the journal, reaching point
//! L; it then applies `[upto, tail)` if a commit to L was in flight,
//! `[head, tail)` if L is the durable point, and nothing otherwise (the
//! cache was opened since without this log: the log is stale).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use zerocopy::FromBytes;

use crate::engine::format::{RawRecord, Record, Superblock};

const MAGIC: u64 = u64::from_le_bytes(*b"TCCRLOG1");
const VERSION: u64 = 1;
/// Bytes before the first record: one page.
pub const HEADER_BYTES: usize = 4096;
const RECORD_BYTES: usize = 16;
/// Records in one 4 KiB page of the ring; capacities are multiples of it.
const RECORDS_PER_PAGE: u64 = (HEADER_BYTES / RECORD_BYTES) as u64;
/// Records the ring holds by default: 4 MiB of shared memory. At half of it
/// the background commits; at three quarters writers commit themselves.
pub const DEFAULT_CAPACITY: u64 = 1 << 18;

const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_BOOT: usize = 2;
const W_IDENTITY: usize = 4;
const W_CAPACITY: usize = 8;
const W_STATE: usize = 9;
const W_DURABLE: usize = 10;
const W_HEAD: usize = 12;
const W_TAIL: usize = 13;
const W_INFLIGHT: usize = 14;
const W_TARGET: usize = 15;
const W_UPTO: usize = 17;
const WORDS: usize = 18;
const _: () = assert!(WORDS * 8 <= HEADER_BYTES);

const STATE_VALID: u64 = 0;
const STATE_INVALID: u64 = 1;

/// Errors of the crash log file.
#[derive(Debug, thiserror::Error)]
pub enum CrashLogError {
    /// The file could not be created, sized, locked or mapped.
    #[error("crash log {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the log: it has this cache open.
    #[error("crash log {0} is locked: another process has this cache open")]
    Locked(PathBuf),
    /// The log's directory is not this user's alone: another user made it,
    /// or its mode lets others write in it. They could plant a log, or a
    /// symlink that turns the log's writes onto a file of their choosing.
    #[error(
        "crash log directory {} belongs to uid {owner} with mode {mode:04o}; it must belong to \
         uid {euid} (this process's user) and be writable by no one else (it is made 0700), \
         or another user could plant the log or turn its writes onto another file. Remove it \
         (`rm -r {}`, as root if need be: it may be another user's) and start again",
        dir.display(),
        dir.display()
    )]
    UnsafeDirectory {
        dir: PathBuf,
        owner: u32,
        mode: u32,
        euid: u32,
    },
    /// The log file (or its directory's name) is not a plain file of this
    /// user's: a symlink, another user's file, a file with other names.
    #[error(
        "crash log {}: {why}; refusing to use it. Nothing was written to it; if no daemon \
         of this cache was killed, remove it, else move it aside and look at it",
        path.display()
    )]
    UnsafeFile { path: PathBuf, why: String },
    /// The file system holding the log has no room for it.
    #[error(
        "crash log {}: cannot allocate its {bytes} bytes: {source}. Its file system (a tmpfs, \
         e.g. /dev/shm) is full or too small: free space there and start again (the log is \
         allocated whole at start so that this is found now, not by a SIGBUS while serving)",
        path.display()
    )]
    NoSpace {
        path: PathBuf,
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
}

/// Largest log file that open reads: far above any capacity in use (the
/// default log is 4 MiB), so a huge file is refused, not read.
const FILE_BYTES_MAX: u64 = 256 << 20;

/// A state of the on-disk metadata: the checkpoint generation, and the
/// journal sequence after the last page replay reached (or a commit wrote).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub checkpoint_generation: u64,
    pub journal_seq: u64,
}

/// What a log belongs to: the boot and the cache. A log whose identity
/// differs is never applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub boot_id: [u64; 2],
    pub cache: [u64; 4],
}

impl Identity {
    pub fn of(sb: &Superblock) -> Identity {
        Identity {
            boot_id: boot_id(),
            cache: [
                sb.created_unix_secs.get(),
                sb.origin_identity.get(),
                sb.slot_count.get(),
                sb.block_bytes.get() as u64,
            ],
        }
    }
}

impl Identity {
    /// A log of `self`'s belongs to the cache of `cache` (an identity of
    /// a superblock): the same creation, origin and block size, and no
    /// more slots than the cache has (the cache device may have grown
    /// since the log was started: `CrashLog::slots_grew`).
    pub fn same_cache(&self, cache: &Identity) -> bool {
        let (a, b) = (self.cache, cache.cache);
        a[0] == b[0] && a[1] == b[1] && a[3] == b[3] && a[2] <= b[2]
    }
}

/// The kernel's id of this boot; zeros where it cannot be read.
fn boot_id() -> [u64; 2] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = text.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    if hex.len() != 32 {
        return [0, 0];
    }
    let word = |s: &str| u64::from_str_radix(s, 16).unwrap_or(0);
    [word(&hex[..16]), word(&hex[16..])]
}

/// A log as found in a file: parsed, not yet matched to the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogImage {
    pub identity: Identity,
    pub valid: bool,
    pub durable: Point,
    pub head: u64,
    pub tail: u64,
    /// A commit's target point and the end of its batch.
    pub in_flight: Option<(Point, u64)>,
    /// Records `[first, tail)`, where `first` is the lower of `head` and
    /// the in-flight batch's start.
    pub first: u64,
    pub records: Vec<Record>,
}

/// What recovery makes of a log.
#[derive(Debug, PartialEq, Eq)]
pub enum Pending<'a> {
    /// These records follow the loaded state; apply them in order.
    Apply(&'a [Record]),
    /// The log does not follow the loaded state; why.
    Ignore(String),
}

fn word(bytes: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

impl LogImage {
    /// Parses a log file's bytes. Never panics; `Err` says why the bytes
    /// are not a usable log.
    pub fn parse(bytes: &[u8]) -> Result<LogImage, String> {
        if bytes.is_empty() {
            return Err("empty".into());
        }
        if bytes.len() < HEADER_BYTES {
            return Err(format!("{} bytes: shorter than its header", bytes.len()));
        }
        if word(bytes, W_MAGIC) != MAGIC {
            return Err("no crash log magic".into());
        }
        if word(bytes, W_VERSION) != VERSION {
            return Err(format!(
                "version {} (expected {VERSION})",
                word(bytes, W_VERSION)
            ));
        }
        let capacity = word(bytes, W_CAPACITY);
        let room = ((bytes.len() - HEADER_BYTES) / RECORD_BYTES) as u64;
        if capacity == 0 || capacity > room {
            return Err(format!("capacity {capacity} records, file holds {room}"));
        }
        let identity = Identity {
            boot_id: [word(bytes, W_BOOT), word(bytes, W_BOOT + 1)],
            cache: std::array::from_fn(|k| word(bytes, W_IDENTITY + k)),
        };
        let point = |i: usize| Point {
            checkpoint_generation: word(bytes, i),
            journal_seq: word(bytes, i + 1),
        };
        let (head, tail) = (word(bytes, W_HEAD), word(bytes, W_TAIL));
        let in_flight = match word(bytes, W_INFLIGHT) {
            0 => None,
            1 => Some((point(W_TARGET), word(bytes, W_UPTO))),
            f => return Err(format!("in-flight flag {f}")),
        };
        let first = in_flight.map_or(head, |(_, upto)| head.min(upto));
        let upto_ok = in_flight.is_none_or(|(_, upto)| head <= upto && upto <= tail);
        if head > tail || tail - first > capacity || !upto_ok {
            return Err(format!(
                "head {head}, tail {tail}, in flight {in_flight:?}: not a ring of {capacity}"
            ));
        }
        let mut records = Vec::with_capacity((tail - first) as usize);
        for i in first..tail {
            let at = HEADER_BYTES + (i % capacity) as usize * RECORD_BYTES;
            let raw = RawRecord::read_from_bytes(&bytes[at..at + RECORD_BYTES])
                .map_err(|_| "record size".to_string())?;
            records.push(Record::from_raw(&raw).map_err(|e| format!("record {i}: {e}"))?);
        }
        Ok(LogImage {
            identity,
            valid: word(bytes, W_STATE) == STATE_VALID,
            durable: point(W_DURABLE),
            head,
            tail,
            in_flight,
            first,
            records,
        })
    }

    /// The records that follow `loaded` (the point recovery reached), for
    /// the cache and boot `identity`.
    pub fn pending(&self, identity: &Identity, loaded: Point) -> Pending<'_> {
        if !self.identity.same_cache(identity) {
            return Pending::Ignore("it belongs to another cache".into());
        }
        if self.identity.boot_id != identity.boot_id {
            return Pending::Ignore("it was written before the machine restarted".into());
        }
        if !self.valid {
            return Pending::Ignore(
                "it was marked incomplete (a commit failed or the log filled up)".into(),
            );
        }
        let from = |start: u64| Pending::Apply(&self.records[(start - self.first) as usize..]);
        match self.in_flight {
            Some((target, upto)) if target == loaded => from(upto),
            _ if self.durable == loaded => from(self.head),
            _ => Pending::Ignore(format!(
                "it follows {:?}, the cache is at {loaded:?}: the cache was opened without it since",
                self.durable
            )),
        }
    }
}

/// The live log of an open cache. Held under the engine's metadata lock.
pub struct CrashLog {
    path: PathBuf,
    /// Holds the flock for as long as the log lives; shared with a trim
    /// under way (`Trim`), which clears pages with no lock held.
    file: Arc<File>,
    map: *mut u8,
    map_bytes: usize,
    capacity: u64,
    /// Mirrors of words the engine changes (the mapping is only written).
    head: u64,
    tail: u64,
    valid: bool,
    /// A record was dropped (ring full) since the commit in flight began.
    dropped: bool,
    /// The commit in flight began while the log was invalid: its success
    /// makes the log valid again (unless a record was dropped meanwhile).
    revalidate: bool,
    upto: u64,
    /// Record pages (`RECORDS_PER_PAGE` records each, counted from record
    /// 0) below this one have been cleared.
    released_page: u64,
    /// The page slots a trim is clearing now (`Trim`): `first << 32 | n`,
    /// 0 when none. An append into one of them waits for the trim.
    fence: Arc<AtomicU64>,
}

/// Pages of durable records to clear (`CrashLog::plan_trim`): one run of
/// page slots, contiguous in the file, cleared by `run` after the metadata
/// lock is released (no system call runs under it). Until `run` ends, an
/// append that comes round the ring into these pages waits.
pub struct Trim {
    file: Arc<File>,
    offset: u64,
    len: u64,
    fence: Arc<AtomicU64>,
}

impl Trim {
    /// Clears the pages, then lifts the fence.
    pub fn run(self) {
        crate::sync::assert_unheld(crate::sync::Rank::Meta, "a crash log trim");
        clear(&self.file, self.offset, self.len);
        self.fence.store(0, Ordering::Release);
    }
}

/// Overwrites `len` bytes at `offset` of the file with zeroes, keeping
/// them allocated. Not a hole punch: a punched page of a shared mapping
/// is allocated again by the store that next writes it, and on a full
/// tmpfs that store gets SIGBUS (the fault cannot allocate); the pages
/// reserved at open (`reserve`) must stay reserved. Best effort: an
/// error leaves old, durable records there, which nothing reads.
fn clear(file: &File, offset: u64, len: u64) {
    use std::os::unix::fs::FileExt;
    static ZEROES: [u8; HEADER_BYTES] = [0; HEADER_BYTES];
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(HEADER_BYTES as u64);
        if file.write_all_at(&ZEROES[..n as usize], at).is_err() {
            return;
        }
        at += n;
    }
}

/// Allocates the file's first `bytes` bytes (their contents kept), so no
/// store into the mapping can fault on a full file system.
fn reserve(file: &File, bytes: u64) -> std::io::Result<()> {
    // SAFETY: posix_fallocate on our own descriptor; no memory is involved.
    // It returns the error number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) };
    match rc {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

// SAFETY: the mapping is owned by this value (unmapped on drop) and is only
// touched through `&mut self`, under the engine's metadata lock.
unsafe impl Send for CrashLog {}

/// Makes `dir` if it is missing (mode 0700) and opens it, refusing one
/// that is a symlink, belongs to another user or that others may write
/// in (sticky or not): the name is predictable
/// (`/dev/shm/tiercache-<uid>`), so another user may have made it first
/// to plant or redirect the log. One others may only read (0755, as a
/// scratch directory is made) is used: the log itself is 0600. The log is
/// then opened relative to this descriptor, so the directory checked is
/// the one used even if its name is swapped afterwards.
fn open_private_dir(dir: &Path) -> Result<File, CrashLogError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let io = |what| io_error(dir, what);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("creating the directory"))?;
    let fd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => CrashLogError::UnsafeFile {
                path: dir.to_path_buf(),
                why: "the crash log directory is a symbolic link or not a directory".into(),
            },
            _ => io("opening the directory")(e),
        })?;
    let st = fd.metadata().map_err(io("checking the directory"))?;
    let euid = effective_uid();
    if !owned_privately(&st) {
        return Err(CrashLogError::UnsafeDirectory {
            dir: dir.to_path_buf(),
            owner: st.uid(),
            mode: st.mode() & 0o7777,
            euid,
        });
    }
    Ok(fd)
}

/// Makes an I/O error of `what` on `path` a `CrashLogError`.
fn io_error<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> CrashLogError + 'a {
    move |source| CrashLogError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// This process's effective uid, whom its files and sockets belong to.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A file or directory of this user's that no one else may write: what the
/// crash log directory must be (the registry asks the same of its own).
pub fn owned_privately(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.uid() == effective_uid() && meta.mode() & 0o022 == 0
}

/// Opens (creating it, mode 0600) the log `name` in the directory `dir`
/// without following a symlink, and checks it is a plain file of this
/// user's with one name, of a size a log can have.
fn open_log_file(dir: &File, name: &std::ffi::OsStr, path: &Path) -> Result<File, CrashLogError> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let unsafe_file = |why: &str| CrashLogError::UnsafeFile {
        path: path.to_path_buf(),
        why: why.into(),
    };
    let c_name = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| unsafe_file("the file name holds a NUL byte"))?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: openat(2) on a directory descriptor we own, with a
    // NUL-terminated name; the result is checked before use.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c_name.as_ptr(),
            flags,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) {
            return Err(unsafe_file("it is a symbolic link"));
        }
        return Err(io_error(path, "opening")(e));
    }
    // SAFETY: `fd` was just returned by openat and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    check_log_file(&file, path)?;
    Ok(file)
}

/// A log file must be a plain file of this user's with one name and a
/// size a log can have; one whose mode lets others in is made 0600.
fn check_log_file(file: &File, path: &Path) -> Result<(), CrashLogError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let io = |what| io_error(path, what);
    let st = file.metadata().map_err(io("checking"))?;
    let euid = effective_uid();
    let why = if !st.file_type().is_file() {
        Some("it is not a regular file".to_string())
    } else if st.uid() != euid {
        Some(format!("it belongs to uid {}, not {euid}", st.uid()))
    } else if st.nlink() != 1 {
        Some(format!("it has {} hard links", st.nlink()))
    } else if st.len() > FILE_BYTES_MAX {
        Some(format!(
            "{} bytes, more than a log holds ({FILE_BYTES_MAX})",
            st.len()
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return Err(CrashLogError::UnsafeFile {
            path: path.to_path_buf(),
            why,
        });
    }
    if st.mode() & 0o077 != 0 {
        // Made by an older tiercache, which left the mode to the umask.
        let private = std::fs::Permissions::from_mode(0o600);
        file.set_permissions(private)
            .map_err(io("making it private"))?;
    }
    Ok(())
}

/// Opens (creating it and its directory, mode 0700) the log file at
/// `path` and takes its lock: a second process opening the same cache
/// fails here (`CrashLogError::Locked`).
fn open_locked(path: &Path) -> Result<File, CrashLogError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| CrashLogError::UnsafeFile {
        path: path.to_path_buf(),
        why: "the path names no file".into(),
    })?;
    let dir = open_private_dir(dir)?;
    let file = open_log_file(&dir, name, path)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(CrashLogError::Locked(path.to_path_buf()));
        }
        return Err(io_error(path, "locking")(e));
    }
    Ok(file)
}

/// A log file's bytes, for a reader that does not open the log (`check`):
/// never through a symlink, only from a regular file, at most
/// `FILE_BYTES_MAX` (a FIFO or a link to /dev/zero would never end).
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(FILE_BYTES_MAX).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A shared read-write mapping of the file's first `bytes` bytes.
fn map_shared(file: &File, bytes: usize) -> std::io::Result<*mut u8> {
    // SAFETY: a shared mapping of `bytes` bytes of a file the caller sized
    // and allocated to at least that length; checked for MAP_FAILED below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(map as *mut u8)
}

impl CrashLog {
    /// Opens (creating if needed) and locks the log at `path`; returns it
    /// with the image it held, if it parsed. The image's records still
    /// have to be matched to the cache (`LogImage::pending`); the log must
    /// be `reset` before use. The whole file is allocated here: a file
    /// system without room for it is an error now, never a SIGBUS on a
    /// later store into the mapping.
    pub fn open(
        path: &Path,
        capacity: u64,
    ) -> Result<(CrashLog, Result<LogImage, String>), CrashLogError> {
        use std::io::Read;
        let io = |what| io_error(path, what);
        assert!(capacity > 0, "a crash log holds at least one record");
        let file = Arc::new(open_locked(path)?);
        let mut old = Vec::new();
        // Read through the checked descriptor, never by name again.
        (&*file)
            .take(FILE_BYTES_MAX)
            .read_to_end(&mut old)
            .map_err(io("reading"))?;
        let image = LogImage::parse(&old);
        drop(old);
        let map_bytes = HEADER_BYTES + capacity as usize * RECORD_BYTES;
        reserve(&file, map_bytes as u64).map_err(|source| CrashLogError::NoSpace {
            path: path.to_path_buf(),
            bytes: map_bytes as u64,
            source,
        })?;
        file.set_len(map_bytes as u64).map_err(io("sizing"))?;
        let map = map_shared(&file, map_bytes).map_err(io("mapping"))?;
        let log = CrashLog {
            path: path.to_path_buf(),
            file,
            map,
            map_bytes,
            capacity,
            head: 0,
            tail: 0,
            valid: false,
            dropped: false,
            revalidate: false,
            upto: 0,
            released_page: 0,
            fence: Arc::new(AtomicU64::new(0)),
        };
        Ok((log, image))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS);
        // SAFETY: word i lies in the header, inside the mapping, and is
        // 8-byte aligned (the mapping is page aligned). Only this process
        // writes the file while it holds the lock.
        unsafe { &*(self.map.add(i * 8) as *const AtomicU64) }
    }

    fn store(&self, i: usize, v: u64) {
        self.word(i).store(v, Ordering::Release);
    }

    /// Starts an empty log for a cache at `durable`.
    /// The cache's slot count grew (its superblock says so now): the
    /// identity follows. A log that names fewer slots than its cache is
    /// still the cache's (`Identity::same_cache`), so a stop between the
    /// two loses nothing.
    pub fn slots_grew(&mut self, slot_count: u64) {
        self.store(W_IDENTITY + 2, slot_count);
    }

    pub fn reset(&mut self, identity: &Identity, durable: Point) {
        // Invalid while the header is rewritten: a stop half-way leaves a
        // log that is never applied.
        self.store(W_STATE, STATE_INVALID);
        self.store(W_INFLIGHT, 0);
        self.store(W_BOOT, identity.boot_id[0]);
        self.store(W_BOOT + 1, identity.boot_id[1]);
        for (k, &w) in identity.cache.iter().enumerate() {
            self.store(W_IDENTITY + k, w);
        }
        self.store(W_CAPACITY, self.capacity);
        self.store(W_DURABLE, durable.checkpoint_generation);
        self.store(W_DURABLE + 1, durable.journal_seq);
        self.store(W_HEAD, 0);
        self.store(W_TAIL, 0);
        self.store(W_VERSION, VERSION);
        self.store(W_MAGIC, MAGIC);
        self.store(W_STATE, STATE_VALID);
        (self.head, self.tail, self.upto) = (0, 0, 0);
        (self.valid, self.dropped, self.revalidate) = (true, false, false);
        // The previous life's records are not needed: clear them (their
        // pages stay allocated, see `clear`).
        clear(
            &self.file,
            HEADER_BYTES as u64,
            self.capacity * RECORD_BYTES as u64,
        );
        self.released_page = 0;
    }

    /// Clears the pages of records that are durable now, so the file holds
    /// no record older than the ring's live part (`plan_trim` and
    /// `Trim::run`, until nothing is left). The pages stay allocated.
    pub fn trim(&mut self) {
        while let Some(t) = self.plan_trim() {
            t.run();
        }
    }

    /// The next run of pages to clear, if any: a record page is cleared
    /// once `head` has passed it, unless the ring has come round and the
    /// tail writes in that page again. The pages count as cleared from
    /// here on; `Trim::run` clears them. `None` while an earlier trim is
    /// still clearing.
    pub fn plan_trim(&mut self) -> Option<Trim> {
        if !self.capacity.is_multiple_of(RECORDS_PER_PAGE) {
            return None; // small test logs: pages would hold records of two laps
        }
        if self.fence.load(Ordering::Acquire) != 0 {
            return None;
        }
        let pages = self.capacity / RECORDS_PER_PAGE;
        let head_page = self.head / RECORDS_PER_PAGE;
        // Pages below this one share their place in the ring with live
        // records (tail - capacity and up).
        let reused_below = self
            .tail
            .saturating_sub(self.capacity)
            .div_ceil(RECORDS_PER_PAGE);
        let p = self.released_page.max(reused_below);
        if p >= head_page {
            self.released_page = self.released_page.max(head_page);
            return None;
        }
        // One run of pages contiguous in the file (it breaks where the
        // ring wraps; the next plan takes the rest).
        let slot = p % pages;
        let n = (head_page - p).min(pages - slot);
        self.released_page = p + n;
        self.fence.store(slot << 32 | n, Ordering::Release);
        Some(Trim {
            file: self.file.clone(),
            offset: HEADER_BYTES as u64 + slot * HEADER_BYTES as u64,
            len: n * HEADER_BYTES as u64,
            fence: self.fence.clone(),
        })
    }

    /// Waits while a trim clears the page that record `at` goes into
    /// (the ring came round to it within one trim: rare, and short). No
    /// trim under way, the usual case, costs one atomic load.
    fn wait_for_trim(&self, at: u64) {
        loop {
            let f = self.fence.load(Ordering::Acquire);
            if f == 0 {
                return;
            }
            let (first, n) = (f >> 32, f & 0xffff_ffff);
            let page = (at % self.capacity) / RECORDS_PER_PAGE;
            if page < first || page >= first + n {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Records not known durable.
    pub fn len(&self) -> u64 {
        self.tail - self.head
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Mirrors an appended record. False if the ring was full (the log is
    /// then invalid until a later commit covers everything).
    pub fn append(&mut self, r: &Record) -> bool {
        if self.tail - self.head >= self.capacity {
            self.invalidate();
            self.dropped = true;
            return false;
        }
        // A trim fences pages only of logs whose capacity is whole pages.
        self.wait_for_trim(self.tail);
        let at = HEADER_BYTES + (self.tail % self.capacity) as usize * RECORD_BYTES;
        let raw = r.to_raw();
        let bytes = zerocopy::IntoBytes::as_bytes(&raw);
        // Kept in release builds: the copy below writes raw memory.
        assert!(
            at + RECORD_BYTES <= self.map_bytes,
            "crash log record past its mapping"
        );
        // SAFETY: `at..at + 16` lies inside the mapping (tail % capacity <
        // capacity records after the header); nothing else aliases it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.add(at), RECORD_BYTES) };
        self.tail += 1;
        self.store(W_TAIL, self.tail);
        true
    }

    fn invalidate(&mut self) {
        if self.valid {
            self.store(W_STATE, STATE_INVALID);
            self.valid = false;
        }
    }

    /// A commit of the `batch` records appended so far begins; it leads
    /// to `target`.
    pub fn begin_commit(&mut self, target: Point, batch: usize) {
        if !self.valid {
            // Every record not yet durable is in this batch: the ring
            // starts over behind it.
            self.head = self.tail;
            self.store(W_HEAD, self.head);
            self.revalidate = true;
            self.dropped = false;
        } else {
            assert_eq!(
                self.tail - self.head,
                batch as u64,
                "crash log and buffered records disagree"
            );
        }
        self.upto = self.tail;
        self.store(W_TARGET, target.checkpoint_generation);
        self.store(W_TARGET + 1, target.journal_seq);
        self.store(W_UPTO, self.upto);
        self.store(W_INFLIGHT, 1);
    }

    /// The commit begun last is durable: `target` is the durable point.
    pub fn commit_done(&mut self, target: Point) {
        self.store(W_DURABLE, target.checkpoint_generation);
        self.store(W_DURABLE + 1, target.journal_seq);
        self.head = self.upto;
        self.store(W_HEAD, self.head);
        self.store(W_INFLIGHT, 0);
        if self.revalidate && !self.dropped {
            self.store(W_STATE, STATE_VALID);
            self.valid = true;
        }
        self.revalidate = false;
    }

    /// The commit begun last failed: its records stay buffered in memory,
    /// and what reached the journal is unknown.
    pub fn commit_failed(&mut self) {
        self.invalidate();
        self.store(W_INFLIGHT, 0);
        self.revalidate = false;
    }

    /// A copy of the whole mapping.
    pub fn image_bytes(&self) -> Vec<u8> {
        // SAFETY: the mapping is `map_bytes` long and stays mapped while
        // `self` lives; only this process writes it, under `&mut self`.
        unsafe { std::slice::from_raw_parts(self.map, self.map_bytes) }.to_vec()
    }

    /// After a clean close: the log has nothing to add; remove it.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for CrashLog {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_bytes) };
    }
}

/// The fuzz target's body (fuzz/fuzz_targets/crash_log.rs): a log file's
/// bytes, parsed and matched the way open does, its records applied to a
/// small table the way recovery applies them. Never panics on any input;
/// asserts what parsing promises.
#[cfg(any(test, feature = "testing"))]
pub fn fuzz_exercise(data: &[u8]) {
    use crate::engine::meta::Table;
    let Ok(image) = LogImage::parse(data) else {
        return;
    };
    assert_eq!(image.records.len() as u64, image.tail - image.first);
    assert!(image.first <= image.head && image.head <= image.tail);
    let mut points = vec![
        image.durable,
        Point {
            checkpoint_generation: 0,
            journal_seq: 0,
        },
    ];
    points.extend(image.in_flight.map(|(target, _)| target));
    for at in points {
        if let Pending::Apply(records) = image.pending(&image.identity, at) {
            assert!(records.len() <= image.records.len());
            let mut table = Table::new(64, crate::engine::origin::address::KeySpace::one(1024), 8);
            for r in records {
                if table.validate(r).is_err() {
                    break;
                }
                table.apply(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sectors::SectorRun;

    fn point(g: u64, s: u64) -> Point {
        Point {
            checkpoint_generation: g,
            journal_seq: s,
        }
    }

    fn rec(i: u32) -> Record {
        Record::Map {
            slot: i,
            block: i as u64 * 3,
            dirty: true,
        }
    }

    fn id() -> Identity {
        Identity {
            boot_id: boot_id(),
            cache: [1, 2, 3, 4096],
        }
    }

    fn image(log: &CrashLog) -> LogImage {
        LogImage::parse(&std::fs::read(log.path()).unwrap()).unwrap()
    }

    fn new_log(dir: &Path, capacity: u64) -> CrashLog {
        let (mut log, _) = CrashLog::open(&dir.join("log"), capacity).unwrap();
        log.reset(&id(), point(5, 100));
        log
    }

    #[test]
    fn records_after_the_durable_point_are_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), 64);
        for i in 0..3 {
            assert!(log.append(&rec(i)));
        }
        let img = image(&log);
        assert_eq!(
            img.pending(&id(), point(5, 100)),
            Pending::Apply(&[rec(0), rec(1), rec(2)])
        );
        assert!(matches!(
            img.pending(&id(), point(5, 101)),
            Pending::Ignore(_)
        ));
        let other = Identity {
            cache: [9, 2, 3, 4096],
            ..id()
        };
        assert!(matches!(
            img.pending(&other, point(5, 100)),
            Pending::Ignore(_)
        ));
        let rebooted = Identity {
            boot_id: [1, 1],
            ..id()
        };
        assert!(matches!(
            img.pending(&rebooted, point(5, 100)),
            Pending::Ignore(_)
        ));
    }

    /// Every stop point of a commit: the log gives the records that the
    /// reached state lacks, whether the commit's pages made it or not.
    #[test]
    fn a_commit_in_flight_is_read_by_where_the_disk_got() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), 64);
        log.append(&rec(0));
        log.append(&rec(1));
        log.begin_commit(point(5, 101), 2);
        log.append(&rec(2));
        let img = image(&log);
        // The journal page did not make it: everything is pending.
        assert_eq!(
            img.pending(&id(), point(5, 100)),
            Pending::Apply(&[rec(0), rec(1), rec(2)])
        );
        // It did: only what came after the batch.
        assert_eq!(img.pending(&id(), point(5, 101)), Pending::Apply(&[rec(2)]));
        log.commit_done(point(5, 101));
        let img = image(&log);
        assert_eq!(img.pending(&id(), point(5, 101)), Pending::Apply(&[rec(2)]));
        assert!(matches!(
            img.pending(&id(), point(5, 100)),
            Pending::Ignore(_)
        ));
    }

    #[test]
    fn a_full_ring_invalidates_until_a_commit_covers_everything() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), 4);
        for i in 0..4 {
            assert!(log.append(&rec(i)));
        }
        assert!(!log.append(&rec(4)));
        assert!(!image(&log).valid);
        log.begin_commit(point(6, 100), 5);
        log.append(&rec(5));
        assert!(!image(&log).valid, "invalid until the commit is durable");
        log.commit_done(point(6, 100));
        let img = image(&log);
        assert!(img.valid);
        assert_eq!(img.pending(&id(), point(6, 100)), Pending::Apply(&[rec(5)]));
    }

    #[test]
    fn a_failed_commit_invalidates_until_the_next_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), 16);
        log.append(&rec(0));
        log.begin_commit(point(5, 101), 1);
        log.commit_failed();
        assert!(!image(&log).valid);
        log.append(&rec(1));
        log.begin_commit(point(5, 101), 2);
        log.commit_done(point(5, 101));
        let img = image(&log);
        assert!(img.valid);
        assert_eq!(img.pending(&id(), point(5, 101)), Pending::Apply(&[]));
    }

    #[test]
    fn the_ring_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), 4);
        let mut durable = 100;
        for round in 0..10u32 {
            for k in 0..3 {
                assert!(log.append(&rec(round * 3 + k)));
            }
            durable += 1;
            log.begin_commit(point(5, durable), 3);
            log.commit_done(point(5, durable));
        }
        let r = Record::AddRun {
            slot: 7,
            block: 9,
            run: SectorRun { first: 1, count: 2 },
            dirty: true,
        };
        log.append(&r);
        assert_eq!(
            image(&log).pending(&id(), point(5, durable)),
            Pending::Apply(&[r])
        );
    }

    /// Pages of durable records are cleared; pending ones stay. Every page
    /// stays allocated: a store never has to allocate one (a full tmpfs
    /// would answer that store with SIGBUS).
    #[test]
    fn durable_records_are_cleared_and_their_pages_stay_allocated() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let pages = 8;
        let mut log = new_log(dir.path(), pages * RECORDS_PER_PAGE);
        let file_bytes = HEADER_BYTES as u64 * (pages + 1);
        let allocated = |log: &CrashLog| std::fs::metadata(log.path()).unwrap().blocks() * 512;
        assert!(allocated(&log) >= file_bytes, "allocated at open");
        let mut durable = 100;
        let mut next = 0u32;
        // Several laps of the ring, committing 3.5 pages at a time, with
        // records pending across each commit.
        for _ in 0..20 {
            let batch = (RECORDS_PER_PAGE * 7 / 2) as usize;
            for _ in 0..batch {
                assert!(log.append(&rec(next % 1000)));
                next += 1;
            }
            durable += 1;
            log.begin_commit(point(5, durable), log.len() as usize);
            for _ in 0..10 {
                assert!(log.append(&rec(next % 1000)));
                next += 1;
            }
            log.commit_done(point(5, durable));
            log.trim();
            assert!(
                allocated(&log) >= file_bytes,
                "{} of {file_bytes} bytes allocated after a trim",
                allocated(&log)
            );
            let bytes = std::fs::read(log.path()).unwrap();
            let records = &bytes[HEADER_BYTES..];
            let live = records
                .chunks(RECORD_BYTES)
                .filter(|r| r.iter().any(|&b| b != 0));
            // The page holding the pending records, and at most one more
            // partly consumed one, hold records.
            assert!(
                live.count() as u64 <= 2 * RECORDS_PER_PAGE,
                "durable records left uncleared"
            );
            let img = image(&log);
            let want: Vec<Record> = (next - 10..next).map(|i| rec(i % 1000)).collect();
            assert_eq!(img.pending(&id(), point(5, durable)), Pending::Apply(&want));
        }
    }

    /// A trim clears its pages with no lock held; an append that comes
    /// round the ring into them meanwhile waits for the trim, so the trim
    /// never zeroes a live record.
    #[test]
    fn an_append_into_pages_being_cleared_waits_for_the_trim() {
        let dir = tempfile::tempdir().unwrap();
        let pages = 4;
        let mut log = new_log(dir.path(), pages * RECORDS_PER_PAGE);
        let mut next = 0u32;
        let mut append = |log: &mut CrashLog, n: u64| {
            for _ in 0..n {
                assert!(log.append(&rec(next % 1000)));
                next += 1;
            }
        };
        // Two pages durable: the trim takes pages 0 and 1.
        append(&mut log, 2 * RECORDS_PER_PAGE + 5);
        log.begin_commit(point(5, 101), log.len() as usize);
        log.commit_done(point(5, 101));
        let trim = log.plan_trim().expect("two pages to clear");
        assert!(log.plan_trim().is_none(), "one trim at a time");
        // Fill the ring up to where it comes round to page 0.
        append(&mut log, 2 * RECORDS_PER_PAGE - 5);
        let cleared = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let p = cleared.clone();
        let clearing = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            p.store(true, Ordering::SeqCst);
            trim.run();
        });
        append(&mut log, 3);
        assert!(
            cleared.load(Ordering::SeqCst),
            "the append into a page being cleared did not wait"
        );
        clearing.join().unwrap();
        let img = image(&log);
        let want: Vec<Record> = (next - 2 * RECORDS_PER_PAGE as u32 - 3 + 5..next)
            .map(|i| rec(i % 1000))
            .collect();
        assert_eq!(img.pending(&id(), point(5, 101)), Pending::Apply(&want));
    }

    /// Seeds for the fuzz target: valid logs, idle, with a commit in flight,
    /// and wrapped.
    #[test]
    #[ignore]
    fn write_fuzz_seeds() {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/crash_log");
        std::fs::create_dir_all(&out).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), RECORDS_PER_PAGE);
        let save = |log: &CrashLog, name: &str| {
            std::fs::write(out.join(name), log.image_bytes()).unwrap();
        };
        for i in 0..5 {
            log.append(&rec(i));
        }
        save(&log, "pending");
        log.begin_commit(point(5, 101), 5);
        log.append(&Record::AddRun {
            slot: 3,
            block: 9,
            run: SectorRun { first: 2, count: 3 },
            dirty: true,
        });
        save(&log, "in_flight");
        log.commit_done(point(5, 101));
        for round in 0..3u64 {
            for i in 0..200 {
                log.append(&Record::Unmap { slot: i });
            }
            log.begin_commit(point(5, 102 + round), 200 + usize::from(round == 0));
            log.commit_done(point(5, 102 + round));
        }
        log.append(&Record::Clean { slot: 7 });
        save(&log, "wrapped");
    }

    #[test]
    fn fuzz_body_survives_mutations_of_valid_logs() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), RECORDS_PER_PAGE);
        for i in 0..40 {
            log.append(&rec(i % 60));
        }
        log.begin_commit(point(5, 101), 40);
        log.append(&rec(3));
        let good = log.image_bytes();
        fuzz_exercise(&good);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut bytes = good.clone();
            for _ in 0..6 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = (rng % (HEADER_BYTES as u64 + 50 * 16)) as usize;
                bytes[at] ^= (rng >> 40) as u8;
            }
            fuzz_exercise(&bytes);
        }
    }

    #[test]
    fn a_second_opener_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _log = new_log(dir.path(), 4);
        assert!(matches!(
            CrashLog::open(&dir.path().join("log"), 4),
            Err(CrashLogError::Locked(_))
        ));
    }

    /// A log that is a symlink is refused, and its target untouched.
    #[test]
    fn a_symlinked_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("canary");
        std::fs::write(&canary, b"precious").unwrap();
        std::os::unix::fs::symlink(&canary, dir.path().join("log")).unwrap();
        let e = CrashLog::open(&dir.path().join("log"), 4)
            .err()
            .expect("refused");
        assert!(matches!(e, CrashLogError::UnsafeFile { .. }), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&canary).unwrap(), b"precious");
    }

    /// A file with another name (a hard link) is refused: its other name
    /// may be a file that matters.
    #[test]
    fn a_hard_linked_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("other"), b"x").unwrap();
        std::fs::hard_link(dir.path().join("other"), dir.path().join("log")).unwrap();
        let e = CrashLog::open(&dir.path().join("log"), 4)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("2 hard links"), "{e}");
    }

    /// A directory others may write in is refused, naming owner and mode
    /// (one they may only read is used: the log is 0600); a symlink to a
    /// directory too; a missing one is made 0700.
    #[test]
    fn only_a_private_directory_is_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open_dir = dir.path().join("open");
        std::fs::create_dir(&open_dir).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = CrashLog::open(&open_dir.join("log"), 4)
            .err()
            .expect("refused");
        let text = e.to_string();
        assert!(matches!(e, CrashLogError::UnsafeDirectory { .. }), "{text}");
        assert!(
            text.contains("mode 1777") && text.contains("rm -r"),
            "{text}"
        );
        assert!(!open_dir.join("log").exists(), "nothing is made in it");
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(CrashLog::open(&open_dir.join("log"), 4).unwrap());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("private"), &link).unwrap();
        std::fs::create_dir(dir.path().join("private")).unwrap();
        let e = CrashLog::open(&link.join("log"), 4).err().expect("refused");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let fresh = dir.path().join("a/b");
        let _log = CrashLog::open(&fresh.join("log"), 4).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let mode = std::fs::metadata(fresh.join("log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn garbage_never_parses_into_records_past_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = new_log(dir.path(), 8);
        log.append(&rec(1));
        let good = std::fs::read(log.path()).unwrap();
        let mut rng = 0x9e3779b97f4a7c15u64;
        for _ in 0..2000 {
            let mut bytes = good.clone();
            for _ in 0..4 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = (rng % (WORDS as u64 * 8 + 64)) as usize;
                bytes[at] = (rng >> 32) as u8;
            }
            if let Ok(img) = LogImage::parse(&bytes) {
                assert!(img.records.len() as u64 <= 8);
            }
        }
        assert!(LogImage::parse(&good[..100]).is_err());
    }
}
