//! The daemon's life: open the cache, bind the listeners, start the front
//! end (NBD on a Unix socket and optionally TCP, or the ublk device), answer
//! the control socket, and shut down cleanly when SIGINT, SIGTERM or a
//! detach asks: the front end stops (NBD requests in flight finish, the
//! ublk device is deleted), then metadata is committed and the cache is
//! marked clean. A daemon killed instead leaves the journal to replay and,
//! for ublk, the device to the next daemon (user recovery).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::frontends::{Frontends, ServeAdded, Served, ServedAs};
use super::notify::{notify_or_log, READY, STOPPING};
use super::registry::{self, Registry, RegistryError};
use super::{control, control_listener, socket};
use crate::device::{open_device, DeviceError};
use crate::engine::async_engine::AsyncEngine;
use crate::engine::{CreateOptions, Engine, EngineError, OpenOptions};
use crate::frontend::nbd::{serve_export_set, Exports, Listener, NbdError, ServerConfig};
use crate::nbd::TlsAcceptor;
use crate::volume::Volume;

/// What the daemon serves.
pub enum EngineSource {
    /// A registered cache by name (`None`: the only one registered);
    /// `degraded`: a cache set may open without members that cannot be
    /// found (`CacheSet::open`); `origin_grew`: the operator's word that a
    /// larger origin is the same one grown (`OpenOptions::origin_grew`).
    Registered {
        name: Option<String>,
        degraded: bool,
        origin_grew: bool,
    },
    /// A RAM cache created for this run only over `origin` (a device spec).
    Volatile {
        /// Name of the control socket (default "ram").
        name: Option<String>,
        origin: String,
        /// Size of the RAM cache as `open_device("ram:SIZE")` reads it.
        ram_size: String,
        options: CreateOptions,
    },
}

/// The TCP listener, with its TLS acceptor and whether TLS is required.
pub struct TcpListen {
    pub addr: String,
    pub tls: Option<(TlsAcceptor, bool)>,
}

/// `/dev/ublkb<dev_id>` instead of NBD.
#[derive(Debug, Clone)]
pub struct UblkSettings {
    pub dev_id: i32,
    pub nr_queues: u16,
    pub queue_depth: u16,
    /// Complete writes only once durable (`UblkConfig::durable_writes`).
    pub durable_writes: bool,
}

/// A service started beside the front end once the engine is open (for
/// example metrics over HTTP). It is called inside the daemon's runtime, so
/// it may `tokio::spawn`; it gets the engine and the shutdown signal (true
/// once the daemon stops) and returns an error to abort the start.
pub type Service =
    Box<dyn FnOnce(Arc<Engine>, watch::Receiver<bool>) -> std::io::Result<()> + Send>;

/// Everything the daemon needs, decided by the caller (the CLI's flags).
pub struct DaemonConfig {
    pub source: EngineSource,
    /// NBD Unix socket (default `<state-dir>/<name>.nbd`).
    pub nbd_socket: Option<PathBuf>,
    pub tcp: Option<TcpListen>,
    /// Export name, read-only and resource bounds of the NBD server.
    pub nbd: ServerConfig,
    pub ublk: Option<UblkSettings>,
    /// Runtime worker threads: they answer cache hits directly.
    pub io_threads: u16,
    /// Prometheus metrics on this address (`monitor/`).
    pub metrics: Option<String>,
    /// The dashboard (and the metrics) on this address.
    pub http: Option<String>,
    pub services: Vec<Service>,
}

