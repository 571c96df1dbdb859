//! The operator's surface through the real binary (issue 10): a closed stdout, the exit-code
//! table row by row, missing logs refused, help that shows each option where it acts, the
//! human renderings, `keel runs` / `keel run show` / `keel run cancel`, an agent run's id
//! printed as it starts, and `keel resume` finishing a killed agent run without asking a
//! recorded model call again.

use crate::agent::{KEY, ModelServer, fixture, keel as agent_keel, keel_raw, recorded_answers};
use crate::approvals::Desk;
use crate::cli::{charge_args, keel, start_sim, temp};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

/// `keel ARGS` without `--json`, nothing inherited that would change it.
fn human(db: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.arg("--db").arg(db).args(args).stdin(Stdio::null());
    for var in ["KEEL_DB", "KEEL_PROVIDER_URL", "RUST_LOG", "NO_COLOR", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"] {
        command.env_remove(var);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("keel runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A log holding one completed ticket-review run (no provider needed).
fn log_with_a_run() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let (dir, db) = temp();
    let (code, report) = agent_keel(&db, &["agent", "run", "ticket-review", "--scenario", "complete"], &[]);
    assert_eq!(code, 0, "{report}");
    let run_id = report["run_id"].as_str().expect("a run id").to_owned();
    (dir, db, run_id)
}

// ----- a closed stdout ---------------------------------------------------------------------

#[test]
fn every_command_meets_a_closed_stdout_quietly() {
    let (_dir, db, run_id) = log_with_a_run();
    let commands: [&[&str]; 8] = [
        &["intents"],
        &["runs"],
        &["run", "show", &run_id],
        &["verify"],
        &["--json", "runs"],
        &["--help"],
        &["agent", "run", "ticket-review", "--scenario", "complete"],
        &["show", "charge:t:order_1842_charge"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader); // Whoever read it went away: every write meets a broken pipe.
        let output = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--db")
            .arg(&db)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .env_remove("KEEL_DB")
            .output()
            .expect("keel runs");
        let stderr = text(&output.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        let expected = if args[0] == "show" { 64 } else { 0 };
        assert_eq!(output.status.code(), Some(expected), "{args:?}: the command's own exit code, not 101: {stderr}");
    }
}

#[test]
fn intents_piped_into_head_exits_quietly() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    for n in 0..3 {
        let id = format!("order_19{n:02}_charge");
        assert_eq!(keel(&db, Some(sim.url()), &charge_args(&id, "100")).0, 0);
    }
    let script = format!(
        "'{}' --db '{}' intents | head -1; echo \"keel=${{PIPESTATUS[0]}}\"",
        env!("CARGO_BIN_EXE_keel"),
        db.display()
    );
    let output = Command::new("bash").args(["-c", &script]).env_remove("KEEL_DB").output().expect("bash runs");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(stdout.starts_with("STATUS"), "the header line: {stdout}");
    assert!(stdout.contains("keel=0"), "keel exits 0 when its reader goes away: {stdout} {stderr}");
    assert!(stderr.is_empty(), "quietly: {stderr}");
}

// ----- the exit-code table, row by row -----------------------------------------------------

#[test]
fn exit_0_for_what_went_as_asked() {
    let (_dir, db, run_id) = log_with_a_run();
    for args in [&["intents"][..], &["runs"], &["run", "show", &run_id], &["verify"]] {
        assert_eq!(agent_keel(&db, args, &[]).0, 0, "{args:?}");
    }
}

#[test]
fn exit_1_for_an_internal_error() {
    let (_dir, db) = temp();
    std::fs::write(&db, b"this is not an event log, just some bytes that SQLite will not open as one").expect("writes");
    let (code, report) = agent_keel(&db, &["intents"], &[]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["status"], "error");
}

#[test]
fn exit_2_for_a_controlled_outcome_or_a_refusal() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let mut gated = charge_args("order_1842_charge", "5000");
    gated.extend(["--approval-threshold-minor", "1000"]);
    let (code, waiting, _) = keel(&db, Some(sim.url()), &gated);
    assert_eq!((code, waiting["status"].as_str()), (2, Some("awaiting_approval")), "{waiting}");
    let (code, rejected, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "9900"));
    assert_eq!((code, rejected["status"].as_str()), (2, Some("rejected")), "{rejected}");
    let key = waiting["intent_key"].as_str().expect("a key");
    let (code, refused, _) = keel(&db, None, &["deny", key, "--by", "ana", "--reason", "no"]);
    assert_eq!(code, 0, "{refused}");
    let (code, refused, _) = keel(&db, None, &["approve", key, "--by", "ana"]);
    assert_eq!(
        (code, refused["status"].as_str()),
        (2, Some("refused")),
        "a rejected intent takes no approval: {refused}"
    );
    let (code, forbidden) = agent_keel(&db, &["agent", "run", "ticket-review", "--scenario", "forbidden"], &[]);
    assert_eq!((code, forbidden["status"].as_str()), (2, Some("permission_denied")));
}

