//! A device that makes every request wait: a fixed delay before each read,
//! write and flush of the device it wraps, one request at a time, as a
//! single disk arm would (nbdkit's delay and noparallel filters together).
//! `tiercache demo` puts it in front of its origin file so that a cache
//! has something to hide.

use std::time::Duration;

use crate::sync::{Mutex, MutexGuard, Rank};

use super::{BlockDevice, DeviceRef, DeviceResult};

pub struct LatencyDevice {
    inner: DeviceRef,
    delay: Duration,
    name: String,
    /// Held across each request: requests wait for each other.
    arm: Mutex<()>,
}

impl LatencyDevice {
    pub fn new(inner: DeviceRef, delay: Duration) -> LatencyDevice {
        let name = format!("{} (+{} us a request)", inner.name(), delay.as_micros());
        LatencyDevice {
            inner,
            delay,
            name,
            arm: Mutex::new(Rank::Device, ()),
        }
    }

    fn wait(&self) -> MutexGuard<'_, ()> {
        let g = self.arm.lock();
        std::thread::sleep(self.delay);
        g
    }
}

impl BlockDevice for LatencyDevice {
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
        let _g = self.wait();
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        let _g = self.wait();
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DeviceResult<()> {
        let _g = self.wait();
        self.inner.flush()
    }
    fn discard_helps(&self) -> bool {
        self.inner.discard_helps()
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        let _g = self.wait();
        self.inner.discard(offset, len)
    }
    fn is_volatile(&self) -> bool {
        self.inner.is_volatile()
    }
    fn name(&self) -> &str {
        &self.name
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn requests_wait_and_pass_through() {
        let ram: DeviceRef = Arc::new(crate::device::ram::RamDevice::new("r", 1 << 20));
        let d = LatencyDevice::new(ram, Duration::from_millis(2));
        let t = Instant::now();
        d.write_at(&[7u8; 512], 512).unwrap();
        let mut b = [0u8; 512];
        d.read_at(&mut b, 512).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(4));
        assert_eq!(b, [7u8; 512]);
        assert_eq!(d.size_bytes(), 1 << 20);
    }
}
