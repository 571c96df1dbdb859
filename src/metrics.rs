//! `keel metrics`: seed 004's reliability figures, for people (`--json` for scripts,
//! `--prometheus` for a scraper).
//!
//! Owns the flags' translation (`--by` into `store::metrics::Dimension`, `--since` into an
//! instant) and the three renderings of the figures the store computes from its metrics
//! projection. It never reads events: every figure comes from `Reader::metrics`.

use crate::exit;
use crate::output::{Failure, Outcome, Output};
use crate::wiring::SystemClock;
use chrono::{DateTime, Utc};
use engine::clock::Clock as _;
use engine::event::RunStatus;
use engine::limits::{DRIFT_COST_SHARE, DRIFT_RATE_POINTS, DRIFT_SAMPLE_MIN};
use serde::Serialize;
use store::metrics::{BUDGET_STOPS, Dimension, Segment};

/// What `--by` segments by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The intent's operation: charge, refund.
    Operation,
    /// The agent tool that proposed the intent (refund); a workflow's own intent by its
    /// operation (charge, refund).
    Tool,
    /// The model that answered the run (`scripted` for a replayed transcript).
    Model,
    /// The run's prompt.version (fingerprint of its instructions and request).
    Prompt,
    /// The run's policy.version.
    Policy,
    /// The run's release.version (the keel build that started it).
    Release,
}

impl By {
    fn dimension(self) -> Dimension {
        match self {
            Self::Operation => Dimension::Operation,
            Self::Tool => Dimension::Tool,
            Self::Model => Dimension::Model,
            Self::Prompt => Dimension::Prompt,
            Self::Policy => Dimension::Policy,
            Self::Release => Dimension::Release,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Operation => "operation",
            Self::Tool => "tool",
            Self::Model => "model",
            Self::Prompt => "prompt",
            Self::Policy => "policy",
            Self::Release => "release",
        }
    }
}

/// One segment's figures as `--json` prints them.
#[derive(Serialize)]
pub struct Figures {
    /// The segment's value (`null` when unsegmented or unrecorded).
    pub segment: Option<String>,
    /// Intents reserved.
    pub intents: u64,
    /// Intents validated.
    pub validated: u64,
    /// Validated intents proven by a receipt or a lookup.
    pub verified: u64,
    /// `verified / validated`.
    pub outcome_verification_rate: Option<f64>,
    /// Intents unknown past their reconciliation window.
    pub ambiguous: u64,
    /// `ambiguous / intents`.
    pub ambiguous_outcome_rate: Option<f64>,
    /// Effects a retry would have repeated.
    pub retries_prevented: RetriesPrevented,
    /// Runs started.
    pub runs: u64,
    /// Model cost of the runs whose cost is known, minor units.
    pub cost_minor: i64,
    /// Runs whose model cost is unknown (an answer from a model without a price): not in
    /// `cost_minor`.
    pub cost_unknown_runs: u64,
    /// `cost_minor / validated`; `null` when some run's cost is unknown.
    pub cost_per_validated_intent_minor: Option<f64>,
    /// Runs stopped by each budget (`repeated_call`, the repeats-per-signature budget, among
    /// them).
    pub runs_stopped_by_budget: std::collections::BTreeMap<&'static str, u64>,
    /// Runs that ended otherwise than completed, by every status a run can end with: how
    /// many, and what share of the runs started.
    pub runs_stopped: std::collections::BTreeMap<&'static str, Stopped>,
    /// What `cost_minor` counts.
    pub cost_includes: &'static str,
    /// From reservation to a definitive outcome.
    pub time_to_definitive_outcome_ms: Quantiles,
}

/// See [`Figures::retries_prevented`].
#[derive(Serialize)]
pub struct RetriesPrevented {
    /// The three below.
    pub total: u64,
    /// Re-submissions answered with the stored outcome.
    pub deduplicated: u64,
    /// Proposals by another run while no new attempt could come of them.
    pub refused_resends: u64,
    /// Reconciliations that found the effect a resend would have repeated.
    pub reconciliation_found_effect: u64,
}

