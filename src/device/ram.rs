//! `ram:SIZE`: a volatile device in process memory. Its contents are lost when
//! the process exits, so the engine refuses writeback on it unless the user
//! accepts data loss.

use parking_lot::RwLock;

use super::{check_range, BlockDevice, DeviceResult};

/// Bytes per independently locked chunk, so requests to different chunks
/// never wait on each other.
const CHUNK_BYTES: u64 = 1 << 20;

pub struct RamDevice {
    name: String,
    size_bytes: u64,
    chunks: Vec<RwLock<Box<[u8]>>>,
}

impl RamDevice {
    pub fn new(name: &str, size_bytes: u64) -> Self {
        let n = size_bytes.div_ceil(CHUNK_BYTES);
        let chunks = (0..n)
            .map(|i| {
                let len = (size_bytes - i * CHUNK_BYTES).min(CHUNK_BYTES) as usize;
                RwLock::new(vec![0u8; len].into_boxed_slice())
            })
            .collect();
        RamDevice {
            name: name.to_string(),
            size_bytes,
            chunks,
        }
    }

    /// Calls `f(chunk_index, offset_in_chunk, range_in_buf)` for each chunk piece.
    fn for_each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>),
    ) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let chunk = (pos / CHUNK_BYTES) as usize;
            let in_chunk = (pos % CHUNK_BYTES) as usize;
            let n = (CHUNK_BYTES as usize - in_chunk).min(len - done);
            f(chunk, in_chunk, done..done + n);
            done += n;
        }
    }
}

impl BlockDevice for RamDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len(), |c, at, r| {
            let chunk = self.chunks[c].read();
            let n = r.len();
            buf[r].copy_from_slice(&chunk[at..at + n]);
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DeviceResult<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len(), |c, at, r| {
            let mut chunk = self.chunks[c].write();
            let n = r.len();
            chunk[at..at + n].copy_from_slice(&buf[r]);
        });
        Ok(())
    }

    fn flush(&self) -> DeviceResult<()> {
        Ok(())
    }

    /// Gives the memory's contents up (zeroes).
    fn discard_helps(&self) -> bool {
        true
    }
    fn discard(&self, offset: u64, len: u64) -> DeviceResult<()> {
        check_range(self, offset, len)?;
        self.for_each_piece(offset, len as usize, |c, at, r| {
            self.chunks[c].write()[at..at + r.len()].fill(0);
        });
        Ok(())
    }

    fn is_volatile(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_chunks() {
        let d = RamDevice::new("ram:3M", 3 << 20);
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let off = CHUNK_BYTES - 4096;
        d.write_at(&data, off).unwrap();
        let mut back = vec![0u8; 8192];
        d.read_at(&mut back, off).unwrap();
        assert_eq!(back, data);
        assert!(d.read_at(&mut back, (3 << 20) - 4096).is_err());
        assert!(d.write_at(&data[..100], 0).is_err());
    }
}
