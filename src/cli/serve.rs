//! `tiercache serve`: exports a cached volume over NBD (Unix socket by
//! default, TCP on request) in the foreground, with a control socket for
//! the other commands. SIGINT/SIGTERM shut down cleanly: in-flight requests
//! finish, metadata is committed and the cache is marked clean.

use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tiercache::device::open_device;
use tiercache::engine::policy::PolicyKind;
use tiercache::engine::volume::AsyncEngine;
use tiercache::engine::{CreateOptions, Engine, Mode, OpenOptions};
use tiercache::nbd::{serve, Listener, ServerConfig};

use super::control;
use super::registry::{self, Registry};
use super::units::parse_block_size;
use super::NameArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    name: NameArg,
    /// NBD Unix socket to listen on (default: <state-dir>/<name>.nbd).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also listen on TCP: on loopback port 10809 when given alone, or at
    /// the address named (e.g. 0.0.0.0:10809 to serve the network).
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:10809")]
    pub(super) tcp: Option<String>,
    /// Export name announced to clients ("" is always accepted).
    #[arg(long, default_value = "")]
    export_name: String,
    /// Refuse writes.
    #[arg(long)]
    read_only: bool,
    /// Serve an unregistered, volatile cache: origin path (needs --ram-cache).
    #[arg(long, requires = "ram_cache")]
    origin: Option<String>,
    /// Size of a RAM cache created for this run only (e.g. 1G).
    #[arg(long, requires = "origin")]
    ram_cache: Option<String>,
    /// Mode of the RAM cache.
    #[arg(long, default_value = "writethrough")]
    mode: String,
    /// Block size of the RAM cache.
    #[arg(long, default_value = "4096")]
    block_size: String,
    /// Accept losing dirty data on exit (writeback on a RAM cache).
    #[arg(long)]
    allow_data_loss: bool,
    /// Threads that serve NBD requests. Cache hits, and in writeback and
    /// writeonly the writes that need only the cache, run on them directly (one device I/O each, no hand-off to another
    /// thread), so this is also how many of those can be in flight at the
    /// cache device; everything else goes to a separate blocking pool.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    io_threads: u16,
    /// Serve the volume as the kernel block device /dev/ublkbN (ublk)
    /// instead of over NBD (built with `--features ublk`). If /dev/ublkcN is left by a daemon that died,
    /// it is taken over (user recovery): its requests are reissued here.
    #[arg(long)]
    ublk: bool,
    /// The ublk device number N.
    #[arg(long, default_value_t = 0, requires = "ublk")]
    ublk_id: i32,
    /// ublk queues (one thread each).
    #[arg(long, default_value_t = 2, requires = "ublk", value_parser = clap::value_parser!(u16).range(1..=64))]
    ublk_queues: u16,
    /// Requests each ublk queue takes at once.
    #[arg(long, default_value_t = 64, requires = "ublk", value_parser = clap::value_parser!(u16).range(1..=4096))]
    ublk_queue_depth: u16,
}

