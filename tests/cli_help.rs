//! Every default `--help` states is the value a fresh cache has: the
//! defaults `create --help` prints (clap's `[default: X]` and the
//! `[default at create: X]` of options that other commands change) are
//! parsed and compared with `status --json` of a cache made without them.

#[path = "common/daemon.rs"]
mod daemon;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// `--option` -> the default its help states, from `COMMAND --help`.
fn help_defaults(command: &str) -> BTreeMap<String, String> {
    let out = Command::new(daemon::BIN)
        .args([command, "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut found = BTreeMap::new();
    let mut option = None;
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with("--") || (t.starts_with('-') && t.contains(", --")) {
            let long = t.split("--").nth(1).unwrap();
            let name = long.split([' ', '=', ',']).next().unwrap();
            option = Some(name.to_string());
        }
        for marker in ["[default: ", "[default at create: "] {
            if let (Some(i), Some(o)) = (line.find(marker), &option) {
                let rest = &line[i + marker.len()..];
                let value = rest.split(']').next().unwrap().to_string();
                found.insert(o.clone(), value);
            }
        }
    }
    found
}

fn size(text: &str) -> u64 {
    tiercache::device::parse_size(text).unwrap_or_else(|| panic!("not a size: {text}"))
}

#[test]
fn create_help_defaults_are_what_a_fresh_cache_has() {
    let defaults = help_defaults("create");
    let s = daemon::Setup::with_sizes(64 << 20, 16 << 20, &[]);
    let st = s.status();
    let checks: Vec<(&str, Value)> = vec![
        ("mode", st["mode"].clone()),
        ("policy", st["policy"].clone()),
        ("placement", st["placement"].clone()),
        ("writeback-order", st["writeback_order"].clone()),
        ("block-size", st["block_bytes"].clone()),
        ("cache-error-limit", st["cache_error_limit"].clone()),
        ("writeback-high", st["writeback"]["high_pct"].clone()),
        ("writeback-low", st["writeback"]["low_pct"].clone()),
        ("writeback-age", st["writeback"]["max_age_secs"].clone()),
        ("writeback-idle", st["writeback"]["idle_secs"].clone()),
        (
            "sequential-cutoff",
            st["admission_settings"]["sequential_cutoff_bytes"].clone(),
        ),
        (
            "promote-after",
            st["admission_settings"]["promote_after"].clone(),
        ),
        (
            "selective-above",
            st["admission_settings"]["selective_above_pct"].clone(),
        ),
        ("guard", st["admission_settings"]["guard"].clone()),
    ];
    for (option, actual) in checks {
        let stated = defaults.get(option).unwrap_or_else(|| {
            panic!("create --help states no default for --{option}: {defaults:?}")
        });
        let expected = match option {
            "block-size" | "sequential-cutoff" => Value::from(size(stated)),
            "guard" => Value::from(stated == "on"),
            _ => match stated.parse::<u64>() {
                Ok(n) => Value::from(n),
                Err(_) => Value::from(stated.as_str()),
            },
        };
        assert_eq!(
            actual, expected,
            "--{option}: help says [default: {stated}], a fresh cache has {actual}"
        );
    }
    // Every default the help states was compared (a new one needs a row).
    let covered = [
        "mode",
        "policy",
        "placement",
        "writeback-order",
        "block-size",
        "cache-error-limit",
        "writeback-high",
        "writeback-low",
        "writeback-age",
        "writeback-idle",
        "sequential-cutoff",
        "promote-after",
        "selective-above",
        "guard",
    ];
    for option in defaults.keys() {
        assert!(
            covered.contains(&option.as_str())
                || ["name", "mirror-share", "state-dir"].contains(&option.as_str()),
            "create --help states a default for --{option} that this test does not compare"
        );
    }
}

#[test]
fn set_admission_help_does_not_claim_defaults_it_does_not_apply() {
    let out = Command::new(daemon::BIN)
        .args(["set-admission", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for option in [
        "--sequential-cutoff",
        "--promote-after",
        "--selective-above",
        "--guard",
    ] {
        let line = (help.lines())
            .find(|l| l.trim_start().starts_with(option))
            .unwrap_or_else(|| panic!("no {option} in:\n{help}"));
        assert!(!line.contains("[default: "), "{line}");
        assert!(line.contains("[default at create: "), "{line}");
    }
    assert!(help.contains("keep their values"), "{help}");
    // What it says a cache starts with is what create says (and what the
    // test above found a fresh cache to have).
    let create = help_defaults("create");
    let stated_here = help_defaults("set-admission");
    assert_eq!(
        stated_here.len(),
        5,
        "four options and --state-dir: {stated_here:?}"
    );
    for (option, stated) in stated_here {
        if option == "state-dir" {
            continue;
        }
        assert_eq!(
            create.get(&option),
            Some(&stated),
            "set-admission --help: --{option} [default at create: {stated}]"
        );
    }
}
