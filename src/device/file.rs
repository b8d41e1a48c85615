//! A regular file or a block device as a [`BlockDevice`].
//!
//! Opened with O_DIRECT where the kernel allows it, so cached blocks are not
//! held a second time in the page cache and a completed write has reached the
//! device (whose own volatile cache `flush` then drains). Where O_DIRECT is
//! refused (tmpfs, some FUSE and network filesystems, devices whose logical
//! sector is larger than 512 bytes) the file is used through the page cache;
//! the durability contract of [`BlockDevice`] is the same, because in both
//! modes only `flush` (fdatasync) makes completed writes durable.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::buf::{is_aligned_ptr, AlignedBuf, BUF_ALIGN_BYTES};
use super::claim::{self, Access};
use super::{check_range, fnv1a64, BlockDevice, DeviceError, DeviceResult, SECTOR_BYTES};

/// `BLKGETSIZE64 = _IOR(0x12, 114, size_t)` from linux/fs.h: device size in bytes.
const BLKGETSIZE64: u32 = 0x8008_1272;
/// `BLKDISCARD = _IO(0x12, 119)` from linux/fs.h: discard a `[offset, len]` byte range.
const BLKDISCARD: u32 = 0x1277;

/// Largest bounce buffer used for a caller buffer that O_DIRECT cannot take,
/// so one huge unaligned request cannot allocate without bound.
const BOUNCE_MAX_BYTES: usize = 1 << 20;

/// The fallback to buffered I/O is worth one warning per process, not one per
/// device opened (tests and the demo open many).
static BUFFERED_FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

/// What the path names; decides how size, discard and identity are obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RegularFile,
    BlockDevice,
}

/// A regular file or a block device. Requests go straight to pread/pwrite on
/// one shared descriptor, so requests from different threads never wait on
/// each other in this layer.
pub struct FileDevice {
    name: String,
    file: File,
    kind: Kind,
    /// Whole sectors, as of the open or the last `refresh_size`.
    size_bytes: AtomicU64,
    direct: bool,
    identity: u64,
    /// Failed flushes (`BlockDevice::loss_epoch`): after one, the kernel
    /// may have dropped the dirty pages it could not write, and the next
    /// fdatasync succeeds without them.
    failed_flushes: std::sync::atomic::AtomicU64,
}

/// The open file, for requests the caller makes itself (the ublk queue's
/// io_uring reads of cache hits: `engine/io/direct.rs`). Reads at byte X of
/// the device are reads at byte X of this descriptor; with O_DIRECT
/// (`is_direct`) buffers and offsets must be sector aligned.
impl AsRawFd for FileDevice {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl FileDevice {
    /// Opens a regular file or a block device read-write, with O_DIRECT when
    /// the kernel accepts it (see [`FileDevice::is_direct`]), and claims it
    /// for this open alone (`claim.rs`): a block device with O_EXCL, any
    /// device with an exclusive OFD lock. A device another open holds is
    /// refused with [`DeviceError::InUse`], naming the holder. Directories,
    /// character devices, FIFOs, sockets, missing paths and devices smaller
    /// than one 512-byte sector are refused with [`DeviceError::Open`].
    pub fn open(path: &str) -> DeviceResult<Self> {
        FileDevice::open_as(path, Access::Write)
    }

    /// Opens a regular file or a block device read-only, under a shared
    /// OFD lock: other readers may hold it too, no writer (a tiercache that
    /// serves or changes it) while this open lives. Nothing can be written
    /// through it (the descriptor is O_RDONLY).
    pub fn open_read_only(path: &str) -> DeviceResult<Self> {
        FileDevice::open_as(path, Access::Read)
    }

