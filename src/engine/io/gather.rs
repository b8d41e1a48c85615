//! Gathering of cache writes into larger device writes (the log
//! placement's "large, in-order runs"). The cursor hands concurrent writers
//! adjacent slots; without gathering each is still its own 4 KiB device
//! write. Here, writes into the same 1 MiB lane of the cache device take
//! turns: a write that finds fewer than `IN_FLIGHT` device writes under
//! way in its lane is written at once, alone (no added latency at low
//! queue depths); writes that arrive while the lane is busy queue, and
//! when a device write ends, one of them (the *leader*) writes the whole
//! queue, sorted, each run of adjacent writes as one device write. So
//! every writer waits for at most a write under way and its own batch, and
//! under load one device write carries many client writes, much as the
//! block layer's plugging merges bcache's bucket writes.
//!
//! A batch write that fails is retried write by write, so each write gets
//! its own result and one bad range does not fail its neighbours.
//! Nothing is held across device I/O; followers park until their leader
//! sets their result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::Thread;

use crate::device::{AlignedBuf, BlockDevice, DeviceResult};
use crate::engine::stats::{bump, Stats};
use crate::sync::{Mutex, Rank};

/// Lanes are this long, aligned on the device (the log placement's
/// segments lie inside them).
pub(crate) const LANE_BYTES: u64 = 1 << 20;

/// A write this large is a large run already: it goes straight down, in
/// parallel with the lane's writes (queueing it would only copy it twice
/// and hold up the writes behind it).
const LARGE_BYTES: usize = 64 << 10;

/// Device writes a lane has under way at once: more than one keeps a
/// device with several queues (or a mirror's two members) busy while a
/// batch is gathered behind them.
const IN_FLIGHT: usize = 2;

const WAITING: u8 = 0;
const DONE: u8 = 1;
const LEAD: u8 = 2;

/// One queued write.
struct Waiter {
    at: u64,
    data: AlignedBuf,
    thread: Thread,
    state: AtomicU8,
    /// The result (DONE), or the batch this waiter is to write (LEAD).
    result: std::sync::Mutex<Option<DeviceResult<()>>>,
    batch: std::sync::Mutex<Vec<Arc<Waiter>>>,
}

impl Waiter {
    fn finish(&self, r: DeviceResult<()>) {
        *self.result.lock().expect("not poisoned") = Some(r);
        self.state.store(DONE, Ordering::Release);
        self.thread.unpark();
    }
}

#[derive(Default)]
struct Lane {
    /// Device writes under way (at most `IN_FLIGHT`).
    in_flight: usize,
    /// Writes waiting for one of them to end (only while `IN_FLIGHT` are
    /// under way).
    queue: Vec<Arc<Waiter>>,
}

pub(crate) struct Gather {
    /// Lanes with a write under way, by `offset / LANE_BYTES`; absent:
    /// idle.
    lanes: Mutex<HashMap<u64, Lane>>,
}

impl Gather {
    pub(crate) fn new() -> Gather {
        Gather {
            lanes: Mutex::new(Rank::Gather, HashMap::new()),
        }
    }

    /// Writes `buf` at `at` on `dev`, alone or in a batch with the writes
    /// queued beside it.
    pub(crate) fn write(
        &self,
        dev: &dyn BlockDevice,
        stats: &Stats,
        buf: &[u8],
        at: u64,
    ) -> DeviceResult<()> {
        if buf.len() >= LARGE_BYTES {
            return dev.write_at(buf, at);
        }
        let key = at / LANE_BYTES;
        let waiter = {
            let mut lanes = self.lanes.lock();
            let lane = lanes.entry(key).or_default();
            match lane.in_flight < IN_FLIGHT {
                true => {
                    lane.in_flight += 1;
                    None
                }
                false => {
                    let w = Arc::new(Waiter {
                        at,
                        data: AlignedBuf::from_slice(buf),
                        thread: std::thread::current(),
                        state: AtomicU8::new(WAITING),
                        result: std::sync::Mutex::new(None),
                        batch: std::sync::Mutex::new(Vec::new()),
                    });
                    lane.queue.push(w.clone());
                    Some(w)
                }
            }
        };
        let Some(w) = waiter else {
            let r = dev.write_at(buf, at);
            self.hand_on(key);
            return r;
        };
        loop {
            match w.state.load(Ordering::Acquire) {
                DONE => {
                    return w.result.lock().expect("not poisoned").take().expect("set");
                }
                LEAD => break,
                _ => std::thread::park(),
            }
        }
        let batch = std::mem::take(&mut *w.batch.lock().expect("not poisoned"));
        self.write_batch(dev, stats, batch, &w);
        self.hand_on(key);
        let r = w.result.lock().expect("not poisoned").take();
        r.expect("the leader's own write is in its batch")
    }

    /// A device write of the lane has ended: its turn passes to the first
    /// write queued, with the whole queue as its batch; with none queued
    /// the lane has one write fewer under way (and is dropped when idle).
    fn hand_on(&self, key: u64) {
        let mut lanes = self.lanes.lock();
        let lane = lanes.get_mut(&key).expect("a busy lane");
        if lane.queue.is_empty() {
            lane.in_flight -= 1;
            if lane.in_flight == 0 {
                lanes.remove(&key);
            }
            return;
        }
        let batch = std::mem::take(&mut lane.queue);
        drop(lanes);
        let leader = batch[0].clone();
        *leader.batch.lock().expect("not poisoned") = batch;
        leader.state.store(LEAD, Ordering::Release);
        leader.thread.unpark();
    }

