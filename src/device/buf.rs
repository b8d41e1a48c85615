//! Sector-aligned heap buffers.
//!
//! O_DIRECT requires the memory address, the length and the file offset of
//! every transfer to be multiples of the device's logical block size. All
//! buffers that reach a device are [`AlignedBuf`]s aligned to 4096 bytes, which
//! satisfies every logical block size Linux supports (512 and 4096).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`], in bytes.
pub const BUF_ALIGN_BYTES: usize = 4096;

/// A zero-initialised, 4096-byte-aligned, fixed-length byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Allocated size: `len` rounded up to the alignment, at least one page.
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8], like Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let cap = len.div_ceil(BUF_ALIGN_BYTES).max(1) * BUF_ALIGN_BYTES;
        let layout = Layout::from_size_align(cap, BUF_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shortens the buffer to `len` bytes (never grows it).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap >= len bytes and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, BUF_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// True if `p` is aligned for O_DIRECT.
pub fn is_aligned_ptr(p: *const u8) -> bool {
    (p as usize).is_multiple_of(BUF_ALIGN_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0usize, 1, 511, 4096, 4097, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(is_aligned_ptr(b.as_ptr()));
            assert!(b.iter().all(|&x| x == 0));
        }
    }
}
