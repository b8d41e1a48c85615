//! Opening a set from its members.
//!
//! Each device given is read for its label. One that cannot be used (it
//! could not be opened at all: ENOENT, EIO on its first read, see
//! [`open_paths`]; its label cannot be read; it holds no valid label) is
//! *left out*, the reason kept for the log and the messages: the set is
//! what the labels that were read say. The one with the highest generation
//! names the stale members (failed, or being rebuilt, when it was written).
//!
//! - A member absent (left out or not given) that this label names stale
//!   is not needed: it failed while the set was serving, and the members
//!   left recorded that (their labels written and flushed) before the
//!   request that met the failure returned. The set opens degraded by
//!   itself: a daemon killed after it lost a member comes back without an
//!   operator.
//! - A member absent that no label read names stale may hold the only
//!   current copies (its own label might name the others stale): the open
//!   is refused, saying so, which member is missing and why, and the two
//!   ways on: `serve --degraded` (the operator's word that it holds
//!   nothing newer) or `replace-cache` (which opens degraded the same way
//!   and rebuilds its copies onto a new device). With `allow_missing`
//!   (that word) such members are marked failed in the labels of the
//!   others.
//!
//! A device held by another process is not left out: that open fails
//! (`DeviceError::InUse`, naming the holder), as for one cache device.
//! What was left out, and why, is in the refusal, or in the log line of
//! a degraded open (a refused command prints its one error line only).

use super::{
    check_member_size, open_error, set_name, CacheSet, Label, MemberState, SetState, LABEL_BYTES,
};
use crate::device::{DeviceError, DeviceRef, DeviceResult};

/// A member device that could not be used at open, and why.
#[derive(Clone, Debug)]
pub struct LeftOut {
    /// Its path (or device name).
    pub name: String,
    pub why: String,
}

/// Opens the set whose members are at `paths`, in any order, each with
/// `open` (`open_device`, or its read-only twin): a path that cannot be
/// opened is left out (see the module comment), one held by another
/// process is the error.
pub fn open_paths(
    paths: &[String],
    allow_missing: bool,
    open: impl Fn(&str) -> DeviceResult<DeviceRef>,
) -> DeviceResult<CacheSet> {
    let mut devs = Vec::new();
    let mut left_out = Vec::new();
    for p in paths {
        match open(p) {
            Ok(d) => devs.push(d),
            Err(e @ DeviceError::InUse { .. }) => return Err(e),
            Err(e) => {
                left_out.push(LeftOut {
                    name: p.clone(),
                    why: e.to_string(),
                });
            }
        }
    }
    CacheSet::open_with(devs, left_out, allow_missing)
}

/// "a (why), b (why)".
fn listed(left_out: &[LeftOut]) -> String {
    let each: Vec<String> = left_out
        .iter()
        .map(|l| format!("{} ({})", l.name, l.why))
        .collect();
    each.join(", ")
}

/// The label of each device that has one; the others join `left_out`.
fn read_labels(devs: Vec<DeviceRef>, left_out: &mut Vec<LeftOut>) -> Vec<(DeviceRef, Label)> {
    let mut labelled = Vec::new();
    for d in devs {
        let why = match CacheSet::read_label(&d) {
            Ok(Ok(l)) => {
                labelled.push((d, l));
                continue;
            }
            Ok(Err(e)) => format!("not a cache-set member: {e}"),
            Err(e) => format!("its label cannot be read: {e}"),
        };
        left_out.push(LeftOut {
            name: d.name().to_string(),
            why,
        });
    }
    labelled
}

/// Each member's device by its index, from the labels; refuses members of
/// another set and a member given twice. A former member (its place was
/// given to another device since: the serials differ) joins `left_out`.
fn place(
    labelled: &[(DeviceRef, Label)],
    newest: &Label,
    left_out: &mut Vec<LeftOut>,
) -> DeviceResult<Vec<Option<DeviceRef>>> {
    let mut slots: Vec<Option<DeviceRef>> = vec![None; newest.member_count()];
    for (d, l) in labelled {
        if l.set_id != newest.set_id || l.geometry != newest.geometry {
            return Err(open_error(d.name(), "a member of another cache set"));
        }
        let (own, set) = (l.own_serial(), newest.serials[l.member_index]);
        if own != set {
            let why = format!(
                "a former member {}: its place was given to another device since (serial {own}, \
                 the set's {set}); never read",
                l.member_index
            );
            left_out.push(LeftOut {
                name: d.name().to_string(),
                why,
            });
            continue;
        }
        if slots[l.member_index].is_some() {
            return Err(open_error(
                d.name(),
                format!("member {} given twice", l.member_index),
            ));
        }
        check_member_size(d, l)?;
        slots[l.member_index] = Some(d.clone());
    }
    Ok(slots)
}

