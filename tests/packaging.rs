//! The Debian package (scripts/build-deb.sh), built from the binary under
//! test: it passes lintian with no error, holds the binary, the unit, the
//! man pages and the completions, has no maintainer scripts (installing or
//! removing it touches no data), and the binary in it runs. Also the
//! completions and man pages themselves: made from the command line, so
//! every command has a page and every shell its file.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tiercache");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn need(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap()
        .status
        .success();
    assert!(
        found,
        "{tool} is missing: install the Debian package {package} (scripts/test.sh does)"
    );
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every visible command, from `tiercache --help`.
fn commands() -> Vec<String> {
    let help = run(Command::new(BIN).arg("--help"));
    let list = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("\n\n")
        .next()
        .unwrap()
        .to_string();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn the_debian_package_passes_lintian_and_holds_what_it_should() {
    for (tool, package) in [
        ("dpkg-deb", "dpkg"),
        ("dpkg-shlibdeps", "dpkg-dev"),
        ("lintian", "lintian"),
    ] {
        need(tool, package);
    }
    let out = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let built = run(Command::new(format!("{ROOT}/scripts/build-deb.sh"))
        .args(["--binary", BIN, "--out"])
        .arg(out.path()));
    let deb = built.trim().to_string();
    assert!(Path::new(&deb).exists(), "no package at {deb}");

    // lintian: no error (warnings and notes are printed for a reader).
    let lint = Command::new("lintian")
        .args(["--tag-display-limit", "0", "--fail-on", "error", &deb])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&lint.stdout);
    eprintln!("lintian:\n{text}");
    assert!(lint.status.success(), "lintian failed:\n{text}");
    assert!(!text.lines().any(|l| l.starts_with("E:")), "{text}");

    let files = run(Command::new("dpkg-deb").args(["-c", &deb]));
    let mut want = vec![
        "./usr/bin/tiercache".to_string(),
        "./lib/systemd/system/tiercache@.service".into(),
        "./usr/share/doc/tiercache/examples/60-tiercache.rules".into(),
        "./etc/tiercache/".into(),
        "./usr/share/doc/tiercache/copyright".into(),
        "./usr/share/doc/tiercache/changelog.Debian.gz".into(),
        "./usr/share/bash-completion/completions/tiercache".into(),
        "./usr/share/zsh/vendor-completions/_tiercache".into(),
        "./usr/share/fish/vendor_completions.d/tiercache.fish".into(),
        "./usr/share/man/man1/tiercache.1.gz".into(),
    ];
    for c in commands() {
        want.push(format!("./usr/share/man/man1/tiercache-{c}.1.gz"));
    }
    for w in &want {
        assert!(
            files.lines().any(|l| l.ends_with(&format!(" {w}"))),
            "the package lacks {w}:\n{files}"
        );
    }
    for l in files.lines() {
        assert!(l.contains(" root/root "), "not owned by root: {l}");
    }
    // Not active: a rule that starts units for names devices record.
    assert!(!files.contains("/udev/rules.d/"), "{files}");
    // No maintainer scripts: nothing runs at install or removal.
    let control = run(Command::new("dpkg-deb").args(["-I", &deb]));
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        assert!(!control.contains(script), "a {script} in:\n{control}");
    }
    assert!(control.contains("Depends: libc6"), "{control}");

    // The binary in it runs and names its commit; the unit runs it.
    let x = out.path().join("x");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x));
    let version = run(Command::new(x.join("usr/bin/tiercache")).arg("--version"));
    assert!(
        version.contains("commit ") && version.contains("on-disk format"),
        "{version}"
    );
    let unit = std::fs::read_to_string(x.join("lib/systemd/system/tiercache@.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/tiercache serve --name %i"),
        "{unit}"
    );
}

#[test]
fn completions_and_man_pages_cover_every_command() {
    let commands = commands();
    assert!(commands.len() > 15, "{commands:?}");
    for shell in ["bash", "zsh", "fish"] {
        let text = run(Command::new(BIN).args(["completions", shell]));
        for c in &commands {
            assert!(text.contains(c.as_str()), "{shell} completions lack {c}");
        }
    }
    let bad = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    run(Command::new(BIN).arg("manpages").arg(dir.path()));
    for c in &commands {
        let page = std::fs::read_to_string(dir.path().join(format!("tiercache-{c}.1")))
            .unwrap_or_else(|e| panic!("no page for {c}: {e}"));
        assert!(page.starts_with(".ie") || page.contains(".TH"), "{c}");
        assert!(page.contains("Exit codes"), "the page of {c} lacks them");
    }
}
