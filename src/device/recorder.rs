//! A recording device wrapper for crash tests: one ordered log of every
//! write, flush and discard of every device of a simulated machine, and a
//! replayer that rebuilds what the media of all devices hold after a power
//! loss at any point of that log.
//!
//! # Model
//!
//! - **One log for the machine.** Every [`RecordingDevice`] made by one
//!   [`EventLog`] appends to it. The log lock is held while the wrapped
//!   device carries the operation out, so the log order is the completion
//!   order across all devices, and a flush in the log follows every write it
//!   covers (a flush makes the writes completed before it durable, as the
//!   [`BlockDevice`] contract says). Failed operations are not logged: the
//!   wrapped device must change nothing when it fails one (as
//!   [`super::fault::FaultDevice`] does).
//! - **Markers.** A test adds [`EventLog::mark`] events (e.g. "write 17
//!   acknowledged") to place its own history between the device events.
//! - **Crash at a log position.** [`Replay`] applies a prefix of the log to
//!   the initial images. Per device it keeps the durable image (every write up
//!   to that device's last flush) and the writes completed since (the current
//!   epoch). [`Replay::image`] builds the media after a power loss there: the
//!   durable image plus, per [`Survival`], none, all, or a seeded random subset
//!   of the epoch's writes, each one dropped, applied whole or torn at
//!   512-byte sectors, and applied in a random order, the same model as
//!   `FaultDevice::power_loss_image`. A discard is a write of zeroes (the
//!   wrapped device must read zeroes after a discard, as FaultDevice and the
//!   RAM device do).
//!
//! Devices must be small (whole images live in memory); this is for tests.

use std::sync::Arc;

use crate::sync::{Mutex, Rank};

use super::fault::for_surviving_sectors;
use super::{BlockDevice, DeviceRef, DeviceResult, SECTOR_BYTES};

/// One entry of the log.
#[derive(Clone, Debug)]
pub enum Event {
    /// A completed write on device `device` (index in creation order).
    Write {
        device: usize,
        offset: u64,
        data: Arc<[u8]>,
    },
    /// A completed discard; replayed as a write of zeroes.
    Discard {
        device: usize,
        offset: u64,
        len: u64,
    },
    /// A completed flush: the device's writes before it are durable.
    Flush { device: usize },
    /// A test's own marker (meaning is up to the test).
    Mark(u64),
}

/// The ordered log shared by the devices of one simulated machine; cloning
/// shares it.
#[derive(Clone)]
pub struct EventLog {
    state: Arc<Mutex<LogState>>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            state: Arc::new(Mutex::new(Rank::Device, LogState::default())),
        }
    }
}

#[derive(Default)]
struct LogState {
    events: Vec<Event>,
    devices: usize,
}

impl EventLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps `inner`; the wrapper's operations are logged with the device
    /// index returned by [`RecordingDevice::index`] (0, 1, ... in call order).
    pub fn record(&self, inner: DeviceRef) -> RecordingDevice {
        let mut st = self.state.lock();
        let index = st.devices;
        st.devices += 1;
        RecordingDevice {
            inner,
            log: self.clone(),
            index,
        }
    }

    /// Appends a marker.
    pub fn mark(&self, tag: u64) {
        self.state.lock().events.push(Event::Mark(tag));
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        self.state.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the log.
    pub fn events(&self) -> Vec<Event> {
        self.state.lock().events.clone()
    }
}

/// A device whose completed writes, flushes and discards are logged.
pub struct RecordingDevice {
    inner: DeviceRef,
    log: EventLog,
    index: usize,
}

impl RecordingDevice {
    /// This device's index in the log's events.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl BlockDevice for RecordingDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn refresh_size(&self) -> DeviceResult<u64> {
        self.inner.refresh_size()
    }
    fn let_go(&self) -> DeviceResult<()> {
        self.inner.let_go()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        let mut st = self.log.state.lock();
        self.inner.write_at(buf, offset)?;
        st.events.push(Event::Write {
            device: self.index,
            offset,
            data: buf.into(),
        });
        Ok(())
    }

    fn flush(&self) -> DeviceResult<()> {
        let mut st = self.log.state.lock();
        self.inner.flush()?;
        st.events.push(Event::Flush { device: self.index });
        Ok(())
    }

    fn discard_helps(&self) -> bool {
        self.inner.discard_helps()
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        let mut st = self.log.state.lock();
        self.inner.discard(offset, len)?;
        st.events.push(Event::Discard {
            device: self.index,
            offset,
            len,
        });
        Ok(())
    }

    fn is_volatile(&self) -> bool {
        self.inner.is_volatile()
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn identity(&self) -> u64 {
        self.inner.identity()
    }
    fn health(&self) -> Option<super::DeviceHealth> {
        self.inner.health()
    }
    fn loss_epoch(&self) -> u64 {
        self.inner.loss_epoch()
    }
}

/// Which of a device's unflushed writes survive a power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Survival {
    /// None: the durable image only.
    NoneSurvive,
    /// All, in completion order: what reads saw just before the crash.
    AllSurvive,
    /// Seeded: each write dropped, applied whole or torn at 512-byte
    /// sectors, survivors applied in a random order.
    Random(u64),
}

/// What an unflushed write put on the device (a discard puts zeroes).
#[derive(Clone, Debug)]
struct Pending {
    offset: u64,
    len_bytes: u64,
    data: Option<Arc<[u8]>>,
}

impl Pending {
    fn apply_sector(&self, image: &mut [u8], sector_index: usize) {
        let sector = SECTOR_BYTES as usize;
        let in_write = sector_index * sector;
        let at = self.offset as usize + in_write;
        let dst = &mut image[at..at + sector];
        match &self.data {
            Some(d) => dst.copy_from_slice(&d[in_write..in_write + sector]),
            None => dst.fill(0),
        }
    }

