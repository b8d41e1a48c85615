//! librbd's asynchronous calls (`rbd_aio_*`): every request of the device
//! is one. A request's completion runs once, on one of librbd's threads,
//! with the request's return value (bytes moved, or `-errno`); it must not
//! block there.
//!
//! - [`submit`]: starts a request with a completion that runs a closure.
//! - [`wait`]: the same, the calling thread waiting for the return value
//!   (the blocking `BlockDevice` calls: one wake-up, no lock).
//!
//! librbd reports every error of `rbd_aio_read`, `_write`, `_discard` and
//! `_flush` through the completion and returns 0 (librbd.cc, Ceph 16); a
//! negative return is taken as "the completion was not taken": it is
//! released and the closure runs with that return, on the caller's thread.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::Arc;
use std::thread::Thread;

use super::librbd::{Api, CompletionT};

/// What a completion carries to its callback.
struct Pending<F> {
    api: &'static Api,
    done: F,
}

/// librbd's callback for a completion made by [`submit`] with closure `F`.
///
/// # Safety
/// `arg` is the `Pending<F>` box `submit` leaked for `c`; librbd calls this
/// once per completion.
unsafe extern "C" fn completed<F: FnOnce(isize) + Send>(c: CompletionT, arg: *mut c_void) {
    // SAFETY: the function's contract: reclaimed once, here.
    let p = unsafe { Box::from_raw(arg.cast::<Pending<F>>()) };
    // SAFETY: `c` is the completion being completed; released once, here,
    // after its return value is read (as qemu's rbd driver does).
    let ret = unsafe { (p.api.rbd_aio_get_return_value)(c) };
    // SAFETY: as above.
    unsafe { (p.api.rbd_aio_release)(c) };
    (p.done)(ret);
}

/// Starts a request: `start` makes the `rbd_aio_*` call with the
/// completion; `done` runs once with its return value when it is over, on
/// a librbd thread, or at once with `-errno` if it could not start.
///
/// # Safety
/// `start` makes one `rbd_aio_*` call on a live image of `api` with the
/// completion it is given, whose buffer (if any) stays valid until `done`
/// runs.
pub(super) unsafe fn submit<F>(api: &'static Api, start: impl FnOnce(CompletionT) -> c_int, done: F)
where
    F: FnOnce(isize) + Send + 'static,
{
    let arg = Box::into_raw(Box::new(Pending { api, done }));
    let mut c: CompletionT = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; `completed::<F>` matches `arg`'s type.
    let ret = unsafe { (api.rbd_aio_create_completion)(arg.cast(), completed::<F>, &mut c) };
    if ret < 0 {
        // SAFETY: librbd made no completion: `arg` is still ours.
        let p = unsafe { Box::from_raw(arg) };
        return (p.done)(ret as isize);
    }
    let ret = start(c);
    if ret < 0 {
        // SAFETY: not taken (module comment): ours to release and reclaim.
        let p = unsafe {
            (api.rbd_aio_release)(c);
            Box::from_raw(arg)
        };
        (p.done)(ret as isize);
    }
}

/// A blocked thread's side of a request: the return value, and the thread
/// to wake.
struct Waiting {
    ret: AtomicIsize,
    over: AtomicBool,
    thread: Thread,
}

/// [`submit`], waiting on this thread for the return value.
///
/// # Safety
/// As [`submit`]; the buffer need only outlive this call.
pub(super) unsafe fn wait(api: &'static Api, start: impl FnOnce(CompletionT) -> c_int) -> isize {
    let w = Arc::new(Waiting {
        ret: AtomicIsize::new(0),
        over: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let theirs = w.clone();
    // SAFETY: the caller's contract; this call outlives the request (it
    // returns only once `done` ran).
    unsafe {
        submit(api, start, move |ret| {
            theirs.ret.store(ret, Ordering::Relaxed);
            let thread = theirs.thread.clone();
            theirs.over.store(true, Ordering::Release);
            // `theirs` may be the last reference now; `thread` is ours.
            drop(theirs);
            thread.unpark();
        })
    };
    while !w.over.load(Ordering::Acquire) {
        std::thread::park();
    }
    w.ret.load(Ordering::Relaxed)
}
