//! What a command acts on. Commands call the operations below and never the
//! engine directly, so that when `tiercache serve` exists a command given
//! for a cache the daemon serves can be sent over its control socket
//! (`Registry::socket_path`) instead: a `Target::Daemon` variant implements
//! the same operations as requests.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tiercache::daemon::Frontends;
use tiercache::device::{open_device, open_device_read_only, DeviceRef};
use tiercache::engine::policy::share::ShareChange;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::{AdmissionSettings, Engine, Mode, OpenOptions, Status, WritebackSettings};

use super::control::{self, Request};
use super::registry::{self, Entry, Lock, Registry};

pub enum Target {
    /// No daemon serves the cache: this process opened the engine itself
    /// and closes it (cleanly, so the next open needs no replay) when done.
    Offline(Arc<Engine>),
    /// `tiercache serve` serves the cache: requests go to its control socket.
    Daemon(PathBuf),
    /// No daemon serves the cache and the command only looks at it: the
    /// engine was opened read-only (devices O_RDONLY under shared locks,
    /// recovery in memory), so nothing is written; only `status` answers.
    ReadOnly(Arc<Engine>),
}

/// What a command that changes the cache gets from a read-only target (a
/// bug: such commands open with `Opened::open`).
fn read_only() -> anyhow::Error {
    anyhow::anyhow!("the cache was opened read-only, to look at it")
}

impl Target {
    pub fn status(&self) -> Result<Status> {
        Ok(self.status_and_frontends()?.0)
    }

    /// The status and, when a daemon serves the cache, what it serves on.
    pub fn status_and_frontends(&self) -> Result<(Status, Option<Frontends>)> {
        match self {
            Target::Offline(e) => Ok((e.status(), None)),
            Target::ReadOnly(e) => {
                let mut status = e.status();
                // The engine is closed from the start (nothing may change
                // through it); what it shows is the cache at rest.
                status.state = "not served".into();
                Ok((status, None))
            }
            Target::Daemon(p) => {
                let resp = control::call(p, &Request::Status)?;
                let status = resp.status.context("the daemon sent no status")?;
                Ok((status, resp.frontends))
            }
        }
    }

    /// Writes back all dirty data, or volume `volume`'s; `progress` gets
    /// (blocks done, blocks to do).
    pub fn write_back(
        &self,
        volume: Option<&str>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let request = Request::Flush {
            volume: volume.map(String::from),
        };
        match self {
            Target::Offline(e) => e
                .write_back_named(volume, progress)
                .context("writing back dirty data"),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call_with_progress(p, &request, progress)
                .map(|_| ())
                .context("writing back dirty data"),
        }
    }

    /// Promotes `length` bytes at `offset` of `volume` (else of the first)
    /// into the cache; `progress` gets (bytes done, bytes to do).
    pub fn warm(
        &self,
        volume: Option<&str>,
        offset: u64,
        length: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let request = Request::Warm {
            offset,
            length,
            volume: volume.map(String::from),
        };
        match self {
            Target::Offline(e) => {
                (e.warm_named(volume, offset, length, progress)).context("warming")
            }
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call_with_progress(p, &request, progress)
                .map(|_| ())
                .context("warming"),
        }
    }

    /// Switches every volume's mode, or `volume`'s.
    pub fn set_mode(&self, volume: Option<&str>, mode: Mode) -> Result<()> {
        let what = || format!("switching to {} mode", mode.name());
        let request = Request::SetMode {
            mode,
            volume: volume.map(String::from),
        };
        match self {
            Target::Offline(e) => e.set_mode_named(volume, mode).with_context(what),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call(p, &request).map(|_| ()).with_context(what),
        }
    }

    /// Measures every volume's origin again, or `volume`'s, and takes a
    /// larger one (`Engine::grow_named`); the status after.
    pub fn resize(&self, volume: Option<&str>) -> Result<Status> {
        self.resize_as(volume, false)
    }

    /// Takes a cache device that grew (`Engine::grow_cache`).
    pub fn resize_cache(&self) -> Result<Status> {
        self.resize_as(None, true)
    }

    fn resize_as(&self, volume: Option<&str>, cache: bool) -> Result<Status> {
        let what = match cache {
            true => "taking the cache device's new size",
            false => "taking the origin's new size",
        };
        match self {
            Target::Offline(e) => {
                match cache {
                    true => e.grow_cache().map(|_| ()),
                    false => e.grow_named(volume).map(|_| ()),
                }
                .context(what)?;
                Ok(e.status())
            }
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => {
                let request = Request::Resize {
                    volume: volume.map(String::from),
                    cache,
                };
                let resp = control::call(p, &request).context(what)?;
                resp.status.context("the daemon sent no status")
            }
        }
    }

