//! A regular file or a block device, opened with O_DIRECT where the
//! filesystem allows it. (Minimal version; to be completed.)

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use super::{check_range, BlockDevice, DeviceError, DeviceResult};

pub struct FileDevice {
    name: String,
    file: File,
    size_bytes: u64,
}

impl FileDevice {
    pub fn open(path: &str) -> DeviceResult<Self> {
        let open_err = |reason: String| DeviceError::Open {
            spec: path.to_string(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| open_err(e.to_string()))?;
        let size_bytes = file.metadata().map_err(|e| open_err(e.to_string()))?.len();
        Ok(FileDevice {
            name: path.to_string(),
            file,
            size_bytes: size_bytes / 512 * 512,
        })
    }

    fn io_err(&self, what: &'static str, source: std::io::Error) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            what,
            source,
        }
    }
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_err("read", e))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io_err("write", e))
    }
    fn flush(&self) -> DeviceResult<()> {
        self.file.sync_data().map_err(|e| self.io_err("flush", e))
    }
    fn name(&self) -> &str {
        &self.name
    }
}
