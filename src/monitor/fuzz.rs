//! The body of the monitoring server's fuzz target
//! (fuzz/fuzz_targets/monitor_http.rs), here so tests/fuzz_parsers.rs runs
//! the same code in CI. The request head is what any client of
//! `serve --metrics`/`--http` sends, often from the network.
//!
//! Input: a byte choosing the routes (bit 0: the dashboard's, else
//! `/metrics` only), then what the client sends before it closes its side
//! (at most [`CLIENT_BYTES_MAX`]). The whole connection runs
//! (`http::connection`) over an in-memory stream, against a monitor of a
//! closed cache (its state answers 503), and [`http_request`] checks the
//! response against a model of the rules: 431 for a head longer than the
//! limit, 400 for what is not an HTTP/1 request line, 405 for a method
//! but GET and HEAD, the route's status otherwise, a `Content-Length`
//! that is the body's, no body for HEAD, nothing for a client that closed
//! before the end of its head.

use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::http::{connection, Limits, Routes};
use super::Monitor;

/// Bytes of client input a body takes: twice the head limit.
pub const CLIENT_BYTES_MAX: usize = 16 << 10;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fn monitor() -> &'static Arc<Monitor> {
    static M: OnceLock<Arc<Monitor>> = OnceLock::new();
    M.get_or_init(|| Monitor::detached("fuzz"))
}

/// The status a request head gets, by the rules in the module doc; `None`:
/// no response (the client closed before the end of its head).
fn model(sent: &[u8], routes: Routes, head_bytes: usize) -> Option<&'static str> {
    let window = &sent[..sent.len().min(head_bytes)];
    let ended = |pat: &[u8]| window.windows(pat.len()).any(|w| w == pat);
    if !ended(b"\r\n\r\n") && !ended(b"\n\n") {
        return (sent.len() >= head_bytes).then_some("431 Request Header Fields Too Large");
    }
    let line_end = window.iter().position(|&b| b == b'\r' || b == b'\n')?;
    let Ok(line) = std::str::from_utf8(&window[..line_end]) else {
        return Some("400 Bad Request");
    };
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Some("400 Bad Request");
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Some("400 Bad Request");
    }
    if method != "GET" && method != "HEAD" {
        return Some("405 Method Not Allowed");
    }
    let path = &target[..target.find(['?', '#']).unwrap_or(target.len())];
    let dashboard = [
        "/",
        "/index.html",
        "/app.js",
        "/style.css",
        "/favicon.svg",
        "/favicon.ico",
    ];
    Some(match path {
        "/metrics" => "503 Service Unavailable",
        "/api/snapshot" if routes == Routes::All => "503 Service Unavailable",
        p if routes == Routes::All && dashboard.contains(&p) => "200 OK",
        "/" => "200 OK",
        _ => "404 Not Found",
    })
}

/// One connection from untrusted bytes. See the module doc.
pub fn http_request(data: &[u8]) {
    let Some((&r, sent)) = data.split_first() else {
        return;
    };
    let sent = &sent[..sent.len().min(CLIENT_BYTES_MAX)];
    let routes = if r & 1 != 0 {
        Routes::All
    } else {
        Routes::Metrics
    };
    let limits = Limits::default();
    let response = runtime().block_on(async {
        let (mut client, server) = tokio::io::duplex(CLIENT_BYTES_MAX);
        client
            .write_all(sent)
            .await
            .expect("the pipe holds the input");
        client.shutdown().await.expect("shutdown");
        let serve = connection(server, monitor(), routes, limits);
        let mut response = Vec::new();
        let (_, read) = tokio::join!(serve, client.read_to_end(&mut response));
        read.expect("the response");
        response
    });
    let Some(status) = model(sent, routes, limits.head_bytes) else {
        assert!(response.is_empty(), "a response to an unfinished head");
        return;
    };
    check_response(&response, status, sent.starts_with(b"HEAD "));
}

fn check_response(response: &[u8], status: &str, head_only: bool) {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.split("\r\n");
    assert_eq!(lines.next(), Some(&*format!("HTTP/1.1 {status}")));
    let length: usize = lines
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("a Content-Length")
        .parse()
        .expect("a number");
    // HEAD is honoured once the request is routed.
    let routed = !["400", "405", "431"].iter().any(|s| status.starts_with(s));
    let want = if head_only && routed { 0 } else { length };
    assert_eq!(body.len(), want, "body of a {status} response");
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests() {
        for r in [
            &b"\x01GET /app.js?x HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"\x00HEAD /metrics HTTP/1.0\n\n",
            b"\x00POST / HTTP/1.1\r\n\r\n",
            b"\x01GET / HTTP/1.1\r\n",
            b"\x01GET /x HTTP/2\r\n\r\n",
        ] {
            super::http_request(r);
        }
        super::http_request(&[b'x'; 9000]);
    }
}