/// See [`Figures::runs_stopped`].
#[derive(Serialize)]
pub struct Stopped {
    /// Runs that ended with this status.
    pub runs: u64,
    /// `runs` over the runs started; `null` when none was.
    pub proportion: Option<f64>,
}

/// What a run's cost holds today, said wherever a cost is shown.
const COST_INCLUDES: &str = "model calls, at the prices the run was given; tools, provider fees and reconciliation \
     calls are not priced, so they count nothing";

/// See [`Figures::time_to_definitive_outcome_ms`].
#[derive(Serialize)]
pub struct Quantiles {
    /// Intents measured.
    pub count: usize,
    /// Median.
    pub p50: Option<i64>,
    /// 99th percentile.
    pub p99: Option<i64>,
}

/// The figures, by segment: what `keel metrics --json` prints and `GET /v1/metrics` answers.
#[derive(Serialize)]
pub struct Report {
    /// The window's start, when bounded.
    pub since: Option<String>,
    /// What the segments are (`null` when unsegmented).
    pub by: Option<&'static str>,
    /// One entry per segment (one when unsegmented).
    pub segments: Vec<Figures>,
    /// The rates that moved when a version changed (see [`Drift`]), over the same window.
    pub drift: Vec<Drift>,
}

/// A rate that moved when a version changed: seed 004's "a useful alert names the dimension
/// that drifts and the version from which it changed". Versions are the release, policy,
/// prompt and model the runs recorded, ordered by the first run of each in the window; each is
/// compared with the one before it, when both have at least `DRIFT_SAMPLE_MIN` intents (or
/// runs, for a rate over runs).
#[derive(Serialize)]
pub struct Drift {
    /// The dimension whose version changed: `release`, `policy`, `prompt` or `model`.
    pub dimension: &'static str,
    /// The rate that moved (a figure of [`Figures`]).
    pub rate: &'static str,
    /// The version before.
    pub from_version: String,
    /// The version from which the rate changed.
    pub to_version: String,
    /// The rate under `from_version`.
    pub before: f64,
    /// The rate under `to_version`.
    pub after: f64,
}

/// How a rate is read from a segment, and how much of a move is a drift.
struct Watched {
    rate: &'static str,
    /// Over runs (else over intents): which count the sample floor applies to.
    over_runs: bool,
    value: fn(&Segment) -> Option<f64>,
    /// The move that is a drift: an absolute one for a proportion, a relative one for a cost.
    moved: fn(f64, f64) -> bool,
}

fn moved_by_points(before: f64, after: f64) -> bool {
    (after - before).abs() >= DRIFT_RATE_POINTS
}

fn moved_by_share(before: f64, after: f64) -> bool {
    if before == 0.0 { after != 0.0 } else { ((after - before) / before).abs() >= DRIFT_COST_SHARE }
}

/// The rates a drift is looked for in.
const WATCHED: [Watched; 5] = [
    Watched {
        rate: "outcome_verification_rate",
        over_runs: false,
        value: Segment::verification_rate,
        moved: moved_by_points,
    },
    Watched {
        rate: "ambiguous_outcome_rate",
        over_runs: false,
        value: Segment::ambiguous_rate,
        moved: moved_by_points,
    },
    Watched {
        rate: "retries_prevented_rate",
        over_runs: false,
        value: |s| store::metrics::ratio(s.retries_prevented(), s.intents),
        moved: moved_by_points,
    },
    Watched {
        rate: "runs_stopped_by_budget_rate",
        over_runs: true,
        value: |s| store::metrics::ratio(s.budget_stopped(), s.runs),
        moved: moved_by_points,
    },
    Watched {
        rate: "cost_per_validated_intent_minor",
        over_runs: false,
        value: Segment::cost_per_validated,
        moved: moved_by_share,
    },
];

