//! What a daemon serves its cache on, as `status` reports it, and the
//! guard that keeps a device in use from being torn down: a detach of a
//! cache whose ublk device is mounted or held open, or that an NBD client
//! is connected to, is refused unless forced (the filesystem on it would
//! see every later request fail).

use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The front ends of a running daemon (the control socket's wire form).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontends {
    /// NBD Unix socket, when NBD is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_socket: Option<String>,
    /// NBD TCP address as bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_tcp: Option<String>,
    /// NBD clients past the handshake now.
    #[serde(default)]
    pub nbd_clients: usize,
    /// The NBD export names of a cache of several volumes (its volumes'
    /// names; the empty name is the first); empty for one volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nbd_exports: Vec<String>,
    /// The ublk block device (`/dev/ublkbN`), when ublk is served; of a
    /// cache of several volumes, volume 0's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ublk_device: Option<String>,
    /// Of a cache of several volumes served over ublk: every volume's
    /// device, in volume order (`/dev/ublkb<N+v>`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ublk_devices: Vec<String>,
    /// The ublk device's size, fixed when it was made: a volume grown
    /// online since (`tiercache resize`) keeps the old size on it until
    /// the daemon restarts (Linux 6.12 cannot resize a live ublk device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ublk_bytes: Option<u64>,
    /// Of a cache of several volumes served over ublk: the size each
    /// device was made with, in volume order (as `ublk_bytes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ublk_devices_bytes: Vec<u64>,
}

impl Frontends {
    /// The ublk devices whose volume grew since they were made, with the
    /// size each keeps and the volume's now: a restart makes them anew
    /// (`volume_bytes`: every volume's size now, in order).
    pub fn ublk_behind(&self, volume_bytes: &[u64]) -> Vec<(String, u64, u64)> {
        let devices: Vec<(String, u64)> = if self.ublk_devices.is_empty() {
            (self.ublk_device.clone().zip(self.ublk_bytes))
                .into_iter()
                .collect()
        } else {
            (self.ublk_devices.iter().cloned())
                .zip(self.ublk_devices_bytes.iter().copied())
                .collect()
        };
        (devices.into_iter().zip(volume_bytes))
            .filter(|((_, made), &now)| *made < now)
            .map(|((dev, made), &now)| (dev, made, now))
            .collect()
    }
}

/// Serves volume `v`, added online, on the daemon's front end; returns
/// how it is served now, or why it cannot be.
pub type ServeAdded = Box<dyn Fn(usize) -> Result<ServedAs, String> + Send + Sync>;

/// How a volume added online is served.
pub enum ServedAs {
    /// The NBD exports that are new (its name; with the cache's second
    /// volume also the first's).
    Exports(Vec<String>),
    /// Its ublk device, made now, and the size it was made with.
    Ublk { device: String, bytes: u64 },
}

/// Stops serving volume `v` named so, removed online; returns the NBD
/// exports that are gone (its name, and "" if that named volume 0).
pub type Unserve = Box<dyn Fn(usize, &str) -> Vec<String> + Send + Sync>;

/// The daemon's live view: its addresses, exports and devices (more
/// exports as volumes are added online), and the server's client count.
pub struct Served {
    fixed: parking_lot::Mutex<Frontends>,
    nbd_clients: Arc<AtomicUsize>,
    /// How a volume added online is served: set once the front end runs
    /// (`serve_added`).
    serve_added: std::sync::OnceLock<ServeAdded>,
    /// How a volume removed online stops being served (`unserve`).
    unserve: std::sync::OnceLock<Unserve>,
}

impl Served {
    pub fn new(fixed: Frontends, nbd_clients: Arc<AtomicUsize>) -> Served {
        Served {
            fixed: parking_lot::Mutex::new(fixed),
            nbd_clients,
            serve_added: std::sync::OnceLock::new(),
            unserve: std::sync::OnceLock::new(),
        }
    }

    pub fn snapshot(&self) -> Frontends {
        Frontends {
            nbd_clients: self.nbd_clients.load(Ordering::Relaxed),
            ..self.fixed.lock().clone()
        }
    }

    /// From now on a volume added online is served by `f`.
    pub fn set_serve_added(&self, f: ServeAdded) {
        let _ = self.serve_added.set(f);
    }

    /// True if a volume added now would be served at once (NBD: as its
    /// export; ublk: as a device made then; not with `--export-name`).
    pub fn can_serve_added(&self) -> bool {
        self.serve_added.get().is_some()
    }

    /// Serves volume `v`, just added, as `set_serve_added` said; the
    /// exports it is served as join `status`'s list.
    pub fn serve_added(&self, v: usize) -> Result<(), String> {
        let serve = (self.serve_added.get()).ok_or("no front end serves added volumes")?;
        let how = serve(v)?;
        let mut fixed = self.fixed.lock();
        match how {
            ServedAs::Exports(exports) => fixed.nbd_exports.extend(exports),
            ServedAs::Ublk { device, bytes } => {
                if fixed.ublk_devices.is_empty() {
                    // A cache of one had its device alone.
                    let first = (fixed.ublk_device.clone()).zip(fixed.ublk_bytes);
                    let (d, b): (Vec<String>, Vec<u64>) = first.into_iter().unzip();
                    (fixed.ublk_devices, fixed.ublk_devices_bytes) = (d, b);
                }
                fixed.ublk_devices.push(device);
                fixed.ublk_devices_bytes.push(bytes);
            }
        }
        Ok(())
    }

