//! Records the commit the binary is built from for `tiercache --version`
//! (`TIERCACHE_COMMIT`): git's short hash, or "unknown" outside a git
//! checkout (a crate from a tarball). `TIERCACHE_COMMIT` in the
//! environment wins (a package built from a source tree without .git).
//!
//! Only a new commit reruns this (HEAD and the branch it names are
//! watched, not the index): the hash is an env of the whole package, and
//! a change of it rebuilds every target.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TIERCACHE_COMMIT");
    if let Ok(c) = std::env::var("TIERCACHE_COMMIT") {
        if !c.is_empty() {
            println!("cargo:rustc-env=TIERCACHE_COMMIT={c}");
            return;
        }
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    // What names the commit: HEAD, the branch it points at, packed refs.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    let commit = commit.unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TIERCACHE_COMMIT={commit}");
}

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}