#[test]
fn exit_64_for_a_missing_provider_whichever_command_needs_it() {
    let (_dir, db, _run) = log_with_a_run();
    let cases: [&[&str]; 5] = [
        &[
            "charge",
            "--tenant",
            TENANT,
            "--intent-id",
            "order_1842_charge",
            "--order",
            "o",
            "--amount-minor",
            "1",
            "--currency",
            "EUR",
            "--payment-method-token",
            testkit::sample::CARD_TOKEN,
        ],
        &["agent", "run", "support", "--scenario", "refund"],
        &["reconcile", "--due"],
        &["resume"],
        &[
            "refund",
            "--tenant",
            TENANT,
            "--intent-id",
            "order_1842_refund",
            "--order",
            "o",
            "--amount-minor",
            "1",
            "--currency",
            "EUR",
        ],
    ];
    for args in cases {
        let (code, report) = agent_keel(&db, args, &[]);
        assert_eq!(code, 64, "{args:?}: {report}");
        assert_eq!(report["reason"], "missing_provider", "{args:?}: {report}");
        assert!(report["error"].as_str().is_some_and(|e| e.contains("--provider")), "{report}");
    }
}

#[test]
fn exit_64_for_an_intent_or_run_that_is_not_there() {
    let (_dir, db, _run) = log_with_a_run();
    let key = format!("charge:{TENANT}:order_0000_charge");
    let cases: [&[&str]; 6] = [
        &["show", &key],
        &["agent", "resume", "no-such-run"],
        &["run", "show", "no-such-run"],
        &["run", "cancel", "no-such-run", "--by", "ana", "--reason", "r"],
        &["approve", &key, "--by", "ana"],
        &["cancel", &key, "--by", "ana", "--reason", "r"],
    ];
    for args in cases {
        let (code, report) = agent_keel(&db, args, &[]);
        assert_eq!(code, 64, "{args:?}: {report}");
        assert_eq!(report["reason"], "not_found", "{args:?}: {report}");
    }
}

#[test]
fn exit_64_for_a_missing_log_with_one_clear_line_and_nothing_created() {
    let (dir, _) = temp();
    let db = dir.path().join("typo.db");
    let key = format!("charge:{TENANT}:order_1842_charge");
    let cases: [&[&str]; 13] = [
        &["intents"],
        &["show", &key],
        &["runs"],
        &["run", "show", "r"],
        &["run", "cancel", "r", "--by", "ana", "--reason", "r"],
        &["verify"],
        &["resume", "--provider", "http://127.0.0.1:9"],
        &["reconcile", "--due", "--provider", "http://127.0.0.1:9"],
        &["cancel", &key, "--by", "ana", "--reason", "r"],
        &["approve", &key, "--by", "ana"],
        &["deny", &key, "--by", "ana", "--reason", "r"],
        &["resolve", &key, "--absent", "--by", "ana", "--reason", "r"],
        &["agent", "resume", "r"],
    ];
    for args in cases {
        let output = human(&db, args, &[]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert_eq!(stderr.matches("typo.db").count(), 1, "{args:?}: the path once: {stderr}");
        assert!(stderr.contains("--create"), "{stderr}");
        assert!(!db.exists(), "{args:?} created nothing");
    }
    let (code, report) = agent_keel(&db, &["intents"], &[]);
    assert_eq!((code, report["reason"].as_str()), (64, Some("missing_database")));
    let (code, report) = agent_keel(&db, &["intents", "--create"], &[]);
    assert_eq!((code, report), (0, Value::Array(Vec::new())), "--create starts an empty log");
    assert!(db.exists());
    assert_eq!(agent_keel(&db, &["verify"], &[]).0, 0, "now it exists");
}

#[test]
fn exit_64_for_bad_input() {
    let (_dir, db, run_id) = log_with_a_run();
    let cases: [&[&str]; 7] = [
        &["intents", "--state", "bogus"],
        &["runs", "--status", "bogus"],
        &["runs", "--since", "yesterday-ish"],
        &["show", "not-a-key"],
        &["agent", "run", "ticket-review", "--scenario", "complete", "--capabilities", "bogus.cap"],
        &["run", "cancel", &run_id, "--by", " ", "--reason", "r"],
        &["charge", "--amount-minor", "abc"],
    ];
    for args in cases {
        let (code, report) = agent_keel(&db, args, &[]);
        assert_eq!(code, 64, "{args:?}: {report}");
        assert_eq!(report["status"], "usage_error", "{args:?}: {report}");
    }
    let (_, report) = agent_keel(&db, &["runs", "--status", "bogus"], &[]);
    let error = report["error"].as_str().unwrap_or_default();
    for status in ["running", "completed", "cancelled", "tool_budget"] {
        assert!(error.contains(status), "the valid statuses are listed: {error}");
    }
    let (_, report) = agent_keel(
        &db,
        &["agent", "run", "ticket-review", "--scenario", "complete", "--capabilities", "bogus.cap"],
        &[],
    );
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("bogus.cap") && error.contains("ticket.read") && error.contains("review.finish"), "{error}");
}