    /// How the volumes share the cache (`Engine::change_share`).
    pub fn set_share(&self, change: &ShareChange) -> Result<()> {
        let what = "changing the volumes' shares";
        match self {
            Target::Offline(e) => e.change_share(change).context(what),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => {
                let request = Request::SetShare {
                    change: change.clone(),
                };
                control::call(p, &request).map(|_| ()).context(what)
            }
        }
    }

    pub fn set_writeback(&self, w: WritebackSettings) -> Result<()> {
        match self {
            Target::Offline(e) => e.set_writeback(w).context("changing writeback settings"),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call(p, &Request::SetWriteback { settings: w })
                .map(|_| ())
                .context("changing writeback settings"),
        }
    }

    pub fn set_admission(&self, a: AdmissionSettings) -> Result<()> {
        match self {
            Target::Offline(e) => e.set_admission(a).context("changing admission settings"),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call(p, &Request::SetAdmission { settings: a })
                .map(|_| ())
                .context("changing admission settings"),
        }
    }

    pub fn set_policy(&self, policy: PolicyKind) -> Result<()> {
        let what = || format!("switching to the {} policy", policy.name());
        match self {
            Target::Offline(e) => e.set_policy(policy).with_context(what),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call(
                p,
                &Request::SetPolicy {
                    policy: policy.name().into(),
                },
            )
            .map(|_| ())
            .with_context(what),
        }
    }

    /// Replaces cache set member `member` with the device at `path` and
    /// rebuilds its copies; `progress` gets (bytes copied, bytes to copy).
    pub fn replace_cache(
        &self,
        member: usize,
        path: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let what = || format!("replacing cache set member {member} with {path}");
        match self {
            Target::Offline(e) => {
                let dev = open_device(path).with_context(what)?;
                e.replace_cache_member(member, dev, progress)
                    .with_context(what)
            }
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call_with_progress(
                p,
                &Request::ReplaceCache {
                    member,
                    device: path.to_string(),
                },
                progress,
            )
            .map(|_| ())
            .with_context(what),
        }
    }

    /// The cache device is gone for good: its dirty data is lost (see
    /// `Engine::give_up_cache`).
    pub fn give_up_cache(&self) -> Result<()> {
        match self {
            Target::Offline(e) => e.give_up_cache().map(|_| ()).context("giving the cache up"),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call(p, &Request::GiveUpCache)
                .map(|_| ())
                .context("giving the cache up"),
        }
    }

    /// Writes everything back and dissolves the cache. A daemon refuses
    /// while its device is in use, unless `force`.
    pub fn detach(&self, force: bool) -> Result<()> {
        match self {
            Target::Offline(e) => e.detach().context("detaching"),
            Target::ReadOnly(_) => Err(read_only()),
            Target::Daemon(p) => control::call(p, &Request::Detach { force })
                .map(|_| ())
                .context("detaching"),
        }
    }

    /// Ends this command's use of the cache. Idempotent.
    pub fn finish(&self) -> Result<()> {
        match self {
            Target::Offline(e) => match e.close() {
                Err(tiercache::engine::EngineError::ShutDown) | Ok(()) => Ok(()),
                Err(e) => Err(e).context("closing the cache"),
            },
            Target::Daemon(_) | Target::ReadOnly(_) => Ok(()),
        }
    }
}

impl Drop for Target {
    /// A command that failed half-way still shuts the engine down cleanly
    /// where it can; an unclosed cache would replay its journal next time.
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            log::warn!("{e:#}");
        }
    }
}

/// A registered cache, opened for one command.
pub struct Opened {
    pub entry: Entry,
    // Field order matters: the target closes before the lock is released.
    pub target: Target,
    _lock: Option<Lock>,
}

impl Opened {
    /// Resolves `name` (or the only cache), takes its lock and opens it.
    pub fn open(reg: &Registry, name: Option<&str>) -> Result<Opened> {
        Opened::open_with(reg, name, false)
    }

    /// `open`; `degraded`: a cache set opens without members that cannot
    /// be found (see `CacheSet::open`).
    pub fn open_with(reg: &Registry, name: Option<&str>, degraded: bool) -> Result<Opened> {
        Opened::open_by(reg, name, |entry| {
            let engine = open_engine(reg, entry, degraded)
                .with_context(|| format!("cache '{}'", entry.name))?;
            super::registry::record_distrust(reg, entry, &engine)?;
            Ok(Target::Offline(engine))
        })
    }