/// The drifts over the versions of every versioned dimension (see [`Drift`]).
fn drifts(
    reader: &store::Reader,
    since: Option<DateTime<Utc>>,
    tenant: Option<&str>,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<Drift>> {
    let mut drifts = Vec::new();
    for by in [By::Release, By::Policy, By::Prompt, By::Model] {
        let mut versions: Vec<Segment> = reader
            .metrics(since, Some(by.dimension()), tenant, now)?
            .into_iter()
            .filter(|s| s.value.is_some())
            .collect();
        versions.sort_by_key(|segment| segment.first_run_at);
        for pair in versions.windows(2) {
            let [from, to] = pair else { continue };
            for watched in &WATCHED {
                let sample = |s: &Segment| if watched.over_runs { s.runs } else { s.intents };
                if sample(from) < DRIFT_SAMPLE_MIN || sample(to) < DRIFT_SAMPLE_MIN {
                    continue;
                }
                let (Some(before), Some(after)) = ((watched.value)(from), (watched.value)(to)) else { continue };
                if (watched.moved)(before, after) {
                    drifts.push(Drift {
                        dimension: by.name(),
                        rate: watched.rate,
                        from_version: from.value.clone().unwrap_or_default(),
                        to_version: to.value.clone().unwrap_or_default(),
                        before,
                        after,
                    });
                }
            }
        }
    }
    Ok(drifts)
}

fn figures(segment: &Segment) -> Figures {
    let stopped = |status: &RunStatus| segment.stops.get(status.as_str()).copied().unwrap_or(0);
    let stops = BUDGET_STOPS.iter().map(|status| (status.as_str(), stopped(status))).collect();
    let runs_stopped = RunStatus::ALL
        .iter()
        .filter(|status| **status != RunStatus::Completed)
        .map(|status| {
            let runs = stopped(status);
            (status.as_str(), Stopped { runs, proportion: store::metrics::ratio(runs, segment.runs) })
        })
        .collect();
    Figures {
        segment: segment.value.clone(),
        intents: segment.intents,
        validated: segment.validated,
        verified: segment.verified,
        outcome_verification_rate: segment.verification_rate(),
        ambiguous: segment.ambiguous,
        ambiguous_outcome_rate: segment.ambiguous_rate(),
        retries_prevented: RetriesPrevented {
            total: segment.retries_prevented(),
            deduplicated: segment.deduplicated,
            refused_resends: segment.refused_resends,
            reconciliation_found_effect: segment.reconciled_found,
        },
        runs: segment.runs,
        cost_minor: segment.cost_minor,
        cost_unknown_runs: segment.cost_unknown_runs,
        cost_per_validated_intent_minor: segment.cost_per_validated(),
        runs_stopped_by_budget: stops,
        runs_stopped,
        cost_includes: COST_INCLUDES,
        time_to_definitive_outcome_ms: Quantiles {
            count: segment.settle_ms.len(),
            p50: segment.settle_quantile_ms(0.5),
            p99: segment.settle_quantile_ms(0.99),
        },
    }
}

/// Refuses `--prometheus` with `--json` (before anything is read).
pub fn check_format(out: &Output, prometheus: bool) -> Result<(), Failure> {
    if prometheus && out.json {
        return Err(Failure::Usage("--prometheus and --json are two formats: choose one".into()));
    }
    Ok(())
}

/// The figures at `now` of the intents reserved and runs started since `since`, segmented
/// `by`, only `tenant`'s when given (the API's and the console's: a key sees its own tenant's
/// figures). One pass over the metrics projection's narrow rows.
///
/// # Errors
///
/// The log's, when it cannot be read.
pub fn report(
    reader: &store::Reader,
    since: Option<DateTime<Utc>>,
    by: Option<By>,
    tenant: Option<&str>,
    now: DateTime<Utc>,
) -> anyhow::Result<Report> {
    let segments = reader.metrics(since, by.map(By::dimension), tenant, now)?;
    Ok(Report {
        since: since.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        by: by.map(By::name),
        segments: segments.iter().map(figures).collect(),
        drift: drifts(reader, since, tenant, now)?,
    })
}

/// What `keel metrics` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// Every figure (`--json`: the whole report).
    Figures,
    /// The Prometheus text exposition format.
    Prometheus,
    /// Only the rates that moved when a version changed (`--json`: `{since, drift}`).
    Drift,
}

