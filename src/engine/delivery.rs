//! Where a read's data goes, and when its reader gets it (`Delivery`):
//! the read fills a buffer, one it makes (`Made`, for a caller that takes
//! it when the read returns) or one the reader lends (`Lent`: a ublk tag's,
//! filled with no copy, given back through a reply). A lent buffer is
//! given back as soon as it is filled, before what the read fetched to
//! keep is stored (`Cache::read_planned`, within cache/deferred.rs's
//! budget): the reader does not wait for the cache write. A made one
//! returns after it, so that a caller who reads, then asks what is cached
//! (NBD block status, `status`), sees the read's promotion.

use super::EngineError;
use crate::device::AlignedBuf;
use crate::volume::Dest;

pub(crate) trait Delivery {
    /// Runs `fill` over the read's buffer of `len` bytes.
    fn fill<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R;
    /// The buffer is filled: the reader may have it (once; later calls do
    /// nothing).
    fn deliver(&mut self);
    /// The read failed: the reader gets the error (unless it was delivered).
    fn fail(&mut self, e: EngineError);
    /// Delivered before the read's promotion is stored (module comment).
    fn early(&self) -> bool {
        false
    }
}

/// A buffer the read makes and its caller takes when the read returns.
#[derive(Default)]
pub(crate) struct Made(pub Option<AlignedBuf>);

impl Delivery for Made {
    fn fill<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        fill(self.0.insert(AlignedBuf::to_overwrite(len)))
    }
    fn deliver(&mut self) {}
    fn fail(&mut self, _: EngineError) {
        self.0 = None;
    }
}

/// The reader's buffer (`volume::Dest`, of the request's length), given
/// back to `to` with the outcome: after that the read touches it no more.
pub(crate) struct Lent<F: FnOnce(Dest, Result<(), EngineError>)> {
    dest: Option<Dest>,
    to: Option<F>,
}

impl<F: FnOnce(Dest, Result<(), EngineError>)> Lent<F> {
    pub(crate) fn new(dest: Dest, to: F) -> Self {
        Lent {
            dest: Some(dest),
            to: Some(to),
        }
    }

    fn give_back(&mut self, r: Result<(), EngineError>) {
        if let (Some(dest), Some(to)) = (self.dest.take(), self.to.take()) {
            to(dest, r);
        }
    }
}

impl<F: FnOnce(Dest, Result<(), EngineError>)> Delivery for Lent<F> {
    fn fill<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> R {
        let dest = self.dest.as_mut().expect("filled before it is given back");
        let buf = dest.as_mut_slice();
        let n = len.min(buf.len());
        fill(&mut buf[..n])
    }
    fn deliver(&mut self) {
        self.give_back(Ok(()));
    }
    fn fail(&mut self, e: EngineError) {
        self.give_back(Err(e));
    }
    fn early(&self) -> bool {
        true
    }
}
