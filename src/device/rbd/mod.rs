//! `rbd://POOL/IMAGE[?conf=PATH&id=NAME]`: a Ceph RBD image as a block
//! device (typically the origin), through librbd in this process, without
//! an NBD hop (docs/ceph.md).
//!
//! - `uri.rs`: the URI.
//! - `librbd.rs`: librados and librbd, loaded at run time (dlopen), so the
//!   crate needs no Ceph headers or libraries to build.
//! - `aio.rs`: librbd's asynchronous calls (`rbd_aio_*`), which every
//!   request is: started with a completion, ended on a librbd thread.
//! - `submit.rs`: requests started without blocking (`device::Submit`):
//!   the engine sends the reads of blocks it holds none of that way
//!   (engine/io/submitted.rs), no thread of ours waiting.
//! - here: the device (`RbdDevice`); its blocking calls wait on the
//!   calling thread for their completion.
//!
//! Concurrency: librbd's image calls may be made from many threads at
//! once. Opening happens before the device exists; closing (`close`, or
//! drop) takes the handles' lock exclusively, so it waits for the blocking
//! requests under way and for the submitted ones (counted), and requests
//! after it fail instead of using a closed image.
//!
//! Closing matters beyond the process: an open image holds a watch on the
//! OSD, which a process that exits without `rbd_close` leaves behind for
//! 30 s (osd_client_watch_timeout), and until then `rbd rm` fails and
//! another client waits for the image's exclusive lock. The engine closes
//! its origin when it is closed or detached.
//!
//! Durability: librbd's cache follows the Ceph config (by default on, in
//! writearound: writes go to the OSDs at once, and may be acknowledged
//! before they are stable); `flush` is `rbd_aio_flush`, which ends once
//! every write completed before it is stable on the OSDs. That is the
//! device contract: a write may be lost until a later flush completes.
//! librbd would otherwise keep its cache in writethrough until the first
//! flush (`rbd_cache_writethrough_until_flush`, for guests that never
//! flush); tiercache flushes wherever durability needs it, so it turns
//! that off unless the config sets it (`DEFAULTS`).
//!
//! Bounds: connecting gives up after `client_mount_timeout` (set to 30 s
//! unless the config sets it); an OSD request that gets no answer fails
//! with ETIMEDOUT after `rados_osd_op_timeout` (set to `serve
//! --origin-timeout`, 30 s by default, unless the config sets it), so an
//! origin that stops answering becomes an origin error instead of a hang,
//! and the image is unreachable until a request succeeds (health.rs).

mod aio;
mod health;
mod librbd;
mod submit;
mod uri;

pub use uri::RbdUri;

use std::ffi::{c_char, CString};
use std::io;
use std::sync::Arc;

use parking_lot::RwLock;

use super::{check_range, fnv1a64, BlockDevice, DeviceError, DeviceResult, SECTOR_BYTES};
use librbd::{api, Api, ImageT, IoctxT, RadosT};
use submit::Ends;

/// Config values set when the config leaves them at Ceph's default:
/// (option, Ceph's default, ours).
/// - `client_mount_timeout`: connecting gives up after 30 s, not 300
///   (module comment, "Bounds").
/// - `rbd_cache_writethrough_until_flush`: librbd keeps its cache in
///   writethrough until a client's first flush, for guests that never send
///   one; tiercache flushes its origin wherever durability needs it (each
///   commit covering foreground writes, each writeback batch), so librbd
///   may use its cache as configured from the start. Left on, every origin
///   write waited for the OSD until the first FLUSH: passthrough writes ran
///   at half the IOPS (docs/benchmarks.md).
///
/// `rados_osd_op_timeout` is `device::origin_timeout` (`serve
/// --origin-timeout`) unless the config sets it.
const DEFAULTS: [(&str, &str, &str); 2] = [
    ("client_mount_timeout", "300", "30"),
    ("rbd_cache_writethrough_until_flush", "true", "false"),
];

