//! Reads and writes started without blocking ([`Submit`]): an
//! `rbd_aio_read` or `rbd_aio_write` whose completion hands the buffer and
//! the outcome to the caller's [`Done`], on a librbd thread. What that
//! completion needs of the device (its name, its health, the count of
//! requests under way) is [`Ends`], shared with it.
//!
//! Closing waits for the requests under way (`RbdDevice::close`): the
//! handles' lock keeps new ones out, then the count must reach zero before
//! `rbd_close` (librbd would wait too; the count makes it ours to bound).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{aio, errno_error, health, RbdDevice};
use crate::device::{check_range, AlignedBuf, DeviceError, DeviceResult, Done, Submit};

/// What outlives a request's start: the device's name and health, and how
/// many submitted requests are under way.
pub(super) struct Ends {
    pub(super) name: String,
    /// Whether the cluster answers (health.rs).
    pub(super) health: health::Health,
    pub(super) in_flight: AtomicUsize,
}

impl Ends {
    pub(super) fn new(name: &str) -> Ends {
        Ends {
            name: name.to_string(),
            health: Default::default(),
            in_flight: AtomicUsize::new(0),
        }
    }

    pub(super) fn io_err(&self, what: &'static str, source: io::Error) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            what,
            source,
        }
    }

    /// Tells the health tracker how a request ended. Only a read or a
    /// flush that succeeded (`answered`) says the cluster answers:
    /// librbd's cache may acknowledge a write or a discard without it.
    pub(super) fn noted<T>(&self, r: DeviceResult<T>, answered: bool) -> DeviceResult<T> {
        match &r {
            Ok(_) if answered => self.health.succeeded(),
            Ok(_) => {}
            Err(e @ DeviceError::Io { source, .. }) => {
                if let Some(errno) = source.raw_os_error() {
                    self.health.failed(errno, &e.to_string());
                }
            }
            Err(_) => {}
        }
        r
    }

    /// The result of `rbd_aio_read` (`len`: the bytes read, all of them)
    /// or `rbd_aio_write` (`None`: 0, which librbd's own blocking write
    /// turns into the length), or an error.
    pub(super) fn transferred(
        &self,
        what: &'static str,
        ret: isize,
        len: Option<usize>,
    ) -> DeviceResult<()> {
        match (usize::try_from(ret), len) {
            (Ok(_), None) => Ok(()),
            (Ok(n), Some(len)) if n == len => Ok(()),
            (Ok(n), Some(len)) => Err(self.io_err(
                what,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("rbd_aio_{what} returned {n} of {len} bytes"),
                ),
            )),
            (Err(_), _) => Err(self.io_err(what, errno_error(ret as i64))),
        }
    }

    /// How a submitted request ended, given to `done`. Only a read that
    /// succeeded says the cluster answers (`noted`).
    fn end(&self, ret: isize, buf: AlignedBuf, write: bool, done: Done) {
        let r = match write {
            false => self.noted(self.transferred("read", ret, Some(buf.len())), true),
            true => self.noted(self.transferred("write", ret, None), false),
        };
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        done(buf, r);
    }
}

impl RbdDevice {
    /// Starts a read into `buf` at `offset`, or a write of `buf` there;
    /// `done` gets the buffer back with the outcome.
    fn submit(&self, buf: AlignedBuf, offset: u64, write: bool, done: Done) {
        if let Err(e) = check_range(self, offset, buf.len() as u64) {
            return done(buf, Err(e));
        }
        // Taken by the start; left for the error of a closed image.
        let mut job = Some((buf, done));
        let what = if write { "write" } else { "read" };
        let started = self.with_image(what, |h| {
            let (mut buf, done) = job.take().expect("taken once");
            let (ptr, len) = (buf.as_mut_ptr(), buf.len());
            // Counted before the start: a completion may run before it returns.
            self.ends.in_flight.fetch_add(1, Ordering::AcqRel);
            let ends = Arc::clone(&self.ends);
            // The buffer moves into the completion; its heap bytes stay put.
            let finish = move |ret: isize| ends.end(ret, buf, write, done);
            let (image, ptr) = (h.image, ptr.cast());
            // SAFETY: a live image (the handles' read lock keeps it open for
            // the call; close waits for `in_flight`); `ptr` is the heap of
            // `buf`, which the completion owns until librbd is done with it
            // (librbd only reads it for a write).
            unsafe {
                aio::submit(
                    h.api,
                    |c| match write {
                        false => (h.api.rbd_aio_read)(image, offset, len, ptr, c),
                        true => (h.api.rbd_aio_write)(image, offset, len, ptr, c),
                    },
                    finish,
                )
            };
            Ok(())
        });
        if let (Err(e), Some((buf, done))) = (started, job) {
            done(buf, Err(e));
        }
    }

    /// Waits up to `limit` for the submitted requests under way to end.
    pub(super) fn drain_submitted(&self, limit: std::time::Duration) -> bool {
        crate::sync::poll_until(limit, || self.ends.in_flight.load(Ordering::Acquire) == 0)
    }
}

impl Submit for RbdDevice {
    fn submit_read(&self, buf: AlignedBuf, offset: u64, done: Done) {
        self.submit(buf, offset, false, done);
    }

    fn submit_write(&self, buf: AlignedBuf, offset: u64, done: Done) {
        self.submit(buf, offset, true, done);
    }
}
