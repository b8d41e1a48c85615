//! The body of the whole-server fuzz target (fuzz/fuzz_targets/nbd_session.rs),
//! here so tests/fuzz_session.rs runs the same code in CI: a client's bytes,
//! handshake then transmission requests, through the server's whole path
//! (`server::serve_stream`: greeting, option haggling, the transmission
//! loop, `execute`, the volume, the replies) with the process's allocations
//! counted.
//!
//! The server's memory is bounded by its charges: every request is charged
//! what it may hold against `--conn-buffer` and `--total-buffer` before it
//! runs. A request that makes it allocate beyond them is how a client
//! exhausts the daemon (two pipelined 1 GiB NBD_CMD_CACHE once took it to
//! 4.28 GB: the prefetch held the whole range). [`session`] fails when the
//! process's live heap grows, during one session, past
//! [`TOTAL_BUFFER_BYTES`] + [`MARGIN_BYTES`]. The binary must install
//! [`CappedAlloc`] as its global allocator (`#[global_allocator]`); beyond
//! [`HARD_LIMIT_BYTES`] above the session's start it refuses allocations, so
//! a runaway aborts the process before the machine runs out of memory.
//!
//! Input: the bytes the client sends before it closes its sending side (at
//! most [`CLIENT_BYTES_MAX`]); the server's replies are read and dropped
//! as they come. The volume is a small engine over RAM (64 MiB origin,
//! 16 MiB cache, writethrough), made once per process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::server::{serve_stream, ServerConfig};
use crate::device::ram::RamDevice;
use crate::engine::async_engine::AsyncEngine;
use crate::engine::{CreateOptions, Engine, Mode, OpenOptions};
use crate::volume::Volume;

/// The server's bounds in a session: `--max-request-size 1M --conn-buffer
/// 4M --total-buffer 8M`.
pub const MAX_REQUEST_BYTES: u32 = 1 << 20;
pub const CONN_BUFFER_BYTES: u32 = 4 << 20;
pub const TOTAL_BUFFER_BYTES: u64 = 8 << 20;
/// What a session may allocate beyond its charged buffers: the
/// connection's read buffer (64 KiB), tasks, reply queues, the runtime's
/// and the engine's own bookkeeping. The seeds peak at 2.3 MiB over the
/// start (tests/fuzz_session.rs prints it).
pub const MARGIN_BYTES: u64 = 8 << 20;
/// Allocations fail this far above a session's start.
pub const HARD_LIMIT_BYTES: usize = 1 << 30;
/// Client bytes a body takes.
pub const CLIENT_BYTES_MAX: usize = 8 << 20;
/// A session that has not ended by then is a hang (every input ends in
/// EOF; the server's own timeouts are longer than any request here).
const SESSION_TIMEOUT: Duration = Duration::from_secs(60);

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static HARD_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The system allocator, counting the bytes live and their peak, and
/// failing allocations above a hard limit.
pub struct CappedAlloc;

impl CappedAlloc {
    /// Counts `size` more bytes, unless that passes the hard limit.
    fn charge(size: usize) -> bool {
        let live = LIVE.fetch_add(size, Relaxed).saturating_add(size);
        if live > HARD_LIMIT.load(Relaxed) {
            LIVE.fetch_sub(size, Relaxed);
            return false;
        }
        PEAK.fetch_max(live, Relaxed);
        true
    }
}

// SAFETY: every method hands its arguments unchanged to `System`, whose
// contract is the same as the caller's, and returns what it returned (or
// null, an allocation failure the contract allows). The bookkeeping is
// atomics only: it neither allocates nor unwinds.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::charge(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller meets `alloc`'s contract for `layout`.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::charge(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller meets `alloc_zeroed`'s contract for `layout`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`,
        // with `layout` (the caller's contract).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        let grow = new_size.saturating_sub(old);
        if grow > 0 && !Self::charge(grow) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`, and the caller
        // meets `realloc`'s contract for `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            LIVE.fetch_sub(grow, Relaxed);
        } else {
            LIVE.fetch_sub(old.saturating_sub(new_size), Relaxed);
        }
        p
    }
}