// ----- help ----------------------------------------------------------------------------------

fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_keel")).args(args).arg("--help").output().expect("keel runs");
    assert_eq!(output.status.code(), Some(0), "{args:?}");
    text(&output.stdout)
}

#[test]
fn help_shows_each_option_only_where_it_acts() {
    for read_only in [&["show"][..], &["intents"], &["verify"], &["runs"], &["run", "show"]] {
        let text = help(read_only);
        for option in ["--durability", "--provider", "--provider-tier", "--provider-timeout-ms", "--lease-ttl-ms"] {
            assert!(!text.contains(option), "{read_only:?} shows {option}:\n{text}");
        }
        assert!(text.contains("--create"), "{read_only:?}:\n{text}");
    }
    let bench = help(&["bench"]);
    // `keel bench --provider URL` charges through that provider, its tier and timeouts with it.
    assert!(bench.contains("--durability") && bench.contains("--provider-timeout-ms"), "{bench}");
    for writes in [&["charge"][..], &["resume"], &["reconcile"], &["agent", "run"]] {
        let text = help(writes);
        assert!(text.contains("--durability") && text.contains("--provider-timeout-ms"), "{writes:?}:\n{text}");
    }
    let approve = help(&["approve"]);
    assert!(approve.contains("--durability") && !approve.contains("--provider"), "{approve}");
    let top = Command::new(env!("CARGO_BIN_EXE_keel")).output().expect("keel runs");
    assert_eq!(top.status.code(), Some(64));
    let listing = text(&top.stderr);
    assert!(listing.contains("Usage: keel") && listing.contains("charge"), "{listing}");
    for hidden in ["soak-worker", "provider-sim", "bench-leave-in-flight", "--durability", "--provider"] {
        assert!(!listing.contains(hidden), "`keel` alone lists {hidden}:\n{listing}");
    }
    assert!(!listing.starts_with("keel: "), "the help as it is: {listing}");
    let reconcile = Command::new(env!("CARGO_BIN_EXE_keel")).arg("reconcile").output().expect("runs");
    let usage = text(&reconcile.stderr);
    assert!(usage.contains("<KEY|--due>"), "{usage}");
    assert!(help(&["reconcile"]).contains("<KEY|--due>"));
    let resolve = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["resolve", "charge:t:k", "--by", "ana", "--reason", "r"])
        .output()
        .expect("runs");
    let usage = text(&resolve.stderr);
    assert!(usage.contains("--landed") && usage.contains("--absent"), "{usage}");
}

// ----- human output --------------------------------------------------------------------------

