//! Real process kills: the kit's child processes and the parent's SIGKILL.
//!
//! Owns [`Order`] (what a child is told to do, carried in [`CHILD_ENV`]), [`serve`] (the
//! child's whole life: open the same SQLite log, run one submission or a recovery, say
//! `done`, exit) and [`supervise`] (the parent's: start the child, SIGKILL it after a seeded
//! delay or the moment it reports it reached a seeded failpoint). A child is the user's own
//! test binary re-executed (`std::env::current_exe()`) on the one test that built the kit:
//! that test builds the same [`crate::Kit`] and calls [`crate::Kit::run`], which sees the
//! order and plays the child's part instead. It must never decide anything the parent checks:
//! the parent reads only the log and the simulator's effects afterwards.
//!
//! A child armed at a failpoint does not crash there: it writes `keel-kit: at POINT` to
//! its stdout and parks, so the kill lands exactly at that boundary, in a process that is
//! really gone (no destructor, no flush, no writer thread finishing its batch).

use crate::{Kit, Tier, Work, agent_run_id, agents, open_process, provider_at, recover};
use chrono::{DateTime, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, RunId};
use engine::executor::RunRequest;
use engine::failpoints::{Failpoints, Point};
use serde::{Deserialize, Serialize};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The environment variable that makes a re-executed test binary a kit child.
pub const CHILD_ENV: &str = "KEEL_KIT_CHILD";

/// The prefix of every line a child writes for its parent.
const LINE: &str = "keel-kit:";

/// How long a child may take before the parent gives up on it (a hung child is a failure,
/// never a wait without end).
const CHILD_TIMEOUT_MS: u64 = 60_000;

/// What a child process does.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Order {
    /// The Keel log, shared with the parent.
    pub keel_db: PathBuf,
    /// The simulator's base URL (it runs in the parent).
    pub provider_url: String,
    /// The provider tier the simulator plays.
    pub tier: Tier,
    /// The parent's clock: the child's starts there.
    pub now: DateTime<Utc>,
    /// The process number: the child's lease owner.
    pub process: u64,
    /// The seed's file of model requests ([`agents::Recorder`]).
    pub requests: PathBuf,
    /// A failpoint to stop at (its name) and the hit to stop on.
    pub point: Option<(String, u32)>,
    /// Its part.
    pub part: Part,
}

/// A child's part.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Part {
    /// Starts the kit's submission number `submission` as run `run_id`.
    Start { submission: usize, run_id: String },
    /// Recovers and resumes, as a restarted process does.
    Recover,
}

/// When the parent kills a child.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kill {
    /// Never: the child runs to its end.
    Never,
    /// This many milliseconds after it started.
    After(u64),
    /// When it reports it reached its failpoint.
    AtPoint,
}

/// The order in this process's environment, when it is a kit child.
pub(crate) fn order_from_env() -> Option<Result<Order, String>> {
    let text = std::env::var(CHILD_ENV).ok()?;
    Some(serde_json::from_str(&text).map_err(|e| format!("{CHILD_ENV} is not a kit order: {e}")))
}

/// The child's whole life: carries out `order` and exits the process (0 when done).
pub(crate) fn serve(kit: &Kit, order: Result<Order, String>) -> ! {
    let result = order.and_then(|order| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        runtime.block_on(carry_out(kit, order))
    });
    let mut out = std::io::stdout().lock();
    // The parent reads this line; if stdout is gone the parent is too, and the exit code says it.
    let code = match result {
        Ok(()) => i32::from(writeln!(out, "{LINE} done").is_err()),
        Err(message) => {
            let _ = writeln!(out, "{LINE} failed: {message}");
            1
        }
    };
    let _ = out.flush();
    std::process::exit(code)
}

