//! The ublk front end: a [`Volume`] as the kernel block device
//! `/dev/ublkbN`, through the kernel's ublk driver and the `libublk` crate.
//!
//! One ublk queue per queue thread; each queue takes up to `queue_depth`
//! requests at once. A hit, or a write the cache takes at once, is started
//! in the engine on the queue thread (`Volume::start_read`/`start_write`,
//! engine/io/direct.rs: try-locks only, never a wait) and its cache device
//! I/O goes on the queue's own io_uring, straight into or from the tag's
//! buffer; its completion finishes it in the engine and completes the tag.
//! No other thread takes part and nothing is copied (ublk itself copies
//! the data once between the request's pages and the tag's buffer: the
//! 6.12 kernel has no ublk zero-copy). Any other read the volume can make
//! into the tag's buffer (`Start::Blocking`: a miss) runs on the runtime's
//! blocking pool, which reads straight into that buffer and reports back
//! as below; the queue lends the buffer until the reply and, when it
//! stops, waits for what it lent. Every other request goes on in the
//! tokio runtime (where the volume's futures run, as for NBD), and the
//! queue completes it when the runtime reports back through a channel and
//! an eventfd that the queue's io_uring reads (libublk `wait_and_handle_io`:
//! "use eventfd to wakeup & notify ublk queue/io_uring").
//!
//! Recovery (`UBLK_F_USER_RECOVERY` with `_REISSUE`): when the daemon dies
//! the driver keeps `/dev/ublkbN` and queues its requests (requests in
//! flight are reissued), and a new daemon started with `recover` takes the
//! device over (START/END_USER_RECOVERY); the filesystem sees a stall, not
//! an error. Kernel docs: Documentation/block/ublk.rst, "User recovery".

use std::cell::RefCell;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{BufDesc, UblkError, UblkFlags, UblkIORes};

use crate::device::AlignedBuf;
use crate::volume::{
    BlockingRead, Dest, DirectRead, DirectWrite, ErrorKind, Later, LaterRead, Piece, Start, Volume,
    VolumeError,
};

/// Largest request the driver sends, in bytes (also each tag's buffer).
const IO_BUF_BYTES: u32 = 512 * 1024;
/// `op` of the eventfd read in io_uring user data (any value unused by
/// libublk's own target I/O).
const EVENTFD_OP: u32 = 0xfe;
/// `op` of a direct request's device requests (the piece's index is the
/// target data).
const DIRECT_OP: u32 = 0xfd;
/// How long a stopped queue waits for its direct requests' device I/O
/// and the blocking reads it lent tag buffers to.
const DRAIN_S: u64 = 30;

/// How a ublk device is set up.
#[derive(Debug, Clone)]
pub struct UblkConfig {
    /// Device number (`/dev/ublkbN`); `None` lets the driver choose.
    pub dev_id: Option<i32>,
    pub nr_queues: u16,
    pub queue_depth: u16,
    /// Take over an existing device left by a daemon that died.
    pub recover: bool,
    /// Complete a write only once it is durable (as if FUA). Off, the
    /// device has a volatile write cache and the kernel sends FLUSH. A
    /// daemon that dies is replaced under a live filesystem, which then
    /// flushes to the new one: writes the dead one acknowledged but had not
    /// committed are kept by the engine's crash log either way.
    pub durable_writes: bool,
}

/// Errors of the ublk front end.
#[derive(Debug, thiserror::Error)]
pub enum UblkFrontendError {
    /// The driver or libublk refused an operation.
    #[error("ublk: {what}: {source}")]
    Ublk {
        what: &'static str,
        #[source]
        source: UblkError,
    },
    /// No device to recover with that number.
    #[error("ublk: no device {0} to recover (is /dev/ublkc{0} there?)")]
    NoDevice(i32),
}

fn ublk_err(what: &'static str) -> impl FnOnce(UblkError) -> UblkFrontendError {
    move |source| UblkFrontendError::Ublk { what, source }
}

/// A finished request: tag, result (bytes or -errno), data read.
type Done = (u16, i32, Option<AlignedBuf>);