#[test]
fn human_output_counts_in_words_and_lists_with_a_header() {
    let (dir, db) = temp();
    let complete = human(&db, &["agent", "run", "ticket-review", "--scenario", "complete"], &[]);
    assert!(text(&complete.stdout).contains("(3 model calls, 2 tool calls)"), "{}", text(&complete.stdout));
    let forbidden = human(&db, &["agent", "run", "ticket-review", "--scenario", "forbidden"], &[]);
    assert!(text(&forbidden.stdout).contains("(1 model call, 0 tool calls)"), "{}", text(&forbidden.stdout));

    let sim = start_sim(dir.path(), None);
    let charged =
        human(&db, &[&["--provider", sim.url()][..], &charge_args("order_1842_charge", "4900")].concat(), &[]);
    assert!(text(&charged.stdout).contains(", 1 attempt"), "{}", text(&charged.stdout));
    assert!(!text(&charged.stdout).contains("attempt(s)"));
    let listed = text(&human(&db, &["intents"], &[]).stdout);
    let mut lines = listed.lines();
    let header = lines.next().unwrap_or_default();
    for column in ["STATUS", "KEY", "AMOUNT", "ATTEMPTS", "LAST SENT"] {
        assert!(header.contains(column), "{listed}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(row.contains("49.00 EUR") && row.contains("1/"), "{listed}");
    assert!(row.chars().filter(|c| *c == ':').count() >= 4, "a time on the row: {row}");
}

#[test]
fn a_refused_proposal_names_no_run_and_no_reserved_limits() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let mut denied = charge_args("order_1842_charge", "4900");
    denied.extend(["--max-charge-minor", "100"]);
    let (code, report, _) = keel(&db, Some(sim.url()), &denied);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["code"], "policy_denied");
    assert_eq!(report["recorded"], false);
    assert!(report.get("run_id").is_none(), "no run was written: {report}");
    let refund = [
        "refund",
        "--tenant",
        TENANT,
        "--intent-id",
        "order_1842_refund",
        "--order",
        "order_1842",
        "--amount-minor",
        "100",
        "--currency",
        "EUR",
    ];
    let (code, report, _) = keel(&db, Some(sim.url()), &refund);
    assert_eq!((code, report["code"].as_str()), (2, Some("invariant_violated")), "{report}");
    assert!(report.get("attempts_max").is_none() && report.get("run_id").is_none(), "{report}");
    let (_, runs, _) = keel(&db, None, &["runs"]);
    assert_eq!(runs, Value::Array(Vec::new()), "neither run exists");
}

#[test]
fn show_tells_what_a_lookup_found_and_approve_what_it_did() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":3000}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let args = [&["--provider-timeout-ms", "300"][..], &charge_args("order_1900_charge", "2500")].concat();
    let (code, unknown, _) = keel(&db, Some(sim.url()), &args);
    assert_eq!(code, 2, "{unknown}");
    let key = unknown["intent_key"].as_str().expect("a key").to_owned();
    assert_eq!(keel(&db, Some(sim.url()), &["reconcile", &key]).0, 0);
    let shown = text(&human(&db, &["show", &key], &[]).stdout);
    let line = shown.lines().find(|l| l.contains("ReconciliationResolved")).unwrap_or_default();
    assert!(line.contains("found") && line.contains("pi_") && line.contains("25.00 EUR"), "{shown}");

    let mut gated = charge_args("order_1842_charge", "5000");
    gated.extend(["--approval-threshold-minor", "1000"]);
    let (_, waiting, _) = keel(&db, Some(sim.url()), &gated);
    let key = waiting["intent_key"].as_str().expect("a key").to_owned();
    let approved = text(&human(&db, &["approve", &key, "--by", "lead"], &[]).stdout);
    assert!(approved.starts_with(&format!("approved {key} by lead")), "{approved}");
    assert!(!approved.contains(": reserved"), "{approved}");
}

#[test]
fn the_approval_hint_is_printed_once() {
    let desk = Desk::new();
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--db")
        .arg(&desk.db)
        .args(["agent", "run", "support", "--scenario", "refund", "--provider", desk.sim.url()])
        .env_remove("KEEL_DB");
    let stdout = text(&command.output().expect("runs").stdout);
    assert_eq!(stdout.matches("keel approve").count(), 1, "{stdout}");
    assert_eq!(stdout.matches("keel agent resume").count(), 1, "{stdout}");
}

// ----- logs and progress ---------------------------------------------------------------------

#[test]
fn logs_have_no_colour_off_a_terminal_and_json_when_asked() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":2,"ms":3000}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let args = |id: &'static str, order: &'static str| {
        let mut charge = charge_args(id, "2500");
        charge[6] = order;
        [&["--provider", sim.url(), "--provider-timeout-ms", "300"][..], &charge].concat()
    };
    let plain = human(&db, &args("order_1900_charge", "order_1900"), &[]);
    let stderr = text(&plain.stderr);
    assert!(stderr.contains("WARN") && !stderr.contains('\u{1b}'), "{stderr}");
    let json = human(&db, &[&["--log-format", "json"][..], &args("order_1901_charge", "order_1901")].concat(), &[]);
    let stderr = text(&json.stderr);
    let line = stderr.lines().next().unwrap_or_default();
    let log: Value = serde_json::from_str(line).unwrap_or_else(|_| panic!("a JSON log line: {stderr}"));
    assert_eq!(log["level"], "WARN", "{log}");
}

#[test]
fn progress_stays_off_a_pipe_and_json() {
    let (_dir, db, _) = log_with_a_run();
    let verify = human(&db, &["verify"], &[]);
    assert!(verify.stderr.is_empty(), "{}", text(&verify.stderr));
    let bench = human(&db, &["--json", "bench", "--intents", "20", "--concurrency", "2"], &[]);
    assert_eq!(bench.status.code(), Some(0), "{}", text(&bench.stderr));
    assert!(bench.stderr.is_empty(), "{}", text(&bench.stderr));
}