pub fn run(reg: &Registry, a: &Args) -> Result<()> {
    let (engine, name, _lock) = if let (Some(origin), Some(size)) = (&a.origin, &a.ram_cache) {
        let mode = Mode::parse(&a.mode).with_context(|| format!("unknown mode '{}'", a.mode))?;
        let block_bytes = parse_block_size(&a.block_size)?;
        let cache = open_device(&format!("ram:{size}")).context("creating the RAM cache")?;
        let origin_dev = open_device(origin).context("opening the origin device")?;
        let opts = CreateOptions {
            mode,
            block_bytes,
            policy: PolicyKind::default(),
            allow_data_loss: a.allow_data_loss,
            ..Default::default()
        };
        let engine = Engine::create(cache, origin_dev, &opts)?;
        (
            engine,
            a.name.name.clone().unwrap_or_else(|| "ram".into()),
            None,
        )
    } else {
        let entry = reg.resolve(a.name.name.as_deref())?;
        if control::daemon_listening(&reg.socket_path(&entry.name)) {
            bail!("cache '{}' is already being served", entry.name);
        }
        let lock = reg.lock(&entry.name)?;
        let cache = open_device(&entry.cache).context("opening the cache device")?;
        let origin = open_device(&entry.origin).context("opening the origin device")?;
        let opts = OpenOptions {
            distrust_clean: entry.distrust_clean,
            ..OpenOptions::default()
        };
        let engine = Engine::open(cache, origin, &opts)
            .with_context(|| format!("cache '{}'", entry.name))?;
        registry::record_distrust(reg, &entry, &engine)?;
        (engine, entry.name, Some(lock))
    };
    reg.prepare()?;
    let nbd_path = a
        .socket
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.io_threads.into())
        .enable_all()
        .max_blocking_threads(256)
        .build()
        .context("starting the runtime")?;
    let result = rt.block_on(async {
        let mut listeners = vec![Listener::bind_unix(&nbd_path).with_context(|| format!("listening on {}", nbd_path.display()))?];
        if let Some(addr) = &a.tcp {
            listeners.push(Listener::bind_tcp(addr.as_str()).await.with_context(|| format!("listening on {addr}"))?);
        }
        let (tx, rx) = tokio::sync::watch::channel(false);
        let tx = Arc::new(tx);
        // Control socket, on its own thread (requests can take long: flush).
        let ctl = StdUnixListener::bind(&control_path).with_context(|| format!("listening on {}", control_path.display()))?;
        {
            let engine = engine.clone();
            let tx = tx.clone();
            std::thread::Builder::new()
                .name("tiercache-control".into())
                .spawn(move || {
                    for stream in ctl.incoming().flatten() {
                        let e = engine.clone();
                        let tx = tx.clone();
                        std::thread::spawn(move || control::handle(&e, stream, &|| {
                            let _ = tx.send(true);
                        }));
                    }
                })
                .context("starting the control thread")?;
        }
        {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => log::warn!("SIGINT: shutting down"),
                    _ = term.recv() => log::warn!("SIGTERM: shutting down"),
                }
                let _ = tx.send(true);
            });
        }
        // Request buffers (up to 32 MiB each) are freed into malloc's
        // per-thread arenas, which keep them resident; hand idle memory back
        // so the daemon's RSS reflects what it holds.
        tokio::spawn(async {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                every.tick().await;
                // SAFETY: malloc_trim only releases free heap memory.
                unsafe { libc::malloc_trim(0) };
            }
        });
        eprintln!(
            "tiercache: serving '{name}' ({} bytes, {} mode) on nbd+unix:///{}?socket={}{}; control socket {}",
            engine.volume_bytes(),
            engine.mode(),
            a.export_name,
            nbd_path.display(),
            a.tcp.as_ref().map(|t| format!(" and nbd://{t}/{}", a.export_name)).unwrap_or_default(),
            control_path.display()
        );
        if a.ublk {
            return serve_ublk(&engine, a, rx).await;
        }
        let config = ServerConfig {
            export_name: a.export_name.clone(),
            read_only: a.read_only,
            ..ServerConfig::default()
        };
        serve(Arc::new(AsyncEngine(engine.clone())), listeners, config, rx)
            .await
            .context("NBD server")
    });
    let _ = std::fs::remove_file(&nbd_path);
    let _ = std::fs::remove_file(&control_path);
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    result?;
    match engine.close() {
        Ok(()) => {
            eprintln!("tiercache: '{name}' shut down cleanly");
            Ok(())
        }
        Err(tiercache::engine::EngineError::ShutDown) => Ok(()),
        Err(e) => Err(e).context("closing the cache"),
    }
}

#[cfg(not(feature = "ublk"))]
async fn serve_ublk(
    _engine: &Arc<tiercache::engine::Engine>,
    _a: &Args,
    _shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    bail!("this tiercache was built without ublk support (cargo build --features ublk)")
}

/// Serves the engine as /dev/ublkb<id> until shutdown is asked for, then
/// deletes the device. A daemon killed without that leaves the device to
/// the next `serve --ublk` with the same id (user recovery).
#[cfg(feature = "ublk")]
async fn serve_ublk(
    engine: &Arc<tiercache::engine::Engine>,
    a: &Args,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    use tiercache::frontend::ublk;
    let id = a.ublk_id;
    let recover = std::path::Path::new(&format!("/dev/ublkc{id}")).exists();
    let cfg = ublk::UblkConfig {
        dev_id: Some(id),
        nr_queues: a.ublk_queues,
        queue_depth: a.ublk_queue_depth,
        recover,
    };
    let volume = Arc::new(AsyncEngine(engine.clone()));
    let rt = tokio::runtime::Handle::current();
    let thread = std::thread::Builder::new()
        .name("tiercache-ublk".into())
        .spawn(move || {
            ublk::serve(volume, rt, &cfg, move |ctrl| {
                eprintln!(
                    "tiercache: {} /dev/ublkb{}",
                    if recover { "recovered" } else { "serving on" },
                    ctrl.dev_info().dev_id
                );
            })
        })
        .context("starting the ublk thread")?;
    // Until shutdown is asked for, or the device ends on its own (an
    // error, or `ublk del`).
    while !*shutdown.borrow() && !thread.is_finished() {
        tokio::select! {
            r = shutdown.changed() => if r.is_err() { break },
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
    if !thread.is_finished() {
        ublk::delete(id).context("deleting the ublk device")?;
    }
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .context("joining the ublk thread")?
        .map_err(|_| anyhow::anyhow!("the ublk thread panicked"))?
        .context("ublk")
}
