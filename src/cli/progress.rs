//! Progress on stderr for long commands, only when stderr is a terminal:
//! logs and pipes get only the commands' final lines.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// What a bar counts.
#[derive(Clone, Copy)]
pub enum Unit {
    Blocks,
    Bytes,
}

/// A bar of `len` units, or none when stderr is not a terminal.
pub fn bar(what: &'static str, len: u64, unit: Unit) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(len);
    let template = match unit {
        Unit::Blocks => "{msg} [{bar:40}] {pos}/{len} blocks, {per_sec}, eta {eta}",
        Unit::Bytes => "{msg} [{bar:40}] {bytes}/{total_bytes}, {bytes_per_sec}, eta {eta}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what);
    Some(bar)
}

/// A spinner for work of unknown length, or none when stderr is not a
/// terminal.
pub fn spinner(what: &'static str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let s = ProgressBar::new_spinner();
    s.set_message(what);
    s.enable_steady_tick(Duration::from_millis(100));
    Some(s)
}

/// A callback that moves `bar` (if any) to (done, total).
pub fn updater(bar: &Option<ProgressBar>) -> impl FnMut(u64, u64) + '_ {
    move |done, total| {
        if let Some(bar) = bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    }
}
