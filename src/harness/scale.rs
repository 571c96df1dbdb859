//! `keel bench-scale`: what one command costs as the log grows.
//!
//! Owns the scale benchmark. For each log size (0, 10 000, 100 000 and 1 000 000 charges by
//! default) it grows a log in `--dir` with the in-process benchmark path
//! ([`super::bench::build`], resumable: a log already as large is reused, a smaller one
//! extended), then times whole `keel` processes on it — `charge` (one new intent, through a
//! provider simulator child), `show KEY`, `intents --state outcome_unknown` and `resume` —
//! under `/usr/bin/time`, which reports each one's wall time and peak RSS. Then it leaves
//! `--in-flight` attempts in flight in a fresh log (a child process that ends with them
//! pending, as a crash would) and times the `keel resume` that recovers them. Medians of
//! `--runs` runs are printed, with each log's bytes per charge. Nothing is asserted.

use super::bench::BENCH_TENANT;
use crate::exit;
use crate::output::Output;
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::{Command, Stdio};

/// What `keel resume --json` prints that this measurement counts: the intents it found in
/// flight and recovered.
#[derive(Deserialize)]
struct Resumed {
    recovered: Vec<serde::de::IgnoredAny>,
}

/// One command's figures on one log.
#[derive(Debug, Serialize)]
struct Figure {
    command: String,
    charges: usize,
    wall_ms: f64,
    peak_rss_mb: f64,
}

/// Every figure, and each log's size.
#[derive(Debug, Serialize)]
struct Report {
    figures: Vec<Figure>,
    logs: Vec<LogSize>,
}

#[derive(Debug, Serialize)]
struct LogSize {
    charges: usize,
    bytes: u64,
    bytes_per_charge: f64,
}