fn errno(e: &VolumeError) -> i32 {
    -match e.kind {
        ErrorKind::Io => libc::EIO,
        ErrorKind::Invalid => libc::EINVAL,
        ErrorKind::NoSpace => libc::ENOSPC,
        ErrorKind::ReadOnly => libc::EROFS,
        ErrorKind::NotSupported => libc::EOPNOTSUPP,
        ErrorKind::ShuttingDown => libc::EIO,
    }
}

/// Creates (or, with `recover`, takes over) the device and serves it until
/// it is stopped (`stop` from another thread, or `ublk del`). `started`
/// gets the device number once the device is live.
pub fn serve<V: Volume>(
    volume: Arc<V>,
    rt: tokio::runtime::Handle,
    cfg: &UblkConfig,
    started: impl FnOnce(&UblkCtrl) + Send + Sync + 'static,
) -> Result<(), UblkFrontendError> {
    let mut dev_flags = UblkFlags::UBLK_DEV_F_ADD_DEV;
    if cfg.recover {
        let id = cfg.dev_id.ok_or(UblkFrontendError::NoDevice(-1))?;
        let old = UblkCtrl::new_simple(id).map_err(|_| UblkFrontendError::NoDevice(id))?;
        old.start_user_recover()
            .map_err(ublk_err("starting user recovery"))?;
        dev_flags = UblkFlags::UBLK_DEV_F_RECOVER_DEV;
    }
    let ctrl = UblkCtrlBuilder::default()
        .name("tiercache")
        .id(cfg.dev_id.unwrap_or(-1))
        .nr_queues(cfg.nr_queues)
        .depth(cfg.queue_depth)
        .io_buf_bytes(IO_BUF_BYTES)
        .ctrl_flags(
            (libublk::sys::UBLK_F_USER_RECOVERY | libublk::sys::UBLK_F_USER_RECOVERY_REISSUE)
                as u64,
        )
        .dev_flags(dev_flags)
        .build()
        .map_err(ublk_err("creating the device"))?;
    let size_bytes = volume.size_bytes();
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size_bytes);
        Ok(())
    };
    let durable = cfg.durable_writes;
    let q_fn =
        move |qid: u16, dev: &UblkDev| queue_thread(qid, dev, volume.clone(), rt.clone(), durable);
    ctrl.run_target(tgt_init, q_fn, started)
        .map_err(ublk_err("running the device"))?;
    Ok(())
}

/// Deletes device `id` (after a clean shutdown; a killed daemon's device
/// is kept for recovery instead).
pub fn delete(id: i32) -> Result<(), UblkFrontendError> {
    let ctrl = UblkCtrl::new_simple(id).map_err(|_| UblkFrontendError::NoDevice(id))?;
    let _ = ctrl.kill_dev();
    ctrl.del_dev().map_err(ublk_err("deleting the device"))?;
    Ok(())
}

/// Stops device `id`'s queues (its `serve` returns); the device stays.
pub fn stop(id: i32) -> Result<(), UblkFrontendError> {
    let ctrl = UblkCtrl::new_simple(id).map_err(|_| UblkFrontendError::NoDevice(id))?;
    ctrl.kill_dev().map_err(ublk_err("stopping the device"))?;
    Ok(())
}

