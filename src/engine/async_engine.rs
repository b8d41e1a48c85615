//! The asynchronous API: `crate::volume::Volume` over the engine. A read
//! whose blocks are all cached and unlocked, and a write in writeback or
//! writeonly mode that rewrites dirty blocks in place or stores whole
//! blocks in free slots, run right on the calling worker thread: one cache
//! device I/O, never an origin request, a commit or a wait for another
//! request (`Engine::try_read_hits`, `Engine::try_write_cached`). Over an
//! origin that completes requests on its own threads (`rbd://`), a read of
//! blocks the cache holds none of, and a write around the cache that needs
//! no wait or commit first, are sent there from the worker and awaited
//! (engine/io/submitted.rs). Everything else, including a request a fast
//! path handed on (resolved and counted once), runs on tokio's blocking
//! pool, so many are in flight at once and requests for different blocks
//! never wait on each other. Handing a 4 KiB hit to the pool and back cost
//! about three context switches and ~30 us of CPU per request on the
//! 2-core development machine; `serve --io-threads` sets how many worker
//! threads there are.

use std::sync::Arc;

use super::io::direct::WriteLeft;
use super::io::direct_origin::{DeferredStore, DirectOriginRead, OriginReadLeft};
use super::io::submitted::{OriginRead, OriginWrite};
use super::origin::address::in_volume;
use super::request::{Fast, Request};
use super::{Engine, EngineError};
use crate::device::{AlignedBuf, DeviceResult};
use crate::volume::{
    Direct, ErrorKind, Extent, Later, LaterRead, ReadStart, Start, Volume, VolumeError,
    VolumeResult, WriteStart,
};

/// One of the engine's volumes as an asynchronous volume: its offsets are
/// the volume's, moved to the volume's addresses (origin/address.rs); no
/// offset, however large, reaches another volume (`in_volume`).
#[derive(Clone)]
pub struct AsyncEngine {
    pub engine: Arc<Engine>,
    /// The volume's index and the address of its byte 0.
    v: usize,
    base: u64,
}

impl AsyncEngine {
    /// The first volume (a cache of one origin: its only one).
    pub fn new(engine: Arc<Engine>) -> AsyncEngine {
        AsyncEngine::volume(engine, 0).expect("every cache has a volume 0")
    }

    /// Volume `v`, if the cache has it.
    pub fn volume(engine: Arc<Engine>, v: usize) -> Option<AsyncEngine> {
        let (_, base, _) = engine.volumes().into_iter().nth(v)?;
        Some(AsyncEngine { engine, v, base })
    }
}

async fn run<T: Send + 'static>(
    engine: &Arc<Engine>,
    f: impl FnOnce(&Engine) -> Result<T, EngineError> + Send + 'static,
) -> VolumeResult<T> {
    let e = engine.clone();
    match tokio::task::spawn_blocking(move || f(&e)).await {
        Ok(r) => r.map_err(VolumeError::from),
        Err(join) => Err(VolumeError::new(
            ErrorKind::Io,
            format!("engine task failed: {join}"),
        )),
    }
}

/// The rest of a read a fast path handed on, on the blocking pool.
fn read_later(engine: Arc<Engine>, req: Request) -> LaterRead {
    Box::pin(async move { run(&engine, move |e| e.cache.read_request(req)).await })
}

/// A read sent to an origin that completes it on its own threads
/// (engine/io/submitted.rs): awaited here, no thread of ours blocked. It
/// ends (its promotion stored, its blocks unlocked) on the thread that
/// awaits it, not the origin's; or, if nobody awaits it any more, where
/// it is dropped, without its promotion (`Ended`).
async fn sent(engine: Arc<Engine>, r: OriginRead) -> VolumeResult<AlignedBuf> {
    let (tx, rx) = tokio::sync::oneshot::channel::<Ended>();
    let e = engine.clone();
    engine.cache.send_origin_read(r, move |r, res| {
        let _ = tx.send(Ended(Some((e, r, res))));
    });
    match rx.await {
        Ok(mut ended) => ended.end().map_err(VolumeError::from),
        Err(_) => Err(VolumeError::new(
            ErrorKind::Io,
            "the origin dropped a read without ending it".to_string(),
        )),
    }
}

/// A submitted read the origin completed, to end once: by its awaiter,
/// or by its drop (a request whose awaiter went away, or a channel
/// dropped with it inside), so its blocks are never left locked.
struct Ended(Option<(Arc<Engine>, OriginRead, DeviceResult<AlignedBuf>)>);

