//! What kind of failure an error is: the exit code a command ends with
//! (`src/cli/exit.rs` maps each class to its number) and the class a
//! daemon sends with a refused control request, so a command that asked a
//! daemon exits as one that did the work itself.
//!
//! Classes are decided here, from the typed errors of the layers below,
//! in one place; a message is never parsed for its class.

use serde::{Deserialize, Serialize};

use super::registry::RegistryError;
use super::run::DaemonError;
use crate::device::DeviceError;
use crate::engine::crash_log::CrashLogError;
use crate::engine::EngineError;

/// The kinds of failure a script may want to tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// Anything else: an I/O error, a device that failed, a bug.
    Failed,
    /// The command line was wrong: an unknown value, options that do not
    /// go together, a request outside the volume.
    Usage,
    /// What was named is not there: no such cache, volume or device.
    NotFound,
    /// Another process holds it: a device claimed, a cache's lock, a
    /// daemon serving it, a crash log in use.
    Busy,
    /// A cache's metadata failed its checks (`check` found damage, or the
    /// cache cannot be opened for it), or data was lost.
    Damaged,
    /// A cache set misses a member and opens only degraded, on the
    /// operator's word.
    Degraded,
    /// Refused for safety: the command would lose data or act on the
    /// wrong device unless told so in explicit words (`--wipe`,
    /// `--force`, `--lose-dirty-data`, a device in use by a mount).
    Refused,
}

impl Class {
    /// The class of an engine error.
    pub fn of_engine(e: &EngineError) -> Class {
        match e {
            EngineError::Device(d) => Class::of_device(d),
            EngineError::CacheMetadata(_) => Class::Failed,
            EngineError::NotACache { .. } | EngineError::Corrupt { .. } => Class::Damaged,
            EngineError::AlreadyACache { .. }
            | EngineError::OriginMismatch { .. }
            | EngineError::VolatileWriteback { .. } => Class::Refused,
            EngineError::Config(_) | EngineError::InvalidRequest(_) => Class::Usage,
            EngineError::NoSuchVolume(_) => Class::NotFound,
            EngineError::StaleData(_) | EngineError::OriginWritesLost(_) => Class::Damaged,
            EngineError::NoSpace(_) | EngineError::ShutDown | EngineError::DrainFirst => {
                Class::Failed
            }
            EngineError::CrashLog(c) => Class::of_crash_log(c),
        }
    }

    /// The class of a device error.
    pub fn of_device(e: &DeviceError) -> Class {
        match e {
            DeviceError::Missing { .. } => Class::NotFound,
            DeviceError::Degraded { .. } => Class::Degraded,
            DeviceError::InUse { .. } => Class::Busy,
            DeviceError::OutOfRange { .. } | DeviceError::Unaligned { .. } => Class::Usage,
            DeviceError::Io { .. } | DeviceError::Injected { .. } | DeviceError::Open { .. } => {
                Class::Failed
            }
        }
    }

    /// The class of a crash log error.
    pub fn of_crash_log(e: &CrashLogError) -> Class {
        match e {
            CrashLogError::Locked(_) => Class::Busy,
            CrashLogError::UnsafeDirectory { .. } | CrashLogError::UnsafeFile { .. } => {
                Class::Refused
            }
            _ => Class::Failed,
        }
    }

    /// The class of a registry error.
    pub fn of_registry(e: &RegistryError) -> Class {
        match e {
            RegistryError::Unknown { .. } | RegistryError::Empty { .. } => Class::NotFound,
            RegistryError::Ambiguous { .. }
            | RegistryError::InvalidName(_)
            | RegistryError::NotUtf8(_) => Class::Usage,
            RegistryError::InUse { .. } => Class::Busy,
            RegistryError::NotPrivate { .. } => Class::Refused,
            RegistryError::Corrupt { .. } | RegistryError::Invalid { .. } => Class::Damaged,
            RegistryError::Io { .. }
            | RegistryError::NotWritable { .. }
            | RegistryError::Encode(_) => Class::Failed,
        }
    }

    /// The class of a daemon's own error. Its transparent variants hide
    /// the error they wrap from the chain, so they are looked into here;
    /// the others are `None`: their source, further down the chain,
    /// decides.
    pub fn of_daemon(e: &DaemonError) -> Option<Class> {
        match e {
            DaemonError::Registry(r) => Some(Class::of_registry(r)),
            DaemonError::Create(c) => Some(Class::of_engine(c)),
            DaemonError::AlreadyServed(_) => Some(Class::Busy),
            DaemonError::NoUblk | DaemonError::OneVolumeOnly { .. } => Some(Class::Usage),
            _ => None,
        }
    }

    /// Its name in a control reply and in `--help` (`not-found`).
    pub fn name(self) -> &'static str {
        match self {
            Class::Failed => "failed",
            Class::Usage => "usage",
            Class::NotFound => "not-found",
            Class::Busy => "busy",
            Class::Damaged => "damaged",
            Class::Degraded => "degraded",
            Class::Refused => "refused",
        }
    }
}

/// A failure with its class: what a daemon's request step returns, and
/// what a command raises for a refusal of its own.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Classed {
    pub class: Class,
    pub message: String,
}

impl Classed {
    pub fn new(class: Class, message: impl Into<String>) -> Classed {
        Classed {
            class,
            message: message.into(),
        }
    }
}

impl From<EngineError> for Classed {
    fn from(e: EngineError) -> Classed {
        Classed::new(Class::of_engine(&e), e.to_string())
    }
}

impl From<DeviceError> for Classed {
    fn from(e: DeviceError) -> Classed {
        Classed::new(Class::of_device(&e), e.to_string())
    }
}