/// An RBD image behind [`BlockDevice`].
pub struct RbdDevice {
    identity: u64,
    /// As of the open or the last `refresh_size` (`rbd resize`).
    size_bytes: std::sync::atomic::AtomicU64,
    /// `None` once closed. Requests hold it shared for their call into
    /// librbd; closing holds it exclusively (module comment).
    handles: RwLock<Option<Handles>>,
    /// The name, health and requests under way, which a request's
    /// completion on a librbd thread also reaches (submit.rs).
    ends: Arc<Ends>,
    /// Failed flushes (`BlockDevice::loss_epoch`).
    failed_flushes: std::sync::atomic::AtomicU64,
}

/// The cluster connection, pool context and image; any may be null while
/// opening. Released in reverse order when dropped.
struct Handles {
    api: &'static Api,
    cluster: RadosT,
    ioctx: IoctxT,
    image: ImageT,
}

// SAFETY: the handles are only used through librbd/librados calls that are
// thread-safe for I/O (module comment); they are released only by Drop,
// which has exclusive access.
unsafe impl Send for Handles {}
// SAFETY: as for Send.
unsafe impl Sync for Handles {}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each handle is either null or a live handle made by the
        // matching create/open call, released once here.
        unsafe {
            if !self.image.is_null() {
                // Writes out librbd's cache and removes the watch; an
                // error has no caller to go to (callers that need
                // durability flush first).
                let ret = (self.api.rbd_close)(self.image);
                if ret < 0 {
                    log::warn!("rbd_close: {}", errno_error(ret.into()));
                }
            }
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                // Also the way to release a handle that never connected.
                (self.api.rados_shutdown)(self.cluster);
            }
        }
    }
}

/// An error from a librados/librbd call returning `-errno`.
fn errno_error(ret: i64) -> io::Error {
    io::Error::from_raw_os_error(i32::try_from(-ret).unwrap_or(libc::EIO))
}

fn cstring(what: &str, s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} '{s}' contains a NUL"))
}

impl RbdDevice {
    /// Connects to the cluster and opens the image of `uri`.
    pub fn open(uri: &str) -> DeviceResult<RbdDevice> {
        let open_err = |reason: String| DeviceError::Open {
            spec: uri.to_string(),
            reason,
        };
        let parsed = RbdUri::parse(uri.trim()).map_err(open_err)?;
        let api = api().map_err(open_err)?;
        Self::open_parsed(uri, &parsed, api).map_err(open_err)
    }

    fn open_parsed(uri: &str, u: &RbdUri, api: &'static Api) -> Result<RbdDevice, String> {
        let pool = cstring("pool name", &u.pool)?;
        let image_name = cstring("image name", &u.image)?;
        let mut h = Handles {
            api,
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
            image: std::ptr::null_mut(),
        };
        connect_cluster(&mut h, u)?;
        // SAFETY: every call gets valid C strings that outlive it, and
        // handles made by the calls before it (or out-pointers to fill).
        unsafe {
            check(
                (api.rados_ioctx_create)(h.cluster, pool.as_ptr(), &mut h.ioctx).into(),
                format!("opening pool '{}'", u.pool),
            )?;
            check(
                (api.rbd_open)(h.ioctx, image_name.as_ptr(), &mut h.image, std::ptr::null()).into(),
                format!("opening image '{}' in pool '{}'", u.image, u.pool),
            )?;
            let mut size_bytes = 0u64;
            check(
                (api.rbd_get_size)(h.image, &mut size_bytes).into(),
                "rbd_get_size".into(),
            )?;
            if size_bytes == 0 || !size_bytes.is_multiple_of(SECTOR_BYTES) {
                return Err(format!(
                    "the image is {size_bytes} bytes: not a non-zero multiple of 512"
                ));
            }
            let fsid = read_string(|buf, len| (api.rados_cluster_fsid)(h.cluster, buf, len))
                .map_err(|e| format!("rados_cluster_fsid: {e}"))?;
            let image_id = read_string(|buf, len| (api.rbd_get_id)(h.image, buf, len))
                .map_err(|e| format!("rbd_get_id: {e}"))?;
            let pool_id = (api.rados_ioctx_get_id)(h.ioctx);
            // The cluster, pool and image ids survive renames of the pool
            // and the image, and a changed config path or client name.
            let identity = fnv1a64(format!("rbd:{fsid}:{pool_id}:{image_id}").as_bytes());
            Ok(RbdDevice {
                identity,
                size_bytes: size_bytes.into(),
                handles: RwLock::new(Some(h)),
                ends: Arc::new(Ends::new(uri)),
                failed_flushes: Default::default(),
            })
        }
    }

