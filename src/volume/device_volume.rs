//! [`DeviceVolume`]: a [`Volume`] over any [`BlockDevice`], running each
//! blocking device call on tokio's blocking pool. It exports a plain device
//! and is the reference volume the NBD tests run against.

use crate::device::{AlignedBuf, DeviceError, DeviceRef};
use crate::volume::{ErrorKind, Volume, VolumeError, VolumeResult};

/// Largest buffer written per device call when zeroing a range.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

pub struct DeviceVolume {
    dev: DeviceRef,
    preferred_block_bytes: u32,
}

impl DeviceVolume {
    /// Exports `dev`; `preferred_block_bytes` is advertised to clients.
    pub fn new(dev: DeviceRef, preferred_block_bytes: u32) -> Self {
        DeviceVolume {
            dev,
            preferred_block_bytes,
        }
    }

    pub fn device(&self) -> &DeviceRef {
        &self.dev
    }

    async fn blocking<T: Send + 'static>(
        &self,
        writes: bool,
        f: impl FnOnce(&DeviceRef) -> Result<T, DeviceError> + Send + 'static,
    ) -> VolumeResult<T> {
        let dev = self.dev.clone();
        match tokio::task::spawn_blocking(move || f(&dev)).await {
            Ok(r) => r.map_err(|e| volume_error(e, writes)),
            Err(e) => Err(VolumeError::new(ErrorKind::Io, format!("device task: {e}"))),
        }
    }
}

fn volume_error(e: DeviceError, writes: bool) -> VolumeError {
    let kind = match &e {
        DeviceError::OutOfRange { .. } if writes => ErrorKind::NoSpace,
        DeviceError::OutOfRange { .. } | DeviceError::Unaligned { .. } => ErrorKind::Invalid,
        DeviceError::Io { .. }
        | DeviceError::Injected { .. }
        | DeviceError::Open { .. }
        | DeviceError::Missing { .. }
        | DeviceError::Degraded { .. }
        | DeviceError::InUse { .. } => ErrorKind::Io,
    };
    VolumeError::new(kind, e.to_string())
}

impl Volume for DeviceVolume {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }

    fn preferred_block_bytes(&self) -> u32 {
        self.preferred_block_bytes
    }

    async fn read(&self, offset: u64, len: u32) -> VolumeResult<AlignedBuf> {
        self.blocking(false, move |d| {
            let mut buf = AlignedBuf::zeroed(len as usize);
            d.read_at(&mut buf, offset)?;
            Ok(buf)
        })
        .await
    }

    async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> VolumeResult<()> {
        self.blocking(true, move |d| {
            d.write_at(&data, offset)?;
            if fua {
                d.flush()?;
            }
            Ok(())
        })
        .await
    }

    async fn flush(&self) -> VolumeResult<()> {
        self.blocking(false, |d| d.flush()).await
    }

    async fn trim(&self, offset: u64, len: u64, fua: bool) -> VolumeResult<()> {
        self.blocking(true, move |d| {
            crate::device::check_range(&**d, offset, len)?;
            d.discard(offset, len)?;
            if fua {
                d.flush()?;
            }
            Ok(())
        })
        .await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> VolumeResult<()> {
        self.blocking(true, move |d| {
            crate::device::check_range(&**d, offset, len)?;
            let zeroes = AlignedBuf::zeroed(len.min(ZERO_CHUNK_BYTES) as usize);
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(ZERO_CHUNK_BYTES) as usize;
                d.write_at(&zeroes[..n], offset + done)?;
                done += n as u64;
            }
            if fua {
                d.flush()?;
            }
            Ok(())
        })
        .await
    }

    async fn prefetch(&self, offset: u64, len: u64) -> VolumeResult<()> {
        // A plain device has no cache to fill; only the range is checked.
        self.blocking(false, move |d| {
            crate::device::check_range(&**d, offset, len)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::ram::RamDevice;
    use std::sync::Arc;

    #[tokio::test]
    async fn round_trip_and_errors() {
        let v = DeviceVolume::new(Arc::new(RamDevice::new("ram", 1 << 20)), 4096);
        let data = AlignedBuf::from_slice(&[7u8; 4096]);
        v.write(8192, data, true).await.unwrap();
        assert!(v.read(8192, 4096).await.unwrap().iter().all(|&b| b == 7));
        v.write_zeroes(8192, 2048, false).await.unwrap();
        let back = v.read(8192, 4096).await.unwrap();
        assert!(back[..2048].iter().all(|&b| b == 0) && back[2048..].iter().all(|&b| b == 7));
        let e = v
            .write(1 << 20, AlignedBuf::zeroed(512), false)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoSpace);
        assert_eq!(v.read(1, 512).await.unwrap_err().kind, ErrorKind::Invalid);
    }
}