/// `keel ARGS` on a pseudo-terminal (util-linux `script`): what a person at a terminal sees.
fn on_a_terminal(db: &Path, args: &str) -> Option<String> {
    if !Path::new("/usr/bin/script").exists() {
        return None; // No pty here: the pipe half of the promise is tested above.
    }
    let line = format!("'{}' --db '{}' {args}", env!("CARGO_BIN_EXE_keel"), db.display());
    let output = Command::new("/usr/bin/script").args(["-qec", &line, "/dev/null"]).output().expect("script runs");
    Some(text(&output.stdout))
}

#[test]
fn progress_is_drawn_on_a_terminal_unless_json() {
    let (_dir, db, _) = log_with_a_run();
    let Some(bench) = on_a_terminal(&db, "bench --intents 400 --concurrency 2") else { return };
    assert!(bench.contains("bench: charging ["), "{bench}");
    let json = on_a_terminal(&db, "--json bench --intents 100 --concurrency 2").unwrap_or_default();
    assert!(!json.contains("bench: charging"), "{json}");
}

// ----- the demo and the soak -----------------------------------------------------------------

#[test]
fn the_demo_is_quiet_complete_and_cleans_up_after_itself() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("the demo runs");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.is_empty(), "no log lines unless RUST_LOG asks: {stderr}");
    assert!(!stdout.contains('\u{1b}'), "{stdout}");
    let scenes: Vec<&str> = stdout.lines().filter(|l| l.starts_with('✔') || l.starts_with('✘')).collect();
    for scene in scenes.iter().filter(|s| !s.contains("keel verify")) {
        assert!(scene.contains(" EUR"), "every scene names its amount: {scene}");
    }
    let sigkill = stdout.split("SIGKILL").nth(1).unwrap_or_default();
    let mut after = sigkill.lines().skip(1);
    assert!(after.next().is_some_and(|l| l.trim().starts_with("charge:")), "the key: {stdout}");
    assert!(after.next().is_some_and(|l| l.contains("expected attempting, got attempting")), "{stdout}");
    assert!(!stdout.contains("intents | show"), "{stdout}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("reads").collect();
    assert!(left.is_empty(), "the demo's directory was removed: {left:?}");
}

#[test]
fn the_soak_removes_its_files_when_every_invariant_held() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--json", "soak", "--kills", "3", "--seed", "7"])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("the soak runs");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("reads").collect();
    assert!(left.is_empty(), "the soak's directory was removed: {left:?}");
}

// ----- the README runs as written ------------------------------------------------------------

#[test]
fn the_readme_says_how_to_get_keel_on_path_and_names_real_transcripts() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README");
    assert!(readme.contains("cargo install --path ."), "how `keel` gets on PATH");
    assert!(readme.contains("export PATH=\"$PWD/target/debug:$PATH\""), "or the build's directory");
    for word in readme.split_whitespace().filter(|w| w.contains("fixtures/agent/")) {
        let path = word.trim_matches(|c: char| c == '`' || c == '(' || c == ')' || c == ',' || c == '.' || c == ';');
        assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join(path).exists(), "{path} exists");
    }
    assert!(!readme.contains("--transcript run.json"));
    assert!(readme.contains("--order C-1042"), "the support scenario's order is charged first");
    let table = readme.split("## Exit codes").nth(1).expect("an exit-code section");
    for code in ["| `0` ", "| `1` ", "| `2` ", "| `64` ", "| `130` ", "| `143` "] {
        assert!(table.contains(code), "the table has the row {code}");
    }
}

// ----- runs ----------------------------------------------------------------------------------

