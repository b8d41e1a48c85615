//! Requests whose device I/O the front end makes itself: a volume that
//! would serve a read or a write with I/O to a plain file or block device
//! says where ([`Direct`]), and the front end makes it straight from or
//! into the request's buffer on its own io_uring (the ublk queue's), with
//! no hand-off to another thread and no copy. The volume keeps the places
//! it named (the cache's blocks locked, new slots taken) until the front
//! end reports back, then records what was done.

use std::future::Future;
use std::ops::Range;
use std::os::fd::RawFd;
use std::pin::Pin;

use crate::device::AlignedBuf;

use super::VolumeResult;

/// A request that goes on in the volume's own way (on the runtime it was
/// started in), already past its first step.
pub type Later<T> = Pin<Box<dyn Future<Output = VolumeResult<T>> + Send>>;
pub type LaterRead = Later<AlignedBuf>;

/// How a request starts ([`super::Volume::start_read`],
/// [`super::Volume::start_write`]).
pub enum Start<T, B = std::convert::Infallible> {
    /// The front end makes the device I/O.
    Direct(Direct<T>),
    /// The volume took the request's first step; the rest runs as a future.
    Later(Later<T>),
    /// The rest is work that may block, for the front end to run on a
    /// thread that may (reads: [`BlockingRead`], into the front end's
    /// buffer; writes have none).
    Blocking(B),
    /// Nothing was done: use [`super::Volume::read`] or `write`.
    Default,
}

pub type ReadStart = Start<AlignedBuf, BlockingRead>;
pub type WriteStart = Start<()>;

/// The front end's buffer for a read's data, lent to the volume's
/// [`BlockingRead`] until it replies: the data goes there with no copy.
/// When it drops, `on_return` tells the lender it is no longer used.
pub struct Dest {
    ptr: *mut u8,
    len: usize,
    on_return: Option<Box<dyn FnOnce() + Send>>,
}

// SAFETY: the lender gives the buffer up until `on_return` (Dest::new's
// contract); one thread at a time has the Dest.
unsafe impl Send for Dest {}

impl Dest {
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes, and nothing but
    /// this Dest touches them until `on_return` runs (at its drop).
    pub unsafe fn new(ptr: *mut u8, len: usize, on_return: impl FnOnce() + Send + 'static) -> Dest {
        Dest {
            ptr,
            len,
            on_return: Some(Box::new(on_return)),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer, for the read to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: valid and ours while the Dest lives (Dest::new).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        if let Some(f) = self.on_return.take() {
            f();
        }
    }
}

/// How a [`BlockingRead`] answers: the buffer given back (filled, on
/// success) with the outcome. The front end completes the request then.
pub type Reply = Box<dyn FnOnce(Dest, VolumeResult<()>) + Send>;

/// A read to run where it may block (the runtime's blocking pool), into
/// the front end's buffer; it calls the reply once, and touches the buffer
/// no more after it (the reply takes it).
pub type BlockingRead = Box<dyn FnOnce(Dest, Reply) + Send>;
pub type DirectRead = Direct<AlignedBuf>;
pub type DirectWrite = Direct<()>;

/// One device request of a [`Direct`]: `buf.len()` bytes at byte `at` of
/// the descriptor, to or from the request's buffer at `buf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub at: u64,
    pub buf: Range<usize>,
}

/// A direct request's device requests, held inline (no allocation) when
/// they are two or fewer, as for most.
pub type Pieces = smallvec::SmallVec<[Piece; 2]>;

/// What a front end reports when the device I/O is over: `true` if each
/// piece moved all its bytes, and the request's data (a write's, for the
/// volume to finish it its own way after a failure). On `false` the volume
/// answers with the request done its own way (counted once).
type Finish<T> = Box<dyn FnOnce(bool, &[u8]) -> Option<Later<T>> + Send>;

/// The device I/O of one request, and the volume's hold on the places it
/// named until it is over. Dropped without [`Direct::finish`], it lets go
/// as if the I/O had failed (and nothing is finished).
pub struct Direct<T> {
    /// An open file or block device (kept open until `finish`), read and
    /// written with pread/pwrite semantics; if it was opened with O_DIRECT,
    /// buffers and offsets are sector aligned.
    pub fd: RawFd,
    pub pieces: Pieces,
    finish: Option<Finish<T>>,
}

impl<T> Direct<T> {
    pub fn new(
        fd: RawFd,
        pieces: Pieces,
        finish: impl FnOnce(bool, &[u8]) -> Option<Later<T>> + Send + 'static,
    ) -> Direct<T> {
        Direct {
            fd,
            pieces,
            finish: Some(Box::new(finish)),
        }
    }

    /// The device I/O is over: `ok` if every piece moved whole; `data` is
    /// the request's buffer. The volume records the request (or lets go of
    /// it); after a failure it returns the request to finish instead
    /// (`None` after a success).
    pub fn finish(mut self, ok: bool, data: &[u8]) -> Option<Later<T>> {
        self.finish.take().and_then(|f| f(ok, data))
    }
}

impl<T> Drop for Direct<T> {
    fn drop(&mut self) {
        if let Some(f) = self.finish.take() {
            drop(f(false, &[]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_direct_request_lets_go_once_whether_finished_or_dropped() {
        let calls = Arc::new(AtomicU32::new(0));
        let (c1, c2) = (calls.clone(), calls.clone());
        let r = DirectWrite::new(3, Pieces::new(), move |ok, data| {
            assert!(ok);
            assert_eq!(data, b"x");
            c1.fetch_add(1, Ordering::Relaxed);
            None
        });
        assert!(r.finish(true, b"x").is_none());
        drop(DirectRead::new(3, Pieces::new(), move |ok, _| {
            assert!(!ok, "a dropped request counts as failed");
            c2.fetch_add(1, Ordering::Relaxed);
            None
        }));
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_lent_buffer_is_returned_once_when_its_dest_drops() {
        let mut buf = vec![0u8; 16];
        let returned = Arc::new(AtomicU32::new(0));
        let r = returned.clone();
        // SAFETY: `buf` outlives the Dest and is not touched meanwhile.
        let mut d = unsafe {
            Dest::new(buf.as_mut_ptr(), buf.len(), move || {
                r.fetch_add(1, Ordering::Relaxed);
            })
        };
        d.as_mut_slice()[3] = 7;
        let moved = std::thread::spawn(move || d).join().unwrap();
        assert_eq!(returned.load(Ordering::Relaxed), 0);
        drop(moved);
        assert_eq!(returned.load(Ordering::Relaxed), 1);
        assert_eq!(buf[3], 7);
    }
}
