//! What a device of several members tells the engine and takes from it
//! (a cache set: device/set/), so that the engine does not look inside
//! it: which slots are mirrored and which a member that is not healthy
//! made unusable, the members' states for `status`, and the steps of its
//! open, resync and member replacement. `BlockDevice::members` gives it;
//! a device of one member has none.

use std::ops::Range;

use super::{DeviceRef, DeviceResult};

pub use super::set::MemberStatus;

/// A metadata page's own check (a checksum), which a device of several
/// members uses to tell a damaged copy from a good one.
pub type MetaCheck = fn(&[u8]) -> bool;

pub trait Members: Send + Sync {
    /// The device itself, for a test that looks inside (the engine never
    /// does).
    fn as_any(&self) -> &dyn std::any::Any;
    /// The device's name, for messages.
    fn set_name(&self) -> &str;
    /// Changes whenever a member's state does.
    fn epoch(&self) -> u64;
    /// Slots below this may hold dirty data: each has a copy on two
    /// members.
    fn mirror_slots(&self) -> u64;
    /// Slots on members that are not healthy, not to be used.
    fn unusable_slots(&self) -> Vec<Range<u32>>;
    /// Member `i`'s own slots (one copy).
    fn own_slots(&self, i: usize) -> Range<u32>;
    /// Each member's state, device and errors, for `status`.
    fn member_statuses(&self) -> Vec<MemberStatus>;
    /// The state in a word (`healthy`, `degraded`, ...).
    fn state_name(&self) -> &'static str;
    /// A member is lost: mirrored data has one copy left.
    fn degraded(&self) -> bool;
    /// Bytes of metadata every member holds a copy of.
    fn meta_bytes(&self) -> u64;
    /// From now on metadata pages are checked with `check`.
    fn set_meta_check(&self, check: MetaCheck);
    /// Compares and mends the members' copies of `range` of the metadata.
    fn scrub_meta(&self, range: Range<u64>, clean: bool) -> u64;
    /// The open is done: damaged metadata pages count against a member.
    fn count_meta_damage(&self);
    /// The mirrored copies may differ (an unclean shutdown).
    fn begin_resync(&self);
    fn resync_pending(&self) -> bool;
    /// Makes the mirrored copies equal; `progress` gets bytes done and to do.
    fn resync(&self, progress: &mut dyn FnMut(u64, u64)) -> DeviceResult<()>;
    fn stop_resync(&self);
    /// Replaces member `i` with `new` and rebuilds its copies.
    fn replace(
        &self,
        i: usize,
        new: DeviceRef,
        progress: &mut dyn FnMut(u64, u64),
    ) -> DeviceResult<()>;
}