    fn open_as(path: &str, access: Access) -> DeviceResult<Self> {
        let open_err = |reason: String| DeviceError::Open {
            spec: path.to_string(),
            reason,
        };

        // Classified before opening: opening a FIFO or a terminal read-write
        // has side effects, and the reason given is clearer than EISDIR.
        let meta = std::fs::metadata(path).map_err(|e| match is_missing(&e) {
            true => DeviceError::Missing {
                spec: path.to_string(),
                reason: e.to_string(),
            },
            false => open_err(e.to_string()),
        })?;
        let kind = classify(&meta).map_err(open_err)?;
        let how = How { kind, access };

        let (file, direct) = match how.open(path, libc::O_DIRECT) {
            Ok(file) => (file, true),
            Err(OpenFailed::Os(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                let file = how.open(path, 0).map_err(|e| e.into_device_error(path))?;
                warn_buffered(path, "the filesystem refuses O_DIRECT opens");
                (file, false)
            }
            Err(e) => return Err(e.into_device_error(path)),
        };
        // The path may have been replaced between the stat and the open;
        // from here on only the descriptor's own metadata counts.
        let meta = file.metadata().map_err(|e| open_err(e.to_string()))?;
        if classify(&meta).map_err(open_err)? != kind {
            return Err(open_err("the path was replaced while opening it".into()));
        }
        how.claim(path, &file)?;

        let size_bytes = device_size_bytes(&file, kind, &meta).map_err(open_err)?;
        let (file, direct) = if direct {
            keep_direct_or_reopen(path, file, &meta, size_bytes, how)?
        } else {
            (file, false)
        };

        let identity = match kind {
            Kind::RegularFile => regular_file_identity(&meta),
            Kind::BlockDevice => block_device_identity(meta.rdev()),
        };
        Ok(FileDevice {
            name: path.to_string(),
            file,
            kind,
            size_bytes: AtomicU64::new(size_bytes),
            direct,
            identity,
            failed_flushes: Default::default(),
        })
    }

    /// True if requests bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// True if the path is a block device rather than a regular file.
    pub fn is_block_device(&self) -> bool {
        self.kind == Kind::BlockDevice
    }

    /// Writes `buf` at `offset` on this device and on `other` at once, in
    /// one submission (`uring.rs`); each write's result, or `None` if that
    /// cannot be done (no io_uring; a buffer O_DIRECT cannot take; a range
    /// past either end, which the caller's own path then reports): then
    /// nothing was written.
    pub(crate) fn write_pair(
        &self,
        other: &FileDevice,
        buf: &[u8],
        offset: u64,
    ) -> Option<(DeviceResult<()>, DeviceResult<()>)> {
        let aligned = is_aligned_ptr(buf.as_ptr());
        let len = buf.len() as u64;
        if buf.is_empty()
            || (self.direct || other.direct) && !aligned
            || check_range(self, offset, len).is_err()
            || check_range(other, offset, len).is_err()
        {
            return None;
        }
        let [ra, rb] =
            super::uring::write_pair([self.file.as_raw_fd(), other.file.as_raw_fd()], buf, offset)?;
        // A short write (the kernel may stop early) is finished here.
        let finish = |dev: &FileDevice, r: io::Result<usize>| {
            let n = r.map_err(|e| dev.io_err("write", e))?;
            if n < buf.len() {
                dev.file
                    .write_all_at(&buf[n..], offset + n as u64)
                    .map_err(|e| dev.io_err("write", e))?;
            }
            Ok(())
        };
        Some((finish(self, ra), finish(other, rb)))
    }

    fn io_err(&self, what: &'static str, source: io::Error) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            what,
            source,
        }
    }

    /// Turns the EOF that `read_exact_at` reports into a message that says
    /// what happened: the size was fixed at open, so the file shrank since.
    fn read_err(&self, offset: u64, len: usize, source: io::Error) -> DeviceError {
        if source.kind() != io::ErrorKind::UnexpectedEof {
            return self.io_err("read", source);
        }
        let source = io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "end of file inside {offset}+{len}; the file is shorter than the \
                 {} bytes it had when opened",
                self.size_bytes()
            ),
        );
        self.io_err("read", source)
    }
}

/// Creates a sparse regular file of `size_bytes` (a non-zero multiple of 512)
/// for use as a device. Fails if anything already exists at `path`, so a
/// typo can never truncate a device or a file holding data.
pub fn create_file(path: impl AsRef<Path>, size_bytes: u64) -> DeviceResult<()> {
    let path = path.as_ref();
    let open_err = |reason: String| DeviceError::Open {
        spec: path.display().to_string(),
        reason,
    };
    if size_bytes == 0 || !size_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(open_err(format!(
            "size {size_bytes} is not a non-zero multiple of {SECTOR_BYTES} bytes"
        )));
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        // It will hold a copy of the volume's data.
        .mode(0o600)
        .open(path)
        .map_err(|e| open_err(e.to_string()))?;
    // set_len extends without allocating, which is what makes the file sparse.
    let sized = file.set_len(size_bytes).and_then(|()| file.sync_all());
    if let Err(e) = sized {
        drop(file);
        // Best effort: leaving a wrong-sized file behind would make the
        // retry fail with "exists".
        let _ = std::fs::remove_file(path);
        return Err(open_err(format!("cannot set its size: {e}")));
    }
    Ok(())
}