/// Runs `keel ARGS` under `/usr/bin/time`; returns (wall ms, peak RSS MiB, its stdout). The
/// wall time is this process's monotonic clock around the child (GNU time's has 10 ms
/// steps); the peak RSS is GNU time's.
fn timed(args: &[String]) -> anyhow::Result<(f64, f64, String)> {
    let began = std::time::Instant::now();
    let output = Command::new("/usr/bin/time")
        .args(["-f", "keel-scale %e %M"])
        .arg(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run /usr/bin/time (GNU time) for the scale benchmark")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr.lines().rev().find(|l| l.starts_with("keel-scale ")).context("no timing from /usr/bin/time")?;
    let mut parts = line.split_whitespace().skip(1);
    let wall_ms = began.elapsed().as_secs_f64() * 1000.0;
    let _gnu_seconds = parts.next().context("wall time")?;
    let kib: f64 = parts.next().context("peak RSS")?.parse()?;
    Ok((wall_ms, kib / 1024.0, String::from_utf8_lossy(&output.stdout).into_owned()))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// How many charges the log at `db` was built with (a note next to it), 0 if none.
fn built(db: &Path) -> usize {
    std::fs::read_to_string(db.with_extension("built")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// Grows the log at `db` to `charges`, in steps the note records (so an interrupted build
/// resumes where it stopped).
async fn grow(out: &Output, db: &Path, charges: usize) -> anyhow::Result<()> {
    const STEP: usize = 50_000;
    let mut have = built(db);
    let name = db.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let progress = out.progress(charges as u64, &format!("bench-scale: building {name}"));
    progress.set(have as u64);
    while have < charges {
        let count = STEP.min(charges - have);
        if !out.progress_allowed() && !out.json {
            errln!("keel bench-scale: {}: charges {have}..{}", db.display(), have + count);
        }
        // Durability does not change what is written, only what a power cut keeps: the build
        // is set-up, the measured commands run at the default.
        let validated = super::bench::build(db, store::Durability::Normal, have, count, 64, progress.clone()).await?;
        anyhow::ensure!(validated == count, "only {validated} of {count} charges validated while building");
        have += count;
        std::fs::write(db.with_extension("built"), have.to_string())?;
    }
    progress.finish();
    Ok(())
}

/// A fresh log with `count` attempts left in flight by a child process that ended with them.
fn leave_in_flight(dir: &Path, count: usize) -> anyhow::Result<std::path::PathBuf> {
    let db = dir.join(format!("in-flight-{count}-{}.db", uuid::Uuid::new_v4().simple()));
    let status = Command::new(std::env::current_exe()?)
        .arg("--db")
        .arg(&db)
        .args(["bench-leave-in-flight", "--intents", &count.to_string()])
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "leaving attempts in flight failed: {status}");
    Ok(db)
}

fn remove(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// `keel bench-scale`.
pub async fn run(out: &Output, dir: &Path, sizes: &[usize], runs: usize, in_flight: usize) -> anyhow::Result<u8> {
    std::fs::create_dir_all(dir)?;
    let sim = super::start_sim(&dir.join("sim.db"), None, Stdio::null())?;
    let url = sim.url().to_owned();
    let mut report = Report { figures: Vec::new(), logs: Vec::new() };
    for &charges in sizes {
        let db = dir.join(format!("scale-{charges}.db"));
        grow(out, &db, charges).await?;
        let bytes = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
        report.logs.push(LogSize {
            charges,
            bytes,
            bytes_per_charge: if charges == 0 { 0.0 } else { bytes as f64 / charges as f64 },
        });
        let db_arg = db.display().to_string();
        let shown = format!("charge:{BENCH_TENANT}:bench_intent_{:08}", charges / 2);
        let commands: Vec<(&str, Vec<String>)> = vec![
            ("charge", Vec::new()),
            ("show", vec!["show".into(), shown]),
            ("intents --state outcome_unknown", vec!["intents".into(), "--state".into(), "outcome_unknown".into()]),
            ("resume", vec!["--provider".into(), url.clone(), "resume".into()]),
        ];
        for (name, args) in commands {
            let (mut walls, mut rss) = (Vec::new(), Vec::new());
            for run in 0..runs {
                let args = if name == "charge" {
                    let id = format!("scale_probe_{}_{run}", uuid::Uuid::new_v4().simple());
                    [
                        "--provider",
                        &url,
                        "charge",
                        "--tenant",
                        BENCH_TENANT,
                        "--intent-id",
                        &id,
                        "--order",
                        &id,
                        "--amount-minor",
                        "100",
                        "--currency",
                        "EUR",
                        "--payment-method-token",
                        "pm_scale_token_0123456789",
                    ]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect()
                } else {
                    args.clone()
                };
                let full: Vec<String> =
                    ["--json".to_owned(), "--db".to_owned(), db_arg.clone()].into_iter().chain(args).collect();
                let (wall, peak, _) = timed(&full)?;
                walls.push(wall);
                rss.push(peak);
            }
            report.figures.push(Figure {
                command: name.to_owned(),
                charges,
                wall_ms: median(walls),
                peak_rss_mb: median(rss),
            });
        }
    }
    if in_flight > 0 {
        // The recovery commit alone, in this process: open, `Recover`, commit, shut down.
        let db = leave_in_flight(dir, in_flight)?;
        let began = std::time::Instant::now();
        let store = crate::wiring::open_store(&db, store::Durability::Full)?;
        let recover = engine::ledger::Command::new(
            engine::event::Cause::recovery(),
            engine::ledger::Action::Recover { owner: crate::wiring::lessee().owner().clone(), run: None },
        );
        let recovered = match engine::log::EventLog::execute(&store, recover).await? {
            engine::ledger::Reply::Recovered(recovery) => recovery.recovered.len(),
            _ => 0,
        };
        store.shutdown()?;
        report.figures.push(Figure {
            command: format!("open + recovery commit ({in_flight} in flight, {recovered} recovered)"),
            charges: in_flight,
            wall_ms: began.elapsed().as_secs_f64() * 1000.0,
            peak_rss_mb: 0.0,
        });
        remove(&db);
        // The whole `keel resume`: recovery, then every unfinished run replayed.
        let db = leave_in_flight(dir, in_flight)?;
        let db_arg = db.display().to_string();
        let args = ["--json", "--db", &db_arg, "--provider", &url, "resume"].map(str::to_owned);
        let (wall, peak, stdout) = timed(&args)?;
        let recovered = serde_json::from_str::<Resumed>(&stdout)
            .with_context(|| format!("keel resume --json printed no report: {stdout}"))?
            .recovered
            .len();
        report.figures.push(Figure {
            command: format!("resume ({in_flight} in flight, {recovered} recovered)"),
            charges: in_flight,
            wall_ms: wall,
            peak_rss_mb: peak,
        });
        remove(&db);
    }
    drop(sim);
    out.emit(&report, || {
        outln!("{:<44} {:>9} {:>10} {:>12}", "command", "charges", "wall ms", "peak RSS MB");
        for f in &report.figures {
            outln!("{:<44} {:>9} {:>10.1} {:>12.1}", f.command, f.charges, f.wall_ms, f.peak_rss_mb);
        }
        for log in &report.logs {
            outln!("log of {} charges: {} bytes, {:.0} bytes per charge", log.charges, log.bytes, log.bytes_per_charge);
        }
    });
    Ok(exit::OK)
}
