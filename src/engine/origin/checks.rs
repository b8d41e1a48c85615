//! The origins a cache is made for and opened with: a new cache's volumes
//! checked before anything is written, an open's origins held against
//! what the superblock records, and origins that grew taken.

use crate::device::DeviceRef;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::format::volumes::{names_valid, VolumeEntry};
use crate::engine::format::Superblock;
use crate::engine::options::OpenOptions;

use super::address::MAX_VOLUME_BYTES;

/// The volumes of a new cache of `block_bytes` blocks: each origin holds
/// at least one block and at most `MAX_VOLUME_BYTES`, names are valid and
/// distinct, and no device is given twice (two volumes over one disk
/// would each cache the other's blocks as their own).
pub(crate) fn new_volumes(
    origins: &[(String, DeviceRef)],
    block_bytes: u32,
) -> EngineResult<Vec<VolumeEntry>> {
    let config = |m: String| Err(EngineError::Config(m));
    let names: Vec<String> = origins.iter().map(|(n, _)| n.clone()).collect();
    names_valid(&names).map_err(EngineError::Config)?;
    let mut out: Vec<VolumeEntry> = Vec::with_capacity(origins.len());
    for (name, origin) in origins {
        let bytes = origin.size_bytes();
        if bytes < block_bytes as u64 || bytes > MAX_VOLUME_BYTES {
            return config(format!(
                "origin {} has {bytes} bytes: an origin holds at least one cache block \
                 ({block_bytes} bytes) and at most {MAX_VOLUME_BYTES}",
                origin.name(),
            ));
        }
        // Identity 0: a device that cannot say (a RAM device).
        let same = |v: &&VolumeEntry| origin.identity() != 0 && v.identity == origin.identity();
        if let Some(v) = out.iter().find(same) {
            return config(format!(
                "{} is given twice (it is volume {}'s origin already)",
                origin.name(),
                v.name
            ));
        }
        out.push(VolumeEntry {
            name: name.clone(),
            bytes,
            identity: origin.identity(),
            mode: None,
            share: Default::default(),
            removed: false,
        });
    }
    Ok(out)
}

/// The superblock with volumes `names` appended for the last origins of
/// `origins` (the others are the cache's, in its order), each checked as
/// a new cache's are (`new_volumes`): names valid and distinct from every
/// volume's, sizes of one block to 4 PiB, no device twice.
pub(crate) fn add_volumes(
    mut sb: Superblock,
    origins: &[DeviceRef],
    names: &[String],
) -> EngineResult<Superblock> {
    if names.is_empty() {
        return Ok(sb);
    }
    let mut volumes = sb.volume_list();
    if volumes.len() + names.len() != origins.len() {
        return Err(EngineError::Config(format!(
            "adding {} volumes to a cache of {} takes {} origins, not {}",
            names.len(),
            volumes.len(),
            volumes.len() + names.len(),
            origins.len()
        )));
    }
    // The cache's volumes as they are, then the new ones, checked together.
    let named: Vec<(String, DeviceRef)> = (volumes.iter().map(|v| v.name.clone()))
        .chain(names.iter().cloned())
        .zip(origins.iter().cloned())
        .collect();
    let checked = new_volumes(&named, sb.block_bytes.get())?;
    volumes.extend(checked.into_iter().skip(volumes.len()));
    sb.set_volume_list(&volumes);
    Ok(sb)
}

