//! The monitoring endpoints as `serve` and `demo` start them: bound, and
//! their addresses printed.

use std::sync::Arc;

use anyhow::{Context, Result};
use tiercache::engine::Engine;
use tiercache::monitor::{spawn_endpoints, EndpointConfig, Endpoints};

/// Starts the endpoints `cfg` asks for and says where they are.
pub async fn start(
    engine: &Arc<Engine>,
    cfg: &EndpointConfig,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<Endpoints> {
    let endpoints = spawn_endpoints(engine, cfg, shutdown)
        .await
        .context("starting the monitoring endpoints")?;
    if let Some(a) = endpoints.metrics_addr {
        eprintln!("tiercache: metrics on http://{a}/metrics");
    }
    if let Some(a) = endpoints.http_addr {
        eprintln!("tiercache: dashboard on http://{a}/");
    }
    Ok(endpoints)
}