    /// Runs `f` with the open handles, or fails if the device was closed.
    fn with_image<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Handles) -> DeviceResult<T>,
    ) -> DeviceResult<T> {
        match self.handles.read().as_ref() {
            Some(h) => f(h),
            None => Err(self.ends.io_err(
                what,
                io::Error::new(io::ErrorKind::NotConnected, "the image was closed"),
            )),
        }
    }
}

/// `Err` naming `what` and the errno for a librados/librbd return below 0.
fn check(ret: i64, what: String) -> Result<(), String> {
    if ret < 0 {
        Err(format!("{what}: {}", errno_error(ret)))
    } else {
        Ok(())
    }
}

/// Makes `h.cluster` and connects it as `u`'s client: the config file (or
/// Ceph's search for one), CEPH_ARGS, then our bounds where the config
/// leaves Ceph's defaults.
fn connect_cluster(h: &mut Handles, u: &RbdUri) -> Result<(), String> {
    let api = h.api;
    let id = cstring("client id", &u.id)?;
    let conf = u
        .conf
        .as_deref()
        .map(|c| cstring("config path", c))
        .transpose()?;
    // SAFETY: every call gets valid C strings that outlive it, and the
    // cluster handle made by the first call (or its out-pointer).
    unsafe {
        check(
            (api.rados_create)(&mut h.cluster, id.as_ptr()).into(),
            format!("rados_create (client.{})", u.id),
        )?;
        let conf_ptr = conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        check(
            (api.rados_conf_read_file)(h.cluster, conf_ptr).into(),
            match &u.conf {
                Some(c) => format!("reading the Ceph config {c}"),
                None => "finding a Ceph config (CEPH_CONF, /etc/ceph/ceph.conf; or give \
                         ?conf=PATH)"
                    .into(),
            },
        )?;
        check(
            (api.rados_conf_parse_env)(h.cluster, std::ptr::null()).into(),
            "parsing CEPH_ARGS".into(),
        )?;
        for (option, ceph_default, ours) in DEFAULTS {
            set_if_default(api, h.cluster, option, ceph_default, ours)?;
        }
        let op_timeout = crate::device::origin_timeout().as_secs().max(1).to_string();
        set_if_default(api, h.cluster, "rados_osd_op_timeout", "0", &op_timeout)?;
        check(
            (api.rados_connect)(h.cluster).into(),
            format!("connecting to the cluster as client.{}", u.id),
        )
    }
}

/// Sets `option` to `ours` if the config left it at `ceph_default`
/// (numbers compared as numbers: "300" is "300.000000").
///
/// # Safety
/// `cluster` is a live, not yet connected handle of `api`.
unsafe fn set_if_default(
    api: &Api,
    cluster: RadosT,
    option: &str,
    ceph_default: &str,
    ours: &str,
) -> Result<(), String> {
    let copt = cstring("option", option)?;
    // SAFETY: live handle, valid C string, a buffer of the stated length.
    let current =
        read_string(|buf, len| unsafe { (api.rados_conf_get)(cluster, copt.as_ptr(), buf, len) })
            .map_err(|e| format!("rados_conf_get {option}: {e}"))?;
    let current = current.trim();
    let same = match (current.parse::<f64>(), ceph_default.parse::<f64>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => current == ceph_default,
    };
    if same {
        let value = cstring("value", ours)?;
        // SAFETY: as above.
        let ret = unsafe { (api.rados_conf_set)(cluster, copt.as_ptr(), value.as_ptr()) };
        if ret < 0 {
            return Err(format!(
                "rados_conf_set {option}={ours}: {}",
                errno_error(ret.into())
            ));
        }
    }
    Ok(())
}

