//! Naming the cache behind a device another process holds. The device
//! layer refuses the open and names the process (`DeviceError::InUse`,
//! device/claim.rs); when that process is a tiercache, its command line
//! and environment say which state directory it uses, and that registry
//! says which cache the device belongs to.

use std::path::{Path, PathBuf};

use tiercache::device::proc_strings;
use tiercache::device::DeviceError;

use super::registry::{self, Registry};
use super::{DEFAULT_STATE_DIR, STATE_DIR_ENV};

/// True if `e` was caused by a device another open holds.
pub fn in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<DeviceError>(),
            Some(DeviceError::InUse { .. })
        )
    })
}

/// "; it is the cache of 'tc0' (state directory /x), which that process
/// serves", for an error whose cause is a device a tiercache holds; empty
/// when there is no such cause or nothing more can be told.
pub fn holder_note(e: &anyhow::Error) -> String {
    let Some((device, pid)) = e
        .chain()
        .find_map(|c| match c.downcast_ref::<DeviceError>() {
            Some(DeviceError::InUse {
                device,
                pid: Some(pid),
                ..
            }) => Some((device.clone(), *pid)),
            _ => None,
        })
    else {
        return String::new();
    };
    let Some(process) = Process::read(pid) else {
        return String::new();
    };
    if process.flag("--ram-cache").is_some() {
        return "; that process serves it as the origin of a RAM cache (serve --ram-cache)".into();
    }
    let dir = process.state_dir();
    let found = Registry::new(dir.clone())
        .list()
        .unwrap_or_default()
        .into_iter()
        .find_map(|entry| {
            let caches = entry.cache_paths();
            if caches.iter().any(|c| registry::same_file(c, &device)) {
                Some((entry.name, "a cache device"))
            } else if (entry.origin_paths().iter()).any(|o| registry::same_file(o, &device)) {
                let role = if entry.more_origins.is_empty() {
                    "the origin"
                } else {
                    "an origin"
                };
                Some((entry.name, role))
            } else {
                None
            }
        });
    match found {
        Some((name, role)) => format!(
            "; it is {role} of cache '{name}' (state directory {})",
            dir.display()
        ),
        None => match process.flag("--name") {
            Some(name) => format!("; that process works on cache '{name}'"),
            None => String::new(),
        },
    }
}

/// A tiercache process's arguments, environment and working directory.
struct Process {
    args: Vec<String>,
    env: Vec<String>,
    cwd: Option<PathBuf>,
}

impl Process {
    /// `None` unless `pid` runs a program named tiercache.
    fn read(pid: u32) -> Option<Process> {
        let args = proc_strings(pid, "cmdline");
        let program = Path::new(args.first()?).file_name()?.to_string_lossy();
        if !program.starts_with("tiercache") {
            return None;
        }
        Some(Process {
            args,
            env: proc_strings(pid, "environ"),
            cwd: std::fs::read_link(format!("/proc/{pid}/cwd")).ok(),
        })
    }

    /// The value of `--flag VALUE` or `--flag=VALUE`; "" for a flag alone.
    fn flag(&self, flag: &str) -> Option<String> {
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            if a == flag {
                return Some(it.next().cloned().unwrap_or_default());
            }
            if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                return Some(v.to_string());
            }
        }
        None
    }

    /// Its state directory, as its CLI resolves it: the flag, the
    /// environment variable, the default; relative to its own directory.
    fn state_dir(&self) -> PathBuf {
        let given = self.flag("--state-dir").or_else(|| {
            self.env.iter().find_map(|v| {
                v.strip_prefix(STATE_DIR_ENV)?
                    .strip_prefix('=')
                    .map(str::to_string)
            })
        });
        let dir = PathBuf::from(given.unwrap_or_else(|| DEFAULT_STATE_DIR.into()));
        match &self.cwd {
            Some(cwd) if dir.is_relative() => cwd.join(dir),
            _ => dir,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_state_dirs_are_read_as_the_cli_reads_them() {
        let p = Process {
            args: ["tiercache", "serve", "--name=a", "--state-dir", "st"]
                .map(String::from)
                .to_vec(),
            env: vec!["TIERCACHE_STATE_DIR=/elsewhere".into()],
            cwd: Some("/work".into()),
        };
        assert_eq!(p.flag("--name").as_deref(), Some("a"));
        assert_eq!(p.flag("--ram-cache"), None);
        assert_eq!(p.state_dir(), PathBuf::from("/work/st"));
        let p = Process {
            args: vec!["tiercache".into()],
            ..p
        };
        assert_eq!(p.state_dir(), PathBuf::from("/elsewhere"));
        let p = Process { env: vec![], ..p };
        assert_eq!(p.state_dir(), PathBuf::from(DEFAULT_STATE_DIR));
    }
}
