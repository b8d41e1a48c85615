//! The operator commands, one file per command.
//!
//! Commands name a cache from the registry (`registry.rs`) and act on it
//! through a [`target::Target`], which today is always an engine this process
//! opens itself. A later `serve` daemon adds a target that forwards the same
//! operations over `<state-dir>/<name>.sock`; the command files do not change.
//!
//! Errors: `anyhow` lives here and nowhere below. Every failure is printed as
//! one line, `tiercache: error: ...`, and exits with its class's code
//! (`exit.rs`: 2 usage, 3 not found, 4 busy, 5 damaged, 6 degraded, 7
//! refused for safety, 1 anything else).

#[macro_use]
mod out;

mod add_origin;
mod check;
mod claims;
mod create;
mod demo;
mod detach;
mod exit;
mod flush;
mod forget;
mod generate;
mod give_up;
mod import;
mod list;
mod logging;
mod progress;
mod remove_origin;
mod replace_cache;
mod resize;
mod scan;
mod serve;
mod set_admission;
mod set_mode;
mod set_policy;
mod set_share;
mod set_writeback;
mod status;
mod target;
mod top;
mod units;
mod warm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tiercache::daemon::{control, registry};

use registry::Registry;

/// `--state-dir`'s environment variable and default (claims.rs reads them
/// back from another tiercache's environment).
const STATE_DIR_ENV: &str = "TIERCACHE_STATE_DIR";
const DEFAULT_STATE_DIR: &str = "/var/lib/tiercache";

#[derive(Parser, Debug)]
#[command(
    name = "tiercache",
    version,
    long_version = long_version(),
    about = "A userspace block cache: a slow origin device cached on a fast cache device",
    after_help = exit::exit_codes_help()
)]
struct Cli {
    /// Directory holding the registry of named caches.
    #[arg(
        long,
        global = true,
        env = STATE_DIR_ENV,
        default_value = DEFAULT_STATE_DIR
    )]
    state_dir: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Format a cache device for an origin and register it under a name
    /// (a device that holds something is formatted only with --wipe).
    Create(create::Args),
    /// Put one more origin behind a cache, as a volume of its own (served:
    /// online, exported at once under its name).
    AddOrigin(add_origin::Args),
    /// Take one origin out of a cache of several: its dirty data is written
    /// back and it stands alone (the cache must not be served meanwhile).
    RemoveOrigin(remove_origin::Args),
    /// One line per cache and per volume, as lvs and casadm -L: chosen
    /// fields, sorted, in chosen units, or JSON (writes nothing).
    List(list::Args),
    /// Find tiercache caches on devices from their labels: every block
    /// device, or those named (writes nothing).
    Scan(scan::Args),
    /// Register again a cache found on its devices (after the state
    /// directory was lost, or on another host); writes nothing to them.
    Import(import::Args),
    /// Show mode, occupancy, counters and settings of a cache (writes
    /// nothing: a cache no daemon serves is read in place).
    Status(status::Args),
    /// Write all dirty data back to the origin.
    Flush(flush::Args),
    /// Switch the cache mode (leaving a mode that holds dirty data flushes first).
    SetMode(set_mode::Args),
    /// Change when background writeback runs.
    SetWriteback(set_writeback::Args),
    /// Change what may enter the cache (sequential cutoff, promotion, guard);
    /// options not given keep their values.
    SetAdmission(set_admission::Args),
    /// Switch the replacement policy (s3fifo, lru, fifo), live.
    SetPolicy(set_policy::Args),
    /// How the volumes of a cache share it: one ranking or curve-set
    /// floors, and each volume's minimum and maximum share, live.
    SetShare(set_share::Args),
    /// Write everything back, dissolve the cache and unregister it.
    Detach(detach::Args),
    /// Check a cache device's metadata offline, without writing anything.
    Check(check::Args),
    /// Promote a range of the volume into the cache ahead of use.
    Warm(warm::Args),
    /// Replace a cache set's member (failed, missing or retiring) with a new
    /// device and rebuild its copies online.
    ReplaceCache(replace_cache::Args),
    /// Take an origin that grew (lvextend, a longer file, rbd resize) as
    /// its volume's new size, online when served.
    Resize(resize::Args),
    /// Give up a cache device that is gone for good (its dirty data is lost):
    /// serve on from the origin, failing reads of the stale ranges.
    GiveUpCache(give_up::Args),
    /// Drop a cache whose devices are gone (an origin, or every cache
    /// device) from the registry, writing nothing to any device.
    Forget(forget::Args),
    /// Watch a cache's counters and rates, refreshed every second (q quits;
    /// writes nothing).
    Top(top::Args),
    /// Export the cached volume over NBD (foreground; SIGINT/SIGTERM stop it cleanly).
    Serve(serve::Args),
    /// Run a self-contained demonstration on two files in a directory.
    Demo(demo::Args),
    /// Print the shell completions for bash, zsh or fish.
    Completions(generate::CompletionsArgs),
    /// Write the man pages (tiercache.1, tiercache-create.1, ...) to a
    /// directory (for packaging).
    #[command(hide = true)]
    Manpages(generate::ManpagesArgs),
}