    /// Writes a batch, each run of adjacent writes as one device write,
    /// and sets every waiter's result (the leader's without waking it).
    fn write_batch(
        &self,
        dev: &dyn BlockDevice,
        stats: &Stats,
        mut batch: Vec<Arc<Waiter>>,
        leader: &Arc<Waiter>,
    ) {
        batch.sort_by_key(|w| w.at);
        let mut i = 0;
        let mut writes = 0;
        while i < batch.len() {
            let mut end = i + 1;
            let mut next = batch[i].at + batch[i].data.len() as u64;
            while end < batch.len() && batch[end].at == next {
                next += batch[end].data.len() as u64;
                end += 1;
            }
            let run = &batch[i..end];
            let r = if run.len() == 1 {
                dev.write_at(&run[0].data, run[0].at)
            } else {
                let mut buf = AlignedBuf::zeroed((next - run[0].at) as usize);
                let mut o = 0;
                for w in run {
                    buf[o..o + w.data.len()].copy_from_slice(&w.data);
                    o += w.data.len();
                }
                dev.write_at(&buf, run[0].at)
            };
            writes += 1;
            match r {
                r if run.len() == 1 => settle(&run[0], leader, r),
                Ok(()) => run.iter().for_each(|w| settle(w, leader, Ok(()))),
                // A failed run is retried write by write.
                Err(_) => run
                    .iter()
                    .for_each(|w| settle(w, leader, dev.write_at(&w.data, w.at))),
            }
            i = end;
        }
        bump(&stats.gathered_device_writes, writes);
        bump(&stats.gathered_writes, batch.len() as u64);
    }
}

/// Sets a batch member's result; the leader reads its own without waking.
fn settle(w: &Arc<Waiter>, leader: &Arc<Waiter>, r: DeviceResult<()>) {
    if Arc::ptr_eq(w, leader) {
        *w.result.lock().expect("not poisoned") = Some(r);
    } else {
        w.finish(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::ram::RamDevice;
    use crate::device::DeviceError;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    /// RAM that takes 2 ms per write, counts them, and fails every write
    /// that covers `bad`.
    struct Slow {
        ram: RamDevice,
        writes: AtomicU64,
        bad: Option<u64>,
    }

    impl BlockDevice for Slow {
        fn size_bytes(&self) -> u64 {
            self.ram.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
            self.ram.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
            self.writes.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(2));
            if let Some(bad) = self
                .bad
                .filter(|b| (offset..offset + buf.len() as u64).contains(b))
            {
                return Err(DeviceError::Injected {
                    device: "slow".into(),
                    offset: bad,
                });
            }
            self.ram.write_at(buf, offset)
        }
        fn flush(&self) -> DeviceResult<()> {
            Ok(())
        }
        fn name(&self) -> &str {
            "slow"
        }
    }

    fn slow(bad: Option<u64>) -> Slow {
        Slow {
            ram: RamDevice::new("ram", 4 << 20),
            writes: AtomicU64::new(0),
            bad,
        }
    }

    /// 32 threads each write 16 blocks of 4 KiB at consecutive offsets
    /// (the cursor's pattern, block = i * 32 + thread); returns each
    /// thread's results.
    fn cursor_writes(g: &Gather, dev: &Slow, stats: &Stats) -> Vec<Vec<DeviceResult<()>>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..32u64)
                .map(|t| {
                    s.spawn(move || {
                        (0..16u64)
                            .map(|i| {
                                let block = i * 32 + t;
                                let data = vec![(block % 251) as u8 + 1; 4096];
                                g.write(dev, stats, &data, block * 4096)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn concurrent_adjacent_writes_go_down_in_batches_and_all_land() {
        let (g, dev, stats) = (Gather::new(), slow(None), Stats::default());
        let results = cursor_writes(&g, &dev, &stats);
        assert!(results.iter().flatten().all(|r| r.is_ok()));
        let mut buf = vec![0u8; 4096];
        for block in 0..512u64 {
            dev.read_at(&mut buf, block * 4096).unwrap();
            assert!(
                buf.iter().all(|&b| b == (block % 251) as u8 + 1),
                "block {block}"
            );
        }
        let writes = dev.writes.load(Ordering::Relaxed);
        let snap = stats.snapshot();
        // Every write queued behind another went in a batch: the device saw
        // the lone writes plus the batches' runs, far fewer than 512.
        assert_eq!(
            writes,
            512 - snap.gathered_writes + snap.gathered_device_writes
        );
        assert!(writes <= 384, "{writes} device writes for 512 ({snap:?})");
    }

    #[test]
    fn one_writer_is_never_held_back() {
        let (g, dev, stats) = (Gather::new(), slow(None), Stats::default());
        for block in 0..8u64 {
            g.write(&dev, &stats, &[7u8; 4096], block * 4096).unwrap();
        }
        assert_eq!(dev.writes.load(Ordering::Relaxed), 8);
        assert_eq!(stats.snapshot().gathered_writes, 0);
    }

    #[test]
    fn a_failed_batch_fails_only_the_write_over_the_bad_range() {
        let bad = 77 * 4096 + 512;
        let (g, dev, stats) = (Gather::new(), slow(Some(bad)), Stats::default());
        let results = cursor_writes(&g, &dev, &stats);
        for (t, rs) in results.iter().enumerate() {
            for (i, r) in rs.iter().enumerate() {
                let block = i as u64 * 32 + t as u64;
                assert_eq!(r.is_err(), block == 77, "block {block}: {r:?}");
            }
        }
        let mut buf = vec![0u8; 4096];
        dev.read_at(&mut buf, 78 * 4096).unwrap();
        assert!(buf.iter().all(|&b| b == 78 + 1));
    }
}
