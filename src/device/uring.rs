//! Two writes of one buffer to two files at once, in one system call
//! (io_uring), for a cache set's mirrored writes (`set/`).
//!
//! A mirrored write on two threads (the caller and a helper) costs four
//! or more context switches: the helper wakes, each thread sleeps in its
//! own write, the caller waits for the helper. On a small machine those
//! switches, not the copies, were most of what a second copy cost
//! (docs/benchmarks.md, "Mirroring on two devices"). Submitted together,
//! the two writes go to their devices at once and the caller sleeps once,
//! until both are done.
//!
//! Each thread keeps a small ring of its own, made on its first pair. A
//! kernel without io_uring (or with it turned off:
//! `kernel.io_uring_disabled`) makes `write_pair` answer `None` from then
//! on, and the caller writes the copies its own way.

use std::cell::RefCell;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::{opcode, types, IoUring};

/// Entries per ring: one pair at a time.
const RING_ENTRIES: u32 = 4;

/// io_uring could not be set up once: no thread tries again.
static UNAVAILABLE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// The outcome of one of the two writes: bytes written (maybe fewer than
/// asked: the caller writes the rest) or the error.
pub(crate) type Written = io::Result<usize>;

/// Writes `buf` at `at` to `fds[0]` and `fds[1]` at once; returns each
/// write's outcome, or `None` if io_uring is not available (nothing was
/// written then).
pub(crate) fn write_pair(fds: [RawFd; 2], buf: &[u8], at: u64) -> Option<[Written; 2]> {
    if UNAVAILABLE.load(Ordering::Relaxed) {
        return None;
    }
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            match IoUring::new(RING_ENTRIES) {
                Ok(r) => *slot = Some(r),
                Err(e) => {
                    if !UNAVAILABLE.swap(true, Ordering::Relaxed) {
                        log::info!(
                            "io_uring is not available ({e}): mirrored writes use a helper thread"
                        );
                    }
                    return None;
                }
            }
        }
        let ring = slot.as_mut().expect("made above");
        let r = submit_pair(ring, fds, buf, at);
        if r.is_none() {
            *slot = None;
        }
        r
    })
}

/// An `io_uring_enter` error worth trying again at once.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// `None`: nothing was submitted, and the ring is to be dropped (with
/// whatever entries it still holds).
fn submit_pair(ring: &mut IoUring, fds: [RawFd; 2], buf: &[u8], at: u64) -> Option<[Written; 2]> {
    // A set's requests are at most a few MiB; a longer one takes the
    // caller's own path.
    let len = u32::try_from(buf.len()).ok()?;
    for (i, fd) in fds.iter().enumerate() {
        let sqe = opcode::Write::new(types::Fd(*fd), buf.as_ptr(), len)
            .offset(at)
            .build()
            .user_data(i as u64);
        // SAFETY: `buf` outlives the request: once submitted, this function
        // returns only after both completions (a ring is used by its one
        // thread only, one pair at a time).
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            // Cannot happen: the ring is empty between pairs.
            return None;
        }
    }
    loop {
        match ring.submit() {
            Ok(_) => break,
            Err(e) if transient(&e) => continue,
            Err(e) if ring.submission().len() == 2 => {
                // Neither write went in: drop the ring (the entries with
                // it) and let the caller write its own way.
                log::warn!("io_uring submit: {e}");
                return None;
            }
            Err(e) => {
                // Some went in: wait for them below.
                log::warn!("io_uring submit: {e}");
                break;
            }
        }
    }
    let mut out: [Option<Written>; 2] = [None, None];
    let mut done = 0;
    let mut warned = false;
    while done < 2 {
        if let Err(e) = ring.submit_and_wait(2 - done) {
            if !transient(&e) {
                // The completions still arrive in the shared ring; look
                // for them without the system call.
                if !std::mem::replace(&mut warned, true) {
                    log::warn!("io_uring wait: {e}; polling for the completions");
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            if i < 2 && out[i].is_none() {
                let r = cqe.result();
                out[i] = Some(if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r as usize)
                });
                done += 1;
            }
        }
    }
    Some(out.map(|o| o.expect("both completed")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;

    fn fresh(dir: &tempfile::TempDir, name: &str) -> std::fs::File {
        std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join(name))
            .unwrap()
    }

    /// `None` is the answer only where io_uring cannot be set up.
    fn unavailable() -> bool {
        let off = UNAVAILABLE.load(Ordering::Relaxed);
        assert!(off, "write_pair gave up with io_uring available");
        eprintln!("io_uring is not available here: the callers' fallback is used");
        off
    }

    #[test]
    fn both_files_get_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (fresh(&dir, "a"), fresh(&dir, "b"));
        let buf: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        let Some([ra, rb]) = write_pair([a.as_raw_fd(), b.as_raw_fd()], &buf, 4096) else {
            assert!(unavailable());
            return;
        };
        assert_eq!(ra.unwrap(), 8192);
        assert_eq!(rb.unwrap(), 8192);
        for f in [&a, &b] {
            let mut back = vec![0u8; 8192];
            f.read_exact_at(&mut back, 4096).unwrap();
            assert_eq!(back, buf);
        }
        // The ring is used again by the next pair on this thread.
        let again = write_pair([a.as_raw_fd(), b.as_raw_fd()], &buf[..512], 0).unwrap();
        assert!(again.iter().all(|r| matches!(r, Ok(512))));
    }

    #[test]
    fn each_write_gets_its_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let good = fresh(&dir, "good");
        std::fs::write(dir.path().join("ro"), [0u8; 512]).unwrap();
        let read_only = std::fs::File::open(dir.path().join("ro")).unwrap();
        let buf = [9u8; 512];
        let Some([rg, rr]) = write_pair([good.as_raw_fd(), read_only.as_raw_fd()], &buf, 0) else {
            assert!(unavailable());
            return;
        };
        assert_eq!(rg.unwrap(), 512);
        assert_eq!(rr.unwrap_err().raw_os_error(), Some(libc::EBADF));
        let mut back = [0u8; 512];
        good.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, buf);
    }
}
