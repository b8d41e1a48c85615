//! HTTP and the Chrome DevTools protocol for the monitoring tests: a
//! blocking HTTP/1.1 GET, a free loopback port, headless Chromium started
//! and driven over a WebSocket written here (RFC 6455: client frames
//! masked, server frames read whole, fragments joined, pings answered).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::daemon::KillOnDrop;

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from `addr`: (status code, body). Reads Content-Length
/// bytes when given (Chromium keeps the connection open), else to the end.
pub fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    let code = status
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {status:.80}")))?;
    let mut length = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            r.read_exact(&mut body)?;
        }
        None => {
            r.read_to_end(&mut body)?;
        }
    }
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// Waits until `addr` answers `path` with 200.
pub fn wait_http(addr: &str, path: &str) {
    let t = Instant::now();
    while !matches!(get(addr, path), Ok((200, _))) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{addr}{path} never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub struct WebSocket {
    s: TcpStream,
}

impl WebSocket {
    /// Connects to a `ws://host:port/path` URL.
    pub fn connect(url: &str) -> WebSocket {
        let rest = url.strip_prefix("ws://").expect("a ws:// URL");
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let mut s = TcpStream::connect(host).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        // Byte by byte: nothing after the head may be swallowed.
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "no WebSocket: {head}");
        WebSocket { s }
    }

    fn send_frame(&mut self, opcode: u8, payload: &[u8]) {
        let mut f = vec![0x80 | opcode];
        let n = payload.len();
        if n < 126 {
            f.push(0x80 | n as u8);
        } else if n < 65536 {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
        let mask = [0x12, 0x34, 0x56, 0x78];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.s.write_all(&f).unwrap();
    }

    pub fn send(&mut self, text: &str) {
        self.send_frame(0x1, text.as_bytes());
    }

    /// The next text message.
    pub fn recv(&mut self) -> String {
        let mut msg = Vec::new();
        loop {
            let mut h = [0u8; 2];
            self.s
                .read_exact(&mut h)
                .expect("reading a WebSocket frame");
            let fin = h[0] & 0x80 != 0;
            let opcode = h[0] & 0x0f;
            let mut len = u64::from(h[1] & 0x7f);
            if len == 126 {
                let mut l = [0u8; 2];
                self.s.read_exact(&mut l).unwrap();
                len = u64::from(u16::from_be_bytes(l));
            } else if len == 127 {
                let mut l = [0u8; 8];
                self.s.read_exact(&mut l).unwrap();
                len = u64::from_be_bytes(l);
            }
            assert!(h[1] & 0x80 == 0, "the server masked a frame");
            let mut payload = vec![0u8; len as usize];
            self.s.read_exact(&mut payload).unwrap();
            match opcode {
                0x9 => self.send_frame(0xA, &payload),
                0xA => {}
                0x8 => panic!("the browser closed the DevTools connection"),
                _ => {
                    msg.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(msg).expect("UTF-8 message");
                    }
                }
            }
        }
    }
}

/// A headless Chromium and a DevTools session on its page.
pub struct Browser {
    _child: KillOnDrop,
    _profile: tempfile::TempDir,
    ws: WebSocket,
    next_id: u64,
    /// Events received while waiting for answers.
    pub events: Vec<Value>,
}

impl Browser {
    /// Starts Chromium on about:blank and attaches to its page.
    pub fn start() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = KillOnDrop(
            Command::new("chromium")
                .args([
                    "--headless",
                    "--disable-gpu",
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--remote-debugging-port=0",
                    "--window-size=1300,1300",
                ])
                .arg(format!("--user-data-dir={}", profile.path().display()))
                .arg("about:blank")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting chromium"),
        );
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let browser_url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium did not print its DevTools address within 30 s");
        let host = browser_url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .unwrap()
            .to_string();
        let t = Instant::now();
        let page_url = loop {
            let (_, body) = get(&host, "/json/list").unwrap();
            let list: Value = serde_json::from_str(&body).unwrap();
            let page = list.as_array().and_then(|l| {
                l.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
                    .map(str::to_string)
            });
            if let Some(p) = page {
                break p;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no page target");
            std::thread::sleep(Duration::from_millis(100));
        };
        Browser {
            _child: child,
            _profile: profile,
            ws: WebSocket::connect(&page_url),
            next_id: 0,
            events: Vec::new(),
        }
    }

    /// Calls a DevTools method and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.ws
            .send(&json!({"id": id, "method": method, "params": params}).to_string());
        loop {
            let msg: Value = serde_json::from_str(&self.ws.recv()).unwrap();
            if msg["id"] == id {
                assert!(msg.get("error").is_none(), "{method}: {msg}");
                return msg["result"].clone();
            }
            self.events.push(msg);
        }
    }

    /// Evaluates a JavaScript expression in the page; its value as JSON.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expr} threw: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is true; panics with `what` after `secs`.
    pub fn wait_for(&mut self, expr: &str, secs: u64, what: &str) {
        let t = Instant::now();
        while self.eval(expr) != json!(true) {
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "the page never showed {what} ({expr})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Console errors, uncaught exceptions and error log entries seen.
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e["method"].as_str()? {
                "Runtime.exceptionThrown" => Some(e["params"]["exceptionDetails"].to_string()),
                "Runtime.consoleAPICalled" if e["params"]["type"] == "error" => {
                    Some(e["params"]["args"].to_string())
                }
                "Log.entryAdded" if e["params"]["entry"]["level"] == "error" => {
                    Some(e["params"]["entry"].to_string())
                }
                _ => None,
            })
            .collect()
    }
}

/// True if Chromium can be run here.
pub fn have_chromium() -> bool {
    Command::new("sh")
        .args(["-c", "command -v chromium"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
