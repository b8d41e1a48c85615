//! Claiming a file or block device for this process, so that two processes
//! never write one device and a reader never sees a writer's half-done work.
//!
//! - A block device opened for writing is opened with `O_EXCL`: the kernel
//!   then refuses (EBUSY) while anything else holds it exclusively: another
//!   tiercache, a mounted filesystem, md, device-mapper (LVM, dm-crypt),
//!   mkfs. A regular file has no such claim (Linux ignores `O_EXCL` without
//!   `O_CREAT` there).
//! - Every file and block device also gets an OFD lock over its whole length
//!   (`fcntl(F_OFD_SETLK)`): exclusive for a writer, shared for a reader.
//!   The lock belongs to the open file description, not the process: it
//!   also refuses a second open inside one process, and it ends with the
//!   descriptor, so a killed daemon leaves none behind. It is advisory: it
//!   binds the programs that ask (tiercache); `O_EXCL` is what binds the
//!   kernel's users of a block device.
//!
//! A refusal names the holder. For an OFD lock the kernel reports no PID
//! (`F_OFD_GETLK` and /proc/locks show -1: the lock has no owning process),
//! but /proc/PID/fdinfo/FD lists it under the descriptor that holds it; a
//! block device's kernel holders are under /sys/dev/block/M:m/holders and
//! in the mount table.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// How a device is opened, and so claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read and write: `O_EXCL` for a block device and an exclusive lock.
    Write,
    /// Read only: a shared lock, which any number of readers hold at once
    /// and no writer while they do.
    Read,
}

/// Longest command line quoted in a refusal.
const COMMAND_MAX_CHARS: usize = 160;

/// Takes the OFD lock `access` asks for on the whole of `file`, without
/// waiting: `Err` with `ErrorKind::WouldBlock` if another open file
/// description holds a conflicting one.
pub(crate) fn lock(file: &File, access: Access) -> io::Result<()> {
    // SAFETY: flock is a plain C struct of integers; all-zero is valid
    // (l_whence SEEK_SET, l_start 0, l_len 0 = to the end, l_pid 0 as OFD
    // locks require).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = match access {
        Access::Write => libc::F_WRLCK,
        Access::Read => libc::F_RDLCK,
    } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_OFD_SETLK reads one flock through the pointer, which points
    // to a live local; the descriptor is open for the call (borrowed `file`).
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Err(io::ErrorKind::WouldBlock.into()),
        _ => Err(e),
    }
}

/// Who holds the device at `path` (whose metadata is `meta`): the process
/// whose descriptor holds its OFD lock, else (a block device) the kernel's
/// holders, else the processes that have it open. `.1` is the PID of the
/// lock's holder, when one was found.
pub(crate) fn holder(path: &str, meta: &Metadata) -> (String, Option<u32>) {
    let openers = openers(meta);
    if let Some(o) = openers.iter().find(|o| o.lock.is_some()) {
        let what = match o.lock {
            Some(LockKind::Write) => "holds it locked for writing",
            _ => "holds it locked for reading",
        };
        return (format!("{} {what}", describe_process(o.pid)), Some(o.pid));
    }
    if meta.file_type().is_block_device() {
        if let Some(k) = kernel_holders(meta.rdev()) {
            return (k, None);
        }
    }
    let others: Vec<String> = openers
        .iter()
        .map(|o| describe_process(o.pid))
        .take(3)
        .collect();
    let by = if meta.file_type().is_block_device() {
        "another program opened it exclusively (O_EXCL)"
    } else {
        "another program holds a lock on it"
    };
    if others.is_empty() {
        (
            format!("{by}; no process that has {path} open was found (another PID namespace?)"),
            None,
        )
    } else {
        (format!("{by}; open in {}", others.join(", ")), None)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LockKind {
    Write,
    Read,
}

/// A process's descriptor of the device, and the OFD lock it holds, if any.
struct Opener {
    pid: u32,
    lock: Option<LockKind>,
}

/// Every descriptor in /proc that names the same file (same device and
/// inode) or, for a block device, the same device number.
fn openers(meta: &Metadata) -> Vec<Opener> {
    let is_block = meta.file_type().is_block_device();
    let same = |m: &Metadata| {
        if is_block {
            m.file_type().is_block_device() && m.rdev() == meta.rdev()
        } else {
            (m.dev(), m.ino()) == (meta.dev(), meta.ino())
        }
    };
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            // metadata() follows the link to the open file itself.
            if !std::fs::metadata(fd.path()).is_ok_and(|m| same(&m)) {
                continue;
            }
            let info = p.path().join("fdinfo").join(fd.file_name());
            let lock = std::fs::read_to_string(info)
                .ok()
                .and_then(|t| ofd_lock(&t));
            found.push(Opener { pid, lock });
        }
    }
    // The lock's holder first; one entry per process.
    found.sort_by_key(|o| (o.lock.is_none(), o.pid));
    found.dedup_by_key(|o| o.pid);
    found
}