/// `keel metrics --drift --json`.
#[derive(Serialize)]
struct DriftReport<'a> {
    since: &'a Option<String>,
    drift: &'a [Drift],
}

/// `keel metrics`.
pub fn show(reader: &store::Reader, out: &Output, since: Option<&str>, by: Option<By>, shown: Shown) -> Outcome {
    let now = SystemClock.now();
    let since = since.map(|s| crate::runs::parse_since(s, now)).transpose()?;
    let report = report(reader, since, by, None, now)?;
    match shown {
        Shown::Prometheus => prometheus_lines(&report).iter().for_each(|line| outln!("{line}")),
        Shown::Drift => {
            out.emit(&DriftReport { since: &report.since, drift: &report.drift }, || print_drift(&report.drift));
        }
        Shown::Figures => out.emit(&report, || {
            print_human(&report);
            if !report.drift.is_empty() {
                outln!("");
                print_drift(&report.drift);
            }
        }),
    }
    Ok(exit::OK)
}

fn print_drift(drift: &[Drift]) {
    if drift.is_empty() {
        outln!("no rate moved when a release, policy, prompt or model changed");
    }
    for moved in drift {
        outln!(
            "drift: {} went from {:.3} to {:.3} when {} changed from {} to {}",
            moved.rate,
            moved.before,
            moved.after,
            moved.dimension,
            moved.from_version,
            moved.to_version
        );
    }
}

fn percent(rate: Option<f64>) -> String {
    rate.map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0))
}

fn millis(ms: Option<i64>) -> String {
    ms.map_or("-".to_owned(), |ms| format!("{ms} ms"))
}

fn print_human(report: &Report) {
    match (&report.since, report.by) {
        (Some(since), _) => outln!("intents reserved and runs started since {since}"),
        (None, _) => outln!("every intent and run in the log"),
    }
    for figures in &report.segments {
        if let Some(by) = report.by {
            outln!("");
            outln!("{by} = {}", figures.segment.as_deref().unwrap_or("(not recorded)"));
        }
        outln!(
            "  outcome verification rate   {:>8}  ({} of {} validated proven by a receipt or a lookup)",
            percent(figures.outcome_verification_rate),
            figures.verified,
            figures.validated
        );
        outln!(
            "  ambiguous outcome rate      {:>8}  ({} of {} intents unknown past their reconciliation window)",
            percent(figures.ambiguous_outcome_rate),
            figures.ambiguous,
            figures.intents
        );
        let prevented = &figures.retries_prevented;
        outln!(
            "  retries prevented           {:>8}  ({} deduplicated, {} refused as a resend, {} found by reconciliation)",
            prevented.total,
            prevented.deduplicated,
            prevented.refused_resends,
            prevented.reconciliation_found_effect
        );
        let unknown = match figures.cost_unknown_runs {
            0 => String::new(),
            n => format!("; {n} run(s) of unknown cost, an answer without a price"),
        };
        outln!(
            "  cost per validated intent   {:>8}  ({} minor units over {} run(s){unknown})",
            figures.cost_per_validated_intent_minor.map_or("-".to_owned(), |c| format!("{c:.2}")),
            figures.cost_minor,
            figures.runs
        );
        let stops: Vec<String> = figures.runs_stopped_by_budget.iter().map(|(k, v)| format!("{k} {v}")).collect();
        outln!("  runs stopped by budget      {}", stops.join(", "));
        let times = &figures.time_to_definitive_outcome_ms;
        outln!(
            "  time to definitive outcome  p50 {}, p99 {} (over {} intent(s))",
            millis(times.p50),
            millis(times.p99),
            times.count
        );
    }
}