/// Bytes allocated through [`CappedAlloc`] and not freed.
pub fn live_bytes() -> usize {
    LIVE.load(Relaxed)
}

/// The most bytes live since the last [`start_window`].
pub fn peak_bytes() -> usize {
    PEAK.load(Relaxed)
}

/// Starts measuring a peak from the bytes live now (returned), and fails
/// allocations [`HARD_LIMIT_BYTES`] above them.
pub fn start_window() -> usize {
    let live = LIVE.load(Relaxed);
    PEAK.store(live, Relaxed);
    HARD_LIMIT.store(live.saturating_add(HARD_LIMIT_BYTES), Relaxed);
    live
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// The engine the sessions are served from (made once).
pub fn engine_volume() -> Arc<AsyncEngine> {
    static V: OnceLock<Arc<AsyncEngine>> = OnceLock::new();
    V.get_or_init(|| {
        let opts = CreateOptions {
            mode: Mode::Writethrough,
            ..CreateOptions::default()
        };
        let open = OpenOptions {
            no_background: true,
            ..OpenOptions::default()
        };
        let cache = Arc::new(RamDevice::new("cache", 16 << 20));
        let origin = Arc::new(RamDevice::new("origin", 64 << 20));
        let engine = Engine::create_with(cache, origin, &opts, &open).expect("the harness engine");
        Arc::new(AsyncEngine::new(engine))
    })
    .clone()
}

/// The server's configuration in a session (see the constants).
pub fn config() -> ServerConfig {
    ServerConfig {
        max_request_bytes: MAX_REQUEST_BYTES,
        max_buffered_bytes_per_conn: CONN_BUFFER_BYTES,
        max_buffered_bytes_total: TOTAL_BUFFER_BYTES,
        ..ServerConfig::default()
    }
}

/// One session against the engine. See the module doc.
pub fn session(data: &[u8]) {
    session_on(engine_volume(), data);
}

/// One session against `volume`; returns the peak bytes above its start.
/// Panics if that passes the cap, or the session hangs.
pub fn session_on<V: Volume>(volume: Arc<V>, data: &[u8]) -> u64 {
    let sent = &data[..data.len().min(CLIENT_BYTES_MAX)];
    assert!(
        {
            let probe = std::hint::black_box(vec![0u8; 64]);
            drop(probe);
            PEAK.load(Relaxed) > 0
        },
        "the binary does not count allocations: install CappedAlloc as its #[global_allocator]"
    );
    let base = start_window();
    runtime().block_on(async {
        let (client, server) = tokio::net::UnixStream::pair().expect("socketpair");
        let serve = tokio::spawn(serve_stream(volume, config(), server));
        let (mut rd, mut wr) = client.into_split();
        let send = async {
            // The server may close first (a protocol violation): not an error.
            let _ = wr.write_all(sent).await;
            let _ = wr.shutdown().await;
        };
        let drain = async {
            let mut buf = vec![0u8; 64 << 10];
            while rd.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        };
        let all = async { tokio::join!(send, drain, serve).2 };
        match tokio::time::timeout(SESSION_TIMEOUT, all).await {
            Ok(served) => served.expect("the server task").expect("the configuration"),
            Err(_) => panic!("the session did not end within {SESSION_TIMEOUT:?}"),
        }
    });
    let grew = (peak_bytes() - base) as u64;
    let cap = TOTAL_BUFFER_BYTES + MARGIN_BYTES;
    assert!(
        grew <= cap,
        "the server allocated {} KiB during the session, beyond its {} KiB of buffers \
         (--total-buffer) and a {} KiB margin",
        grew >> 10,
        TOTAL_BUFFER_BYTES >> 10,
        MARGIN_BYTES >> 10
    );
    grew
}
