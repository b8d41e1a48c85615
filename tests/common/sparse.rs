//! Device images kept as their non-zero 4 KiB pages
//! (scripts/sparse-image.py has the format): the fixtures of
//! tests/fixtures/, caches made by older releases.

use std::path::Path;

const MAGIC: &[u8] = b"TCSPARSE1\n";

/// The image `path` holds, every page not listed zero.
pub fn read(path: &Path) -> Vec<u8> {
    let blob = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        blob.starts_with(MAGIC),
        "{}: not a sparse image",
        path.display()
    );
    let word = |at: usize, n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&blob[at..at + n]);
        u64::from_le_bytes(b)
    };
    let size = word(MAGIC.len(), 8) as usize;
    let page = word(MAGIC.len() + 8, 4) as usize;
    let mut image = vec![0u8; size];
    let mut at = MAGIC.len() + 12;
    while at < blob.len() {
        let start = word(at, 8) as usize * page;
        let end = (start + page).min(size);
        image[start..end].copy_from_slice(&blob[at + 8..at + 8 + end - start]);
        at += 8 + page;
    }
    image
}