/// The Prometheus text exposition format, one line each: one gauge family per figure
/// (`# HELP`, `# TYPE`, then a sample per segment), labelled by segment — what `keel metrics
/// --prometheus` prints and `GET /metrics` answers.
pub fn prometheus_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    let label = |figures: &Figures| match (report.by, &figures.segment) {
        (Some(by), Some(value)) => format!("{{{by}=\"{}\"}}", value.replace('\\', "\\\\").replace('"', "\\\"")),
        (Some(by), None) => format!("{{{by}=\"\"}}"),
        (None, _) => String::new(),
    };
    let mut family = |name: &str, help: &str, value: &dyn Fn(&Figures) -> Option<String>| {
        lines.push(format!("# HELP keel_{name} {help}"));
        lines.push(format!("# TYPE keel_{name} gauge"));
        for figures in &report.segments {
            if let Some(value) = value(figures) {
                lines.push(format!("keel_{name}{} {value}", label(figures)));
            }
        }
    };
    family("intents", "Intents reserved.", &|f| Some(f.intents.to_string()));
    family("intents_validated", "Intents validated.", &|f| Some(f.validated.to_string()));
    family("outcome_verification_ratio", "Validated intents proven by a provider receipt or lookup.", &|f| {
        f.outcome_verification_rate.map(|r| r.to_string())
    });
    family("ambiguous_outcome_ratio", "Intents unknown past their normal reconciliation window.", &|f| {
        f.ambiguous_outcome_rate.map(|r| r.to_string())
    });
    family("retries_prevented", "Deduplications, refused resends and reconciliations that found the effect.", &|f| {
        Some(f.retries_prevented.total.to_string())
    });
    family("resends_refused", "Proposals of an intent by another run while no new attempt could come of them.", &|f| {
        Some(f.retries_prevented.refused_resends.to_string())
    });
    family("cost_per_validated_intent_minor", "Model cost per validated intent, minor units.", &|f| {
        f.cost_per_validated_intent_minor.map(|c| c.to_string())
    });
    family("runs_cost_unknown", "Runs whose model cost is unknown: an answer from a model without a price.", &|f| {
        Some(f.cost_unknown_runs.to_string())
    });
    family("time_to_definitive_outcome_p50_ms", "Median time from reservation to a definitive outcome.", &|f| {
        f.time_to_definitive_outcome_ms.p50.map(|v| v.to_string())
    });
    family(
        "time_to_definitive_outcome_p99_ms",
        "99th percentile time from reservation to a definitive outcome.",
        &|f| f.time_to_definitive_outcome_ms.p99.map(|v| v.to_string()),
    );
    lines.push(
        "# HELP keel_drift A rate that moved when a version changed: its value under the new version.".to_owned(),
    );
    lines.push("# TYPE keel_drift gauge".to_owned());
    for moved in &report.drift {
        let quoted = |text: &str| text.replace('\\', "\\\\").replace('"', "\\\"");
        lines.push(format!(
            "keel_drift{{dimension=\"{}\",rate=\"{}\",from=\"{}\",to=\"{}\"}} {}",
            moved.dimension,
            moved.rate,
            quoted(&moved.from_version),
            quoted(&moved.to_version),
            moved.after
        ));
    }
    lines.push("# HELP keel_runs_stopped_by_budget Runs stopped by each budget.".to_owned());
    lines.push("# TYPE keel_runs_stopped_by_budget gauge".to_owned());
    for figures in &report.segments {
        let base = label(figures);
        for (status, count) in &figures.runs_stopped_by_budget {
            let labels = match base.strip_suffix('}') {
                Some(open) => format!("{open},budget=\"{status}\"}}"),
                None => format!("{{budget=\"{status}\"}}"),
            };
            lines.push(format!("keel_runs_stopped_by_budget{labels} {count}"));
        }
    }
    lines
}
