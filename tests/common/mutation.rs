//! Seeded mutation of valid inputs, so CI runs the fuzz targets' bodies
//! without libFuzzer (tests/nbd_fuzz.rs, fuzz_parsers.rs, fuzz_session.rs):
//! every seed unchanged, then mutations of them. The seed of the run is
//! printed and read back from an environment variable; a failing input is
//! saved for replay with the fuzz target of the same name.
#![allow(dead_code)]

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Flips, overwrites, truncates, inserts, deletes and repeats bytes: a
/// cheap approximation of libFuzzer's mutators.
pub fn mutate(rng: &mut ChaCha8Rng, s: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..6) {
        if s.is_empty() {
            s.push(rng.gen());
            continue;
        }
        let at = rng.gen_range(0..s.len());
        match rng.gen_range(0..7) {
            0 => s[at] ^= 1 << rng.gen_range(0..8),
            1 => s[at] = rng.gen(),
            2 => s.truncate(at),
            3 => {
                let junk: Vec<u8> = (0..rng.gen_range(1..16)).map(|_| rng.gen()).collect();
                s.splice(at..at, junk);
            }
            4 => {
                let end = (at + rng.gen_range(1..32)).min(s.len());
                s.drain(at..end);
            }
            5 => {
                // Repeat a slice: options, lines and extents come in runs.
                let end = (at + rng.gen_range(1..64)).min(s.len());
                let piece = s[at..end].to_vec();
                let to = rng.gen_range(0..=s.len());
                s.splice(to..to, piece);
            }
            _ => s[at] = [0, 0xff, 0x7f, 0x80][rng.gen_range(0..4)],
        }
    }
}

/// The run's seed: `$var` if set, else the clock; printed either way.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (rerun with {var}={seed})");
    seed
}

/// Runs `body` on every seed unchanged, then on `runs` mutations; the seed
/// comes from `seed_var`. A failing input is saved under the test's
/// temporary directory, named after `target`.
pub fn mutation_test(
    target: &str,
    seed_var: &str,
    seeds: Vec<Vec<u8>>,
    runs: u32,
    body: impl Fn(&[u8]) + std::panic::RefUnwindSafe,
) {
    let seed = seed(seed_var);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for s in &seeds {
        body(s);
    }
    for i in 0..runs {
        let mut input = seeds[rng.gen_range(0..seeds.len())].clone();
        mutate(&mut rng, &mut input);
        if std::panic::catch_unwind(|| body(&input)).is_err() {
            let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{target}-{seed}-{i}"));
            std::fs::write(&path, &input).unwrap();
            panic!(
                "{target}: mutation {i} of seed {seed} failed; input saved to {} (replay with fuzz target {target})",
                path.display()
            );
        }
    }
}

/// The inputs of named seeds.
pub fn values(v: Vec<(&'static str, Vec<u8>)>) -> Vec<Vec<u8>> {
    v.into_iter().map(|(_, b)| b).collect()
}

/// Writes named seeds into fuzz/seeds/<target>/.
pub fn write_seeds(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