/// An eventfd the runtime's tasks signal when a request is done.
fn done_eventfd(qid: u16) -> Option<Arc<OwnedFd>> {
    // SAFETY: eventfd(2) has no memory arguments; the result is checked.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if raw < 0 {
        log::error!(
            "ublk queue {qid}: eventfd: {}",
            std::io::Error::last_os_error()
        );
        return None;
    }
    // SAFETY: `raw` is a new descriptor that nothing else owns.
    Some(Arc::new(unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// Completes a finished request: copies read data into the tag's buffer,
/// then tells the driver (the commit goes out with the queue's next
/// submission, together with the others finished by then).
fn complete(q: &UblkQueue, bufs: &[IoBuf<u8>], (tag, res, data): Done) {
    let buf = &bufs[tag as usize];
    if let Some(data) = data {
        // SAFETY: the driver does not touch a tag's buffer between handing
        // us the request and our completion.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(buf.as_slice().as_ptr() as *mut u8, data.len())
        };
        dst.copy_from_slice(&data);
    }
    let _ = q.complete_io_cmd_unified(
        tag,
        BufDesc::Slice(buf.as_slice()),
        Ok(UblkIORes::Result(res)),
    );
}

/// Hands a finished request to the queue and wakes its io_uring.
fn report(tx: &mpsc::Sender<Done>, efd: &OwnedFd, done: Done) {
    let _ = tx.send(done);
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live array to our eventfd.
    unsafe { libc::write(efd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// Completes every request the runtime has finished.
fn complete_finished(q: &UblkQueue, rx: &mpsc::Receiver<Done>, bufs: &[IoBuf<u8>]) {
    while let Ok(done) = rx.try_recv() {
        complete(q, bufs, done);
    }
}

/// One ublk request, as the volume runs it: what to complete the tag with.
async fn run_request<V: Volume>(
    volume: &V,
    tag: u16,
    op: u32,
    offset: u64,
    len: u32,
    data: Option<AlignedBuf>,
    fua: bool,
) -> Done {
    let ok = len as i32;
    let res = |r: Result<(), VolumeError>, ok: i32| r.map_or_else(|e| errno(&e), |_| ok);
    match op {
        libublk::sys::UBLK_IO_OP_READ => match volume.read(offset, len).await {
            Ok(buf) => (tag, ok, Some(buf)),
            Err(e) => (tag, errno(&e), None),
        },
        libublk::sys::UBLK_IO_OP_WRITE => {
            let data = data.expect("write data");
            (tag, res(volume.write(offset, data, fua).await, ok), None)
        }
        libublk::sys::UBLK_IO_OP_FLUSH => (tag, res(volume.flush().await, 0), None),
        libublk::sys::UBLK_IO_OP_DISCARD => (
            tag,
            res(volume.trim(offset, len.into(), fua).await, ok),
            None,
        ),
        libublk::sys::UBLK_IO_OP_WRITE_ZEROES => (
            tag,
            res(volume.write_zeroes(offset, len.into(), fua).await, ok),
            None,
        ),
        _ => (tag, -libc::EOPNOTSUPP, None),
    }
}

/// A direct request under way: its device requests not yet reported, and
/// whether all so far moved whole.
struct InFlight {
    io: DirectIo,
    left: usize,
    ok: bool,
    len: u32,
}

enum DirectIo {
    Read(DirectRead),
    Write(DirectWrite),
}

impl DirectIo {
    fn pieces(&self) -> (RawFd, &[Piece]) {
        match self {
            DirectIo::Read(d) => (d.fd, &d.pieces),
            DirectIo::Write(d) => (d.fd, &d.pieces),
        }
    }
}

async fn later_done(tag: u16, len: u32, later: LaterRead) -> Done {
    match later.await {
        Ok(buf) => (tag, len as i32, Some(buf)),
        Err(e) => (tag, errno(&e), None),
    }
}

async fn later_write_done(tag: u16, len: u32, later: Later<()>) -> Done {
    match later.await {
        Ok(()) => (tag, len as i32, None),
        Err(e) => (tag, errno(&e), None),
    }
}

/// Queues the device requests of a direct request on the queue's
/// io_uring, to or from the tag's buffer; each completion names the tag
/// and the piece. Returns how many were queued (all, unless the ring
/// failed).
fn submit_direct(q: &UblkQueue, tag: u16, buf: &IoBuf<u8>, io: &DirectIo) -> usize {
    let base = buf.as_slice().as_ptr() as *mut u8;
    let (fd, pieces) = io.pieces();
    let fd = io_uring::types::Fd(fd);
    for (i, p) in pieces.iter().enumerate() {
        // SAFETY: the piece lies inside the request, which fits the tag's
        // buffer; the driver leaves the buffer to us until completion.
        let at = unsafe { base.add(p.buf.start) };
        let n = p.buf.len() as u32;
        let sqe = match io {
            DirectIo::Read(_) => io_uring::opcode::Read::new(fd, at, n).offset(p.at).build(),
            DirectIo::Write(_) => io_uring::opcode::Write::new(fd, at, n).offset(p.at).build(),
        };
        let sqe = sqe.user_data(UblkIOCtx::build_user_data(tag, DIRECT_OP, i as u32, true));
        if let Err(e) = q.ublk_submit_sqe_sync(sqe) {
            log::error!("ublk: queueing a cache device request: {e}");
            return i;
        }
    }
    pieces.len()
}

/// One queue's state, on its thread.
struct Queue<V: Volume> {
    volume: Arc<V>,
    rt: tokio::runtime::Handle,
    durable_writes: bool,
    /// Each tag's buffer.
    bufs: Vec<IoBuf<u8>>,
    /// Requests finished on the runtime come back through `rx`, and
    /// `efd` wakes the queue's io_uring for them.
    efd: Arc<OwnedFd>,
    tx: mpsc::Sender<Done>,
    rx: mpsc::Receiver<Done>,
    /// The eventfd's counter is read into this; leaked, so it outlives the
    /// queue loop and any read still in flight when the queue stops.
    counter: *mut u64,
    /// Direct requests under way, by tag.
    inflight: RefCell<Vec<Option<InFlight>>>,
    /// Tag buffers lent to blocking reads and not yet given back.
    lent: Arc<AtomicUsize>,
}

impl<V: Volume> Queue<V> {
    /// Arms the read of the eventfd.
    fn arm(&self, q: &UblkQueue, qid: u16) {
        let fd = io_uring::types::Fd(self.efd.as_raw_fd());
        let sqe = io_uring::opcode::Read::new(fd, self.counter.cast(), 8)
            .build()
            .user_data(UblkIOCtx::build_user_data(0, EVENTFD_OP, 0, true));
        if let Err(e) = q.ublk_submit_sqe_sync(sqe) {
            log::error!("ublk queue {qid}: arming the eventfd: {e}");
        }
    }

    /// Runs a request's future on the runtime; the queue completes it when
    /// the eventfd says so.
    fn spawn(&self, request: impl Future<Output = Done> + Send + 'static) {
        let (tx, efd) = (self.tx.clone(), self.efd.clone());
        self.rt
            .spawn(async move { report(&tx, &efd, request.await) });
    }

    /// Runs a blocking read on the runtime's blocking pool, into the tag's
    /// buffer (lent until the reply, `lent` counting it); the queue
    /// completes it when the eventfd says so, with nothing to copy.
    fn start_blocking(&self, tag: u16, len: u32, read: BlockingRead) {
        let (tx, efd) = (self.tx.clone(), self.efd.clone());
        let lent = self.lent.clone();
        lent.fetch_add(1, Ordering::SeqCst);
        let ptr = self.bufs[tag as usize].as_slice().as_ptr() as *mut u8;
        // SAFETY: the tag's buffer holds the request (the driver bounds it
        // by IO_BUF_BYTES); the driver leaves it to us until we complete
        // the tag, which waits for the reply, and the queue keeps its
        // buffers until `lent` is back to 0 (`wait_lent`).
        let dest = unsafe {
            Dest::new(ptr, len as usize, move || {
                lent.fetch_sub(1, Ordering::SeqCst);
            })
        };
        self.rt.spawn_blocking(move || {
            read(
                dest,
                Box::new(move |dest, r| {
                    drop(dest); // given back before the queue can complete the tag
                    report(
                        &tx,
                        &efd,
                        (tag, r.map_or_else(|e| errno(&e), |()| len as i32), None),
                    );
                }),
            )
        });
    }

    /// A completion on the queue's io_uring.
    fn handle(&self, q: &UblkQueue, tag: u16, ctx: &UblkIOCtx) {
        if !ctx.is_tgt_io() {
            return self.request(q, tag);
        }
        if UblkIOCtx::user_data_to_op(ctx.user_data()) == DIRECT_OP {
            return self.piece_done(q, tag, ctx);
        }
        // Requests the runtime finished: copy reads out, complete.
        complete_finished(q, &self.rx, &self.bufs);
        self.arm(q, q.get_qid());
    }

    /// A new request from the driver.
    fn request(&self, q: &UblkQueue, tag: u16) {
        let iod = q.get_iod(tag);
        let op = iod.op_flags & 0xff;
        let fua = self.durable_writes || iod.op_flags & libublk::sys::UBLK_IO_F_FUA != 0;
        let (offset, len) = (iod.start_sector << 9, iod.nr_sectors << 9);
        if op == libublk::sys::UBLK_IO_OP_READ && self.start_read(q, tag, offset, len) {
            return;
        }
        if op == libublk::sys::UBLK_IO_OP_WRITE && self.start_write(q, tag, offset, len, fua) {
            return;
        }
        let data = (op == libublk::sys::UBLK_IO_OP_WRITE)
            .then(|| AlignedBuf::from_slice(&self.bufs[tag as usize].as_slice()[..len as usize]));
        let volume = self.volume.clone();
        self.spawn(async move { run_request(&*volume, tag, op, offset, len, data, fua).await });
    }

    /// Starts a read the volume lets the queue make itself (direct.rs), or
    /// has taken the first step of; false if it is left to `read`.
    fn start_read(&self, q: &UblkQueue, tag: u16, offset: u64, len: u32) -> bool {
        match self.volume.start_read(offset, len) {
            Start::Direct(read) => self.start_direct(q, tag, len, DirectIo::Read(read)),
            Start::Later(later) => self.spawn(later_done(tag, len, later)),
            Start::Blocking(read) => self.start_blocking(tag, len, read),
            Start::Default => return false,
        }
        true
    }

    /// `start_read` for a write.
    fn start_write(&self, q: &UblkQueue, tag: u16, offset: u64, len: u32, fua: bool) -> bool {
        let data = &self.bufs[tag as usize].as_slice()[..len as usize];
        match self.volume.start_write(offset, data, fua) {
            Start::Direct(write) => self.start_direct(q, tag, len, DirectIo::Write(write)),
            Start::Later(later) => self.spawn(later_write_done(tag, len, later)),
            Start::Blocking(never) => match never {},
            Start::Default => return false,
        }
        true
    }

    fn start_direct(&self, q: &UblkQueue, tag: u16, len: u32, io: DirectIo) {
        let want = io.pieces().1.len();
        let left = submit_direct(q, tag, &self.bufs[tag as usize], &io);
        // Not all queued: once those that were are over, the volume does
        // the request its own way.
        let ok = left == want && want > 0;
        let f = InFlight { io, left, ok, len };
        match left {
            0 => self.direct_over(q, tag, f),
            _ => self.inflight.borrow_mut()[tag as usize] = Some(f),
        }
    }

    /// A direct request's piece is over: once all are, `direct_over`.
    fn piece_done(&self, q: &UblkQueue, tag: u16, ctx: &UblkIOCtx) {
        let mut all = self.inflight.borrow_mut();
        let Some(f) = all[tag as usize].as_mut() else {
            return;
        };
        let piece = ((ctx.user_data() >> 24) & 0xffff) as usize;
        let want = (f.io.pieces().1.get(piece)).map_or(0, |p| p.buf.len() as i32);
        f.ok &= ctx.result() == want;
        f.left -= 1;
        if f.left > 0 {
            return;
        }
        let f = all[tag as usize].take().expect("in flight");
        drop(all);
        self.direct_over(q, tag, f);
    }

    /// After the queue stopped: waits for the device requests of direct
    /// requests still under way, then lets those requests go (the driver
    /// completes nothing more), so that none of their device I/O lands
    /// after their blocks are unlocked or their new slots given back.
    /// (The queue's io_uring is its thread's, alive until the queue drops.)
    /// A cache device that answers nothing for `DRAIN_S` is given up on
    /// (logged): its requests are let go regardless.
    fn drain(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(DRAIN_S);
        while self.inflight.borrow().iter().any(Option::is_some) {
            if std::time::Instant::now() >= deadline {
                log::error!(
                    "ublk: the cache device did not finish its requests within {DRAIN_S} s of the \
                     queue's end; letting them go"
                );
                return;
            }
            let ts = io_uring::types::Timespec::new().sec(1);
            let args = io_uring::types::SubmitArgs::new().timespec(&ts);
            let done = libublk::io::with_task_io_ring_mut(|ring| {
                match ring.submitter().submit_with_args(1, &args) {
                    Err(e) if e.raw_os_error() != Some(libc::ETIME) => return Err(e),
                    _ => {}
                }
                Ok(ring.completion().map(|c| c.user_data()).collect::<Vec<_>>())
            });
            let done = match done {
                Ok(done) => done,
                Err(e) => {
                    log::error!("ublk: waiting for cache device requests at the end: {e}");
                    return;
                }
            };
            for user_data in done {
                let target = user_data & libublk::UblkUringData::Target as u64 != 0;
                if !target || UblkIOCtx::user_data_to_op(user_data) != DIRECT_OP {
                    continue;
                }
                let tag = UblkIOCtx::user_data_to_tag(user_data) as usize;
                let mut all = self.inflight.borrow_mut();
                if let Some(f) = all[tag].as_mut() {
                    f.left -= 1;
                    if f.left == 0 {
                        // Dropped: the volume lets go, as after a failure.
                        let f = all[tag].take();
                        drop(all);
                        drop(f);
                    }
                }
            }
        }
    }

    /// After the queue stopped: waits for the blocking reads it lent tag
    /// buffers to (their replies go nowhere now), at most `DRAIN_S`; false
    /// if some still have one (logged).
    fn wait_lent(&self) -> bool {
        let limit = std::time::Duration::from_secs(DRAIN_S);
        if crate::sync::poll_until(limit, || self.lent.load(Ordering::SeqCst) == 0) {
            return true;
        }
        log::error!(
            "ublk: {} reads still held tag buffers {DRAIN_S} s after the queue's end; \
             the buffers are kept",
            self.lent.load(Ordering::SeqCst)
        );
        false
    }

    /// Completes a direct request, or (a device request failed, or the
    /// mode changed meanwhile) lets the volume finish it its own way.
    fn direct_over(&self, q: &UblkQueue, tag: u16, f: InFlight) {
        let data = &self.bufs[tag as usize].as_slice()[..f.len as usize];
        match f.io {
            DirectIo::Read(r) => match r.finish(f.ok, data) {
                None => complete(q, &self.bufs, (tag, f.len as i32, None)),
                Some(later) => self.spawn(later_done(tag, f.len, later)),
            },
            DirectIo::Write(w) => match w.finish(f.ok, data) {
                None => complete(q, &self.bufs, (tag, f.len as i32, None)),
                Some(later) => self.spawn(later_write_done(tag, f.len, later)),
            },
        }
    }
}

fn queue_thread<V: Volume>(
    qid: u16,
    dev: &UblkDev,
    volume: Arc<V>,
    rt: tokio::runtime::Handle,
    durable_writes: bool,
) {
    let Some(efd) = done_eventfd(qid) else {
        return;
    };
    let (tx, rx) = mpsc::channel::<Done>();
    let bufs: Vec<IoBuf<u8>> = dev.alloc_queue_io_bufs();
    let inflight = RefCell::new((0..bufs.len()).map(|_| None).collect());
    let st = Queue {
        volume,
        rt,
        durable_writes,
        bufs,
        efd,
        tx,
        rx,
        counter: Box::leak(Box::new(0u64)),
        inflight,
        lent: Arc::new(AtomicUsize::new(0)),
    };
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&st.bufs))))
    {
        Ok(q) => q,
        Err(e) => {
            log::error!("ublk queue {qid}: {e}");
            return;
        }
    };
    st.arm(&queue, qid);
    // A volume starts a read inside the runtime (its slow part may start a
    // blocking task).
    let _runtime = st.rt.enter();
    queue.wait_and_handle_io(|q: &UblkQueue, tag: u16, ctx: &UblkIOCtx| st.handle(q, tag, ctx));
    st.drain();
    drop(queue);
    if !st.wait_lent() {
        // A read still has a tag's buffer: keep them all rather than free
        // memory it may write.
        std::mem::forget(st);
    }
}