/// Calls `f(buf, len)`, which fills `buf` with a NUL-terminated string or
/// returns `-errno` (-ERANGE: too small), with growing buffers.
fn read_string(mut f: impl FnMut(*mut c_char, usize) -> i32) -> io::Result<String> {
    let mut len = 128usize;
    loop {
        let mut buf = vec![0u8; len];
        let ret = f(buf.as_mut_ptr().cast(), len);
        if ret == -libc::ERANGE && len < 1 << 16 {
            len *= 4;
            continue;
        }
        if ret < 0 {
            return Err(errno_error(ret.into()));
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        return Ok(String::from_utf8_lossy(&buf[..end]).into_owned());
    }
}

impl BlockDevice for RbdDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(std::sync::atomic::Ordering::Acquire)
    }

    fn refresh_size(&self) -> DeviceResult<u64> {
        let mut now = 0u64;
        self.with_image("size", |h| {
            // SAFETY: a live image handle; librbd writes the u64.
            let ret = unsafe { (h.api.rbd_get_size)(h.image, &mut now) };
            if ret < 0 {
                return Err(self.ends.io_err("size", errno_error(ret.into())));
            }
            Ok(())
        })?;
        let now = now / SECTOR_BYTES * SECTOR_BYTES;
        (self.size_bytes).store(now, std::sync::atomic::Ordering::Release);
        Ok(now)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        let len = buf.len();
        let ret = self.with_image("read", |h| {
            let to = buf.as_mut_ptr().cast();
            // SAFETY: a live image handle; librbd writes at most len bytes
            // into buf, which stays borrowed until the request is over.
            Ok(unsafe { aio::wait(h.api, |c| (h.api.rbd_aio_read)(h.image, offset, len, to, c)) })
        })?;
        self.ends
            .noted(self.ends.transferred("read", ret, Some(len)), true)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        let ret = self.with_image("write", |h| {
            let (from, len) = (buf.as_ptr().cast(), buf.len());
            // SAFETY: a live image handle; librbd only reads len bytes of
            // buf, which stays borrowed until the request is over.
            Ok(unsafe {
                aio::wait(h.api, |c| {
                    (h.api.rbd_aio_write)(h.image, offset, len, from, c)
                })
            })
        })?;
        self.ends
            .noted(self.ends.transferred("write", ret, None), false)
    }

    fn flush(&self) -> DeviceResult<()> {
        let r = self.with_image("flush", |h| {
            // SAFETY: a live image handle.
            let ret = unsafe { aio::wait(h.api, |c| (h.api.rbd_aio_flush)(h.image, c)) };
            if ret < 0 {
                return Err(self.ends.io_err("flush", errno_error(ret as i64)));
            }
            Ok(())
        });
        if r.is_err() {
            self.failed_flushes
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.ends.noted(r, true)
    }

    fn loss_epoch(&self) -> u64 {
        self.failed_flushes
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn health(&self) -> Option<super::DeviceHealth> {
        Some(self.ends.health.report())
    }

    fn is_reachable(&self) -> bool {
        self.ends.health.is_reachable()
    }

    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        let r = self.with_image("discard", |h| {
            // SAFETY: a live image handle.
            let ret =
                unsafe { aio::wait(h.api, |c| (h.api.rbd_aio_discard)(h.image, offset, len, c)) };
            if ret < 0 {
                return Err(self.ends.io_err("discard", errno_error(ret as i64)));
            }
            Ok(())
        });
        self.ends.noted(r, false)
    }

    fn close(&self) -> DeviceResult<()> {
        // The write lock waits for blocking requests under way and keeps
        // new ones out; then the submitted ones (each bounded by
        // rados_osd_op_timeout) end; rbd_close in Handles::drop.
        let mut handles = self.handles.write();
        let limit = crate::device::origin_timeout() + std::time::Duration::from_secs(5);
        if !self.drain_submitted(limit) {
            log::warn!("{}: requests still under way at close", self.ends.name);
        }
        drop(handles.take());
        Ok(())
    }

    fn submitter(&self) -> Option<&dyn super::Submit> {
        Some(self)
    }

    fn name(&self) -> &str {
        &self.ends.name
    }

    fn identity(&self) -> u64 {
        self.identity
    }
}