impl Ended {
    fn end(&mut self) -> Result<AlignedBuf, EngineError> {
        let (e, r, res) = self.0.take().expect("ended once");
        e.cache.origin_read_done(r, res)
    }
}

impl Drop for Ended {
    /// Nobody awaits the read: it ends without storing its promotion.
    fn drop(&mut self) {
        if let Some((e, r, res)) = self.0.take() {
            e.cache.origin_read_abandoned(r, res);
        }
    }
}

/// A read the front end makes on the origin itself (io/direct_origin.rs).
/// A `Direct` dropped unreported (its queue stopped) reports a failure:
/// the read is let go, and the `Later` it returns is dropped unpolled.
fn direct_origin(engine: Arc<Engine>, mut r: DirectOriginRead) -> Direct<AlignedBuf> {
    let (fd, pieces) = (r.fd, std::mem::take(&mut r.pieces));
    Direct::new(fd, pieces, move |ok, data| {
        match engine.cache.direct_origin_read_done(r, ok, data) {
            OriginReadLeft::Nothing => None,
            OriginReadLeft::Store(s) => {
                store_later(engine, s);
                None
            }
            OriginReadLeft::Again(req) => Some(read_later(engine, req)),
        }
    })
}

/// Stores a direct origin read's promotion on the blocking pool (here if
/// there is no runtime), after the read went back to the reader.
fn store_later(engine: Arc<Engine>, s: DeferredStore) {
    let pending = Unstored(Some((engine, s)));
    let store = move || {
        let mut pending = pending;
        if let Some((e, s)) = pending.0.take() {
            e.cache.end_deferred(s, true);
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(store)),
        Err(_) => store(),
    }
}

/// A promotion whose task may never run (the runtime going): its read
/// ends without it.
struct Unstored(Option<(Arc<Engine>, DeferredStore)>);

impl Drop for Unstored {
    fn drop(&mut self) {
        if let Some((e, s)) = self.0.take() {
            e.cache.end_deferred(s, false);
        }
    }
}

/// The rest of a read a fast path handed on: sent to the origin if it
/// can go there without a thread of ours (`start_origin_read`), else on
/// the blocking pool.
async fn read_rest(engine: &Arc<Engine>, req: Request) -> VolumeResult<AlignedBuf> {
    match engine.cache.start_origin_read(req) {
        Ok(r) => sent(engine.clone(), r).await,
        Err(req) => run(engine, move |e| e.cache.read_request(req)).await,
    }
}

/// The rest of a write a fast path handed on: sent to the origin if it
/// can go there without a thread of ours (`start_origin_write`), else on
/// the blocking pool.
fn write_later(engine: Arc<Engine>, req: Request, data: AlignedBuf) -> Later<()> {
    Box::pin(async move {
        match engine.cache.start_origin_write(req) {
            Ok(w) => sent_write(engine, w, data).await,
            Err(req) => run(&engine, move |e| e.write_request(req, &data)).await,
        }
    })
}

/// A write sent to an origin that completes it on its own threads
/// (engine/io/submitted.rs), ended there (nothing in its ending blocks),
/// its outcome awaited here.
async fn sent_write(engine: Arc<Engine>, w: OriginWrite, data: AlignedBuf) -> VolumeResult<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let e = engine.clone();
    engine.cache.send_origin_write(w, data, move |w, res| {
        let _ = tx.send(e.cache.origin_write_done(w, res));
    });
    match rx.await {
        Ok(r) => r.map_err(VolumeError::from),
        Err(_) => Err(VolumeError::new(
            ErrorKind::Io,
            "the origin dropped a write without ending it".to_string(),
        )),
    }
}

impl Volume for AsyncEngine {
    /// The volume's size now: it may grow online (`Engine::grow_volume`).
    fn size_bytes(&self) -> u64 {
        self.engine.volume_size(self.v)
    }

    fn preferred_block_bytes(&self) -> u32 {
        self.engine.block_bytes()
    }

    fn flush_is_global(&self) -> bool {
        // A commit flushes both devices for every connection's writes.
        true
    }

    async fn read(&self, offset: u64, len: u32) -> VolumeResult<AlignedBuf> {
        // Hits of unlocked blocks cost one cache read: done here, without
        // the two thread hand-offs of the blocking pool.
        let at = in_volume(self.base, offset);
        match self.engine.try_read_hits(at, len as u64) {
            Fast::Done(r) => r.map_err(VolumeError::from),
            Fast::Pending(req) => read_rest(&self.engine, req).await,
        }
    }

