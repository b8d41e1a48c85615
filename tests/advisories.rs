//! Known vulnerabilities in what tiercache is built from: Cargo.lock (and
//! fuzz/Cargo.lock) against the RustSec advisory database, with RustSec's
//! own library (the engine of cargo-audit). CI cannot reach GitHub, where
//! the database lives, so the test reads the copy in advisories
//! (front matter only: which versions of which crate; refreshed by
//! `scripts/advisories-refresh.sh PATH/TO/advisory-db`, and dated in
//! advisories/SOURCE). `TIERCACHE_ADVISORY_DB=PATH` checks against a
//! fresher checkout instead.
//!
//! A vulnerability fails the test, naming the crate, the version, the
//! advisory and the fixed versions. Informational advisories (unmaintained,
//! unsound) are printed, not failed: each needs a person's judgement.

use std::path::{Path, PathBuf};

use rustsec::report::{Report, Settings};
use rustsec::{Database, Lockfile};

fn database() -> (Database, PathBuf) {
    let path = std::env::var_os("TIERCACHE_ADVISORY_DB")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("advisories"));
    let db = Database::open(&path)
        .unwrap_or_else(|e| panic!("the advisory database at {}: {e}", path.display()));
    (db, path)
}

fn check(lock: &str) -> Vec<String> {
    check_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join(lock), lock)
}

fn check_file(file: &Path, lock: &str) -> Vec<String> {
    let (db, path) = database();
    assert!(
        db.iter().count() > 500,
        "{}: too few advisories",
        path.display()
    );
    let lockfile = Lockfile::load(file).unwrap_or_else(|e| panic!("{lock}: {e}"));
    let report = Report::generate(&db, &lockfile, &Settings::default());
    for (kind, warnings) in &report.warnings {
        for w in warnings {
            let id = w.advisory.as_ref().map_or("-".into(), |a| a.id.to_string());
            eprintln!(
                "{lock}: warning ({kind:?}): {} {} ({id})",
                w.package.name, w.package.version
            );
        }
    }
    report
        .vulnerabilities
        .list
        .iter()
        .map(|v| {
            let patched: Vec<String> = v.versions.patched().iter().map(|r| r.to_string()).collect();
            format!(
                "{lock}: {} {} has {} ({}); fixed in {}",
                v.package.name,
                v.package.version,
                v.advisory.id,
                v.advisory.url.as_ref().map_or("", |u| u.as_str()),
                if patched.is_empty() {
                    "no release".into()
                } else {
                    patched.join(", ")
                }
            )
        })
        .collect()
}

#[test]
fn no_dependency_has_a_known_vulnerability() {
    let mut found = check("Cargo.lock");
    if Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/Cargo.lock")
        .exists()
    {
        found.extend(check("fuzz/Cargo.lock"));
    }
    assert!(
        found.is_empty(),
        "known vulnerabilities:\n{}",
        found.join("\n")
    );
}

/// The check finds a vulnerable version (openssl 0.10.50 has
/// RUSTSEC-2023-0044, fixed in 0.10.55): it is not passing by reading
/// nothing.
#[test]
fn a_vulnerable_lockfile_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("Cargo.lock");
    std::fs::write(
        &lock,
        "version = 3\n\n[[package]]\nname = \"openssl\"\nversion = \"0.10.50\"\n\
         source = \"registry+https://github.com/rust-lang/crates.io-index\"\n",
    )
    .unwrap();
    let found = check_file(&lock, "a test lockfile");
    assert!(
        found
            .iter()
            .any(|f| f.contains("RUSTSEC-2023-0044") && f.contains(">=0.10.55")),
        "{found:?}"
    );
}

/// The copy is read whole: every advisory parses (a refresh that broke the
/// format would otherwise hide advisories).
#[test]
fn the_database_copy_parses_whole() {
    let (db, path) = database();
    let files = walk(&path.join("crates"));
    assert_eq!(
        db.iter().count(),
        files,
        "advisories parsed vs files in {}",
        path.display()
    );
}

fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            if p.is_dir() {
                walk(&p)
            } else {
                p.extension().is_some_and(|x| x == "md") as usize
            }
        })
        .sum()
}
