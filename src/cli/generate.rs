//! `tiercache completions SHELL` and `tiercache manpages DIR`: shell
//! completions and man pages made from the command line's own definition
//! (clap_complete, clap_mangen), so they cannot drift from it. The Debian
//! package (scripts/build-deb.sh) ships both.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh or fish (also elvish, powershell).
    shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManpagesArgs {
    /// Directory to write the pages into (created if missing; pages there
    /// of the same names are replaced).
    dir: PathBuf,
}

pub fn completions(a: &CompletionsArgs) -> Result<()> {
    let mut cmd = super::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "tiercache", &mut out);
    out.flush().context("writing the completions")
}

/// One page for `tiercache` and one per command (`tiercache-create.1`),
/// hidden commands left out.
pub fn manpages(a: &ManpagesArgs) -> Result<()> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let cmd = super::command();
    let version = cmd.get_version().unwrap_or_default().to_string();
    let mut pages = vec![("tiercache".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("tiercache-{}", sub.get_name());
        // The page's title names its file; the synopsis, the command.
        let page = (sub.clone().name(name.clone()))
            .bin_name(format!("tiercache {}", sub.get_name()))
            .version(version.clone());
        pages.push((name, page));
    }
    for (name, page) in pages {
        let path = a.dir.join(format!("{name}.1"));
        let mut text = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut text)
            .with_context(|| format!("rendering {name}.1"))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        outln!("{}", path.display());
    }
    Ok(())
}
