//! Sector-aligned heap buffers.
//!
//! O_DIRECT requires the memory address, the length and the file offset of
//! every transfer to be multiples of the device's logical block size. All
//! buffers that reach a device are [`AlignedBuf`]s aligned to 4096 bytes, which
//! satisfies every logical block size Linux supports (512 and 4096).
//!
//! Large buffers are kept for reuse when they drop (`Pool`): glibc serves
//! them with fresh pages from the kernel (mmap, or an arena trimmed on the
//! previous free), so each read miss of 256 KiB faulted in and zeroed 64
//! pages twice; under emulation the faults cost more than the origin's
//! own time (docs/benchmarks.md, the seed case). A reused buffer is zeroed
//! again by `zeroed` (a memset of mapped memory, no fault), so no data of
//! one request reaches another.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

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

/// Buffers from `POOL_MIN_BYTES` to `POOL_MAX_BYTES` (allocated sizes, a
/// power of two each) are pooled, at most `POOL_KEEP_BYTES` in all.
const POOL_MIN_BYTES: usize = 128 << 10;
const POOL_MAX_BYTES: usize = 4 << 20;
const POOL_KEEP_BYTES: usize = 32 << 20;
const POOL_CLASSES: usize =
    (POOL_MAX_BYTES.trailing_zeros() - POOL_MIN_BYTES.trailing_zeros() + 1) as usize;

/// An allocation of the pool's class size, not in use.
struct Free(NonNull<u8>);

// SAFETY: a free allocation belongs to no one; the pool hands it to one
// AlignedBuf at a time.
unsafe impl Send for Free {}

/// Free large buffers by size class (module comment).
struct Pool {
    classes: [Mutex<Vec<Free>>; POOL_CLASSES],
    /// Bytes held in `classes`.
    kept: AtomicUsize,
}

static POOL: Pool = Pool {
    classes: [const { Mutex::new(Vec::new()) }; POOL_CLASSES],
    kept: AtomicUsize::new(0),
};

impl Pool {
    /// The class and allocated size of a pooled buffer of `len` bytes.
    fn class_of(len: usize) -> Option<(usize, usize)> {
        if !(POOL_MIN_BYTES / 2 < len && len <= POOL_MAX_BYTES) {
            return None;
        }
        let cap = len.next_power_of_two().max(POOL_MIN_BYTES);
        let class = (cap.trailing_zeros() - POOL_MIN_BYTES.trailing_zeros()) as usize;
        Some((class, cap))
    }

    fn take(&self, class: usize, cap: usize) -> Option<NonNull<u8>> {
        let free = self.classes[class].lock().pop()?;
        self.kept.fetch_sub(cap, Ordering::Relaxed);
        Some(free.0)
    }

    /// Keeps `ptr` (of `cap` bytes) if the pool has room; false if not.
    fn give(&self, class: usize, cap: usize, ptr: NonNull<u8>) -> bool {
        if self.kept.fetch_add(cap, Ordering::Relaxed) + cap > POOL_KEEP_BYTES {
            self.kept.fetch_sub(cap, Ordering::Relaxed);
            return false;
        }
        self.classes[class].lock().push(Free(ptr));
        true
    }
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        if let Some((class, cap)) = Pool::class_of(len) {
            if let Some(ptr) = POOL.take(class, cap) {
                // SAFETY: a pooled allocation of cap >= len bytes, ours now.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
                return AlignedBuf { ptr, len, cap };
            }
            return Self::allocated(len, cap);
        }
        Self::allocated(len, len.div_ceil(BUF_ALIGN_BYTES).max(1) * BUF_ALIGN_BYTES)
    }

    /// A buffer of `len` bytes whose contents are unspecified: a reused
    /// buffer keeps what it held (other requests' data), so the caller
    /// must overwrite every byte before any of it leaves the process (a
    /// failed fill drops the buffer). Saves `zeroed`'s memset, which under
    /// emulation costs as much as a copy (docs/benchmarks.md, the seed case).
    pub fn to_overwrite(len: usize) -> Self {
        match Pool::class_of(len).and_then(|(class, cap)| Some((POOL.take(class, cap)?, cap))) {
            Some((ptr, cap)) => AlignedBuf { ptr, len, cap },
            None => Self::zeroed(len),
        }
    }

    fn allocated(len: usize, cap: usize) -> Self {
        let layout = Layout::from_size_align(cap, BUF_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        // Every byte is overwritten: not zeroed first (a kept buffer, or
        // a fresh one the allocator zeroes only if it must).
        let mut b = Self::to_overwrite(data.len());
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
        if let Some((class, cap)) = Pool::class_of(self.cap) {
            if cap == self.cap && POOL.give(class, cap, self.ptr) {
                return;
            }
        }
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

    #[test]
    fn a_reused_buffer_is_zeroed_again() {
        // Other tests allocate from the same pool at the same time: every
        // buffer must come back zeroed whether it was reused or not.
        for round in 0..50 {
            let len = (200 << 10) + round * 512;
            let mut b = AlignedBuf::zeroed(len);
            assert!(b.iter().all(|&x| x == 0), "round {round}");
            b.fill(0xa5);
            let ptr = b.as_ptr();
            drop(b);
            let again = AlignedBuf::zeroed(len);
            assert!(is_aligned_ptr(again.as_ptr()));
            assert!(
                again.iter().all(|&x| x == 0),
                "round {round}: reused {}",
                again.as_ptr() == ptr
            );
        }
    }

    #[test]
    fn a_buffer_to_overwrite_is_aligned_and_of_its_length() {
        for len in [
            0usize,
            512,
            4096,
            100 << 10,
            255 << 10,
            POOL_MAX_BYTES,
            POOL_MAX_BYTES + 4096,
        ] {
            drop(AlignedBuf::zeroed(len));
            let b = AlignedBuf::to_overwrite(len);
            assert_eq!(b.len(), len);
            assert!(is_aligned_ptr(b.as_ptr()));
        }
    }

    #[test]
    fn the_pool_keeps_a_bounded_amount() {
        let bufs: Vec<AlignedBuf> = (0..40)
            .map(|_| AlignedBuf::zeroed(POOL_MAX_BYTES))
            .collect();
        drop(bufs);
        assert!(POOL.kept.load(Ordering::Relaxed) <= POOL_KEEP_BYTES);
        for len in [POOL_MIN_BYTES / 2, POOL_MAX_BYTES + 1] {
            assert!(Pool::class_of(len).is_none(), "{len}");
        }
        assert_eq!(
            Pool::class_of(POOL_MIN_BYTES / 2 + 1),
            Some((0, POOL_MIN_BYTES))
        );
        assert_eq!(Pool::class_of(255 << 10), Some((1, 256 << 10)));
        assert_eq!(
            Pool::class_of(POOL_MAX_BYTES),
            Some((POOL_CLASSES - 1, POOL_MAX_BYTES))
        );
    }
}