#[test]
fn runs_list_filter_and_show_with_budgets_and_intents() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (_, charged, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    let charge_run = charged["run_id"].as_str().expect("a run").to_owned();
    let (_, agent) = agent_keel(&db, &["agent", "run", "ticket-review", "--scenario", "budget"], &[]);
    let agent_run = agent["run_id"].as_str().expect("a run").to_owned();

    let (code, all) = agent_keel(&db, &["runs"], &[]);
    assert_eq!(code, 0);
    assert_eq!(all.as_array().map(Vec::len), Some(2), "{all}");
    let ids = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|r| r["run_id"].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(ids(&agent_keel(&db, &["runs", "--status", "completed"], &[]).1), [charge_run.as_str()]);
    assert_eq!(ids(&agent_keel(&db, &["runs", "--status", "model_budget"], &[]).1), [agent_run.as_str()]);
    assert_eq!(ids(&agent_keel(&db, &["runs", "--workflow", "ticket-review"], &[]).1), [agent_run.as_str()]);
    assert_eq!(ids(&agent_keel(&db, &["runs", "--workflow", "charge", "--since", "1h"], &[]).1), [charge_run.as_str()]);
    assert!(ids(&agent_keel(&db, &["runs", "--since", "2999-01-01T00:00:00Z"], &[]).1).is_empty());
    assert!(ids(&agent_keel(&db, &["runs", "--status", "running"], &[]).1).is_empty());

    let (code, shown) = agent_keel(&db, &["run", "show", &charge_run], &[]);
    assert_eq!(code, 0, "{shown}");
    assert_eq!(shown["status"], "completed");
    assert_eq!(shown["intents"][0]["intent_key"], format!("charge:{TENANT}:order_1842_charge"));
    let budget = |doc: &Value, name: &str| {
        doc["budgets"].as_array().into_iter().flatten().find(|b| b["name"] == name).cloned().unwrap_or(Value::Null)
    };
    let attempts = budget(&shown, &format!("attempts charge:{TENANT}:order_1842_charge"));
    assert_eq!((attempts["used"].as_i64(), attempts["remaining"].as_i64()), (Some(1), Some(2)), "{shown}");
    let money = budget(&shown, "cost_minor");
    let max = money["max"].as_i64();
    assert_eq!(
        (money["used"].as_i64(), max),
        (Some(4900), Some(engine::limits::RUN_COST_DEFAULT_MINOR)),
        "spent, within the built-in policy's run budget: {shown}"
    );
    assert_eq!(money["remaining"].as_i64(), max.map(|m| m - 4900), "{shown}");

    let (_, shown) = agent_keel(&db, &["run", "show", &agent_run], &[]);
    assert_eq!(shown["status"], "model_budget");
    assert_eq!(shown["stop"]["status"], "model_budget");
    let calls = budget(&shown, "model_calls");
    assert_eq!(
        (calls["used"].as_i64(), calls["max"].as_i64(), calls["remaining"].as_i64()),
        (Some(1), Some(1), Some(0))
    );
    let text = text(&human(&db, &["run", "show", &agent_run], &[]).stdout);
    assert!(text.contains("stopped model_budget") && text.contains("model_calls"), "{text}");
    let listing = self::text(&human(&db, &["runs"], &[]).stdout);
    assert!(listing.starts_with("RUN") && listing.contains(&agent_run), "{listing}");
}

/// Kills a ticket-review run at its `n`th model call; returns its id, read from the line the
/// run printed on stderr as it started.
fn killed_agent_run(db: &Path, transcript: &str, n: &str) -> String {
    let args = ["agent", "run", "ticket-review", "--transcript", transcript];
    let (exit, _, stderr) = keel_raw(db, &args, &[("KEEL_TEST_ABORT_AT_MODEL_CALL", n)]);
    assert_ne!(exit, 0, "the process died");
    let line = stderr.lines().find(|l| l.contains("agent run") && l.contains("started")).unwrap_or_default();
    let run_id = line.split_whitespace().nth(3).unwrap_or_default().to_owned();
    let (_, running) = agent_keel(db, &["runs", "--status", "running"], &[]);
    assert_eq!(running[0]["run_id"], run_id.as_str(), "the printed id finds the killed run: {stderr}");
    run_id
}

#[test]
fn an_agent_run_prints_its_id_as_it_starts_and_first_in_json() {
    let (_dir, db) = temp();
    let (_, stdout, stderr) = keel_raw(&db, &["agent", "run", "ticket-review", "--scenario", "complete"], &[]);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("keel: agent run ") && first.contains("started"), "{stderr}");
    let key = stdout.lines().nth(1).unwrap_or_default();
    assert!(key.trim_start().starts_with("\"run_id\""), "run_id first: {stdout}");
    killed_agent_run(&db, &fixture("agent/ticket-review/changing.json"), "2");
}

#[test]
fn a_finished_run_refuses_cancellation_clearly() {
    let (_dir, db, run_id) = log_with_a_run();
    let (code, report) = agent_keel(&db, &["run", "cancel", &run_id, "--by", "ana", "--reason", "late"], &[]);
    assert_eq!(code, 2, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("already finished (completed)"), "{error}");
}