    /// `open`, for `resize`: a cache no daemon serves is opened with the
    /// operator's word that its origins grew (`OpenOptions::origin_grew`),
    /// and `recorded` gets the volumes (and sizes) it had recorded before.
    pub fn open_grown(
        reg: &Registry,
        name: Option<&str>,
        recorded: &mut Vec<tiercache::engine::format::VolumeEntry>,
    ) -> Result<Opened> {
        Opened::open_by(reg, name, |entry| {
            let opening = || format!("cache '{}'", entry.name);
            let cache = (entry.open_cache(false))
                .context("opening the cache device")
                .with_context(opening)?;
            *recorded =
                tiercache::engine::recovery::recorded_volumes(&cache).with_context(opening)?;
            let origins = open_origins(entry, open_device).with_context(opening)?;
            let opts = OpenOptions {
                origin_grew: true,
                ..command_open_options(reg, entry)
            };
            let engine = Engine::open_volumes(cache, origins, &opts).with_context(opening)?;
            super::registry::record_distrust(reg, entry, &engine)?;
            Ok(Target::Offline(engine))
        })
    }

    /// Resolves `name` (or the only cache) for a command that only looks
    /// at it: a daemon that serves it answers; else the cache is opened
    /// read-only (`Target::ReadOnly`), under the name's lock, and nothing
    /// of it is written, the registry included.
    pub fn open_read_only(reg: &Registry, name: Option<&str>) -> Result<Opened> {
        Opened::open_by(reg, name, |entry| {
            let engine = open_engine_read_only(reg, entry)
                .with_context(|| format!("cache '{}'", entry.name))?;
            Ok(Target::ReadOnly(engine))
        })
    }

    /// Resolves `name`: the daemon that serves it if one listens, else
    /// `offline`'s target, made under the name's lock.
    fn open_by(
        reg: &Registry,
        name: Option<&str>,
        offline: impl FnOnce(&Entry) -> Result<Target>,
    ) -> Result<Opened> {
        let entry = reg.resolve(name)?;
        let socket = reg.socket_path(&entry.name);
        if control::daemon_listening(&socket) {
            return Ok(Opened {
                entry,
                target: Target::Daemon(socket),
                _lock: None,
            });
        }
        let lock = reg.lock(&entry.name)?;
        let target = offline(&entry)?;
        Ok(Opened {
            entry,
            target,
            _lock: Some(lock),
        })
    }

    pub fn finish(&self) -> Result<()> {
        self.target
            .finish()
            .with_context(|| format!("cache '{}'", self.entry.name))
    }
}

fn open_engine(reg: &Registry, entry: &Entry, degraded: bool) -> Result<Arc<Engine>> {
    let cache = entry
        .open_cache(degraded)
        .context("opening the cache device")?;
    let origins = open_origins(entry, open_device)?;
    Ok(Engine::open_volumes(
        cache,
        origins,
        &command_open_options(reg, entry),
    )?)
}

pub(super) fn open_engine_read_only(reg: &Registry, entry: &Entry) -> Result<Arc<Engine>> {
    let cache = open_cache_read_only(&entry.cache_paths()).context("opening the cache device")?;
    let origins = open_origins(entry, open_device_read_only)?;
    Ok(Engine::open_volumes_read_only(
        cache,
        origins,
        &command_open_options(reg, entry),
    )?)
}

/// Every origin of `entry`, volume 0's first, each opened with `open`.
pub(super) fn open_origins(
    entry: &Entry,
    open: impl Fn(&str) -> tiercache::device::DeviceResult<DeviceRef>,
) -> Result<Vec<DeviceRef>> {
    let paths = entry.origin_paths();
    let many = paths.len() > 1;
    paths
        .iter()
        .map(|p| {
            open(p).with_context(|| match many {
                true => format!("opening the origin device {p}"),
                false => "opening the origin device".to_string(),
            })
        })
        .collect()
}

/// How a command opens a cache no daemon serves. A command is short-lived:
/// background writeback would only race the command's own work (the
/// daemon runs it). A daemon killed before this command may have left
/// writes only its crash log knows about: a writing open takes them, a
/// read-only one shows them as the next open would apply them.
pub(super) fn command_open_options(reg: &Registry, entry: &Entry) -> OpenOptions {
    OpenOptions {
        no_background: true,
        distrust_clean: entry.distrust_clean,
        crash_log: Some(reg.crash_log_path(&entry.name)),
        stale_map: Some(reg.stale_map_path(&entry.name)),
        ..OpenOptions::default()
    }
}

/// Opens a cache device, or the cache set of several, read-only: every
/// member under a shared lock, no label written. A member that cannot be
/// opened is left out only where another member's label names it failed
/// (only a writing open may mark a member failed; `set::open_paths`).
pub fn open_cache_read_only(paths: &[String]) -> Result<DeviceRef> {
    Ok(registry::open_cache(paths, false, open_device_read_only)?)
}
