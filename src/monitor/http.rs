//! A small read-only HTTP/1.1 server for the monitoring endpoints: GET and
//! HEAD only, one request per connection (`Connection: close`), every
//! resource bounded: connections served at once (more wait in the listen
//! backlog), request header bytes, and the time a client may take to send
//! its request or read the answer. The page's assets are compiled in.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::Monitor;

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE_CSS: &str = include_str!("dashboard/style.css");
const FAVICON_SVG: &str = include_str!("dashboard/favicon.svg");

/// Which paths a listener answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    /// `/metrics` (and a line at `/` that says so).
    Metrics,
    /// The dashboard, `/api/snapshot` and `/metrics`.
    All,
}

/// The server's bounds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Longest request head (request line and headers).
    pub head_bytes: usize,
    /// Time to send the request head.
    pub read_timeout: Duration,
    /// Time to take the whole response.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 32,
            head_bytes: 8 * 1024,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `listener` until `shutdown` turns true or its sender is gone.
pub async fn serve(
    listener: TcpListener,
    monitor: Arc<Monitor>,
    routes: Routes,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        if *shutdown.borrow() {
            return;
        }
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            r = shutdown.changed() => { if r.is_err() { return } continue }
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: wait rather than spin.
                    log::warn!("monitor: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            r = shutdown.changed() => { if r.is_err() { return } continue }
        };
        let monitor = monitor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection(stream, &monitor, routes, limits).await {
                log::debug!("monitor: connection: {e}");
            }
        });
    }
}

/// A parsed request line.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    /// The path without its query.
    pub path: &'a str,
}

/// Parses the request line of a request head; `None` if it is not HTTP/1.x.
pub fn parse_request_line(head: &[u8]) -> Option<RequestLine<'_>> {
    let line_end = head.iter().position(|&b| b == b'\r' || b == b'\n')?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?;
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some(RequestLine { method, path })
}

/// Where a request head ends (after the blank line), if it has.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2))
}

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: Body,
}

enum Body {
    Static(&'static str),
    Owned(String),
    Shared(Arc<super::Taken>, fn(&Arc<super::Taken>) -> &str),
}

impl Body {
    fn as_str(&self) -> &str {
        match self {
            Body::Static(s) => s,
            Body::Owned(s) => s,
            Body::Shared(t, f) => f(t),
        }
    }
}

fn plain(status: &'static str, text: &'static str) -> Response {
    Response {
        status,
        content_type: "text/plain; charset=utf-8",
        body: Body::Static(text),
    }
}

/// Answers the one request of a connection (`pub(super)` for the fuzz
/// body, `fuzz.rs`, which drives it over an in-memory stream).
pub(super) async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    monitor: &Monitor,
    routes: Routes,
    limits: Limits,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; limits.head_bytes];
    let mut len = 0;
    let read = async {
        loop {
            if head_end(&buf[..len]).is_some() {
                return Ok(true);
            }
            if len == buf.len() {
                return Ok(false);
            }
            let n = stream.read(&mut buf[len..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            len += n;
        }
    };
    let complete: std::io::Result<bool> =
        match tokio::time::timeout(limits.read_timeout, read).await {
            Ok(r) => r,
            Err(_) => return Ok(()), // too slow: just close
        };
    let (resp, head_only) = if !complete? {
        (
            plain(
                "431 Request Header Fields Too Large",
                "request head too large\n",
            ),
            false,
        )
    } else {
        match parse_request_line(&buf[..len]) {
            None => (plain("400 Bad Request", "not an HTTP/1 request\n"), false),
            Some(r) if r.method != "GET" && r.method != "HEAD" => (
                plain("405 Method Not Allowed", "read only: GET and HEAD\n"),
                false,
            ),
            Some(r) => (route(monitor, routes, r.path).await, r.method == "HEAD"),
        }
    };
    let body = resp.body.as_str();
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
         X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'self'\r\n\
         Connection: close\r\n\r\n",
        resp.status,
        resp.content_type,
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        if !head_only {
            stream.write_all(body.as_bytes()).await?;
        }
        stream.shutdown().await
    };
    match tokio::time::timeout(limits.write_timeout, write).await {
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}

async fn route(monitor: &Monitor, routes: Routes, path: &str) -> Response {
    let all = routes == Routes::All;
    match path {
        "/metrics" => match monitor.taken().await {
            Ok(t) => Response {
                status: "200 OK",
                content_type: super::metrics::CONTENT_TYPE,
                body: Body::Shared(t, |t| t.metrics_text()),
            },
            Err(e) => unavailable(e),
        },
        "/api/snapshot" if all => match monitor.taken().await {
            Ok(t) => Response {
                status: "200 OK",
                content_type: "application/json",
                body: Body::Shared(t, |t| t.json_text()),
            },
            Err(e) => unavailable(e),
        },
        "/" | "/index.html" if all => Response {
            status: "200 OK",
            content_type: "text/html; charset=utf-8",
            body: Body::Static(INDEX_HTML),
        },
        "/app.js" if all => Response {
            status: "200 OK",
            content_type: "text/javascript; charset=utf-8",
            body: Body::Static(APP_JS),
        },
        "/style.css" if all => Response {
            status: "200 OK",
            content_type: "text/css; charset=utf-8",
            body: Body::Static(STYLE_CSS),
        },
        "/favicon.svg" | "/favicon.ico" if all => Response {
            status: "200 OK",
            content_type: "image/svg+xml",
            body: Body::Static(FAVICON_SVG),
        },
        "/" => plain("200 OK", "tiercache metrics: /metrics\n"),
        _ => plain("404 Not Found", "not found\n"),
    }
}

fn unavailable(e: super::MonitorError) -> Response {
    Response {
        status: "503 Service Unavailable",
        content_type: "text/plain; charset=utf-8",
        body: Body::Owned(format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        let r = parse_request_line(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(
            r,
            RequestLine {
                method: "GET",
                path: "/metrics"
            }
        );
        assert!(parse_request_line(b"GET /metrics\r\n\r\n").is_none());
        assert!(parse_request_line(b"GET metrics HTTP/1.1\r\n\r\n").is_none());
        assert!(parse_request_line(b"GET / HTTP/2\r\n\r\n").is_none());
        assert!(parse_request_line(b"GET / HTTP/1.1 x\r\n\r\n").is_none());
        assert!(parse_request_line(b"\xff\xfe / HTTP/1.1\r\n\r\n").is_none());
        assert!(parse_request_line(b"").is_none());
        assert_eq!(head_end(b"GET / HTTP/1.0\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.0\r\n"), None);
    }
}