/// What is opened (a regular file or a block device) and how (to write,
/// claimed alone, or to read, shared).
#[derive(Clone, Copy)]
struct How {
    kind: Kind,
    access: Access,
}

/// Why an open failed: the system refused it, or another open holds the
/// device.
enum OpenFailed {
    Os(io::Error),
    InUse(DeviceError),
}

impl OpenFailed {
    fn into_device_error(self, path: &str) -> DeviceError {
        match self {
            OpenFailed::Os(e) if is_missing(&e) => DeviceError::Missing {
                spec: path.to_string(),
                reason: e.to_string(),
            },
            OpenFailed::Os(e) => DeviceError::Open {
                spec: path.to_string(),
                reason: e.to_string(),
            },
            OpenFailed::InUse(e) => e,
        }
    }
}

/// An open that failed because nothing is there (rather than refused).
fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ENODEV))
}

impl How {
    /// Opens the path with `flags` added. A block device opened to write
    /// gets O_EXCL: the kernel refuses it (EBUSY) while another exclusive
    /// open, a mount or a stacked device (dm, md) holds it.
    fn open(self, path: &str, flags: libc::c_int) -> Result<File, OpenFailed> {
        let write = self.access == Access::Write;
        let excl = if write && self.kind == Kind::BlockDevice {
            libc::O_EXCL
        } else {
            0
        };
        let opened = OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(flags | excl)
            .open(path);
        match opened {
            Ok(file) => Ok(file),
            Err(e) if excl != 0 && e.raw_os_error() == Some(libc::EBUSY) => {
                Err(OpenFailed::InUse(in_use(path)))
            }
            Err(e) => Err(OpenFailed::Os(e)),
        }
    }

    /// Takes the OFD lock of this access on `file` (claim.rs).
    fn claim(self, path: &str, file: &File) -> DeviceResult<()> {
        match claim::lock(file, self.access) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(in_use(path)),
            Err(e) => Err(DeviceError::Open {
                spec: path.to_string(),
                reason: format!("cannot lock it (fcntl F_OFD_SETLK): {e}"),
            }),
        }
    }
}

/// The refusal of a device another open holds, naming the holder.
fn in_use(path: &str) -> DeviceError {
    let (holder, pid) = match std::fs::metadata(path) {
        Ok(meta) => claim::holder(path, &meta),
        Err(e) => (format!("its holder cannot be looked up ({e})"), None),
    };
    DeviceError::InUse {
        device: path.to_string(),
        holder,
        pid,
    }
}

/// The usable size: whole 512-byte sectors, at least one.
fn device_size_bytes(file: &File, kind: Kind, meta: &Metadata) -> Result<u64, String> {
    let bytes = match kind {
        Kind::RegularFile => meta.len(),
        Kind::BlockDevice => {
            block_device_size_bytes(file).map_err(|e| format!("BLKGETSIZE64 failed: {e}"))?
        }
    };
    let size_bytes = bytes / SECTOR_BYTES * SECTOR_BYTES;
    if size_bytes == 0 {
        return Err(format!(
            "its size is {bytes} bytes, less than one {SECTOR_BYTES}-byte sector"
        ));
    }
    Ok(size_bytes)
}

fn classify(meta: &Metadata) -> Result<Kind, String> {
    let t = meta.file_type();
    if t.is_file() {
        Ok(Kind::RegularFile)
    } else if t.is_block_device() {
        Ok(Kind::BlockDevice)
    } else if t.is_dir() {
        Err("it is a directory; give a regular file or a block device".into())
    } else if t.is_char_device() {
        Err("it is a character device; give a regular file or a block device".into())
    } else {
        Err("it is neither a regular file nor a block device".into())
    }
}

