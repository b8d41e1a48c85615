//! The control socket of a running `tiercache serve`: one JSON request per
//! line, one JSON response per line. `status`, `flush`, `set-mode`,
//! `set-writeback` and `detach` given for a served cache travel this way,
//! so they act on the live engine and print what they print offline.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use tiercache::engine::{Engine, Mode, Status, WritebackSettings};

/// Longest request line accepted.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Status,
    Flush,
    SetMode { mode: Mode },
    SetWriteback { settings: WritebackSettings },
    Detach,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Response {
    pub ok: bool,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub status: Option<Status>,
}

/// True if a daemon answers on `path`.
pub fn daemon_listening(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

/// Sends one request to the daemon and returns its response.
pub fn call(path: &Path, req: &Request) -> Result<Response> {
    let mut s =
        UnixStream::connect(path).with_context(|| format!("connecting to {}", path.display()))?;
    let mut line = serde_json::to_string(req).context("encoding request")?;
    line.push('\n');
    s.write_all(line.as_bytes()).context("sending request")?;
    let mut reply = String::new();
    BufReader::new(s)
        .take(16 << 20)
        .read_line(&mut reply)
        .context("reading the daemon's reply")?;
    let resp: Response = serde_json::from_str(&reply).context("decoding the daemon's reply")?;
    if !resp.ok {
        return Err(anyhow!(resp
            .error
            .unwrap_or_else(|| "request failed".into())));
    }
    Ok(resp)
}

/// Answers one connection. `on_detach` is called after a detach succeeds.
pub fn handle(engine: &Arc<Engine>, stream: UnixStream, on_detach: &dyn Fn()) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    })
    .take(MAX_REQUEST_BYTES);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut detached = false;
    let resp = match serde_json::from_str::<Request>(&line) {
        Err(e) => Response {
            ok: false,
            error: Some(format!("bad request: {e}")),
            status: None,
        },
        Ok(req) => {
            log::info!("control request: {req:?}");
            let r: Result<Option<Status>, String> = match req {
                Request::Status => Ok(Some(engine.status())),
                Request::Flush => engine
                    .flush_all(&mut |_, _| {})
                    .map(|_| Some(engine.status()))
                    .map_err(|e| e.to_string()),
                Request::SetMode { mode } => engine
                    .set_mode(mode)
                    .map(|_| None)
                    .map_err(|e| e.to_string()),
                Request::SetWriteback { settings } => engine
                    .set_writeback(settings)
                    .map(|_| None)
                    .map_err(|e| e.to_string()),
                Request::Detach => {
                    let r = engine.detach().map(|_| None).map_err(|e| e.to_string());
                    detached = r.is_ok();
                    r
                }
            };
            match r {
                Ok(status) => Response {
                    ok: true,
                    error: None,
                    status,
                },
                Err(e) => Response {
                    ok: false,
                    error: Some(e),
                    status: None,
                },
            }
        }
    };
    let mut out = stream;
    if let Ok(mut text) = serde_json::to_string(&resp) {
        text.push('\n');
        let _ = out.write_all(text.as_bytes());
    }
    if detached {
        on_detach();
    }
}