    /// From now on a volume removed online stops being served by `f`.
    pub fn set_unserve(&self, f: Unserve) {
        let _ = self.unserve.set(f);
    }

    /// True if a volume removed now stops being served at once (NBD: its
    /// export goes; ublk's devices live until the daemon stops).
    pub fn can_unserve(&self) -> bool {
        self.unserve.get().is_some()
    }

    /// Stops serving volume `v`, `name`, removed: its exports leave
    /// `status`'s list, and clients can no longer pick them.
    pub fn unserve(&self, v: usize, name: &str) {
        if let Some(unserve) = self.unserve.get() {
            let gone = unserve(v, name);
            self.fixed.lock().nbd_exports.retain(|e| !gone.contains(e));
        }
    }

    /// [`teardown_refusal`], after giving NBD clients that are leaving up to
    /// [`CLIENT_LEAVE_WAIT`] to be gone: a client that has just sent its
    /// disconnect is still counted until the server has closed its end.
    pub fn teardown_refusal(&self) -> Option<String> {
        let t = Instant::now();
        loop {
            let f = self.snapshot();
            let why = teardown_refusal(&f);
            if why.is_none() || f.nbd_clients == 0 || t.elapsed() >= CLIENT_LEAVE_WAIT {
                return why;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How long a teardown waits for NBD clients that are disconnecting.
pub const CLIENT_LEAVE_WAIT: Duration = Duration::from_secs(2);

/// Why tearing down the cache behind `f` would pull a device from under its
/// users, or `None` when nothing uses it. Checked on the daemon's host: a
/// ublk device is in use when it is mounted (its major:minor in
/// /proc/self/mountinfo) or held open exclusively (an `O_EXCL` open fails
/// with EBUSY: a mount, device-mapper, another `O_EXCL` opener).
pub fn teardown_refusal(f: &Frontends) -> Option<String> {
    for dev in f.ublk_device.iter().chain(&f.ublk_devices) {
        if let Some(why) = block_device_in_use(dev) {
            return Some(format!(
                "{dev} is {why}; unmount it (or close it) first, or pass --force"
            ));
        }
    }
    if f.nbd_clients > 0 {
        return Some(format!(
            "{} NBD client{} connected (e.g. nbd-client on /dev/nbdN); disconnect first \
             (nbd-client -d /dev/nbdN), or pass --force",
            f.nbd_clients,
            if f.nbd_clients == 1 { " is" } else { "s are" }
        ));
    }
    None
}

/// "mounted on PATH" or "held open exclusively", if so.
fn block_device_in_use(dev: &str) -> Option<String> {
    let meta = std::fs::metadata(dev).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        if let Some(mount_point) = mounted_on(&info, major, minor) {
            return Some(format!("mounted on {mount_point}"));
        }
    }
    match std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(dev)
    {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Some("held open exclusively".into()),
        _ => None,
    }
}

/// The mount point of the first mount of device `major:minor`
/// (proc(5) mountinfo: field 3 is major:minor, field 5 the mount point).
fn mounted_on(mountinfo: &str, major: u32, minor: u32) -> Option<String> {
    let want = format!("{major}:{minor}");
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let dev = fields.nth(2)?;
        let mount_point = fields.nth(1)?;
        (dev == want).then(|| mount_point.replace("\\040", " "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ublk_device_behind_its_grown_volume_is_named() {
        let one = Frontends {
            ublk_device: Some("/dev/ublkb0".into()),
            ublk_bytes: Some(100),
            ..Default::default()
        };
        assert!(one.ublk_behind(&[100]).is_empty());
        assert_eq!(one.ublk_behind(&[200]), [("/dev/ublkb0".into(), 100, 200)]);
        let two = Frontends {
            ublk_device: Some("/dev/ublkb4".into()),
            ublk_bytes: Some(100),
            ublk_devices: vec!["/dev/ublkb4".into(), "/dev/ublkb5".into()],
            ublk_devices_bytes: vec![100, 300],
            ..Default::default()
        };
        assert_eq!(
            two.ublk_behind(&[100, 400]),
            [("/dev/ublkb5".into(), 300, 400)]
        );
        assert!(Frontends::default().ublk_behind(&[1]).is_empty());
    }

    #[test]
    fn mountinfo_lines() {
        let info = "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n\
                    98 22 259:0 / /mnt/my\\040disk rw - ext4 /dev/ublkb0 rw\n";
        assert_eq!(mounted_on(info, 259, 0).as_deref(), Some("/mnt/my disk"));
        assert_eq!(mounted_on(info, 259, 2).as_deref(), Some("/"));
        assert_eq!(mounted_on(info, 8, 0), None);
    }

    #[test]
    fn nbd_clients_refuse() {
        let mut f = Frontends {
            nbd_socket: Some("/x.nbd".into()),
            ..Frontends::default()
        };
        assert_eq!(teardown_refusal(&f), None);
        f.nbd_clients = 2;
        let why = teardown_refusal(&f).unwrap();
        assert!(why.contains("2 NBD clients are connected"), "{why}");
        assert!(why.contains("--force"), "{why}");
    }
}
