//! Deterministic simulation for the crash and model tests (FoundationDB's
//! simulation testing and TigerBeetle's VOPR are the models).
//!
//! One thread does everything. The engine is opened without its background
//! thread and with a simulated clock (`tiercache::engine::clock`); the
//! work the background thread would do runs as steps that a seeded
//! scheduler interleaves with the client's requests: a batch of writeback,
//! a commit, a checkpoint, giving back the crash log's durable pages, and
//! time passing. A crash switch armed from the same seed fixes the kill
//! point. So a seed fixes every decision and every device event, and
//! `TIERCACHE_SEED=N cargo test --test X NAME` replays a failure bit for
//! bit (`FaultDevice::io_digest` proves it in each suite's replay test).
//!
//! What this cannot reach (two threads inside the engine at once: a record
//! appended while a commit writes, a write landing during a writeback's
//! origin write) stays with the threaded tests, which say so and keep one
//! of these as their seeded twin.

#![allow(dead_code)]

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercache::engine::clock::{Clock, SimClock};
use tiercache::engine::{Engine, OpenOptions};

/// A background step the scheduler can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// One batch of writeback (`Engine::writeback_step`).
    Writeback,
    Commit,
    Checkpoint,
    /// The crash log gives back its durable pages.
    TrimCrashLog,
    /// Time passes: ages grow, a commit falls due, clients look away.
    Sleep(u64),
}

/// The scheduler of one simulated run.
pub struct Sim {
    pub seed: u64,
    rng: ChaCha8Rng,
    pub clock: SimClock,
    /// Every step and client request, in order, for the failure report.
    trace: Vec<String>,
    /// How to rerun this case.
    replay: String,
}

impl Sim {
    /// `replay` is the command that reruns this case, e.g.
    /// `TIERCACHE_SEED=7 cargo test --test engine_crash crash_writeback`.
    pub fn new(seed: u64, replay: String) -> Sim {
        Sim {
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_5c4e_d01e),
            clock: SimClock::new(),
            trace: Vec::new(),
            replay,
        }
    }

    /// Open options for an engine driven by this scheduler: no background
    /// thread, the simulated clock.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions {
            no_background: true,
            clock: Clock::sim(self.clock.clone()),
            ..Default::default()
        }
    }

    /// The client's own random choices come from the same seed.
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// Notes a client request (or anything else) in the trace.
    pub fn note(&mut self, what: impl Into<String>) {
        self.trace.push(what.into());
    }

    /// Notes a client's stamped write of version `v` and how it ended.
    pub fn note_write(&mut self, v: u64, first: u64, n: u64, fua: bool, outcome: &str) {
        let fua = if fua { " FUA" } else { "" };
        self.note(format!("write v{v} sectors {first}+{n}{fua}: {outcome}"));
    }

    /// A client request takes a little simulated time.
    pub fn client_time(&mut self) {
        let us = self.rng.gen_range(0..2000);
        self.clock.advance(Duration::from_micros(us));
    }

    /// Picks a background step.
    pub fn pick(&mut self) -> Step {
        match self.rng.gen_range(0..100) {
            0..=49 => Step::Writeback,
            50..=69 => Step::Commit,
            70..=74 => Step::Checkpoint,
            75..=84 => Step::TrimCrashLog,
            85..=94 => Step::Sleep(self.rng.gen_range(1..300)),
            _ => Step::Sleep(self.rng.gen_range(300..2500)),
        }
    }

    /// Runs `step`; `Err` is what the engine answered (a crash test may
    /// expect errors once the power is gone).
    pub fn run(&mut self, engine: &Engine, step: Step) -> Result<(), String> {
        let r = match step {
            Step::Writeback => engine.writeback_step().map(|n| {
                self.trace.push(format!("bg: writeback {n} blocks"));
            }),
            Step::Commit => engine.commit(),
            Step::Checkpoint => engine.checkpoint(),
            Step::TrimCrashLog => {
                engine.trim_crash_log();
                Ok(())
            }
            Step::Sleep(ms) => {
                self.clock.advance(Duration::from_millis(ms));
                Ok(())
            }
        };
        if step != Step::Writeback || r.is_err() {
            self.trace.push(format!("bg: {step:?} -> {r:?}"));
        }
        r.map_err(|e| e.to_string())
    }

    /// Picks and runs one background step.
    pub fn background(&mut self, engine: &Engine) -> Result<(), String> {
        let step = self.pick();
        self.run(engine, step)
    }

    /// What to print when a case fails: the replay command and the last
    /// `n` entries of the trace.
    pub fn report(&self, n: usize) -> String {
        let from = self.trace.len().saturating_sub(n);
        let mut out = format!(
            "seed {}: rerun with {}\nlast {} of {} steps:\n",
            self.seed,
            self.replay,
            self.trace.len() - from,
            self.trace.len()
        );
        for (i, line) in self.trace[from..].iter().enumerate() {
            out.push_str(&format!("  {:>5} {line}\n", from + i));
        }
        out
    }
}

/// The replay command of test `name` in test file `file` for `seed`.
/// A request's span among `origins` volumes of `sectors` each, of 1 to
/// `max_sectors`: (model sector, sectors, engine address). The model
/// numbers the volumes' sectors one after the other. With several
/// origins a volume is drawn first; none for one, so the seeds of one
/// origin replay as before volumes.
pub fn pick_span(sim: &mut Sim, origins: u64, sectors: u64, max_sectors: u64) -> (u64, u64, u64) {
    let vol = if origins > 1 {
        sim.rng().gen_range(0..origins)
    } else {
        0
    };
    let n = sim.rng().gen_range(1..=max_sectors);
    let first = sim.rng().gen_range(0..=sectors - n);
    let base = tiercache::engine::origin::address::base(vol as usize);
    (vol * sectors + first, n, base + first * 512)
}

pub fn replay_command(file: &str, name: &str, seed: u64) -> String {
    format!("TIERCACHE_SEED={seed} cargo test --test {file} {name}")
}