    fn apply(&self, image: &mut [u8]) {
        let at = self.offset as usize;
        let dst = &mut image[at..at + self.len_bytes as usize];
        match &self.data {
            Some(d) => dst.copy_from_slice(d),
            None => dst.fill(0),
        }
    }

    fn sector_count(&self) -> usize {
        (self.len_bytes / SECTOR_BYTES) as usize
    }
}

struct DeviceState {
    durable: Vec<u8>,
    unflushed: Vec<Pending>,
}

/// Applies a log, event by event, to the initial images of its devices.
pub struct Replay {
    devices: Vec<DeviceState>,
}

impl Replay {
    /// `initial[i]` is the content of device `i` when logging started.
    pub fn new(initial: Vec<Vec<u8>>) -> Self {
        Replay {
            devices: initial
                .into_iter()
                .map(|durable| DeviceState {
                    durable,
                    unflushed: Vec::new(),
                })
                .collect(),
        }
    }

    /// Advances by one event. Markers change nothing.
    ///
    /// # Panics
    /// If the event names a device or range the initial images lack (a
    /// test's mistake).
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Write {
                device,
                offset,
                data,
            } => self.devices[*device].unflushed.push(Pending {
                offset: *offset,
                len_bytes: data.len() as u64,
                data: Some(data.clone()),
            }),
            Event::Discard {
                device,
                offset,
                len,
            } => self.devices[*device].unflushed.push(Pending {
                offset: *offset,
                len_bytes: *len,
                data: None,
            }),
            Event::Flush { device } => {
                let d = &mut self.devices[*device];
                for p in d.unflushed.drain(..) {
                    p.apply(&mut d.durable);
                }
            }
            Event::Mark(_) => {}
        }
    }

    /// Writes and discards of `device` completed since its last flush.
    pub fn unflushed(&self, device: usize) -> usize {
        self.devices[device].unflushed.len()
    }

    /// The media of `device` after a power loss at the current position.
    pub fn image(&self, device: usize, survival: Survival) -> Vec<u8> {
        let d = &self.devices[device];
        let mut image = d.durable.clone();
        match survival {
            Survival::NoneSurvive => {}
            Survival::AllSurvive => d.unflushed.iter().for_each(|p| p.apply(&mut image)),
            Survival::Random(seed) => {
                for_surviving_sectors(seed, &d.unflushed, Pending::sector_count, |p, i| {
                    p.apply_sector(&mut image, i)
                })
            }
        }
        image
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::fault::FaultDevice;

    fn dev(log: &EventLog, name: &str) -> (Arc<FaultDevice>, RecordingDevice) {
        let inner = Arc::new(FaultDevice::new(name, 8192, 0));
        let rec = log.record(inner.clone());
        (inner, rec)
    }

    #[test]
    fn one_ordered_log_across_devices() {
        let log = EventLog::new();
        let (a_inner, a) = dev(&log, "a");
        let (_, b) = dev(&log, "b");
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(a.identity(), a_inner.identity());
        a.write_at(&[1u8; 512], 0).unwrap();
        log.mark(7);
        b.write_at(&[2u8; 1024], 512).unwrap();
        a.flush().unwrap();
        b.discard(512, 512).unwrap();
        // A refused request is not logged.
        assert!(a.write_at(&[1u8; 512], 1 << 20).is_err());
        let ev = log.events();
        assert_eq!(ev.len(), 5);
        assert!(matches!(
            ev[0],
            Event::Write {
                device: 0,
                offset: 0,
                ..
            }
        ));
        assert!(matches!(ev[1], Event::Mark(7)));
        assert!(matches!(
            ev[2],
            Event::Write {
                device: 1,
                offset: 512,
                ..
            }
        ));
        assert!(matches!(ev[3], Event::Flush { device: 0 }));
        assert!(matches!(
            ev[4],
            Event::Discard {
                device: 1,
                offset: 512,
                len: 512
            }
        ));

        let mut replay = Replay::new(vec![vec![0u8; 8192], vec![9u8; 8192]]);
        for e in &ev[..3] {
            replay.apply(e);
        }
        // Before a's flush: a's write may be lost.
        assert_eq!(replay.unflushed(0), 1);
        assert_eq!(replay.image(0, Survival::NoneSurvive)[0], 0);
        assert_eq!(replay.image(0, Survival::AllSurvive)[0], 1);
        replay.apply(&ev[3]);
        assert_eq!(replay.image(0, Survival::NoneSurvive)[0], 1);
        replay.apply(&ev[4]);
        let all = replay.image(1, Survival::AllSurvive);
        assert_eq!((all[0], all[512], all[1024]), (9, 0, 2));
        let none = replay.image(1, Survival::NoneSurvive);
        assert_eq!((none[512], none[1024]), (9, 9));
    }

    #[test]
    fn random_survival_drops_keeps_and_tears_sector_atomically() {
        let mut replay = Replay::new(vec![vec![0u8; 8192]]);
        replay.apply(&Event::Write {
            device: 0,
            offset: 0,
            data: vec![5u8; 4096].into(),
        });
        let (mut dropped, mut whole, mut torn) = (0, 0, 0);
        for seed in 0..200 {
            let image = replay.image(0, Survival::Random(seed));
            assert_eq!(
                image,
                replay.image(0, Survival::Random(seed)),
                "seed {seed}"
            );
            let new = image[..4096]
                .chunks(512)
                .filter(|s| {
                    assert!(s.iter().all(|&b| b == s[0]), "a sector was split");
                    s[0] == 5
                })
                .count();
            match new {
                0 => dropped += 1,
                8 => whole += 1,
                _ => torn += 1,
            }
        }
        assert!(dropped > 0 && whole > 0 && torn > 0);
    }
}