fn warn_buffered(path: &str, reason: &str) {
    if !BUFFERED_FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
        log::warn!(
            "O_DIRECT is unavailable for {path} ({reason}); using the page cache, \
             so writes become durable only at fdatasync (further such devices are \
             logged at debug level)"
        );
    } else {
        log::debug!("O_DIRECT is unavailable for {path} ({reason}); using the page cache");
    }
}

/// Keeps an O_DIRECT descriptor whose first sector read works; one whose
/// read fails with EINVAL (sectors smaller than the device's logical block)
/// is replaced by a buffered open of the same file, claimed the same way.
/// Returns the descriptor and whether it is direct.
fn keep_direct_or_reopen(
    path: &str,
    file: File,
    meta: &std::fs::Metadata,
    size_bytes: u64,
    how: How,
) -> DeviceResult<(File, bool)> {
    let open_err = |reason: String| DeviceError::Open {
        spec: path.to_string(),
        reason,
    };
    match probe_direct(&file, size_bytes) {
        Ok(()) => Ok((file, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            // The claim (O_EXCL, the OFD lock) is per open file: the direct
            // one must let go before the buffered one can take it.
            drop(file);
            let buffered = how.open(path, 0).map_err(|e| e.into_device_error(path))?;
            let buffered_meta = buffered.metadata().map_err(|e| open_err(e.to_string()))?;
            if (buffered_meta.dev(), buffered_meta.ino()) != (meta.dev(), meta.ino()) {
                return Err(open_err("the path was replaced while opening it".into()));
            }
            how.claim(path, &buffered)?;
            warn_buffered(
                path,
                "an O_DIRECT read of 512-byte sectors failed with EINVAL",
            );
            Ok((buffered, false))
        }
        Err(e) => Err(open_err(format!("first read failed: {e}"))),
    }
}

/// Reads the start of the device the way every later request will. Some
/// filesystems accept the O_DIRECT open and only fail the first transfer, and
/// a device with 4096-byte logical sectors fails 512-byte transfers, which the
/// [`BlockDevice`] contract allows.
fn probe_direct(file: &File, size_bytes: u64) -> io::Result<()> {
    #[cfg(test)]
    if tests::PROBE_FAILS.get() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let first_bytes = size_bytes.min(BUF_ALIGN_BYTES as u64) as usize;
    let mut buf = AlignedBuf::zeroed(first_bytes);
    file.read_exact_at(&mut buf, 0)?;
    if size_bytes >= 2 * SECTOR_BYTES {
        buf.truncate(SECTOR_BYTES as usize);
        file.read_exact_at(&mut buf, SECTOR_BYTES)?;
    }
    Ok(())
}

fn block_device_size_bytes(file: &File) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 stores one u64 through the pointer, which points to
    // a live local u64; the descriptor stays open for the call (borrowed `file`).
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKGETSIZE64 as libc::Ioctl,
            &mut size_bytes as *mut u64,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size_bytes)
}

/// (st_dev, st_ino) names one file on one filesystem and survives rewrites of
/// its content; it changes if the file is copied elsewhere, which is then a
/// different device as far as a cache is concerned.
fn regular_file_identity(meta: &Metadata) -> u64 {
    let mut key = b"file\0".to_vec();
    key.extend_from_slice(&meta.dev().to_le_bytes());
    key.extend_from_slice(&meta.ino().to_le_bytes());
    fnv1a64(&key)
}

/// Prefers an identity the hardware reports (WWID, serial, dm UUID), which
/// survives reboots and renumbering; st_rdev (major:minor) is the fallback
/// and may change when devices are probed in a different order.
fn block_device_identity(rdev: u64) -> u64 {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    match sysfs_block_id(&PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))) {
        Some(id) => fnv1a64(format!("block-id\0{id}").as_bytes()),
        None => {
            let mut key = b"block-rdev\0".to_vec();
            key.extend_from_slice(&rdev.to_le_bytes());
            fnv1a64(&key)
        }
    }
}

/// The first non-empty identity attribute of a sysfs block node.
fn sysfs_block_id(node: &Path) -> Option<String> {
    // A partition's node has no identity attributes of its own: they live on
    // the whole disk one level up, and the partition number keeps partitions
    // of one disk apart.
    let (disk, partition) = match read_attr(&node.join("partition")) {
        Some(number) => (node.join(".."), Some(number)),
        None => (node.to_path_buf(), None),
    };
    // Namespace-level `wwid` first: NVMe `device/serial` names the controller,
    // which several namespaces share.
    ["wwid", "device/wwid", "dm/uuid", "serial", "device/serial"]
        .iter()
        .find_map(|attr| {
            let id = read_attr(&disk.join(attr))?;
            Some(match &partition {
                Some(number) => format!("{attr}={id};partition={number}"),
                None => format!("{attr}={id}"),
            })
        })
}