#[test]
fn a_cancelled_agent_run_stops_cancelled_at_its_next_guard_and_the_operator_is_recorded() {
    let (_dir, db) = temp();
    let run_id = killed_agent_run(&db, &fixture("agent/ticket-review/changing.json"), "3");
    let (code, report) = agent_keel(&db, &["run", "cancel", &run_id, "--by", "ana", "--reason", "runaway"], &[]);
    assert_eq!(code, 0, "{report}");
    let (_, shown) = agent_keel(&db, &["run", "show", &run_id], &[]);
    assert_eq!(shown["status"], "running", "recorded, not yet acted on: {shown}");
    assert_eq!(shown["cancel_requested"]["by"], "ana");
    let (code, again) = agent_keel(&db, &["run", "cancel", &run_id, "--by", "bob", "--reason", "twice"], &[]);
    assert_eq!(code, 0, "a second request changes nothing: {again}");
    assert_eq!(again["cancel_requested"]["by"], "ana");

    let before = recorded_answers(&db, &run_id).len();
    let (code, resumed) = agent_keel(&db, &["agent", "resume", &run_id], &[]);
    assert_eq!(code, 2, "an operator's cancel is a controlled stop, not ctrl-c: {resumed}");
    assert_eq!(resumed["status"], "cancelled", "{resumed}");
    assert_eq!(recorded_answers(&db, &run_id).len(), before, "no model call after the cancellation");
    let (_, shown) = agent_keel(&db, &["run", "show", &run_id], &[]);
    assert_eq!(shown["status"], "cancelled");
    assert!(shown["stop"]["detail"].as_str().is_some_and(|d| d.contains("ana") && d.contains("runaway")), "{shown}");
    let history =
        store::Reader::open(&db).expect("opens").stream(&engine::event::RunId::new(&run_id).stream()).expect("reads");
    let request = history.iter().find(|e| e.event.type_name() == "RunCancelRequested").expect("recorded");
    assert_eq!(request.cause.actor, "operator:ana");
    assert_eq!(agent_keel(&db, &["verify"], &[]).0, 0);
}

#[test]
fn a_live_agent_run_stops_cancelled_at_its_next_guard() {
    let plan = r#"{"seed": 1, "rules": [{"operation": "refund", "fault": "slow", "times": 1, "ms": 1500}]}"#;
    let desk = Desk::with_faults(Some(plan));
    let (run_id, key) = desk.suspended_refund("{}");
    assert_eq!(desk.keel(&["approve", &key, "--by", "ana"]).0, 0);
    let child = desk
        .command(&["agent", "resume", &run_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while desk.refunds_at_provider() == 0 {
        assert!(Instant::now() < deadline, "the refund never reached the provider");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, report) = desk.keel(&["run", "cancel", &run_id, "--by", "ana", "--reason", "stop it"]);
    assert_eq!(code, 0, "{report}");
    let output = child.wait_with_output().expect("ends");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    assert_eq!(output.status.code(), Some(2), "{report} {}", text(&output.stderr));
    assert_eq!(report["status"], "cancelled", "{report}");
    assert_eq!(desk.intent_status(&key), "validated", "the refund in flight was recorded, never abandoned");
    assert_eq!(desk.refunds_at_provider(), 1);
    desk.verify();
}

#[test]
fn a_cancelled_workflow_run_stops_cancelled_when_resume_picks_it_up() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let mut gated = charge_args("order_1842_charge", "5000");
    gated.extend(["--approval-threshold-minor", "1000"]);
    let (_, waiting, _) = keel(&db, Some(sim.url()), &gated);
    let run_id = waiting["run_id"].as_str().expect("a run").to_owned();
    let (_, shown, _) = keel(&db, None, &["run", "show", &run_id]);
    assert_eq!(shown["status"], "running", "suspended on its approval: {shown}");
    assert_eq!(keel(&db, None, &["run", "cancel", &run_id, "--by", "ana", "--reason", "wrong customer"]).0, 0);
    let (code, resumed, _) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(code, 0, "{resumed}");
    assert_eq!(resumed["resumed"][0]["status"], "cancelled", "{resumed}");
    let (_, shown, _) = keel(&db, None, &["run", "show", &run_id]);
    assert_eq!(shown["status"], "cancelled");
    assert!(shown["stop"]["detail"].as_str().is_some_and(|d| d.contains("wrong customer")), "{shown}");
    assert_eq!(keel(&db, None, &["verify"]).0, 0);
}

// ----- `keel resume` finishes killed agent runs ----------------------------------------------

#[test]
fn keel_resume_finishes_a_killed_scripted_agent_run_without_asking_again() {
    let (dir, db) = temp();
    let run_id = killed_agent_run(&db, &fixture("agent/ticket-review/changing.json"), "4");
    let before = recorded_answers(&db, &run_id);
    assert_eq!(before.len(), 3);
    let sim = start_sim(dir.path(), None);
    let (code, report, _) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(code, 0, "{report}");
    let resumed = &report["agent_runs"][0];
    assert_eq!(resumed["run_id"], run_id.as_str(), "{report}");
    assert_eq!(resumed["status"], "tool_budget", "finished, not skipped: {report}");
    let after = recorded_answers(&db, &run_id);
    assert_eq!(after[..3], before[..], "recorded answers kept");
    let mut distinct = after.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), after.len(), "no recorded answer requested again: {after:?}");
    let (_, again, _) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(again["agent_runs"], Value::Array(Vec::new()), "nothing left to resume: {again}");
}

