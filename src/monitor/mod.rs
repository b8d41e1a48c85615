//! Watching a running cache from outside: Prometheus metrics
//! (`metrics.rs`), a live dashboard page with its JSON feed (`dashboard/`,
//! `snapshot.rs`), both over a small read-only HTTP server (`http.rs`), fed
//! by copies of the engine's state and a once-a-second sampler
//! (`sampler.rs`). docs/observability.md describes the endpoints.
//!
//! Rules that keep the endpoints from ever slowing I/O:
//! - Requests read copies. A copy (`Taken`) is made on a blocking thread,
//!   holds the metadata lock only while counters are copied, and serves
//!   every request for `MAX_COPY_AGE`: a storm of scrapes makes one copy.
//! - Nothing the engine owns is held while a response is written.
//! - Connections, request headers and the time a client may take are all
//!   bounded (`http.rs`).

#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod http;
pub mod metrics;
pub mod sampler;
pub mod snapshot;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::engine::{Engine, Observations, Status};
use sampler::{Sample, Sampler};

/// How long one copy of the engine's state answers requests.
const MAX_COPY_AGE: Duration = Duration::from_millis(250);
/// Samples sent to the dashboard: five minutes.
const HISTORY_SENT: usize = 300;

/// Errors of the monitoring endpoints.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// An address could not be bound (in use, not local, not an address).
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The sampler thread could not be started.
    #[error("starting the sampler thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The engine was closed: there is nothing left to watch.
    #[error("the cache is closed")]
    Closed,
}

/// One copy of a cache's state, and what is rendered from it.
#[derive(Debug)]
pub struct Taken {
    pub name: String,
    pub at: Instant,
    pub uptime_s: f64,
    pub status: Status,
    pub observations: Observations,
    /// The sampler's latest interval (rates), if it has one.
    pub latest: Option<Sample>,
    pub history: Vec<Sample>,
    /// Each volume's accesses per second per heat-map region, recently.
    pub heat_rate: Vec<Vec<f64>>,
    metrics: OnceLock<String>,
    json: OnceLock<String>,
}

impl Taken {
    /// The Prometheus exposition of this copy (rendered once).
    pub fn metrics_text(self: &Arc<Self>) -> &str {
        self.metrics.get_or_init(|| metrics::render(self))
    }

    /// The dashboard's JSON of this copy (rendered once).
    pub fn json_text(&self) -> &str {
        self.json.get_or_init(|| snapshot::render(self))
    }
}

/// What the endpoints of one cache share.
pub struct Monitor {
    name: String,
    engine: Weak<Engine>,
    sampler: Arc<Sampler>,
    copy: tokio::sync::Mutex<Option<Arc<Taken>>>,
}

impl Monitor {
    /// A monitor of `engine`; its sampler starts with `start_sampler`.
    pub fn new(engine: &Arc<Engine>, name: &str) -> Arc<Monitor> {
        Arc::new(Monitor {
            name: name.to_string(),
            engine: Arc::downgrade(engine),
            sampler: Arc::new(Sampler::new()),
            copy: tokio::sync::Mutex::new(None),
        })
    }

    /// A monitor of a cache already closed: every request for the
    /// engine's state is answered 503 (the HTTP fuzz body's monitor).
    #[cfg(any(test, feature = "testing"))]
    pub fn detached(name: &str) -> Arc<Monitor> {
        Arc::new(Monitor {
            name: name.to_string(),
            engine: Weak::new(),
            sampler: Arc::new(Sampler::new()),
            copy: tokio::sync::Mutex::new(None),
        })
    }

    pub fn sampler(&self) -> &Arc<Sampler> {
        &self.sampler
    }

    /// A copy at most `MAX_COPY_AGE` old: made on a blocking thread by the
    /// first request that finds the last one stale, while the others wait
    /// for it (without a thread each).
    pub async fn taken(&self) -> Result<Arc<Taken>, MonitorError> {
        let mut slot = self.copy.lock().await;
        if let Some(t) = slot.as_ref().filter(|t| t.at.elapsed() < MAX_COPY_AGE) {
            return Ok(t.clone());
        }
        let engine = self.engine.upgrade().ok_or(MonitorError::Closed)?;
        let sampler = self.sampler.clone();
        let name = self.name.clone();
        let t = tokio::task::spawn_blocking(move || take(&engine, &sampler, name))
            .await
            .map_err(|_| MonitorError::Closed)?;
        let t = Arc::new(t);
        *slot = Some(t.clone());
        Ok(t)
    }

    /// A copy made on this thread (no runtime needed).
    pub fn take_now(&self) -> Result<Arc<Taken>, MonitorError> {
        let engine = self.engine.upgrade().ok_or(MonitorError::Closed)?;
        Ok(Arc::new(take(&engine, &self.sampler, self.name.clone())))
    }
}

fn take(engine: &Engine, sampler: &Sampler, name: String) -> Taken {
    Taken {
        name,
        at: Instant::now(),
        uptime_s: sampler.uptime_s(),
        status: engine.status(),
        observations: engine.observations(),
        latest: sampler.latest(),
        history: sampler.history(HISTORY_SENT),
        heat_rate: sampler.heat(),
        metrics: OnceLock::new(),
        json: OnceLock::new(),
    }
}

/// Where to serve what.
#[derive(Clone, Debug, Default)]
pub struct EndpointConfig {
    /// The cache's name (the `cache` label).
    pub name: String,
    /// `/metrics` only.
    pub metrics: Option<String>,
    /// The dashboard, its JSON and `/metrics`.
    pub http: Option<String>,
}

/// The running endpoints; dropping this stops the sampler (the servers stop
/// with the shutdown signal).
pub struct Endpoints {
    pub metrics_addr: Option<SocketAddr>,
    pub http_addr: Option<SocketAddr>,
    pub monitor: Arc<Monitor>,
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        self.monitor.sampler.stop();
    }
}

async fn bind(addr: &str) -> Result<TcpListener, MonitorError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MonitorError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Binds the listeners asked for (an error before anything is served),
/// starts the sampler and the servers on the current tokio runtime. They
/// run until `shutdown` turns true or its sender is dropped.
pub async fn spawn_endpoints(
    engine: &Arc<Engine>,
    cfg: &EndpointConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<Endpoints, MonitorError> {
    let monitor = Monitor::new(engine, &cfg.name);
    let mut endpoints = Endpoints {
        metrics_addr: None,
        http_addr: None,
        monitor: monitor.clone(),
    };
    let same = cfg.metrics.is_some() && cfg.metrics == cfg.http;
    let mut listeners = Vec::new();
    if let Some(addr) = &cfg.http {
        let l = bind(addr).await?;
        endpoints.http_addr = l.local_addr().ok();
        if same {
            endpoints.metrics_addr = endpoints.http_addr;
        }
        listeners.push((l, http::Routes::All));
    }
    if let (Some(addr), false) = (&cfg.metrics, same) {
        let l = bind(addr).await?;
        endpoints.metrics_addr = l.local_addr().ok();
        listeners.push((l, http::Routes::Metrics));
    }
    if listeners.is_empty() {
        return Ok(endpoints);
    }
    monitor
        .sampler
        .start(Arc::downgrade(engine), Duration::from_secs(1))
        .map_err(MonitorError::Thread)?;
    for (l, routes) in listeners {
        tokio::spawn(http::serve(
            l,
            monitor.clone(),
            routes,
            http::Limits::default(),
            shutdown.clone(),
        ));
    }
    Ok(endpoints)
}