/// Errors of the daemon; each says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The registry could not resolve, lock or update the cache.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The metrics or dashboard endpoint could not start.
    #[error("starting the monitoring endpoints")]
    Monitor(#[source] crate::monitor::MonitorError),
    /// Another daemon answers on the cache's control socket.
    #[error("cache '{0}' is already being served")]
    AlreadyServed(String),
    /// A device could not be opened (`what` says which).
    #[error("{what}")]
    Device {
        what: &'static str,
        #[source]
        source: DeviceError,
    },
    /// The registered cache could not be opened.
    #[error("cache '{name}'")]
    Open {
        name: String,
        #[source]
        source: EngineError,
    },
    /// The RAM cache could not be created.
    #[error(transparent)]
    Create(EngineError),
    /// A socket could not be bound.
    #[error("listening on {what}")]
    Listen {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A thread, the runtime or a service could not be started.
    #[error("starting {what}")]
    Start {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The NBD server refused its configuration.
    #[error("NBD server")]
    Nbd(#[source] NbdError),
    /// The ublk front end failed.
    #[cfg(feature = "ublk")]
    #[error("{what}")]
    Ublk {
        what: &'static str,
        #[source]
        source: crate::frontend::ublk::UblkFrontendError,
    },
    /// `--ublk` in a build without the feature.
    #[error("this tiercache was built without ublk support (cargo build --features ublk)")]
    NoUblk,
    /// The ublk queue thread panicked.
    #[error("the ublk thread panicked")]
    UblkPanic,
    /// A front end that serves one volume, for a cache of several.
    #[error(
        "cache '{name}' holds {volumes} volumes ({names}): {what} names one; over NBD each \
         volume is the export of its name, and over ublk each gets a device"
    )]
    OneVolumeOnly {
        name: String,
        volumes: usize,
        names: String,
        what: &'static str,
    },
    /// The final commit failed: the next open replays the journal.
    #[error("closing the cache")]
    Close(#[source] EngineError),
}

type Result<T> = std::result::Result<T, DaemonError>;

/// The engine and the name its sockets are named after; holds the
/// registry lock while the daemon runs.
struct Opened {
    engine: Arc<Engine>,
    name: String,
    _lock: Option<registry::Lock>,
}

fn device(what: &'static str, spec: &str) -> Result<crate::device::DeviceRef> {
    open_device(spec).map_err(|source| DaemonError::Device { what, source })
}

fn open(reg: &Registry, source: &EngineSource) -> Result<Opened> {
    match source {
        EngineSource::Volatile {
            name,
            origin,
            ram_size,
            options,
        } => {
            let cache = device("creating the RAM cache", &format!("ram:{ram_size}"))?;
            let origin = device("opening the origin device", origin)?;
            let engine = Engine::create(cache, origin, options).map_err(DaemonError::Create)?;
            Ok(Opened {
                engine,
                name: name.clone().unwrap_or_else(|| "ram".into()),
                _lock: None,
            })
        }
        EngineSource::Registered {
            name,
            degraded,
            origin_grew,
        } => {
            let entry = reg.resolve(name.as_deref())?;
            if control::daemon_listening(&reg.socket_path(&entry.name)) {
                return Err(DaemonError::AlreadyServed(entry.name));
            }
            let lock = reg.lock(&entry.name)?;
            let cache = entry
                .open_cache(*degraded)
                .map_err(|source| DaemonError::Device {
                    what: "opening the cache device",
                    source,
                })?;
            let origins = (entry.origin_paths().iter())
                .map(|p| device("opening the origin device", p))
                .collect::<Result<Vec<_>>>()?;
            let opts = OpenOptions {
                origin_grew: *origin_grew,
                distrust_clean: entry.distrust_clean,
                crash_log: Some(reg.crash_log_path(&entry.name)),
                stale_map: Some(reg.stale_map_path(&entry.name)),
                ..OpenOptions::default()
            };
            let engine = Engine::open_volumes(cache, origins, &opts).map_err(|source| {
                DaemonError::Open {
                    name: entry.name.clone(),
                    source,
                }
            })?;
            registry::record_distrust(reg, &entry, &engine)?;
            // The name it is registered under now (an import may have
            // renamed it), for a registry lost later (`tiercache import`).
            if let Err(e) = engine.record_name(&entry.name) {
                log::warn!("recording the name on the cache device: {e}");
            }
            Ok(Opened {
                engine,
                name: entry.name,
                _lock: Some(lock),
            })
        }
    }
}

/// Opens the cache; one that cannot be opened while the ublk device this
/// daemon would take over waits for a daemon (the one before it died: user
/// recovery) is also said to leave it waiting. The kernel holds that
/// device's requests until a daemon takes it over: a filesystem on it
/// hangs, it does not fail (docs/guest.md, "When no daemon can come back").
fn open_or_say(reg: &Registry, cfg: &DaemonConfig) -> Result<Opened> {
    let opened = open(reg, &cfg.source);
    if let (Err(e), Some(u)) = (&opened, &cfg.ublk) {
        ublk_left_waiting(u.dev_id, e);
    }
    opened
}

/// Says so for every device this daemon would take over (one a volume,
/// from `id` on, as `serve_ublk` numbers them) that waits for a daemon.
fn ublk_left_waiting(id: i32, e: &DaemonError) {
    let waiting =
        |v: &usize| std::path::Path::new(&format!("/dev/ublkc{}", id + *v as i32)).exists();
    let devices: Vec<usize> = (0..crate::engine::format::volumes::MAX_VOLUMES)
        .take_while(waiting)
        .collect();
    if devices.is_empty() {
        return;
    }
    // The whole chain: the line must say why on its own.
    let mut why = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        why = format!("{why}: {c}");
        cause = c.source();
    }
    for v in devices {
        let dev = id + v as i32;
        log::error!(
            "/dev/ublkb{dev} is waiting for a daemon: the kernel holds its requests (a filesystem \
             on it hangs, it does not fail) until a `tiercache serve --ublk --ublk-id {id}` opens \
             the cache and takes the device over, and this one cannot: {why}"
        );
    }
}

/// Runs the daemon in the foreground until it is told to stop; returns
/// once the cache is closed.
pub fn run(reg: &Registry, cfg: DaemonConfig) -> Result<()> {
    if cfg!(not(feature = "ublk")) && cfg.ublk.is_some() {
        return Err(DaemonError::NoUblk);
    }
    // Before the registry is read: one that others may write is refused.
    reg.prepare()?;
    let Opened {
        engine,
        name,
        _lock,
    } = open_or_say(reg, &cfg)?;
    refuse_one_volume_frontends(&engine, &name, &cfg)?;
    let nbd_path = cfg
        .nbd_socket
        .clone()
        .unwrap_or_else(|| reg.dir().join(format!("{name}.nbd")));
    let control_path = reg.socket_path(&name);
    let _ = std::fs::remove_file(&nbd_path);
    let _ = std::fs::remove_file(&control_path);

    // glibc gives each thread that allocates concurrently its own arena (up
    // to 8 per core) and each keeps freed request buffers; with the I/O
    // threads of a busy export that was megabytes of RSS that no cache
    // block needed. Two arenas per core are plenty for 4 KiB buffers.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    // SAFETY: mallopt only changes allocator tuning; called before the
    // runtime starts any thread.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, (2 * cores) as libc::c_int) };
    // glibc raises its mmap threshold to the largest block freed (up to
    // 32 MiB), and from then on keeps freed request buffers in its arenas:
    // 16 pipelined 1 GiB CACHE requests under a 32 MiB --total-buffer
    // peaked at 433 MiB, and 1 MiB cached reads kept ~250 MB. A fixed
    // threshold gives buffers of 256 KiB and more back at free, so what
    // the server's charges bound is what the process holds (docs/nbd.md,
    // "Resource bounds"). It costs ~12% of 1 MiB cached-read throughput
    // (fresh pages per buffer); a bounded buffer pool would win it back.
    // SAFETY: as above.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.io_threads.into())
        .enable_all()
        .max_blocking_threads(256)
        .build()
        .map_err(|source| DaemonError::Start {
            what: "the runtime",
            source,
        })?;
    let result = rt.block_on(serve_until_stopped(
        &engine,
        &name,
        cfg,
        &nbd_path,
        &control_path,
    ));
    let _ = std::fs::remove_file(&nbd_path);
    let _ = std::fs::remove_file(&control_path);
    rt.shutdown_timeout(Duration::from_secs(5));
    result?;
    match engine.close() {
        Ok(()) => {
            log::info!("'{name}' shut down cleanly");
            Ok(())
        }
        Err(EngineError::ShutDown) => Ok(()),
        Err(e) => Err(DaemonError::Close(e)),
    }
}

async fn serve_until_stopped(
    engine: &Arc<Engine>,
    name: &str,
    cfg: DaemonConfig,
    nbd_path: &std::path::Path,
    control_path: &std::path::Path,
) -> Result<()> {
    // The handlers first: a SIGTERM once a socket exists (a test or a
    // supervisor that waits for it) is a clean shutdown, not death by the
    // signal's default action.
    let (tx, rx) = watch::channel(false);
    let tx = Arc::new(tx);
    start_signal_handler(&tx);
    let (listeners, mut fixed) = bind_listeners(&cfg, nbd_path).await?;
    volumes_served(engine, &cfg, &mut fixed);
    let served = Arc::new(Served::new(fixed, cfg.nbd.clients_connected.clone()));
    start_control(engine, &served, control_path, &tx)?;
    start_malloc_trim();
    let monitor = crate::monitor::EndpointConfig {
        name: name.to_string(),
        metrics: cfg.metrics.clone(),
        http: cfg.http.clone(),
    };
    let endpoints = crate::monitor::spawn_endpoints(engine, &monitor, rx.clone())
        .await
        .map_err(DaemonError::Monitor)?;
    if let Some(a) = endpoints.metrics_addr {
        log::info!("metrics on http://{a}/metrics");
    }
    if let Some(a) = endpoints.http_addr {
        log::info!("dashboard on http://{a}/");
    }
    for service in cfg.services {
        service(engine.clone(), rx.clone()).map_err(|source| DaemonError::Start {
            what: "a service",
            source,
        })?;
    }
    if let Some(u) = &cfg.ublk {
        for (v, (volume, _, bytes)) in engine.volumes().into_iter().enumerate() {
            log::info!(
                "serving '{name}' volume {volume} ({}, {} mode) as /dev/ublkb{}; control socket {}",
                crate::units::human_bytes(bytes),
                engine.volume_mode(v),
                u.dev_id + v as i32,
                control_path.display()
            );
        }
        return serve_ublk(engine, &served, u, rx).await;
    }
    let exports = nbd_exports(engine, &cfg.nbd.export_name);
    for (export, volume) in &exports {
        log::info!(
            "serving '{name}' ({}, {} mode) on nbd+unix:///{export}?socket={}{}; control socket {}",
            crate::units::human_bytes(volume.size_bytes()),
            engine.mode(),
            nbd_path.display(),
            tcp_text(cfg.tcp.as_ref()),
            control_path.display()
        );
    }
    let named_one = !cfg.nbd.export_name.is_empty();
    let exports = Arc::new(Exports::new(exports, cfg.nbd).map_err(DaemonError::Nbd)?);
    (!named_one).then(|| serve_changes_over_nbd(engine, &served, &exports));
    notify_or_log(READY);
    serve_export_set(&exports, listeners, rx)
        .await
        .map_err(DaemonError::Nbd)
}

/// Volumes added and removed online are served and stop being served over
/// NBD: as the exports of their names (volume 0's also as "").
fn serve_changes_over_nbd(
    engine: &Arc<Engine>,
    served: &Served,
    exports: &Arc<Exports<AsyncEngine>>,
) {
    served.set_serve_added(serve_added_over_nbd(engine, exports));
    let exports = exports.clone();
    served.set_unserve(Box::new(move |v, name| match v {
        0 => exports.remove(&[name, ""]),
        _ => exports.remove(&[name]),
    }));
}

/// How a volume added online is served over NBD: as the export of its
/// name. A cache's second volume also gives the first its name's export
/// (a cache of one is served as ""), as a cache of several has.
fn serve_added_over_nbd(engine: &Arc<Engine>, exports: &Arc<Exports<AsyncEngine>>) -> ServeAdded {
    let (engine, exports) = (engine.clone(), exports.clone());
    Box::new(move |v| {
        let mut added = Vec::new();
        for v in (v == 1).then_some(0).into_iter().chain([v]) {
            let volume = AsyncEngine::volume(engine.clone(), v).ok_or("no such volume")?;
            let name = engine.volumes()[v].0.clone();
            (exports.add(name.clone(), Arc::new(volume))).map_err(|e| e.to_string())?;
            log::info!("volume {name} added: serving it on NBD export {name}");
            added.push(name);
        }
        Ok(ServedAs::Exports(added))
    })
}

/// What `status` shows of a cache of several volumes: its NBD exports or
/// its ublk devices; and the size a ublk device was made with.
fn volumes_served(engine: &Engine, cfg: &DaemonConfig, fixed: &mut Frontends) {
    let volumes = engine.volumes();
    match &cfg.ublk {
        Some(u) if volumes.len() > 1 => {
            fixed.ublk_devices = (0..volumes.len())
                .map(|v| format!("/dev/ublkb{}", u.dev_id + v as i32))
                .collect();
            fixed.ublk_devices_bytes = volumes.iter().map(|v| v.2).collect();
        }
        None if volumes.len() > 1 => {
            fixed.nbd_exports = volumes.into_iter().map(|v| v.0).collect();
        }
        _ => {}
    }
    if fixed.ublk_device.is_some() {
        fixed.ublk_bytes = Some(engine.volume_bytes());
    }
}

/// The NBD exports: a cache of one origin is served under `export_name`;
/// of several, each volume under its own name, the first also under "".
fn nbd_exports(engine: &Arc<Engine>, export_name: &str) -> Vec<(String, Arc<AsyncEngine>)> {
    let volumes = engine.volumes();
    if volumes.len() == 1 {
        let one = Arc::new(AsyncEngine::new(engine.clone()));
        return vec![(export_name.to_string(), one)];
    }
    (volumes.into_iter().enumerate())
        .filter_map(|(v, (name, _, _))| {
            let volume = AsyncEngine::volume(engine.clone(), v)?;
            Some((name, Arc::new(volume)))
        })
        .collect()
}

/// What names one volume (an export name of the operator's) is refused
/// for a cache of several.
fn refuse_one_volume_frontends(engine: &Engine, name: &str, cfg: &DaemonConfig) -> Result<()> {
    let volumes = engine.volumes();
    if cfg.ublk.is_some() || cfg.nbd.export_name.is_empty() || volumes.len() == 1 {
        return Ok(());
    }
    let what = "--export-name";
    Err(DaemonError::OneVolumeOnly {
        name: name.to_string(),
        volumes: volumes.len(),
        names: (volumes.iter().map(|v| v.0.as_str()))
            .collect::<Vec<_>>()
            .join(", "),
        what,
    })
}

/// The NBD listeners (none when ublk serves instead) and the front ends
/// `status` shows.
async fn bind_listeners(
    cfg: &DaemonConfig,
    nbd_path: &std::path::Path,
) -> Result<(Vec<Listener>, Frontends)> {
    let listen = |what: String| move |source| DaemonError::Listen { what, source };
    let mut listeners = Vec::new();
    let mut fixed = Frontends::default();
    if let Some(u) = &cfg.ublk {
        fixed.ublk_device = Some(format!("/dev/ublkb{}", u.dev_id));
        return Ok((listeners, fixed));
    }
    let what = nbd_path.display().to_string();
    let unix = socket::bind_private(nbd_path).and_then(Listener::from_unix);
    listeners.push(unix.map_err(listen(what))?);
    fixed.nbd_socket = Some(nbd_path.display().to_string());
    if let Some(tcp) = &cfg.tcp {
        let mut l = Listener::bind_tcp(tcp.addr.as_str())
            .await
            .map_err(listen(tcp.addr.clone()))?;
        fixed.nbd_tcp = l.local_addr().map(|a| a.to_string());
        if let Some((acceptor, required)) = tcp.tls.clone() {
            l = l.with_tls(acceptor, required);
        }
        listeners.push(l);
    }
    Ok((listeners, fixed))
}

/// " and ADDR as SCHEME" for the TCP listener, if there is one.
fn tcp_text(tcp: Option<&TcpListen>) -> String {
    let Some(t) = tcp else {
        return String::new();
    };
    let scheme = match &t.tls {
        Some((acc, true)) => format!("nbds:// ({}, TLS required; {})", acc.kind(), acc.clients()),
        Some((acc, false)) => format!("nbd:// or nbds:// ({}; {})", acc.kind(), acc.clients()),
        None => "nbd://".into(),
    };
    format!(" and {} as {scheme}", t.addr)
}

/// The control socket (mode 0600), on threads of its own (requests can
/// take long: flush), for root and the daemon's user only
/// (`control_listener.rs`). A detach that succeeds stops the daemon.
fn start_control(
    engine: &Arc<Engine>,
    served: &Arc<Served>,
    path: &std::path::Path,
    stop: &Arc<watch::Sender<bool>>,
) -> Result<()> {
    let ctl = socket::bind_private(path).map_err(|source| DaemonError::Listen {
        what: path.display().to_string(),
        source,
    })?;
    let engine = engine.clone();
    let served = served.clone();
    let stop = stop.clone();
    let handler: control_listener::Handler = Arc::new(move |line, stream| {
        control::answer(&engine, &served, &line, stream, &|| stop_daemon(&stop))
    });
    control_listener::start(ctl, handler).map_err(|source| DaemonError::Start {
        what: "the control thread",
        source,
    })
}

/// SIGINT and SIGTERM ask for a clean shutdown. The handlers are in place
/// when this returns, before READY=1 goes out: a SIGTERM right after it
/// (systemd's stop) must not find the default action, which kills.
fn start_signal_handler(stop: &Arc<watch::Sender<bool>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let stop = stop.clone();
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => log::info!("SIGINT: shutting down"),
            _ = term.recv() => log::info!("SIGTERM: shutting down"),
        }
        stop_daemon(&stop);
    });
}