/// The origins must be the ones the cache was made for, in its order:
/// same identity unless forced, same size unless the operator says they
/// grew (`origin_grew`: the volume then has its new size from this open
/// on, `take_sizes`). One that shrank is refused always: blocks cached or
/// dirty past its new end would have nowhere to go.
pub(crate) fn check_origins(
    sb: &Superblock,
    origins: &[DeviceRef],
    opts: &OpenOptions,
) -> EngineResult<()> {
    let recorded = sb.volume_list();
    if recorded.len() != origins.len() {
        let names: Vec<&str> = recorded.iter().map(|v| v.name.as_str()).collect();
        let cut_short = match recorded.len().checked_sub(origins.len()) {
            Some(1) => "; if `tiercache add-origin` was cut short, run it again to finish it",
            None if origins.len() == recorded.len() + 1 => {
                "; if `tiercache remove-origin` was cut short, run it again to finish it"
            }
            _ => "",
        };
        return Err(EngineError::OriginMismatch {
            what: format!(
                "the cache holds {} volumes ({}) but {} origins were given{cut_short}",
                recorded.len(),
                names.join(", "),
                origins.len()
            ),
        });
    }
    for (v, origin) in recorded.iter().zip(origins) {
        let of = if recorded.len() > 1 {
            format!(" (volume {})", v.name)
        } else {
            String::new()
        };
        check_origin(v, origin, &of, opts)?;
    }
    Ok(())
}

fn check_origin(
    v: &VolumeEntry,
    origin: &DeviceRef,
    of: &str,
    opts: &OpenOptions,
) -> EngineResult<()> {
    let mismatch = |what: String| Err(EngineError::OriginMismatch { what });
    let (now, was) = (origin.size_bytes(), v.bytes);
    if now > MAX_VOLUME_BYTES {
        // Its blocks past 4 PiB would have the next volume's keys.
        return mismatch(format!(
            "{}{of} has {now} bytes, more than a volume's {MAX_VOLUME_BYTES}",
            origin.name()
        ));
    }
    if now > was && !opts.origin_grew {
        return mismatch(format!(
            "{}{of} has {now} bytes but the cache was made for {was} bytes: if it is the same \
             origin grown (lvextend, a longer file, rbd resize), start it with \
             `tiercache serve --origin-grew`; another device must not be used",
            origin.name(),
        ));
    }
    if now < was {
        return mismatch(format!(
            "{}{of} has {now} bytes, fewer than the {was} bytes the cache was made for: an \
             origin may grow under a cache but not shrink (what was cached past its new end \
             would be lost); give it its size back",
            origin.name(),
        ));
    }
    if v.identity != origin.identity() && !opts.force {
        return mismatch(format!(
            "{}{of} is not the device the cache was created for (identity differs)",
            origin.name()
        ));
    }
    Ok(())
}

/// An origin's size read again while it is served (`Engine::grow_volume`):
/// `now` must not be below `was` (what was cached past the new end would
/// have nowhere to go) nor past a volume's 4 PiB.
pub(crate) fn check_growth(
    origin: &DeviceRef,
    volume: &str,
    was: u64,
    now: u64,
) -> EngineResult<()> {
    let refuse = |what: String| Err(EngineError::Config(what));
    if now < was {
        return refuse(format!(
            "{} (volume {volume}) now has {now} bytes, fewer than its {was}: an origin may \
             grow under a cache but not shrink (what was cached past its new end would be \
             lost); give it its size back",
            origin.name()
        ));
    }
    if now > MAX_VOLUME_BYTES {
        return refuse(format!(
            "{} (volume {volume}) now has {now} bytes, more than a volume's {MAX_VOLUME_BYTES}",
            origin.name()
        ));
    }
    Ok(())
}

/// The superblock with the origins' sizes now (`check_origins` let only
/// grown ones through). A writing open flushes a grown origin first, so
/// its new length is durable before the cache records it, then writes the
/// size before any request (`start_journal`); until then a crash leaves
/// the old size, and the next open (told again) grows again.
pub(crate) fn take_sizes(
    mut sb: Superblock,
    origins: &[DeviceRef],
    writing: bool,
) -> EngineResult<Superblock> {
    let mut volumes = sb.volume_list();
    for (v, origin) in volumes.iter_mut().zip(origins) {
        let (was, now) = (v.bytes, origin.size_bytes());
        if now == was {
            continue;
        }
        if writing {
            origin.flush()?;
            log::info!(
                "{}: the origin of {} grew from {was} to {now} bytes; the volume has the new size",
                origin.name(),
                v.name
            );
        }
        v.bytes = now;
    }
    sb.set_volume_list(&volumes);
    Ok(sb)
}