/// The OFD lock an fdinfo text lists (`lock:\t1: OFDLCK ADVISORY WRITE ...`).
fn ofd_lock(fdinfo: &str) -> Option<LockKind> {
    fdinfo
        .lines()
        .filter(|l| l.starts_with("lock:") && l.contains("OFDLCK"))
        .map(|l| {
            if l.contains(" WRITE ") {
                LockKind::Write
            } else {
                LockKind::Read
            }
        })
        .min_by_key(|k| *k != LockKind::Write)
}

/// The NUL-separated strings of `/proc/PID/FILE` (`cmdline`, `environ`);
/// none if it cannot be read (the process is gone, or not ours to see).
pub fn proc_strings(pid: u32, file: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// "process 1234 (tiercache serve --name tc0)", or "this process".
fn describe_process(pid: u32) -> String {
    if pid == std::process::id() {
        return format!("this process ({pid}, through another descriptor)");
    }
    let mut command = proc_strings(pid, "cmdline").join(" ");
    if command.chars().count() > COMMAND_MAX_CHARS {
        command = command.chars().take(COMMAND_MAX_CHARS).collect::<String>() + "...";
    }
    if command.is_empty() {
        format!("process {pid}")
    } else {
        format!("process {pid} ({command})")
    }
}

/// The kernel's holders of block device `rdev`: where it is mounted, and
/// the devices stacked on it (dm, md, bcache).
fn kernel_holders(rdev: u64) -> Option<String> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let mut held = Vec::new();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let number = format!("{major}:{minor}");
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(2) == Some(&number.as_str()) {
            if let Some(at) = fields.get(4) {
                held.push(format!("mounted on {at}"));
            }
        }
    }
    let holders = Path::new("/sys/dev/block").join(&number).join("holders");
    if let Ok(rd) = std::fs::read_dir(holders) {
        for h in rd.flatten() {
            held.push(format!("held by {}", h.file_name().to_string_lossy()));
        }
    }
    (!held.is_empty()).then(|| format!("the kernel has it: {}", held.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn file_in(dir: &tempfile::TempDir) -> std::path::PathBuf {
        let p = dir.path().join("dev");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        p
    }

    #[test]
    fn a_writer_excludes_everyone_readers_share() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_in(&dir);
        let open = || File::options().read(true).write(true).open(&p).unwrap();
        let (a, b, c) = (open(), open(), open());
        lock(&a, Access::Read).unwrap();
        lock(&b, Access::Read).unwrap();
        assert_eq!(
            lock(&c, Access::Write).unwrap_err().kind(),
            ErrorKind::WouldBlock
        );
        drop((a, b));
        lock(&c, Access::Write).unwrap();
        let d = open();
        assert_eq!(
            lock(&d, Access::Read).unwrap_err().kind(),
            ErrorKind::WouldBlock
        );
        // The holder is found through its descriptor, here in this process.
        let (who, pid) = holder(p.to_str().unwrap(), &std::fs::metadata(&p).unwrap());
        assert_eq!(pid, Some(std::process::id()), "{who}");
        assert!(
            who.contains("this process") && who.contains("writing"),
            "{who}"
        );
    }

    #[test]
    fn fdinfo_locks_parse() {
        let w = "pos:\t0\nflags:\t02\nlock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:12 0 EOF\n";
        assert_eq!(ofd_lock(w), Some(LockKind::Write));
        let r = "lock:\t1: OFDLCK ADVISORY  READ -1 fe:00:12 0 EOF\n";
        assert_eq!(ofd_lock(r), Some(LockKind::Read));
        assert_eq!(
            ofd_lock("lock:\t1: FLOCK ADVISORY WRITE 12 fe:00:12 0 EOF\n"),
            None
        );
        assert_eq!(ofd_lock(""), None);
    }
}
