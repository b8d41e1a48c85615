//! Exit codes: one per kind of failure (`tiercache::daemon::class`), so a
//! script can tell `check` finding damage from a cache in use. The table
//! below is the one `--help` and the man page print (`exit_codes_help`).

use std::process::ExitCode;

use tiercache::daemon::class::{Class, Classed};
use tiercache::daemon::control::ControlError;
use tiercache::daemon::{DaemonError, RegistryError};
use tiercache::device::DeviceError;
use tiercache::engine::crash_log::CrashLogError;
use tiercache::engine::EngineError;

/// Each class's exit code, in the order `--help` lists them.
const CODES: [(Class, u8, &str); 7] = [
    (
        Class::Failed,
        1,
        "failed (an I/O error, a device that failed)",
    ),
    (Class::Usage, 2, "usage: a bad argument or value"),
    (
        Class::NotFound,
        3,
        "not found: no such cache, volume or device",
    ),
    (
        Class::Busy,
        4,
        "busy: another process holds the cache or a device",
    ),
    (
        Class::Damaged,
        5,
        "damaged: metadata failed its checks, or data was lost",
    ),
    (
        Class::Degraded,
        6,
        "degraded: a cache set misses a member (see serve --degraded)",
    ),
    (
        Class::Refused,
        7,
        "refused for safety: it would lose data unless told so (--wipe, --force, ...)",
    ),
];

/// The exit code table as `--help` and the man pages show it after the
/// commands.
pub fn exit_codes_help() -> String {
    let rows = CODES.iter().map(|(_, n, text)| format!("\n  {n}  {text}"));
    format!("Exit codes:\n  0  success{}", rows.collect::<String>())
}

/// The exit code of class `class`.
pub fn code(class: Class) -> u8 {
    CODES
        .iter()
        .find(|(c, _, _)| *c == class)
        .map_or(1, |(_, n, _)| *n)
}

/// The exit code a failed command ends with.
pub fn failure(e: &anyhow::Error) -> ExitCode {
    if let Some(w) = e.downcast_ref::<ExitWith>() {
        return ExitCode::from(w.code);
    }
    ExitCode::from(code(class_of(e)))
}

/// A failure that ends the command with a code of its caller's protocol,
/// not of a class: `import --boot` answers systemd's ExecCondition (1:
/// skip the unit, 255: fail it).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExitWith {
    pub code: u8,
    pub message: String,
    /// An expected outcome (the unit skipped), said as a notice, not an
    /// error.
    pub notice: bool,
}

/// The class of the first error in `e`'s chain that has one (contexts
/// added on the way up are plain text); else `Failed`.
pub fn class_of(e: &anyhow::Error) -> Class {
    e.chain().find_map(class_of_one).unwrap_or(Class::Failed)
}

fn class_of_one(cause: &(dyn std::error::Error + 'static)) -> Option<Class> {
    if let Some(c) = cause.downcast_ref::<Classed>() {
        return Some(c.class);
    }
    if let Some(e) = cause.downcast_ref::<ControlError>() {
        return Some(match e {
            ControlError::Refused(c) => c.class,
            _ => Class::Failed,
        });
    }
    if let Some(e) = cause.downcast_ref::<DaemonError>() {
        if let Some(c) = Class::of_daemon(e) {
            return Some(c);
        }
    }
    if let Some(e) = cause.downcast_ref::<RegistryError>() {
        return Some(Class::of_registry(e));
    }
    if let Some(e) = cause.downcast_ref::<EngineError>() {
        return Some(Class::of_engine(e));
    }
    if let Some(e) = cause.downcast_ref::<DeviceError>() {
        return Some(Class::of_device(e));
    }
    if let Some(e) = cause.downcast_ref::<CrashLogError>() {
        return Some(Class::of_crash_log(e));
    }
    None
}

/// `return Err(...)` of a failure of class `$class` with a formatted
/// message: `fail!(Usage, "--offset {x} is not aligned")`.
macro_rules! fail {
    ($class:ident, $($arg:tt)+) => {
        return Err(anyhow::Error::from(tiercache::daemon::class::Classed::new(
            tiercache::daemon::class::Class::$class,
            format!($($arg)+),
        )))
    };
}
pub(crate) use fail;

/// An error of class `$class` with a formatted message, for `ok_or_else`
/// and `map_err`.
macro_rules! classed {
    ($class:ident, $($arg:tt)+) => {
        anyhow::Error::from(tiercache::daemon::class::Classed::new(
            tiercache::daemon::class::Class::$class,
            format!($($arg)+),
        ))
    };
}
pub(crate) use classed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_table_is_the_code_table() {
        let help = exit_codes_help();
        assert!(
            help.starts_with("Exit codes:\n  0  success\n  1  failed"),
            "{help}"
        );
        assert!(help.ends_with("(--wipe, --force, ...)"), "{help}");
        let mut codes: Vec<u8> = CODES.iter().map(|(_, n, _)| *n).collect();
        codes.dedup();
        assert_eq!(codes, (1..=7).collect::<Vec<u8>>());
    }

    #[test]
    fn the_first_typed_cause_decides() {
        use anyhow::Context;
        let e = Err::<(), _>(DeviceError::InUse {
            device: "/dev/x".into(),
            holder: "pid 1".into(),
            pid: Some(1),
        })
        .context("opening the cache device")
        .context("cache 'tc0'")
        .unwrap_err();
        assert_eq!(class_of(&e), Class::Busy);
        let e: anyhow::Error = EngineError::Corrupt {
            device: "c".into(),
            what: "x".into(),
        }
        .into();
        assert_eq!(failure(&e), ExitCode::from(5));
        assert_eq!(class_of(&anyhow::anyhow!("plain")), Class::Failed);
    }
}