/// `--name` as every command that acts on a registered cache takes it.
#[derive(clap::Args, Debug)]
pub struct NameArg {
    /// Name of the cache (default: the only registered cache).
    #[arg(long)]
    pub name: Option<String>,
}

pub fn main() -> ExitCode {
    let parsed = command()
        .try_get_matches()
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    logging::init(matches!(cli.command, Command::Serve(_)));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let notice = e.downcast_ref::<exit::ExitWith>().is_some_and(|w| w.notice);
            let message = format!("{}{}", error_line(&e), claims::holder_note(&e));
            eprintln!("{}", logging::final_line(&message, notice));
            exit::failure(&e)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let reg = Registry::new(cli.state_dir);
    match cli.command {
        Command::Create(a) => create::run(&reg, &a),
        Command::AddOrigin(a) => add_origin::run(&reg, &a),
        Command::RemoveOrigin(a) => remove_origin::run(&reg, &a),
        Command::List(a) => list::run(&reg, &a),
        Command::Scan(a) => scan::run(&reg, &a),
        Command::Import(a) => import::run(&reg, &a),
        Command::Status(a) => status::run(&reg, &a),
        Command::Flush(a) => flush::run(&reg, &a),
        Command::SetMode(a) => set_mode::run(&reg, &a),
        Command::SetWriteback(a) => set_writeback::run(&reg, &a),
        Command::SetAdmission(a) => set_admission::run(&reg, &a),
        Command::SetPolicy(a) => set_policy::run(&reg, &a),
        Command::SetShare(a) => set_share::run(&reg, &a),
        Command::Detach(a) => detach::run(&reg, &a),
        Command::Check(a) => check::run(&reg, &a),
        Command::Warm(a) => warm::run(&reg, &a),
        Command::ReplaceCache(a) => replace_cache::run(&reg, &a),
        Command::Resize(a) => resize::run(&reg, &a),
        Command::GiveUpCache(a) => give_up::run(&reg, &a),
        Command::Forget(a) => forget::run(&reg, &a),
        Command::Top(a) => top::run(&reg, &a),
        Command::Demo(a) => demo::run(&a),
        Command::Completions(a) => generate::completions(&a),
        Command::Manpages(a) => generate::manpages(&a),
        Command::Serve(a) => serve::run(&reg, &a),
    }
}

/// The command line as clap sees it, with the exit codes after every
/// command's help (the man pages are made from it too).
fn command() -> clap::Command {
    use clap::CommandFactory;
    let codes = exit::exit_codes_help();
    Cli::command().mut_subcommands(|c| c.after_help(codes.clone()))
}

/// `--version`: the version, the commit it was built from, the on-disk
/// formats it reads and writes, and the optional parts built in.
fn long_version() -> String {
    use tiercache::engine::format::{FORMAT_VERSION_GROWN, FORMAT_VERSION_ONE_VOLUME};
    let features: Vec<&str> = [("ublk", cfg!(feature = "ublk"))]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    format!(
        "{}\ncommit {}\non-disk format versions {FORMAT_VERSION_ONE_VOLUME} to {FORMAT_VERSION_GROWN} \
         (a cache is written in the oldest its layout allows), cache set label {}\n\
         features: nbd, tls, rbd (librbd loaded at run time){}",
        env!("CARGO_PKG_VERSION"),
        env!("TIERCACHE_COMMIT"),
        tiercache::device::set::label::LABEL_VERSION,
        features
            .iter()
            .map(|f| format!(", {f}"))
            .collect::<String>(),
    )
}

/// Help and version go out as clap renders them; a usage error becomes one
/// line like every other error, with exit code 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.exit_code() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        };
    }
    // clap's first paragraph is the message (a list of missing arguments
    // continues it on indented lines); usage and tips follow a blank line.
    let rendered = e.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    eprintln!("tiercache: error: {message} (see tiercache --help)");
    ExitCode::from(2)
}

/// The error and its causes joined with ": " on one line. A cause whose text
/// the message before it already ends with is left out: several lower-layer
/// errors print their `#[source]` as part of their own message.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() || line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn error_line_joins_causes_once() {
        let io = std::io::Error::other("disk on fire");
        let e = Err::<(), _>(io).context("reading x").context("cache 'tc0'");
        assert_eq!(
            error_line(&e.unwrap_err()),
            "cache 'tc0': reading x: disk on fire"
        );
        let e = anyhow::anyhow!("two\nlines");
        assert_eq!(error_line(&e), "two lines");
    }

    #[test]
    fn serve_tcp_alone_means_loopback() {
        let cli = Cli::try_parse_from(["tiercache", "serve", "--tcp"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(a.tcp.as_deref(), Some("127.0.0.1:10809"));
        let cli = Cli::try_parse_from(["tiercache", "serve", "--tcp", "[::1]:9000"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(a.tcp.as_deref(), Some("[::1]:9000"));
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
