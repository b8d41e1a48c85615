//! Threads that write the second copy of a mirrored write while the
//! caller writes the first, so a mirrored write costs about one device
//! write's time, not two. They block on a channel when idle (a work-stealing
//! pool's idle threads spin, and on two cores that spinning took the CPU
//! the writes needed).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, OnceLock};

use crate::device::{DeviceRef, DeviceResult};

/// Threads at most (each blocks in one device write at a time).
const THREADS: usize = 32;

struct Job {
    dev: DeviceRef,
    /// The caller's buffer: valid until `done` is set, because the caller
    /// waits for it before returning (`write_beside`).
    ptr: *const u8,
    len: usize,
    at: u64,
    done: Arc<Done>,
}

// SAFETY: the buffer behind `ptr` is only read, and outlives the job (see
// `write_beside`).
unsafe impl Send for Job {}

#[derive(Default)]
struct Done {
    result: std::sync::Mutex<Option<DeviceResult<()>>>,
    cv: Condvar,
}

fn pool() -> &'static std::sync::Mutex<Sender<Job>> {
    static POOL: OnceLock<std::sync::Mutex<Sender<Job>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for i in 0..THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("tc-mirror-{i}"))
                .spawn(move || serve(&rx))
                .expect("a mirror thread");
        }
        std::sync::Mutex::new(tx)
    })
}

fn serve(rx: &std::sync::Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock().expect("not poisoned").recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        // SAFETY: see `Job::ptr`.
        let buf = unsafe { std::slice::from_raw_parts(job.ptr, job.len) };
        let r = job.dev.write_at(buf, job.at);
        *job.done.result.lock().expect("not poisoned") = Some(r);
        job.done.cv.notify_one();
    }
}

/// Writes `buf` at `at` on `a` (in this thread) and on `b` (in a helper)
/// at once; returns both results.
pub(super) fn write_beside(
    a: impl FnOnce() -> DeviceResult<()>,
    b: &DeviceRef,
    buf: &[u8],
    at: u64,
) -> (DeviceResult<()>, DeviceResult<()>) {
    let done = Arc::new(Done::default());
    let job = Job {
        dev: b.clone(),
        ptr: buf.as_ptr(),
        len: buf.len(),
        at,
        done: done.clone(),
    };
    if pool().lock().expect("not poisoned").send(job).is_err() {
        // No helper (cannot happen while the process lives): write it here.
        return (a(), b.write_at(buf, at));
    }
    // The helper reads `buf` until it sets the result: wait for it even if
    // `a` unwinds (the guard's drop waits).
    let wait = Wait(&done);
    let ra = a();
    (ra, wait.result())
}

/// Waits for a helper's result; dropped without `result`, it still waits.
struct Wait<'a>(&'a Done);

impl Wait<'_> {
    fn wait(&self) -> std::sync::MutexGuard<'_, Option<DeviceResult<()>>> {
        let mut r = self.0.result.lock().expect("not poisoned");
        while r.is_none() {
            r = self.0.cv.wait(r).expect("not poisoned");
        }
        r
    }

    fn result(self) -> DeviceResult<()> {
        let r = self.wait().take().expect("set");
        // Taken: nothing left for the drop to wait for.
        std::mem::forget(self);
        r
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        drop(self.wait());
    }
}