/// The refusal to open without members `missing` that no label names
/// failed.
fn missing_error(
    name: &str,
    missing: &[usize],
    left_out: &[LeftOut],
    newest: &Label,
) -> DeviceError {
    let why = if left_out.is_empty() {
        String::new()
    } else {
        format!(" (left out: {})", listed(left_out))
    };
    DeviceError::Degraded {
        spec: name.to_string(),
        reason: format!(
            "member(s) {missing:?} of the set are missing{why}, and the label of member {} \
             (generation {}) does not name them failed, so the members here cannot be proven \
             current: a missing member may hold the only current copies of the metadata and \
             dirty data. If it holds nothing newer (it failed, or was removed, while the set \
             was not serving), serve without it with `tiercache serve --degraded`, or rebuild \
             its copies onto a new device with `tiercache replace-cache OLD NEW`; else bring it \
             back",
            newest.member_index, newest.generation
        ),
    }
}

impl CacheSet {
    /// Reads a device's current label.
    pub fn read_label(dev: &DeviceRef) -> DeviceResult<Result<Label, String>> {
        if dev.size_bytes() < LABEL_BYTES {
            return Ok(Err("too small for a label".into()));
        }
        let mut pages = vec![0u8; LABEL_BYTES as usize];
        dev.read_at(&mut pages, 0)?;
        let (a, b) = pages.split_at(4096);
        Ok(Label::current([a, b]))
    }

    /// Opens a set from its devices, in any order (see the module
    /// comment): a device whose label cannot be read is left out;
    /// `allow_missing` is the operator's word that members no label
    /// names failed may be left out too.
    pub fn open(devs: Vec<DeviceRef>, allow_missing: bool) -> DeviceResult<CacheSet> {
        CacheSet::open_with(devs, Vec::new(), allow_missing)
    }

    /// `open`, with the devices that could not even be opened
    /// (`left_out`), for the log and the messages.
    pub fn open_with(
        devs: Vec<DeviceRef>,
        mut left_out: Vec<LeftOut>,
        allow_missing: bool,
    ) -> DeviceResult<CacheSet> {
        let labelled = read_labels(devs, &mut left_out);
        let Some(newest) = labelled.iter().map(|(_, l)| l).max_by_key(|l| l.generation) else {
            return Err(open_error(
                "cache set",
                if left_out.is_empty() {
                    "no member given".to_string()
                } else {
                    format!("no member's label could be read: {}", listed(&left_out))
                },
            ));
        };
        let newest = newest.clone();
        let slots = place(&labelled, &newest, &mut left_out)?;
        let name = set_name(&slots);
        let n = slots.len();
        let named = newest.stale_mask;
        let missing: Vec<usize> = (0..n)
            .filter(|&i| slots[i].is_none() && named & (1 << i) == 0)
            .collect();
        if !missing.is_empty() && !allow_missing {
            return Err(missing_error(&name, &missing, &left_out, &newest));
        }
        let stale = missing.iter().fold(named, |m, &i| m | 1 << i);
        if (0..2).all(|i| stale & (1 << i) != 0) {
            return Err(open_error(
                &name,
                "members 0 and 1 are both failed or missing: the metadata and dirty data are gone",
            ));
        }
        let members = (0..n)
            .map(|i| {
                let state = if stale & (1 << i) != 0 {
                    MemberState::Failed
                } else {
                    MemberState::Healthy
                };
                (slots[i].clone(), state)
            })
            .collect();
        let set = CacheSet::assemble(
            name,
            newest.set_id,
            newest.geometry.clone(),
            members,
            SetState {
                generation: newest.generation,
                stale_mask: named,
                flags: newest.flags,
                serials: newest.serials,
            },
        );
        set.note_named_failed(&newest, &left_out);
        set.fail_missing(&missing, &left_out);
        Ok(set)
    }

    /// With the operator's word (`--degraded`), the members `missing` that
    /// no label named failed are failed now, in the labels of the others.
    fn fail_missing(&self, missing: &[usize], left_out: &[LeftOut]) {
        let why = if left_out.is_empty() {
            "missing at open (--degraded)".to_string()
        } else {
            format!(
                "missing at open (--degraded; left out: {})",
                listed(left_out)
            )
        };
        for &i in missing {
            log::warn!("{}: member {i} is missing; opening degraded", self.name);
            self.fail_member(i, &why);
        }
    }

    /// Says (log, and `status` through the member's failure) which members
    /// the newest label names failed: the set opens degraded without them,
    /// with no operator.
    fn note_named_failed(&self, newest: &Label, left_out: &[LeftOut]) {
        for (i, m) in self.members.iter().enumerate() {
            if newest.stale_mask & (1 << i) == 0 {
                continue;
            }
            let why = format!(
                "named failed by the label of member {} (generation {})",
                newest.member_index, newest.generation
            );
            let here = match m.dev() {
                Some(d) => format!("{} is here but is not read", d.name()),
                None if left_out.is_empty() => "not given".to_string(),
                None => format!("not here; left out: {}", listed(left_out)),
            };
            log::warn!(
                "{}: member {i} is {why} ({here}): serving degraded without it; replace it with \
                 `tiercache replace-cache OLD NEW`",
                self.name
            );
            *m.why.lock() = Some(why);
        }
    }
}