/// Begins the clean shutdown, and tells systemd so.
fn stop_daemon(tx: &watch::Sender<bool>) {
    if !*tx.borrow() {
        notify_or_log(STOPPING);
    }
    let _ = tx.send(true);
}

/// Request buffers (up to 32 MiB each) are freed into malloc's per-thread
/// arenas, which keep them resident; hand idle memory back so the daemon's
/// RSS reflects what it holds.
fn start_malloc_trim() {
    tokio::spawn(async {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            // SAFETY: malloc_trim only releases free heap memory.
            unsafe { libc::malloc_trim(0) };
        }
    });
}

#[cfg(not(feature = "ublk"))]
async fn serve_ublk(
    _engine: &Arc<Engine>,
    _served: &Served,
    _u: &UblkSettings,
    _shutdown: watch::Receiver<bool>,
) -> Result<()> {
    Err(DaemonError::NoUblk)
}

/// Serves each volume `v` as /dev/ublkb<id + v> until shutdown is asked
/// for, then deletes the devices. A volume added online gets its device
/// then (`serve_added_over_ublk`). A daemon killed without that leaves
/// them to the next `serve --ublk` with the same id (user recovery).
#[cfg(feature = "ublk")]
async fn serve_ublk(
    engine: &Arc<Engine>,
    served: &Served,
    u: &UblkSettings,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let n = engine.volumes().len();
    let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(n));
    let devices: UblkDevices = Arc::default();
    let rt = tokio::runtime::Handle::current();
    for v in 0..n {
        let id = u.dev_id + v as i32;
        match start_ublk(engine, &rt, u, v, id, waiting.clone()) {
            Ok(thread) => devices.lock().push((id, thread)),
            Err(e) => {
                let started = std::mem::take(&mut *devices.lock());
                stop_ublk(started).await?;
                return Err(e);
            }
        }
    }
    served.set_serve_added(serve_added_over_ublk(engine, &rt, u, &devices));
    // Until shutdown is asked for, or a device ends on its own (an error,
    // or `ublk del`).
    let ended = || devices.lock().iter().any(|(_, t)| t.is_finished());
    while !*shutdown.borrow() && !ended() {
        tokio::select! {
            r = shutdown.changed() => if r.is_err() { break },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    let all = std::mem::take(&mut *devices.lock());
    stop_ublk(all).await
}

/// The ublk devices served, with their threads; one joins when a volume
/// is added online.
#[cfg(feature = "ublk")]
type UblkDevices = Arc<parking_lot::Mutex<Vec<(i32, UblkThread)>>>;

/// How a volume added online is served over ublk: as /dev/ublkb<id + v>,
/// made now (the size it is made with is the volume's; the daemon is
/// ready already, so starting it tells systemd nothing).
#[cfg(feature = "ublk")]
fn serve_added_over_ublk(
    engine: &Arc<Engine>,
    rt: &tokio::runtime::Handle,
    u: &UblkSettings,
    devices: &UblkDevices,
) -> ServeAdded {
    let (engine, rt, u, devices) = (engine.clone(), rt.clone(), u.clone(), devices.clone());
    Box::new(move |v| {
        let id = u.dev_id + v as i32;
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let thread = start_ublk(&engine, &rt, &u, v, id, told).map_err(|e| e.to_string())?;
        devices.lock().push((id, thread));
        let (name, _, bytes) = engine.volumes()[v].clone();
        log::info!("volume {name} added: serving it as /dev/ublkb{id}");
        Ok(ServedAs::Ublk {
            device: format!("/dev/ublkb{id}"),
            bytes,
        })
    })
}

#[cfg(feature = "ublk")]
type UblkThread =
    std::thread::JoinHandle<std::result::Result<(), crate::frontend::ublk::UblkFrontendError>>;

/// Starts volume `v`'s device `id` on a thread of its own; the last of the
/// `waiting` devices to start tells systemd the daemon is ready.
#[cfg(feature = "ublk")]
fn start_ublk(
    engine: &Arc<Engine>,
    rt: &tokio::runtime::Handle,
    u: &UblkSettings,
    v: usize,
    id: i32,
    waiting: Arc<std::sync::atomic::AtomicUsize>,
) -> Result<UblkThread> {
    use crate::frontend::ublk;
    let recover = std::path::Path::new(&format!("/dev/ublkc{id}")).exists();
    let cfg = ublk::UblkConfig {
        dev_id: Some(id),
        nr_queues: u.nr_queues,
        queue_depth: u.queue_depth,
        recover,
        durable_writes: u.durable_writes,
    };
    let volume = Arc::new(AsyncEngine::volume(engine.clone(), v).ok_or(DaemonError::UblkPanic)?);
    let rt = rt.clone();
    std::thread::Builder::new()
        .name(format!("tiercache-ublk{v}"))
        .spawn(move || {
            ublk::serve(volume, rt, &cfg, move |ctrl| {
                log::info!(
                    "{} /dev/ublkb{}",
                    if recover { "recovered" } else { "serving on" },
                    ctrl.dev_info().dev_id
                );
                if waiting.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                    notify_or_log(READY);
                }
            })
        })
        .map_err(|source| DaemonError::Start {
            what: "the ublk thread",
            source,
        })
}

/// Deletes the devices still served and waits for their threads: the
/// first error, once every one is stopped.
#[cfg(feature = "ublk")]
async fn stop_ublk(devices: Vec<(i32, UblkThread)>) -> Result<()> {
    use crate::frontend::ublk;
    let mut first: Result<()> = Ok(());
    for (id, thread) in devices {
        if !thread.is_finished() {
            if let Err(source) = ublk::delete(id) {
                if first.is_ok() {
                    first = Err(DaemonError::Ublk {
                        what: "deleting the ublk device",
                        source,
                    });
                }
                continue;
            }
        }
        let ended = tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|_| DaemonError::UblkPanic)
            .and_then(|j| j.map_err(|_| DaemonError::UblkPanic))
            .and_then(|r| {
                r.map_err(|source| DaemonError::Ublk {
                    what: "ublk",
                    source,
                })
            });
        if first.is_ok() {
            first = ended;
        }
    }
    first
}
