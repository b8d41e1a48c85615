//! The control socket of a running daemon (`tiercache serve`): one JSON request per
//! line, answered by one JSON response line (a flush first sends progress
//! lines, `{"ok":true,"progress":[done,total]}`, at most ten a second; so
//! does a warm, in bytes). `status`, `flush`, `warm`, `set-mode`,
//! `set-writeback`, `set-admission`, `set-policy`, `set-share`,
//! `add-origin` and `detach` given for a
//! served cache travel this way,
//! so they act on the live engine and print what they print offline.
//! Who may connect, how many at once and for how long:
//! `control_listener.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::class::{Class, Classed};
use super::frontends::{Frontends, Served};
use crate::engine::policy::share::ShareChange;
use crate::engine::policy::PolicyKind;
use crate::engine::{AdmissionSettings, Engine, Mode, Status, WritebackSettings};

/// Errors of a control client ([`call`]).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No daemon listens on the socket (or it cannot be reached).
    #[error("connecting to {}", path.display())]
    Connect {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The request could not be sent.
    #[error("sending request")]
    Send(#[source] std::io::Error),
    /// The reply could not be read.
    #[error("reading the daemon's reply")]
    Receive(#[source] std::io::Error),
    /// The daemon hung up before answering (it died, or shut down).
    #[error("the daemon closed the control connection without answering")]
    Closed,
    /// A request or reply that is not the JSON both sides speak.
    #[error("{what} the daemon's reply")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The daemon refused or failed the request; its message and class.
    #[error("{0}")]
    Refused(Classed),
}

type Result<T> = std::result::Result<T, ControlError>;

/// Longest request line accepted.
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;
/// Least time between two progress lines of a flush.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Status,
    /// Write back every volume's dirty data, or the named volume's.
    Flush {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volume: Option<String>,
    },
    /// Every volume's mode, or the named volume's.
    SetMode {
        mode: Mode,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volume: Option<String>,
    },
    SetWriteback {
        settings: WritebackSettings,
    },
    SetAdmission {
        settings: AdmissionSettings,
    },
    SetPolicy {
        policy: String,
    },
    /// How the volumes share the cache (`Engine::change_share`).
    SetShare {
        change: ShareChange,
    },
    /// Put the device `origin` behind the cache as volume `volume` (in
    /// `mode`, else the cache's) and serve it (`Engine::add_volume`).
    AddOrigin {
        origin: String,
        volume: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<Mode>,
    },
    /// Take volume `volume` out while the others are served
    /// (`Engine::remove_volume_served`), and stop serving it (progress
    /// lines: blocks written back, to write back).
    RemoveOrigin {
        volume: String,
    },
    /// Refused while a front end's device is in use, unless `force`.
    Detach {
        #[serde(default)]
        force: bool,
    },
    /// Promote `length` bytes at `offset` (of the named volume; else of
    /// the first) into the cache.
    Warm {
        offset: u64,
        length: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volume: Option<String>,
    },
    /// Every volume's origin (or the named one's) is measured again and a
    /// grown one taken online (`Engine::grow_named`); with `cache`, the
    /// cache device instead (`Engine::grow_cache`). The reply's status has
    /// the sizes now.
    Resize {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volume: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cache: bool,
    },
    /// The cache device is gone for good: its dirty blocks are lost, their
    /// origin ranges stale (`Engine::give_up_cache`).
    GiveUpCache,
    /// Replace member `member` of the cache set with the device `device`
    /// and rebuild its copies (progress lines: bytes copied, to copy).
    ReplaceCache {
        member: usize,
        device: String,
    },
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Response {
    pub ok: bool,
    #[serde(default)]
    pub error: Option<String>,
    /// With an error: what kind of failure it is (`class.rs`); a daemon
    /// of before classes sends none (taken as `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    #[serde(default)]
    pub status: Option<Status>,
    /// Set on the progress lines of a flush; absent on the final response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<[u64; 2]>,
    /// With a status: what the cache is served on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontends: Option<Frontends>,
}

impl Response {
    pub(super) fn result(r: std::result::Result<Option<Status>, Classed>) -> Response {
        match r {
            Ok(status) => Response {
                ok: true,
                error: None,
                class: None,
                status,
                progress: None,
                frontends: None,
            },
            Err(e) => Response {
                ok: false,
                error: Some(e.message),
                class: Some(e.class),
                status: None,
                progress: None,
                frontends: None,
            },
        }
    }
}

/// Writes `resp` as one line.
pub(super) fn send(out: &mut UnixStream, resp: &Response) -> std::io::Result<()> {
    let mut text = serde_json::to_string(resp).map_err(std::io::Error::other)?;
    text.push('\n');
    out.write_all(text.as_bytes())
}

/// True if a daemon answers on `path`. A socket this user may not connect
/// to counts: a daemon may be behind it, and a command must not open the
/// cache beside it (it then fails to connect, saying why).
pub fn daemon_listening(path: &Path) -> bool {
    match UnixStream::connect(path) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
    }
}

/// Sends one request to the daemon and returns its response.
pub fn call(path: &Path, req: &Request) -> Result<Response> {
    call_with_progress(path, req, &mut |_, _| {})
}

/// Like `call`, passing the progress lines of a flush to `progress`.
pub fn call_with_progress(
    path: &Path,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response> {
    let mut s = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    let mut line = serde_json::to_string(req).map_err(|source| ControlError::Json {
        what: "encoding the request for",
        source,
    })?;
    line.push('\n');
    // A daemon that refuses the connection (control_listener.rs) answers
    // and closes before reading: the write may fail, and the answer says why.
    let sent = s.write_all(line.as_bytes());
    let mut reader = BufReader::new(s);
    loop {
        let mut reply = String::new();
        let n = (&mut reader)
            .take(16 << 20)
            .read_line(&mut reply)
            .map_err(ControlError::Receive)?;
        if n == 0 {
            return Err(match sent {
                Err(e) => ControlError::Send(e),
                Ok(()) => ControlError::Closed,
            });
        }
        let resp: Response = serde_json::from_str(&reply).map_err(|source| ControlError::Json {
            what: "decoding",
            source,
        })?;
        if let Some([done, total]) = resp.progress {
            progress(done, total);
            continue;
        }
        if !resp.ok {
            return Err(ControlError::Refused(Classed::new(
                resp.class.unwrap_or(Class::Failed),
                resp.error.unwrap_or_else(|| "request failed".into()),
            )));
        }
        return Ok(resp);
    }
}

/// `add-origin` of a served cache: refused before anything is opened
/// when the front end cannot serve a new volume (ublk, a custom export
/// name); else the device is opened (claimed as every origin is), added
/// (`Engine::add_volume`: recorded before it serves) and served.
fn add_origin(
    engine: &Engine,
    served: &Served,
    origin: &str,
    volume: &str,
    mode: Option<Mode>,
) -> std::result::Result<(), Classed> {
    if !served.can_serve_added() {
        return Err(Classed::new(
            Class::Refused,
            "this daemon cannot serve a volume added while it runs (--export-name names \
                    a single volume): stop it, add the origin, start it again",
        ));
    }
    let device = crate::device::open_device(origin)?;
    let v = engine.add_volume(volume, device, mode)?;
    served
        .serve_added(v)
        .map_err(|e| Classed::new(Class::Failed, e))
}

/// Takes volume `volume` out of the served cache, then its exports away.
fn remove_origin(
    engine: &Engine,
    served: &Served,
    volume: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> std::result::Result<(), Classed> {
    if !served.can_unserve() {
        return Err(Classed::new(
            Class::Refused,
            "this daemon cannot stop serving one volume while it runs (ublk names its devices \
             by the volumes' places, which a removal moves at the next start, and \
             --export-name names a single volume): stop it, remove the origin, start it again",
        ));
    }
    let v = engine.volume_index(volume)?;
    engine.remove_volume_served(v, progress)?;
    served.unserve(v, volume);
    log::info!("volume {volume} removed: its NBD export is gone");
    Ok(())
}

/// A progress callback that sends progress lines, at most one per
/// `PROGRESS_INTERVAL` (and the last); a client that went away or stopped
/// reading (a write timed out) does not stop the work, and is sent no
/// more lines, so the work never waits on it again.
fn progress_lines(out: &mut UnixStream) -> impl FnMut(u64, u64) + '_ {
    let mut last = Instant::now() - PROGRESS_INTERVAL;
    let mut failed = false;
    move |done: u64, total: u64| {
        if !failed && (last.elapsed() >= PROGRESS_INTERVAL || done == total) {
            last = Instant::now();
            let line = Response {
                ok: true,
                error: None,
                class: None,
                status: None,
                progress: Some([done, total]),
                frontends: None,
            };
            failed = send(out, &line).is_err();
        }
    }
}

/// Answers the request `line` read from a connection (its writes time
/// out: `control_listener.rs`). `on_detach` is called after a detach
/// succeeds.
pub fn answer(
    engine: &Arc<Engine>,
    served: &Served,
    line: &str,
    stream: UnixStream,
    on_detach: &dyn Fn(),
) {
    let mut out = stream;
    let (resp, detached) = match serde_json::from_str::<Request>(line) {
        Err(e) => (
            Response::result(Err(Classed::new(Class::Usage, format!("bad request: {e}")))),
            false,
        ),
        Ok(req) => {
            // The audit trail: who asked for which change, and how it
            // ended (a status is only looked at: debug).
            let who = match super::socket::peer(&out) {
                Ok(p) => format!("uid {} (pid {})", p.uid, p.pid),
                Err(_) => "a peer of unknown uid".to_string(),
            };
            let asked = serde_json::to_string(&req).unwrap_or_else(|_| format!("{req:?}"));
            let status_request = matches!(req, Request::Status);
            match status_request {
                true => log::debug!("control: {who} asked {asked}"),
                false => log::info!("audit: {who} asked {asked}"),
            }
            let (result, detached) = carry_out(engine, served, req, &mut out);
            match (&result, status_request) {
                (_, true) => {}
                (Ok(_), false) => log::info!("audit: {who}: {asked}: done"),
                (Err(e), false) => log::warn!(
                    "audit: {who}: {asked}: failed ({}): {}",
                    e.class.name(),
                    e.message
                ),
            }
            let resp = Response {
                frontends: status_request.then(|| served.snapshot()),
                ..Response::result(result)
            };
            (resp, detached)
        }
    };
    let _ = send(&mut out, &resp);
    if detached {
        on_detach();
    }
}

/// Carries out one request (progress lines go to `out`); returns its
/// result and whether the cache was detached.
fn carry_out(
    engine: &Arc<Engine>,
    served: &Served,
    req: Request,
    out: &mut UnixStream,
) -> (std::result::Result<Option<Status>, Classed>, bool) {
    let status = |r: crate::engine::EngineResult<()>| {
        r.map(|_| Some(engine.status())).map_err(Classed::from)
    };
    let done = |r: crate::engine::EngineResult<()>| r.map(|_| None).map_err(Classed::from);
    let result = match req {
        Request::Status => Ok(Some(engine.status())),
        Request::Flush { volume } => {
            status(engine.write_back_named(volume.as_deref(), &mut progress_lines(out)))
        }
        Request::Warm {
            offset,
            length,
            volume,
        } => status(engine.warm_named(volume.as_deref(), offset, length, &mut progress_lines(out))),
        Request::ReplaceCache { member, device } => match crate::device::open_device(&device) {
            Ok(dev) => status(engine.replace_cache_member(member, dev, &mut progress_lines(out))),
            Err(e) => Err(e.into()),
        },
        Request::GiveUpCache => status(engine.give_up_cache().map(|_| ())),
        Request::Resize { volume, cache } => resize(engine, volume, cache),
        Request::SetMode { mode, volume } => done(engine.set_mode_named(volume.as_deref(), mode)),
        Request::SetWriteback { settings } => done(engine.set_writeback(settings)),
        Request::SetShare { change } => done(engine.change_share(&change)),
        Request::AddOrigin {
            origin,
            volume,
            mode,
        } => add_origin(engine, served, &origin, &volume, mode).map(|_| Some(engine.status())),
        Request::RemoveOrigin { volume } => {
            remove_origin(engine, served, &volume, &mut progress_lines(out))
                .map(|_| Some(engine.status()))
        }
        Request::SetAdmission { settings } => done(engine.set_admission(settings)),
        Request::SetPolicy { policy } => match PolicyKind::parse(&policy) {
            Some(p) => done(engine.set_policy(p)),
            None => Err(Classed::new(
                Class::Usage,
                format!("unknown replacement policy '{policy}'"),
            )),
        },
        Request::Detach { force } => return detach(engine, served, force),
    };
    (result, false)
}

/// `resize`: the cache device, or every volume's origin (or the named
/// one's), measured again; the status after.
fn resize(
    engine: &Engine,
    volume: Option<String>,
    cache: bool,
) -> std::result::Result<Option<Status>, Classed> {
    match (volume, cache) {
        (Some(v), true) => {
            let why = format!(
                "resize takes the cache device or a volume's origin, not both (volume {v})"
            );
            return Err(Classed::new(Class::Usage, why));
        }
        (None, true) => engine.grow_cache().map(|_| ()),
        (volume, false) => engine.grow_named(volume.as_deref()).map(|_| ()),
    }
    .map(|_| Some(engine.status()))
    .map_err(Classed::from)
}

/// `detach`, refused while a front end's device is in use unless
/// `force`; returns its result and whether the cache was detached.
fn detach(
    engine: &Engine,
    served: &Served,
    force: bool,
) -> (std::result::Result<Option<Status>, Classed>, bool) {
    let refusal = if force {
        None
    } else {
        served.teardown_refusal()
    };
    if let Some(why) = refusal {
        let e = Classed::new(Class::Refused, format!("refusing to detach: {why}"));
        return (Err(e), false);
    }
    match engine.detach() {
        Ok(()) => (Ok(None), true),
        Err(e) => (Err(e.into()), false),
    }
}
