//! The whole NBD server under an allocation cap
//! (`tiercache::frontend::nbd::fuzz_session`): a client's handshake and
//! requests through `execute()` to a small engine, seeded mutations of
//! valid sessions, with the process's live heap counted by the global
//! allocator below. A test binary of its own: the count is the process's,
//! so nothing else may run beside it. The seed is printed; rerun with
//! FUZZ_SEED. A failing input is saved for replay with the fuzz target
//! nbd_session.
//!
//! Also: the cap catches the NBD_CMD_CACHE exhaustion it is there for (a
//! volume whose prefetch holds its whole range, as the engine's did).
//!
//! The seeds in fuzz/seeds/nbd_session are written from the same inputs:
//! `cargo test --test fuzz_session -- --ignored write_fuzz_seeds`.

#[path = "common/mutation.rs"]
mod mutation;

use std::sync::Arc;

use mutation::{mutation_test, values, write_seeds};
use tiercache::device::ram::RamDevice;
use tiercache::device::AlignedBuf;
use tiercache::frontend::nbd::fuzz_session::{self as fs, CappedAlloc};
use tiercache::nbd::proto::*;
use tiercache::volume::{DeviceVolume, Extent, Volume, VolumeResult};

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

const MIB: u32 = 1 << 20;

/// The count is the process's: one session at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn opt(code: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&code.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn go(infos: &[u16]) -> Vec<u8> {
    let mut d = 0u32.to_be_bytes().to_vec();
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    opt(OPT_GO, &d)
}

fn req(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&cmd.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

fn write(cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut b = req(CMD_WRITE, 0, cookie, offset, data.len() as u32);
    b.extend_from_slice(data);
    b
}

/// Client flags and options into transmission with structured replies and
/// both metadata contexts.
fn structured() -> Vec<u8> {
    let contexts = meta_context_request("", &["base:allocation", "tiercache:cache"]);
    [
        3u32.to_be_bytes().to_vec(),
        opt(OPT_STRUCTURED_REPLY, &[]),
        opt(OPT_SET_META_CONTEXT, &contexts),
        go(&[INFO_BLOCK_SIZE]),
    ]
    .concat()
}

fn session_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let volume = 64u32 * MIB;
    let simple = [3u32.to_be_bytes().to_vec(), opt(OPT_EXPORT_NAME, b"")].concat();
    vec![
        (
            "reads_writes",
            [
                structured(),
                write(1, 0, &[7; 4096]),
                req(CMD_READ, 0, 2, 0, 4096),
                write(3, 3, b"unalign"),
                req(CMD_READ, 0, 4, 1 << 20, MIB),
                req(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 5, 100, MIB),
                req(CMD_TRIM, 0, 6, 0, 8 * MIB),
                req(CMD_FLUSH, 0, 7, 0, 0),
                req(CMD_DISC, 0, 8, 0, 0),
            ]
            .concat(),
        ),
        // The exhaustion the cap is for: two pipelined whole-volume CACHE.
        (
            "cache_pipelined",
            [
                structured(),
                req(CMD_CACHE, 0, 1, 0, volume),
                req(CMD_CACHE, 0, 2, 0, volume),
                req(CMD_READ, 0, 3, 0, MIB),
            ]
            .concat(),
        ),
        (
            "block_status",
            [
                structured(),
                write(1, 1 << 20, &[1; 8192]),
                req(CMD_BLOCK_STATUS, 0, 2, 0, volume),
                req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 3, 4096, volume - 4096),
            ]
            .concat(),
        ),
        (
            "export_name_simple",
            [
                simple,
                req(CMD_READ, 0, 1, 512, 3 * 512),
                write(2, 1000, &[9; 3000]),
                req(CMD_WRITE_ZEROES, 0, 3, 0, volume),
                req(CMD_READ, 0, 4, u64::from(volume) - 512, 512),
            ]
            .concat(),
        ),
        (
            "oversized_write",
            [structured(), req(CMD_WRITE, 0, 1, 0, 2 * MIB)].concat(),
        ),
    ]
}

#[test]
fn sessions_stay_within_their_buffers() {
    let _one = serial();
    let mut peak = 0;
    for (name, s) in session_seeds() {
        let grew = fs::session_on(fs::engine_volume(), &s);
        eprintln!("{name}: {} KiB above the start", grew >> 10);
        peak = peak.max(grew);
    }
    eprintln!("seeds peak at {} KiB", peak >> 10);
    mutation_test(
        "nbd_session",
        "FUZZ_SEED",
        values(session_seeds()),
        500,
        fs::session,
    );
}

/// A volume whose prefetch holds its whole range in memory, as the engine's
/// did before prefetch went in pieces.
struct Greedy(DeviceVolume);

impl Volume for Greedy {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn preferred_block_bytes(&self) -> u32 {
        self.0.preferred_block_bytes()
    }
    fn flush_is_global(&self) -> bool {
        true
    }
    async fn read(&self, offset: u64, len: u32) -> VolumeResult<AlignedBuf> {
        self.0.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> VolumeResult<()> {
        self.0.write(offset, data, fua).await
    }
    async fn flush(&self) -> VolumeResult<()> {
        self.0.flush().await
    }
    async fn trim(&self, offset: u64, len: u64, fua: bool) -> VolumeResult<()> {
        self.0.trim(offset, len, fua).await
    }
    async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> VolumeResult<()> {
        self.0.write_zeroes(offset, len, fua).await
    }
    async fn prefetch(&self, offset: u64, len: u64) -> VolumeResult<()> {
        let whole = self.0.read(offset, len as u32).await?;
        tokio::task::yield_now().await;
        drop(whole);
        Ok(())
    }
    fn allocation(&self, offset: u64, len: u64) -> Vec<Extent> {
        self.0.allocation(offset, len)
    }
}

#[test]
fn the_cap_catches_a_prefetch_beyond_its_charge() {
    let _one = serial();
    let ram = Arc::new(RamDevice::new("origin", 64 << 20));
    let greedy = Arc::new(Greedy(DeviceVolume::new(ram, 4096)));
    let cache = session_seeds().swap_remove(1);
    assert_eq!(cache.0, "cache_pipelined");
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fs::session_on(greedy, &cache.1)
    }));
    let why = caught.expect_err("two 64 MiB prefetches held at once pass the cap");
    let why = why
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or("");
    assert!(why.contains("beyond its"), "{why}");
}

/// Writes the seeds above into fuzz/seeds/nbd_session:
/// `cargo test --test fuzz_session -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    write_seeds("nbd_session", &session_seeds());
}