    /// A read of hits from a cache device that is a plain file or block
    /// device is left to the caller (`engine/io/direct.rs`).
    fn start_read(&self, offset: u64, len: u32) -> ReadStart {
        let at = in_volume(self.base, offset);
        match self.engine.cache.try_hit_reads(at, len as u64) {
            None => Start::Default,
            Some(Fast::Done(Err(e))) => Start::Later(Box::pin(async move { Err(e.into()) })),
            Some(Fast::Pending(req)) => {
                // Not all hits: sent to the origin if it can go without a
                // thread of ours, else read on the blocking pool straight
                // into the front end's buffer, answered before any
                // promotion.
                let req = match self.engine.cache.start_origin_read(req) {
                    Ok(r) => return Start::Later(Box::pin(sent(self.engine.clone(), r))),
                    Err(req) => req,
                };
                let req = match self.engine.cache.try_direct_origin_read(req) {
                    Ok(r) => return Start::Direct(direct_origin(self.engine.clone(), r)),
                    Err(req) => req,
                };
                let engine = self.engine.clone();
                Start::Blocking(Box::new(move |dest, reply| {
                    (engine.cache).read_request_into(req, dest, |dest, r| {
                        reply(dest, r.map_err(VolumeError::from))
                    })
                }))
            }
            Some(Fast::Done(Ok(mut hits))) => {
                let (fd, pieces) = (hits.fd, std::mem::take(&mut hits.pieces));
                let engine = self.engine.clone();
                Start::Direct(Direct::new(fd, pieces, move |ok, _| {
                    let req = engine.cache.hit_reads_done(hits, ok)?;
                    Some(read_later(engine, req))
                }))
            }
        }
    }

    /// A write the cache takes at once, to a cache device that is a plain
    /// file or block device, is left to the caller (`engine/io/direct.rs`).
    fn start_write(&self, offset: u64, data: &[u8], fua: bool) -> WriteStart {
        let at = in_volume(self.base, offset);
        let engine = self.engine.clone();
        match self
            .engine
            .cache
            .try_cache_writes(at, data.len() as u64, fua)
        {
            None => Start::Default,
            Some(Fast::Done(Err(e))) => Start::Later(Box::pin(async move { Err(e.into()) })),
            Some(Fast::Pending(req)) => {
                Start::Later(write_later(engine, req, AlignedBuf::from_slice(data)))
            }
            Some(Fast::Done(Ok(mut w))) => {
                let (fd, pieces) = (w.fd, std::mem::take(&mut w.pieces));
                Start::Direct(Direct::new(fd, pieces, move |ok, data| {
                    match engine.cache.cache_writes_done(w, ok) {
                        WriteLeft::Nothing => None,
                        WriteLeft::Tail(req) => Some(Box::pin(async move {
                            run(&engine, move |e| e.cache.write_tail(&req)).await
                        })),
                        WriteLeft::Again(req) => {
                            Some(write_later(engine, req, AlignedBuf::from_slice(data)))
                        }
                    }
                }))
            }
        }
    }

    async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> VolumeResult<()> {
        let at = in_volume(self.base, offset);
        match self.engine.try_write_cached(at, &data, fua) {
            Fast::Done(r) => r.map_err(VolumeError::from),
            Fast::Pending(req) => write_later(self.engine.clone(), req, data).await,
        }
    }

    async fn flush(&self) -> VolumeResult<()> {
        let v = crate::engine::origin::address::volume_of(self.base);
        run(&self.engine, move |e| e.flush_volume(v)).await
    }

    async fn trim(&self, offset: u64, len: u64, fua: bool) -> VolumeResult<()> {
        let at = in_volume(self.base, offset);
        run(&self.engine, move |e| e.trim(at, len, fua)).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> VolumeResult<()> {
        let at = in_volume(self.base, offset);
        run(&self.engine, move |e| e.write_zeroes(at, len, fua)).await
    }

    async fn prefetch(&self, offset: u64, len: u64) -> VolumeResult<()> {
        let at = in_volume(self.base, offset);
        run(&self.engine, move |e| e.prefetch(at, len)).await
    }

    fn cache_state(&self, offset: u64, len: u64) -> Vec<Extent> {
        self.engine.cache_state(in_volume(self.base, offset), len)
    }
}