fn read_attr(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn is_discard_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL)
    )
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Puts /dev/null in the descriptor's place (`dup2`): the device's own
    /// open is closed, which drops its claims (O_EXCL, the OFD lock), while
    /// the descriptor number stays valid for this value. The size becomes
    /// 0, so every request after it fails its range check.
    fn let_go(&self) -> DeviceResult<()> {
        let err = |e: std::io::Error| DeviceError::Io {
            device: self.name.clone(),
            what: "letting go of the device",
            source: e,
        };
        let null = File::open("/dev/null").map_err(err)?;
        self.size_bytes.store(0, Ordering::Release);
        // SAFETY: both descriptors are open and owned by live values; dup2
        // replaces ours atomically, closing the device's open.
        if unsafe { libc::dup2(null.as_raw_fd(), self.file.as_raw_fd()) } < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn refresh_size(&self) -> DeviceResult<u64> {
        let now = self
            .file
            .metadata()
            .map_err(|e| e.to_string())
            .and_then(|meta| device_size_bytes(&self.file, self.kind, &meta))
            .map_err(|reason| DeviceError::Open {
                spec: self.name.clone(),
                reason,
            })?;
        self.size_bytes.store(now, Ordering::Release);
        Ok(now)
    }

    fn as_file(&self) -> Option<&FileDevice> {
        Some(self)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.direct || is_aligned_ptr(buf.as_ptr()) {
            return self
                .file
                .read_exact_at(buf, offset)
                .map_err(|e| self.read_err(offset, buf.len(), e));
        }
        let mut bounce = AlignedBuf::zeroed(buf.len().min(BOUNCE_MAX_BYTES));
        let mut at = offset;
        for piece in buf.chunks_mut(BOUNCE_MAX_BYTES) {
            // Only the last piece is shorter, so truncating never needs to grow.
            bounce.truncate(piece.len());
            self.file
                .read_exact_at(&mut bounce, at)
                .map_err(|e| self.read_err(at, piece.len(), e))?;
            piece.copy_from_slice(&bounce);
            at += piece.len() as u64;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.direct || is_aligned_ptr(buf.as_ptr()) {
            return self
                .file
                .write_all_at(buf, offset)
                .map_err(|e| self.io_err("write", e));
        }
        let mut bounce = AlignedBuf::zeroed(buf.len().min(BOUNCE_MAX_BYTES));
        let mut at = offset;
        for piece in buf.chunks(BOUNCE_MAX_BYTES) {
            bounce.truncate(piece.len());
            bounce.copy_from_slice(piece);
            self.file
                .write_all_at(&bounce, at)
                .map_err(|e| self.io_err("write", e))?;
            at += piece.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> DeviceResult<()> {
        // fdatasync also issues the cache flush to the device (REQ_PREFLUSH)
        // that O_DIRECT writes still need.
        self.file.sync_data().map_err(|e| {
            self.failed_flushes
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            self.io_err("flush", e)
        })
    }

    fn loss_epoch(&self) -> u64 {
        self.failed_flushes
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A block device (BLKDISCARD reaches the flash); a regular file's
    /// punched hole would make the next write there allocate again.
    fn discard_helps(&self) -> bool {
        self.is_block_device()
    }

    fn reads_in_parallel(&self) -> bool {
        true
    }

    /// A hint: succeeds without effect where the filesystem or device cannot
    /// discard.
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let rc = match self.kind {
            Kind::RegularFile => {
                let to_off = |v: u64| {
                    libc::off_t::try_from(v).map_err(|_| {
                        self.io_err("discard", io::Error::from(io::ErrorKind::InvalidInput))
                    })
                };
                let (start, count) = (to_off(offset)?, to_off(len)?);
                // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
                unsafe {
                    libc::fallocate(
                        fd,
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        start,
                        count,
                    )
                }
            }
            Kind::BlockDevice => {
                let range: [u64; 2] = [offset, len];
                // SAFETY: BLKDISCARD reads two u64 through the pointer, which
                // points to a live local array; the descriptor is ours and open.
                unsafe { libc::ioctl(fd, BLKDISCARD as libc::Ioctl, range.as_ptr()) }
            }
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if is_discard_unsupported(&e) {
            log::debug!("{}: discard unsupported ({e}); ignored", self.name);
            return Ok(());
        }
        Err(self.io_err("discard", e))
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn identity(&self) -> u64 {
        self.identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory on the real disk. /tmp may be tmpfs, where O_DIRECT is
    /// refused and only the buffered path would be tested. The manifest's
    /// `target/` is ignored by git.
    fn disk_dir() -> tempfile::TempDir {
        let parent = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&parent).expect("create target/");
        tempfile::tempdir_in(&parent).expect("tempdir under target/")
    }

    thread_local! {
        /// Makes the O_DIRECT probe of `FileDevice::open` on this thread fail
        /// with EINVAL, as on filesystems that accept the open but not the I/O.
        pub(super) static PROBE_FAILS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A tmpfs directory. tmpfs refused O_DIRECT opens before Linux 6.6 and
    /// accepts them since, so either mode may result there.
    fn tmpfs_dir() -> tempfile::TempDir {
        let shm = Path::new("/dev/shm");
        let mut st: libc::statfs = unsafe_zeroed_statfs();
        let c = std::ffi::CString::new("/dev/shm").unwrap();
        // SAFETY: c is a valid NUL-terminated path, st a live statfs to fill.
        let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
        assert!(
            rc == 0 && st.f_type == libc::TMPFS_MAGIC,
            "this test needs /dev/shm mounted as tmpfs (to exercise the buffered fallback)"
        );
        tempfile::tempdir_in(shm).expect("tempdir in /dev/shm")
    }

    fn unsafe_zeroed_statfs() -> libc::statfs {
        // SAFETY: statfs is a plain C struct of integers; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    fn new_file(dir: &Path, name: &str, size_bytes: u64) -> String {
        let path = dir.join(name);
        create_file(&path, size_bytes).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn round_trip(dev: &FileDevice) {
        let data = AlignedBuf::from_slice(&pattern(64 << 10, 7));
        dev.write_at(&data, 8192).unwrap();
        let mut back = AlignedBuf::zeroed(data.len());
        dev.read_at(&mut back, 8192).unwrap();
        assert_eq!(&back[..], &data[..]);
        dev.flush().unwrap();
        // Single sectors, including the last one.
        let last = dev.size_bytes() - 512;
        let sector = AlignedBuf::from_slice(&pattern(512, 9));
        dev.write_at(&sector, last).unwrap();
        let mut back = AlignedBuf::zeroed(512);
        dev.read_at(&mut back, last).unwrap();
        assert_eq!(&back[..], &sector[..]);
    }

    #[test]
    fn round_trip_direct_on_disk() {
        let dir = disk_dir();
        let path = new_file(dir.path(), "dev", 1 << 20);
        let dev = FileDevice::open(&path).unwrap();
        assert!(
            dev.is_direct(),
            "O_DIRECT should work on the disk under target/"
        );
        assert!(!dev.is_block_device());
        assert_eq!(dev.size_bytes(), 1 << 20);
        round_trip(&dev);
        // Durable content is visible to a fresh open.
        drop(dev);
        let dev = FileDevice::open(&path).unwrap();
        let mut back = vec![0u8; 64 << 10];
        dev.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, pattern(64 << 10, 7));
    }

    #[test]
    fn round_trip_on_tmpfs() {
        let dir = tmpfs_dir();
        let path = new_file(dir.path(), "dev", 1 << 20);
        let dev = FileDevice::open(&path).unwrap();
        round_trip(&dev);
    }

    #[test]
    fn falls_back_to_buffered_when_the_probe_fails() {
        let dir = disk_dir();
        let path = new_file(dir.path(), "dev", 1 << 20);
        PROBE_FAILS.set(true);
        let opened = FileDevice::open(&path);
        PROBE_FAILS.set(false);
        let dev = opened.unwrap();
        assert!(!dev.is_direct());
        round_trip(&dev);
        // Unaligned buffers go straight to the page cache.
        let mut backing = vec![0u8; 4096 + 1];
        dev.read_at(&mut backing[1..], 8192).unwrap();
        assert_eq!(&backing[1..], &pattern(64 << 10, 7)[..4096]);
        // The buffered open holds the claim the direct one let go of.
        assert!(matches!(
            FileDevice::open(&path),
            Err(DeviceError::InUse { .. })
        ));
        drop(dev);
        assert!(FileDevice::open(&path).unwrap().is_direct());
    }

    /// One writer alone, or readers together; a read-only open cannot
    /// write; the claim ends with the device.
    #[test]
    fn a_device_is_claimed() {
        let dir = disk_dir();
        let path = new_file(dir.path(), "dev", 1 << 20);
        let writer = FileDevice::open(&path).unwrap();
        for second in [FileDevice::open(&path), FileDevice::open_read_only(&path)] {
            match second {
                Err(DeviceError::InUse { holder, pid, .. }) => {
                    assert_eq!(pid, Some(std::process::id()), "{holder}");
                    assert!(holder.contains("locked for writing"), "{holder}");
                }
                other => panic!("second open: {:?}", other.map(|d| d.name)),
            }
        }
        drop(writer);
        let a = FileDevice::open_read_only(&path).unwrap();
        let b = FileDevice::open_read_only(&path).unwrap();
        let err = FileDevice::open(&path).err().unwrap();
        assert!(err.to_string().contains("locked for reading"), "{err}");
        let mut buf = AlignedBuf::zeroed(4096);
        a.read_at(&mut buf, 0).unwrap();
        assert!(b.write_at(&buf, 0).is_err(), "a read-only open wrote");
        drop((a, b));
        FileDevice::open(&path).unwrap();
    }

    #[test]
    fn unaligned_buffers_bounce() {
        let dir = disk_dir();
        // Larger than one bounce buffer, so the chunked path is covered.
        let len = BOUNCE_MAX_BYTES + 3 * 4096;
        let path = new_file(dir.path(), "dev", 4 << 20);
        let dev = FileDevice::open(&path).unwrap();
        assert!(dev.is_direct());

        let mut backing = vec![0u8; len + 1];
        let src = &mut backing[1..];
        assert!(!is_aligned_ptr(src.as_ptr()));
        src.copy_from_slice(&pattern(len, 3));
        dev.write_at(src, 512).unwrap();

        let mut backing_out = vec![0u8; len + 3];
        let out = &mut backing_out[3..];
        assert!(!is_aligned_ptr(out.as_ptr()));
        dev.read_at(out, 512).unwrap();
        assert_eq!(out, &pattern(len, 3)[..]);

        // And the aligned path reads what the bounced path wrote.
        let mut aligned = AlignedBuf::zeroed(len);
        dev.read_at(&mut aligned, 512).unwrap();
        assert_eq!(&aligned[..], &pattern(len, 3)[..]);
    }

    #[test]
    fn out_of_range_and_unaligned_requests_fail() {
        let dir = disk_dir();
        let path = new_file(dir.path(), "dev", 64 << 10);
        let dev = FileDevice::open(&path).unwrap();
        let mut buf = AlignedBuf::zeroed(4096);
        assert!(matches!(
            dev.read_at(&mut buf, 64 << 10),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, (64 << 10) - 512),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, u64::MAX - 511),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.read_at(&mut buf, 100),
            Err(DeviceError::Unaligned { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf[..100], 0),
            Err(DeviceError::Unaligned { .. })
        ));
        assert!(matches!(
            dev.discard(0, (64 << 10) + 512),
            Err(DeviceError::OutOfRange { .. })
        ));
        // Nothing was written past the end.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 10);
    }

    #[test]
    fn short_files() {
        let dir = disk_dir();
        // A tail shorter than a sector is not part of the device.
        let path = dir.path().join("odd");
        std::fs::write(&path, vec![1u8; 1000]).unwrap();
        let dev = FileDevice::open(path.to_str().unwrap()).unwrap();
        assert_eq!(dev.size_bytes(), 512);

        // Less than one sector: refused.
        let tiny = dir.path().join("tiny");
        std::fs::write(&tiny, vec![1u8; 100]).unwrap();
        let err = FileDevice::open(tiny.to_str().unwrap()).err().unwrap();
        assert!(matches!(err, DeviceError::Open { .. }), "{err}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(FileDevice::open(empty.to_str().unwrap()).is_err());

        // A file that shrinks after open: a read past its new end is an
        // error, never zeroes.
        let path = new_file(dir.path(), "shrinks", 64 << 10);
        let dev = FileDevice::open(&path).unwrap();
        dev.write_at(&AlignedBuf::from_slice(&[5u8; 8192]), 0)
            .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let mut buf = AlignedBuf::zeroed(8192);
        let err = dev.read_at(&mut buf, 0).err().unwrap();
        assert!(matches!(err, DeviceError::Io { .. }), "{err}");
        let mut unaligned = vec![0u8; 8192 + 1];
        assert!(dev.read_at(&mut unaligned[1..], 0).is_err());
    }

    #[test]
    fn identity_names_the_file_not_its_content() {
        let dir = disk_dir();
        let a = new_file(dir.path(), "a", 64 << 10);
        let b = new_file(dir.path(), "b", 64 << 10);
        let dev_a = FileDevice::open(&a).unwrap();
        let id_a = dev_a.identity();
        assert_ne!(id_a, 0);
        dev_a
            .write_at(&AlignedBuf::from_slice(&[9u8; 4096]), 0)
            .unwrap();
        drop(dev_a);
        assert_eq!(FileDevice::open(&a).unwrap().identity(), id_a);
        assert_ne!(FileDevice::open(&b).unwrap().identity(), id_a);
    }

    #[test]
    fn discard_zeroes_the_range() {
        for dir in [disk_dir(), tmpfs_dir()] {
            let path = new_file(dir.path(), "dev", 64 << 10);
            let dev = FileDevice::open(&path).unwrap();
            let data = AlignedBuf::from_slice(&pattern(64 << 10, 1));
            dev.write_at(&data, 0).unwrap();
            dev.discard(8192, 8192).unwrap();
            dev.discard(20480, 512).unwrap();
            dev.discard(0, 0).unwrap();
            let mut back = AlignedBuf::zeroed(64 << 10);
            dev.read_at(&mut back, 0).unwrap();
            let mut expect = pattern(64 << 10, 1);
            expect[8192..16384].fill(0);
            expect[20480..20992].fill(0);
            assert!(back[..] == expect[..], "direct={}", dev.is_direct());
            // KEEP_SIZE: the device does not shrink.
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 10);
        }
    }

    #[test]
    fn open_refuses_what_is_not_a_device() {
        let dir = disk_dir();
        let reason = |spec: &str| match FileDevice::open(spec) {
            Err(DeviceError::Open { reason, .. } | DeviceError::Missing { reason, .. }) => reason,
            Err(e) => panic!("{spec}: wrong error {e}"),
            Ok(_) => panic!("{spec}: opened"),
        };
        assert!(reason(dir.path().to_str().unwrap()).contains("directory"));
        let missing = dir.path().join("missing");
        assert!(reason(missing.to_str().unwrap()).contains("No such file"));
        assert!(reason("/dev/null").contains("character device"));
    }

    #[test]
    fn create_file_is_sparse_and_never_overwrites() {
        let dir = disk_dir();
        let path = dir.path().join("new");
        create_file(&path, 1 << 30).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "not sparse: {} blocks",
            meta.blocks()
        );
        assert!(matches!(
            create_file(&path, 4096),
            Err(DeviceError::Open { .. })
        ));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 30);
        assert!(create_file(dir.path().join("zero"), 0).is_err());
        assert!(create_file(dir.path().join("odd"), 1000).is_err());
        assert!(!dir.path().join("zero").exists());
    }

    #[test]
    fn concurrent_disjoint_writes() {
        let dir = disk_dir();
        let path = new_file(dir.path(), "dev", 1 << 20);
        let dev = std::sync::Arc::new(FileDevice::open(&path).unwrap());
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    for i in 0..16u64 {
                        let off = (u64::from(t) * 16 + i) * 4096;
                        let data = AlignedBuf::from_slice(&pattern(4096, t));
                        dev.write_at(&data, off).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for t in 0..4u8 {
            for i in 0..16u64 {
                let mut back = AlignedBuf::zeroed(4096);
                dev.read_at(&mut back, (u64::from(t) * 16 + i) * 4096)
                    .unwrap();
                assert_eq!(&back[..], &pattern(4096, t)[..]);
            }
        }
    }
}