async fn carry_out(kit: &Kit, order: Order) -> Result<(), String> {
    let failpoints = match &order.point {
        None => Failpoints::disarmed(),
        Some((name, nth)) => {
            let point = Point::parse(name).ok_or_else(|| format!("unknown failpoint {name}"))?;
            Failpoints::armed(point, *nth, Arc::new(stop_here))
        }
    };
    let clock = Arc::new(ManualClock::new(order.now));
    let provider = provider_at(&order.provider_url, order.tier)?;
    let (executor, store) = open_process(kit, &order.keel_db, clock.clone(), &provider, failpoints, order.process)?;
    let recorder = agents::Recorder { file: order.requests, process: order.process };
    let result = match order.part {
        Part::Start { submission: index, run_id } => match kit.submissions.get(index) {
            None => Err("the order names no submission of this kit".to_owned()),
            Some(Work::Workflow(submission)) => {
                let request = RunRequest {
                    run_id: RunId::new(run_id),
                    limits: kit.limits.clone(),
                    deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
                    cause: Cause::command("testkit"),
                };
                let started = executor.start(&submission.workflow, &submission.input, request).await;
                started.map(drop).map_err(|e| e.to_string())
            }
            Some(Work::Agent(agent)) => {
                agents::drive(agent, executor.runtime(), &clock, &agent_run_id(index), &recorder, true).await
            }
        },
        Part::Recover => recover(kit, &executor, &clock, &recorder).await,
    };
    store.shutdown().map_err(|e| e.to_string())?;
    result
}

/// A failpoint's hook in a child: tell the parent, then wait for its SIGKILL.
fn stop_here(point: Point) {
    let mut out = std::io::stdout().lock();
    // Nothing to do if stdout is gone: the parent that would read it is gone as well.
    let _ = writeln!(out, "{LINE} at {point}");
    let _ = out.flush();
    drop(out);
    loop {
        std::thread::park();
    }
}

/// Runs the child `order` as the test `test` of this very binary and kills it as `kill`
/// says. True when a SIGKILL hit it alive.
///
/// # Errors
///
/// When the child cannot start, fails, hangs, or never played its part (the test name does
/// not name the test that built the kit).
pub(crate) fn supervise(test: &str, order: &Order, kill: Kill) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the test binary: {e}"))?;
    let order_text = serde_json::to_string(order).map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, order_text)
        .env_remove(crate::SEED_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let stdout = child.stdout.take().ok_or("the child has no stdout")?;
    let (lines, heard) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may have begun the line (`test NAME ... `) before the test spoke.
            if let Some((_, said)) = line.split_once(LINE)
                && lines.send(said.trim().to_owned()).is_err()
            {
                break;
            }
        }
    });
    let started = Instant::now();
    let give_up = started + Duration::from_millis(CHILD_TIMEOUT_MS);
    let until = match kill {
        Kill::After(ms) => started + Duration::from_millis(ms),
        Kill::Never | Kill::AtPoint => give_up,
    };
    let mut said = Vec::new();
    let killed = loop {
        match heard.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(line) if line.starts_with("at ") && matches!(kill, Kill::AtPoint) => break true,
            Ok(line) => said.push(line),
            Err(RecvTimeoutError::Timeout) if matches!(kill, Kill::After(_)) => break true,
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the child took more than {CHILD_TIMEOUT_MS} ms"));
            }
            Err(RecvTimeoutError::Disconnected) => break false,
        }
    };
    let alive = killed && child.try_wait().map_err(|e| e.to_string())?.is_none();
    if alive {
        // `Child::kill` is SIGKILL on Unix: no handler, no destructor, no flush runs.
        child.kill().map_err(|e| format!("cannot SIGKILL the child: {e}"))?;
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if alive {
        return Ok(true);
    }
    // Not killed (or already gone): it must have played its part to the end.
    said.extend(heard.try_iter());
    if let Some(failed) = said.iter().find_map(|line| line.strip_prefix("failed: ")) {
        return Err(format!("the child failed: {failed}"));
    }
    if !said.iter().any(|line| line == "done") {
        return Err(format!(
            "the child exited ({status}) without playing its part: does {test:?} name, exactly, the test that \
             calls Kit::run (see Kit::killing)?"
        ));
    }
    Ok(false)
}
