//! The device layer: every byte the engine reads or writes goes through
//! [`BlockDevice`]. Backends: a file or block device (`file.rs`), volatile RAM
//! (`ram.rs`), a wrapper that delays every request (`latency.rs`, the
//! demo's slow origin), an NBD export (`nbd/`), a Ceph RBD image through
//! librbd (`rbd/`), and, with the `testing` feature (the tests and fuzz
//! targets turn it on), a fault-injecting device (`fault.rs`) and a
//! recording wrapper whose log rebuilds crash images (`recorder.rs`).

pub mod buf;
mod claim;
pub use claim::proc_strings;

#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub mod file;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod latency;
pub mod members;
pub mod nbd;
pub mod probe;
pub mod ram;
pub mod rbd;
#[cfg(any(test, feature = "testing"))]
pub mod recorder;
pub mod set;
mod uring;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use buf::AlignedBuf;

/// Errors of the device layer.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The operating system reported an I/O error.
    #[error("{what} on {device}: {source}")]
    Io {
        device: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The request lies (partly) beyond the end of the device.
    #[error("{device}: request at {offset}+{len} is beyond the device end {size}")]
    OutOfRange {
        device: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    /// The request is not aligned to the device's 512-byte sector size.
    #[error("{device}: request at {offset}+{len} is not 512-byte aligned")]
    Unaligned {
        device: String,
        offset: u64,
        len: u64,
    },
    /// An error injected by the fault backend.
    #[error("{device}: injected I/O error at {offset}")]
    Injected { device: String, offset: u64 },
    /// The device specification given by the user cannot be opened.
    #[error("cannot open device '{spec}': {reason}")]
    Open { spec: String, reason: String },
    /// The device is not there: no such file or device node, or no such
    /// device behind it (ENOENT, ENXIO, ENODEV).
    #[error("cannot open device '{spec}': {reason}")]
    Missing { spec: String, reason: String },
    /// A cache set cannot open because members are missing that no label
    /// names failed (`set/open.rs`): it may open degraded on the
    /// operator's word.
    #[error("cannot open device '{spec}': {reason}")]
    Degraded { spec: String, reason: String },
    /// Another open of the device holds it (`claim.rs`): a writer takes it
    /// alone, readers share it. `holder` says who; `pid` is the process
    /// whose descriptor holds the lock, when it was found.
    #[error("{device} is in use: {holder}")]
    InUse {
        device: String,
        holder: String,
        pid: Option<u32>,
    },
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Sector size every request must be aligned to.
pub const SECTOR_BYTES: u64 = 512;

/// Longest a request to a device behind a network (an NBD export, an RBD
/// image) waits for its answer by default: then the server is taken to
/// have stopped answering (frozen, a partition without a reset, a wedged
/// OSD), the request fails and the device says it is unreachable. The
/// kernel's NBD client and block layer also wait 30 s.
pub const ORIGIN_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(30);
static ORIGIN_TIMEOUT_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(ORIGIN_TIMEOUT_DEFAULT.as_millis() as u64);

/// Sets the request timeout of network devices opened from now on (`serve
/// --origin-timeout`; at least 1 ms).
pub fn set_origin_timeout(t: std::time::Duration) {
    let ms = (t.as_millis() as u64).max(1);
    ORIGIN_TIMEOUT_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// The request timeout of network devices (`set_origin_timeout`).
pub fn origin_timeout() -> std::time::Duration {
    std::time::Duration::from_millis(ORIGIN_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// One block device. All methods are blocking and may be called from many
/// threads at once; requests for disjoint ranges never wait on each other.
///
/// Durability contract (the same as a disk with a volatile write cache): a
/// completed `write_at` may still be lost or torn (at 512-byte granularity) by
/// a power loss until a later `flush` completes.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes (a multiple of 512).
    fn size_bytes(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`. Offset and length are multiples of 512.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()>;
    /// Writes `buf` at `offset`. Offset and length are multiples of 512.
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> DeviceResult<()>;
    /// Tells the device that a range's contents are no longer needed. Reads
    /// of the range afterwards return either the old bytes or zeroes.
    fn discard(&self, _offset: u64, _len: u64) -> DeviceResult<()> {
        Ok(())
    }
    /// True if discarding a range helps the device (flash TRIM, a thin
    /// export, memory given back) without making the next write there
    /// costlier. The log placement discards freed segments only then: on a
    /// regular file a discard punches a hole, and the next write into it
    /// must allocate blocks again.
    fn discard_helps(&self) -> bool {
        false
    }
    /// A count that moves whenever writes this device acknowledged may
    /// have been lost without an error for them: a reconnect to a server
    /// (its volatile cache may have gone with it), a flush that failed (the
    /// pages it could not write may be dropped, and a later flush succeed
    /// without them: "fsyncgate"). A successful flush covers a write only
    /// if the count is the same after it as before the write; callers
    /// compare (engine/origin/sync.rs). 0 for a device that cannot lose
    /// acknowledged writes that way.
    fn loss_epoch(&self) -> u64 {
        0
    }
    /// Reads the device's size again and keeps it from now on (a file or
    /// block device grown by truncate or lvextend, an image `rbd resize`d):
    /// requests may then reach the new end. Returns the size now. A device
    /// that cannot learn a new size while it is open keeps the one it had
    /// (RAM; an NBD export, whose size is its handshake's).
    fn refresh_size(&self) -> DeviceResult<u64> {
        Ok(self.size_bytes())
    }
    /// Releases what the device holds outside this process once no more
    /// requests will come (an RBD image's watch on the OSDs); requests
    /// after it fail. The engine closes its origin when it is closed or
    /// detached, as the process may end without dropping it.
    fn close(&self) -> DeviceResult<()> {
        Ok(())
    }
    /// Gives the device back while this value lives on (an origin removed
    /// from a served cache: `tiercache remove-origin`): whatever claims it
    /// (a block device's O_EXCL open, a file's lock, an RBD image's watch)
    /// is released, so another program may open it; every request after
    /// it fails. By default, `close`.
    fn let_go(&self) -> DeviceResult<()> {
        self.close()
    }
    /// True if reads made at once from several threads finish sooner
    /// than one after another: a device with a queue of its own (a block
    /// device, a file, an NBD export). Writeback reads a run's scattered
    /// slots so (`writeback/run.rs`, `read_run`). False for RAM and the
    /// test devices, whose operations' order a crash test's seed replays.
    fn reads_in_parallel(&self) -> bool {
        false
    }
    /// True if the contents do not survive a process exit (RAM).
    fn is_volatile(&self) -> bool {
        false
    }
    /// A human-readable name, for messages.
    fn name(&self) -> &str;
    /// A stable identity of the device, recorded in the cache superblock so a
    /// cache is never attached to the wrong origin (see docs/format.md).
    fn identity(&self) -> u64 {
        0
    }
    /// What a device of several members (a cache set) tells the engine
    /// and takes from it (`members.rs`); `None` for one device.
    fn members(&self) -> Option<&dyn members::Members> {
        None
    }
    /// The file or block device this is, unwrapped (a cache set writes two
    /// such members' copies in one submission: `FileDevice::write_pair`).
    fn as_file(&self) -> Option<&file::FileDevice> {
        None
    }
    /// Whether a device behind a connection (an NBD export) can be reached
    /// now, as of this call. `None` for a device that has no connection to
    /// lose (a file, RAM): it is always there.
    fn health(&self) -> Option<DeviceHealth> {
        None
    }
    /// `health()`'s `reachable` alone, for the data path's checks: a
    /// device behind connections answers it without building the whole
    /// report (which clones the last error).
    fn is_reachable(&self) -> bool {
        self.health().is_none_or(|h| h.reachable)
    }
    /// Requests started without blocking, for a device whose requests
    /// complete on its own threads (librbd's): [`Submit`]. `None` for the
    /// others, whose callers block in `read_at`/`write_at`.
    fn submitter(&self) -> Option<&dyn Submit> {
        None
    }
}

/// How a [`Submit`] request ends: its buffer given back, with the outcome.
/// Runs once, on whatever thread completed the request (possibly the
/// submitter's, before `submit_*` returns); it must not block.
pub type Done = Box<dyn FnOnce(AlignedBuf, DeviceResult<()>) + Send>;

/// The asynchronous side of a [`BlockDevice`] (`BlockDevice::submitter`):
/// reads and writes under the same rules (range, alignment), started
/// without waiting for them. The device holds the buffer until `done`. The
/// engine sends this way the reads of blocks the cache holds none of, and
/// the origin writes of blocks it holds none of that need no wait first
/// (engine/io/submitted.rs); a write's durability is the device's `flush`,
/// as for `write_at`.
pub trait Submit: Send + Sync {
    /// Reads `buf.len()` bytes at `offset` into `buf`.
    fn submit_read(&self, buf: AlignedBuf, offset: u64, done: Done);
    /// Writes `buf` at `offset`.
    fn submit_write(&self, buf: AlignedBuf, offset: u64, done: Done);
}

/// The reachability of a device behind connections ([`BlockDevice::health`]):
/// what `status` shows of the origin. Times are taken when it is built.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceHealth {
    /// False while no connection to the server is up: every request fails
    /// at once with [`DeviceError::Io`] until a reconnect succeeds.
    pub reachable: bool,
    /// While unreachable: since when, in Unix seconds (the wall clock, for
    /// people; the duration below is measured on the monotonic clock).
    pub unreachable_since_unix_s: Option<u64>,
    /// While unreachable: for how long, in seconds.
    pub unreachable_s: Option<f64>,
    /// Why the last connection was lost or the last reconnect attempt
    /// failed (kept after a reconnect, for the record).
    pub last_error: Option<String>,
    /// Connections up, of `connections`.
    pub connections_up: u32,
    pub connections: u32,
    /// Reconnect attempts since the device was opened, and how many of them
    /// brought every connection back.
    pub reconnect_attempts: u64,
    pub reconnects: u64,
    /// While a connection is down: seconds until the next reconnect attempt.
    pub next_attempt_s: Option<f64>,
}

pub type DeviceRef = Arc<dyn BlockDevice>;

/// Checks a request against the device bounds and the sector alignment.
pub fn check_range(dev: &dyn BlockDevice, offset: u64, len: u64) -> DeviceResult<()> {
    if !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) {
        return Err(DeviceError::Unaligned {
            device: dev.name().to_string(),
            offset,
            len,
        });
    }
    let end = offset.checked_add(len);
    if end.is_none_or(|e| e > dev.size_bytes()) {
        return Err(DeviceError::OutOfRange {
            device: dev.name().to_string(),
            offset,
            len,
            size: dev.size_bytes(),
        });
    }
    Ok(())
}

/// FNV-1a, 64-bit. Device identities are stored on disk, so they need a hash
/// that is fixed forever; std's `DefaultHasher` is allowed to change between
/// Rust releases and `RandomState` is seeded per process.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET_BASIS, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Parses a size such as `512`, `64M`, `1G`, `4KiB`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let n: u64 = s[..digits_end].parse().ok()?;
    let unit = s[digits_end..].trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Opens a device from a user specification: `ram:SIZE`, an NBD URI
/// (`nbd://host[:port]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`), an RBD
/// image (`rbd://POOL/IMAGE[?conf=PATH&id=NAME]`), or a path to a file or
/// block device.
///
/// A file or block device is claimed for this open alone (`claim.rs`):
/// another open of it is refused with [`DeviceError::InUse`] while this one
/// lives. The others cannot be claimed from here: a RAM device is private
/// to this process anyway; an NBD export's server decides who may connect
/// (qemu-nbd takes one client unless `--shared`, nbdkit any number); an RBD
/// image's exclusive-lock feature passes the lock between writers instead
/// of refusing one. Two daemons writing one export or image are not caught.
pub fn open_device(spec: &str) -> DeviceResult<DeviceRef> {
    if NBD_SCHEMES.iter().any(|s| spec.starts_with(s)) {
        return Ok(Arc::new(nbd::NbdDevice::connect(spec, 1)?));
    }
    if spec.starts_with("rbd://") {
        return Ok(Arc::new(rbd::RbdDevice::open(spec)?));
    }
    if let Some(size) = spec.strip_prefix("ram:") {
        let bytes = parse_size(size).ok_or_else(|| DeviceError::Open {
            spec: spec.to_string(),
            reason: format!("'{size}' is not a size (examples: 64M, 1G)"),
        })?;
        if bytes == 0 || !bytes.is_multiple_of(SECTOR_BYTES) {
            return Err(DeviceError::Open {
                spec: spec.to_string(),
                reason: "a RAM device size must be a non-zero multiple of 512 bytes".into(),
            });
        }
        return Ok(Arc::new(ram::RamDevice::new(spec, bytes)));
    }
    Ok(Arc::new(file::FileDevice::open(spec)?))
}

/// The NBD URI schemes. TLS and vsock are routed too, so they get a clear
/// refusal instead of "no such file".
const NBD_SCHEMES: [&str; 5] = [
    "nbd://",
    "nbd+unix://",
    "nbds://",
    "nbds+unix://",
    "nbd+vsock://",
];

/// True if `spec` is a URI of a device behind a network (an NBD export, an
/// RBD image), not a path.
pub fn is_network_spec(spec: &str) -> bool {
    NBD_SCHEMES.iter().any(|s| spec.starts_with(s)) || spec.starts_with("rbd://")
}

/// Opens a device to read it only, sharing it with other readers: a file
/// or block device opened read-only under a shared lock (`claim.rs`), so
/// no byte of it can be written through this open and no writer holds it
/// meanwhile. NBD and RBD devices open as `open_device` does (their server
/// decides who may write; nothing here writes them). A RAM device has
/// nothing to read: refused.
pub fn open_device_read_only(spec: &str) -> DeviceResult<DeviceRef> {
    if spec.starts_with("ram:") {
        return Err(DeviceError::Open {
            spec: spec.to_string(),
            reason: "a RAM device lives only in the process that made it".into(),
        });
    }
    if is_network_spec(spec) {
        return open_device(spec);
    }
    Ok(Arc::new(file::FileDevice::open_read_only(spec)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("4KiB"), Some(4096));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(parse_size("99999999T"), None);
    }

    #[test]
    fn fnv1a64_reference_vectors() {
        // Published FNV-1a 64-bit test vectors; on-disk identities depend on them.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