#[test]
fn keel_resume_finishes_a_killed_live_agent_run_without_asking_a_recorded_call_again() {
    let server = ModelServer::start(false, "agent/ticket-review/complete.json");
    let (dir, db) = temp();
    let args = [
        "agent",
        "run",
        "ticket-review",
        "--model-api",
        "anthropic",
        "--model",
        "m",
        "--model-base-url",
        &server.base_url,
    ];
    let (exit, _, _) = keel_raw(&db, &args, &[("ANTHROPIC_API_KEY", KEY), ("KEEL_TEST_ABORT_AT_MODEL_CALL", "2")]);
    assert_ne!(exit, 0, "the process died");
    assert_eq!(server.requests().len(), 1);
    let sim = start_sim(dir.path(), None);
    let url = sim.url().to_owned();

    let (code, report) = agent_keel(&db, &["resume", "--provider", &url], &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["agent_runs"][0]["status"], "not_resumed", "{report}");
    assert!(report["agent_runs"][0]["detail"].as_str().is_some_and(|d| d.contains("ANTHROPIC_API_KEY")), "{report}");
    assert_eq!(server.requests().len(), 1, "nothing asked without the key");

    let (code, report) = agent_keel(&db, &["resume", "--provider", &url], &[("ANTHROPIC_API_KEY", KEY)]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["agent_runs"][0]["status"], "completed", "{report}");
    assert_eq!(report["agent_runs"][0]["model_calls"], 4, "the call reserved before the death stays counted");
    assert_eq!(server.requests().len(), 3, "the recorded answer was not requested again");
}

/// Text an operator typed (or a hostile one planted) that a terminal would act on: a window
/// title, a bell, a screen clear, the one-byte CSI and a right-to-left override.
const HOSTILE: &str = "ana\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m\u{202e}gro";

/// Whether `bytes` hold anything of [`HOSTILE`] a terminal would act on.
fn acts_on_a_terminal(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.chars().any(|c| matches!(c, '\u{1b}' | '\u{7}' | '\u{9b}' | '\u{202e}'))
}

#[test]
fn control_characters_in_a_name_a_reason_or_an_id_are_shown_escaped_and_kept_exact_in_json() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let mut charge = charge_args("order_ctl_charge_1", "4900");
    charge.extend(["--approval-threshold-minor", "100"]);
    let (code, waiting, _) = keel(&db, Some(sim.url()), &charge);
    assert_eq!(code, 2, "the charge waits for a human: {waiting}");
    let key = format!("charge:{TENANT}:order_ctl_charge_1");
    let run_id = waiting["run_id"].as_str().expect("a run id").to_owned();
    let (code, denied, _) = keel(&db, None, &["deny", &key, "--by", HOSTILE, "--reason", HOSTILE]);
    assert_eq!(code, 0, "{denied}");

    for args in [vec!["show", &key], vec!["intents"], vec!["run", "show", &run_id], vec!["trace", &run_id]] {
        let shown = human(&db, &args, &[]);
        let (out, err) = (text(&shown.stdout), text(&shown.stderr));
        assert!(!acts_on_a_terminal(&shown.stdout) && !acts_on_a_terminal(&shown.stderr), "{args:?}: {out:?} {err:?}");
        if args[0] == "show" {
            assert!(out.contains(r"ana\u001b]0;owned\u0007\u001b[2J\u009b31m\u202egro"), "{args:?}: {out}");
        }
    }
    let (code, shown, _) = keel(&db, None, &["show", &key]);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.to_string().contains("owned"), "{shown}");
    let mut names = Vec::new();
    collect_strings(&shown, &mut names);
    assert!(names.iter().any(|text| text == HOSTILE), "the JSON keeps the text exact: {shown}");

    let unknown = human(&db, &["run", "show", HOSTILE], &[]);
    assert!(!unknown.status.success());
    assert!(!acts_on_a_terminal(&unknown.stdout) && !acts_on_a_terminal(&unknown.stderr), "{unknown:?}");
}

fn collect_strings(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::String(text) => into.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|item| collect_strings(item, into)),
        Value::Object(map) => map.values().for_each(|item| collect_strings(item, into)),
        _ => {}
    }
}
