//! The payment-method vault and the end of what nobody re-submits, through the real `keel`
//! binary and a real `keel-provider-sim`: a charge crashed at any failpoint is finished by
//! `keel resume` and `keel reconcile --due` alone when the vault is on (exactly one effect),
//! and waits for its caller when it is off; the token is never in clear in the log's files,
//! on stderr at `RUST_LOG=trace`, nor in any JSON; a bad key is refused at start (exit 64)
//! with nothing written; a tampered entry is refused, and the intent waits, saying why.

use crate::cli::start_sim;
use base64::Engine as _;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use testkit::sample::TENANT;

/// The provider request timeout of every command (the consistency window is 0): long enough
/// that a simulator slowed by a loaded machine still answers in time (at 300 ms, one CI run
/// timed a request out and the charge ended escalated instead of validated).
const REQUEST_TIMEOUT_MS: u64 = 1_500;

/// The token every charge here uses: its bytes must appear nowhere Keel writes.
const TOKEN: &str = "pm_card_vault_secret_7f3a9c1e5b";

/// Every failpoint a charge's own process can die at, with the hit that matters (the
/// writer's points count commits: reservation with its first attempt, outcome, run end).
const CHARGE_FAILPOINTS: [&str; 9] = [
    "after_reservation",
    "after_attempt_started",
    "after_provider_answer",
    "in_batch_before_commit:1",
    "in_batch_before_commit:2",
    "in_batch_before_commit:3",
    "after_commit_before_answer:1",
    "after_commit_before_answer:2",
    "after_commit_before_answer:3",
];

fn key_text(byte: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([byte; 32])
}

/// One `keel` invocation against `dir/keel.db`, the vault key (if any) in `KEEL_VAULT_KEY`.
struct Keel<'a> {
    dir: &'a Path,
    url: &'a str,
    key: Option<String>,
}

impl Keel<'_> {
    fn db(&self) -> PathBuf {
        self.dir.join("keel.db")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .arg("--db")
            .arg(self.db())
            .args(["--json", "--provider", self.url, "--provider-timeout-ms", &REQUEST_TIMEOUT_MS.to_string()])
            .args(["--provider-consistency-window-ms", "0"])
            .env("RUST_LOG", "trace")
            .env_remove("KEEL_PROVIDER_URL")
            .env_remove("KEEL_DB")
            .env_remove("KEEL_FAILPOINT")
            .env_remove("KEEL_VAULT_KEY")
            .args(args);
        if let Some(key) = &self.key {
            command.env("KEEL_VAULT_KEY", key);
        }
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("keel runs")
    }

    /// Runs a command that must end on its own (0 or 2) and returns its JSON.
    fn json(&self, args: &[&str]) -> Value {
        let output = self.run(args);
        assert!(
            output.status.code().is_some_and(|c| c == 0 || c == 2),
            "keel {args:?} ended with {:?}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert_secret_absent(&output.stdout, &format!("stdout of {args:?}"));
        assert_secret_absent(&output.stderr, &format!("stderr of {args:?}"));
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("keel {args:?} prints JSON: {e}"))
    }

    /// Charges `id` on its own order, dying at `failpoint` (which must fire).
    fn crash_charge(&self, id: &str, failpoint: &str) {
        self.crash(&charge(id), failpoint);
    }

    /// Runs `args`, dying at `failpoint` (which must fire).
    fn crash(&self, args: &[&str], failpoint: &str) {
        let output = self.command(args).env("KEEL_FAILPOINT", failpoint).output().expect("keel runs");
        assert_eq!(
            output.status.signal(),
            Some(libc::SIGABRT),
            "keel {args:?} must abort at {failpoint}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_secret_absent(&output.stdout, "a crashed command's stdout");
        assert_secret_absent(&output.stderr, "a crashed command's stderr");
    }

    /// `keel resume`, the request timeout waited out, then `keel reconcile --due` twice: the
    /// operator's whole part, with no re-submission.
    fn heal(&self) {
        self.json(&["resume"]);
        std::thread::sleep(std::time::Duration::from_millis(REQUEST_TIMEOUT_MS + 100));
        self.json(&["reconcile", "--due"]);
        self.json(&["reconcile", "--due"]);
    }

    fn intent(&self, id: &str) -> Option<engine::ledger::Intent> {
        let key = engine::event::IntentKey::parse(&intent_key(id)).expect("a key");
        store::Reader::open(&self.db()).expect("opens").intent_state(&key).expect("folds")
    }

    fn effects_on(&self, id: &str) -> usize {
        let effects = provider_sim::list_effects(&self.dir.join("sim.db")).expect("effects");
        effects.iter().filter(|e| e.idempotency_key == intent_key(id)).count()
    }

    fn vault_rows(&self) -> i64 {
        let raw = rusqlite::Connection::open(self.db()).expect("raw");
        raw.query_row("SELECT count(*) FROM vault", [], |r| r.get(0)).expect("count")
    }
}

fn charge(id: &str) -> Vec<&str> {
    // Each charge on its own order (the id is its order too), so none blocks another.
    vec![
        "charge",
        "--tenant",
        TENANT,
        "--intent-id",
        id,
        "--order",
        id,
        "--amount-minor",
        "4900",
        "--currency",
        "EUR",
        "--payment-method-token",
        TOKEN,
    ]
}

fn intent_key(id: &str) -> String {
    format!("charge:{TENANT}:{id}")
}

fn case_id(failpoint: &str) -> String {
    format!("vault-{}", failpoint.replace(':', "-"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn assert_secret_absent(bytes: &[u8], what: &str) {
    assert!(!contains(bytes, TOKEN.as_bytes()), "the token appears in {what}");
}

/// Every file of the log (the database, its WAL and shared memory, at least `files` of them:
/// the WAL is gone after a clean shutdown, and left behind by a crash): no token in clear.
fn assert_secret_absent_from_files(dir: &Path, files: usize) {
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).expect("the dir lists") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if name.starts_with("keel.db") {
            assert_secret_absent(&std::fs::read(&path).expect("readable"), &name);
            checked += 1;
        }
    }
    assert!(checked >= files, "{files} files of the log were checked, not {checked}");
}

#[test]
fn with_the_vault_every_crashed_charge_is_finished_by_resume_alone_with_one_effect() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = Keel { dir: dir.path(), url: sim.url(), key: Some(key_text(0x5a)) };
    for failpoint in CHARGE_FAILPOINTS {
        keel.crash_charge(&case_id(failpoint), failpoint);
    }
    assert_secret_absent_from_files(dir.path(), 3);
    keel.heal();
    for failpoint in CHARGE_FAILPOINTS {
        let id = case_id(failpoint);
        match keel.intent(&id) {
            // The reservation's own commit was lost: nothing happened, nothing to finish.
            None => {
                assert_eq!(failpoint, "in_batch_before_commit:1", "only a lost first commit leaves no intent");
                assert_eq!(keel.effects_on(&id), 0, "{failpoint}");
            }
            Some(intent) => {
                assert_eq!(intent.status.as_str(), "validated", "{failpoint}: {intent:#?}");
                assert_eq!(keel.effects_on(&id), 1, "{failpoint}: exactly one effect");
            }
        }
    }
    let report = testkit::invariants::check_files(&keel.db(), &dir.path().join("sim.db")).expect("readable");
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(keel.vault_rows(), 0, "every final intent's entry is shredded");
    assert_secret_absent_from_files(dir.path(), 1);
    assert_eq!(keel.json(&["intents", "--stuck"]), serde_json::json!([]));
}

#[test]
fn with_the_vault_recovery_crashed_at_each_of_its_own_failpoints_still_finishes_the_charge() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = Keel { dir: dir.path(), url: sim.url(), key: Some(key_text(0x6b)) };
    let id = "recovery-crashes-01";
    keel.crash_charge(id, "after_attempt_started");
    let key = intent_key(id);
    keel.crash(&["resume"], "after_recover");
    keel.crash(&["resume"], "after_reconciliation_started");
    // Recovery records the interrupted lookup, due again after a backoff: the operator
    // forces the next one, which dies with the provider's answer in hand.
    keel.json(&["resume"]);
    keel.crash(&["reconcile", &key], "after_lookup");
    keel.json(&["resume"]);
    std::thread::sleep(std::time::Duration::from_millis(REQUEST_TIMEOUT_MS + 100));
    // The resend itself, with the vault's payment method, dies after its write-ahead attempt.
    keel.crash(&["reconcile", &key], "after_attempt_started");
    keel.heal();
    keel.json(&["reconcile", &key]);
    assert_eq!(keel.intent(id).expect("exists").status.as_str(), "validated");
    assert_eq!(keel.effects_on(id), 1, "exactly one effect");
    let report = testkit::invariants::check_files(&keel.db(), &dir.path().join("sim.db")).expect("readable");
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(keel.vault_rows(), 0);
}

#[test]
fn without_the_vault_a_crashed_charge_waits_for_its_caller_and_says_so() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = Keel { dir: dir.path(), url: sim.url(), key: None };
    let waiting = ["after_reservation", "after_attempt_started"];
    for failpoint in waiting {
        keel.crash_charge(&case_id(failpoint), failpoint);
    }
    keel.heal();
    for failpoint in waiting {
        let id = case_id(failpoint);
        let intent = keel.intent(&id).expect("reserved");
        assert_eq!(intent.status.as_str(), "reserved", "{failpoint}");
        assert_eq!(keel.effects_on(&id), 0, "{failpoint}: never sent again");
        let shown = keel.json(&["show", &intent_key(&id)]);
        assert_eq!(shown["waiting"]["waits_for"], "caller", "{shown:#}");
        let reason = shown["waiting"]["reason"].as_str().expect("a reason");
        assert!(reason.contains("never stored") && reason.contains("re-submit"), "{reason}");
    }
    let stuck = keel.json(&["intents", "--stuck"]);
    let listed: Vec<&str> = stuck.as_array().expect("a list").iter().filter_map(|s| s["intent_key"].as_str()).collect();
    assert_eq!(listed.len(), 2, "{stuck:#}");
    assert!(stuck[0]["since"].is_string() && stuck[0]["reason"].is_string(), "{stuck:#}");
    // The caller comes back: the same request sends it, once.
    let id = case_id("after_attempt_started");
    assert_eq!(keel.json(&charge(&id))["status"], "validated");
    assert_eq!(keel.effects_on(&id), 1);
}

#[test]
fn a_charge_nobody_resubmits_is_abandoned_after_the_window_and_frees_its_order() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = Keel { dir: dir.path(), url: sim.url(), key: None };
    let id = "abandoned-charge-01";
    keel.crash_charge(id, "after_attempt_started");
    keel.heal();
    assert_eq!(keel.intent(id).expect("reserved").status.as_str(), "reserved");
    // Another key for the same order is refused while the first waits.
    let mut second = charge("abandoned-charge-02");
    second[6] = id;
    assert_eq!(keel.json(&second)["code"], "reference_pending");
    let before = events(&keel.db());
    for bad in ["31d", "a day", "-1s", "1.5h"] {
        let refused = keel.run(&["--abandon-waiting-after", bad, "reconcile", "--due"]);
        assert_eq!(refused.status.code(), Some(64), "--abandon-waiting-after {bad}");
    }
    assert_eq!(events(&keel.db()), before, "a bad window writes nothing");
    assert_eq!(keel.intent(id).expect("reserved").status.as_str(), "reserved");
    let swept = keel.json(&["--abandon-waiting-after", "1ms", "reconcile", "--due"]);
    let ended = swept.as_array().expect("outcomes").iter().find(|o| o["intent_key"] == intent_key(id)).cloned();
    let ended = ended.unwrap_or_else(|| panic!("the sweep reports the charge: {swept:#}"));
    assert_eq!((ended["status"].as_str(), ended["code"].as_str()), (Some("rejected"), Some("abandoned")), "{ended:#}");
    assert_eq!(keel.effects_on(id), 0);
    // Its money and its order reference are freed: the second key now charges the order.
    assert_eq!(keel.json(&second)["status"], "validated");
    let report = testkit::invariants::check_files(&keel.db(), &dir.path().join("sim.db")).expect("readable");
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(keel.json(&["verify"])["mismatch_count"], 0);
}

#[test]
fn a_tampered_vault_entry_is_refused_and_the_charge_waits_saying_why_without_leaking() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = Keel { dir: dir.path(), url: sim.url(), key: Some(key_text(0x33)) };
    let id = "tampered-charge-01";
    keel.crash_charge(id, "after_attempt_started");
    assert_eq!(keel.vault_rows(), 1, "kept with the reservation");
    {
        let raw = rusqlite::Connection::open(keel.db()).expect("raw");
        let sealed: Vec<u8> = raw.query_row("SELECT sealed FROM vault", [], |r| r.get(0)).expect("the entry");
        let mut flipped = sealed;
        let last = flipped.len() - 1;
        flipped[last] ^= 0x80;
        raw.execute("UPDATE vault SET sealed = ?1", [flipped]).expect("tamper");
    }
    keel.heal();
    let intent = keel.intent(id).expect("reserved");
    assert_eq!(intent.status.as_str(), "reserved", "refused, not decrypted to garbage and sent");
    assert_eq!(keel.effects_on(id), 0);
    let shown = keel.json(&["show", &intent_key(id)]);
    assert_eq!(shown["waiting"]["waits_for"], "caller", "{shown:#}");
    assert!(shown["waiting"]["reason"].as_str().is_some_and(|r| r.contains("does not authenticate")), "{shown:#}");
    let stuck = keel.json(&["intents", "--stuck"]);
    assert_eq!(stuck[0]["intent_key"], intent_key(id), "{stuck:#}");
    keel.json(&["intents"]);
    assert_secret_absent_from_files(dir.path(), 1);
    // The caller re-submits: the same key and payload send it, with the token it brings.
    assert_eq!(keel.json(&charge(id))["status"], "validated");
    assert_eq!(keel.effects_on(id), 1);
    assert_eq!(keel.vault_rows(), 0);
}

/// What the log holds: its events, or `None` when no file was created.
fn events(db: &Path) -> Option<usize> {
    db.exists().then(|| store::Reader::open(db).expect("opens").events_since(0).expect("events").len())
}

fn assert_usage_error(output: &Output, says: &str, never: Option<&str>) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
    if let Some(never) = never {
        assert!(!stderr.contains(never) && !stdout.contains(never), "the key is never echoed: {stderr} {stdout}");
    }
    let json: Value = serde_json::from_str(&stdout).expect("--json prints the usage error");
    assert_eq!(json["status"], "usage_error");
}

/// Runs a command that must refuse to start (a server would not end by itself): its output,
/// or a failure when it still runs after ten seconds.
fn refused_in_time(mut command: Command) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("keel starts");
    for _ in 0..200 {
        if child.try_wait().expect("polls").is_some() {
            return child.wait_with_output().expect("its output");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("{command:?} started instead of refusing: {:?}", child.wait_with_output());
}

fn key_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("written");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

#[test]
fn every_bad_key_is_refused_at_start_with_nothing_written() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = |key: Option<String>| Keel { dir: dir.path(), url: sim.url(), key };
    let short = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
    assert_usage_error(&keel(Some(short.clone())).run(&charge("bad-key-charge-1")), "32 bytes", Some(&short));
    let long = base64::engine::general_purpose::STANDARD.encode([7u8; 48]);
    assert_usage_error(&keel(Some(long.clone())).run(&charge("bad-key-charge-1")), "32 bytes", Some(&long));
    assert_usage_error(
        &keel(Some("not base64!!".to_owned())).run(&charge("bad-key-charge-1")),
        "base64",
        Some("not base64!!"),
    );
    let loose = key_file(dir.path(), "loose.key", &key_text(1), 0o644);
    let mut args = vec!["--vault-key-file", loose.to_str().expect("utf-8")];
    args.extend(charge("bad-key-charge-1"));
    assert_usage_error(&keel(None).run(&args), "chmod 600", Some(&key_text(1)));
    let short_file = key_file(dir.path(), "short.key", &short, 0o600);
    let mut args = vec!["--vault-key-file", short_file.to_str().expect("utf-8")];
    args.extend(charge("bad-key-charge-1"));
    assert_usage_error(&keel(None).run(&args), "32 bytes", Some(&short));
    let good = key_file(dir.path(), "good.key", &key_text(1), 0o600);
    let mut both = vec!["--vault-key-file", good.to_str().expect("utf-8")];
    both.extend(charge("bad-key-charge-1"));
    assert_usage_error(&keel(Some(key_text(1))).run(&both), "give the vault key once", Some(&key_text(1)));
    assert_eq!(events(&keel(None).db()), None, "no bad key created the log");

    // A vault set up with one key, rotated to another: the old key is refused, and so is no key.
    let old = keel(Some(key_text(1)));
    assert_eq!(old.json(&charge("rotated-charge-1"))["status"], "validated");
    old.crash_charge("rotated-charge-2", "after_attempt_started");
    let new_file = key_file(dir.path(), "new.key", &key_text(2), 0o600);
    let loose_new = key_file(dir.path(), "loose-new.key", &key_text(2), 0o640);
    assert_usage_error(
        &old.run(&["vault", "rotate", "--new-key-file", loose_new.to_str().expect("utf-8")]),
        "chmod 600",
        Some(&key_text(2)),
    );
    assert_eq!(old.json(&["vault", "rotate", "--new-key-file", new_file.to_str().expect("utf-8")])["rotated"], 1);
    let before = events(&old.db());
    assert_usage_error(&old.run(&charge("rotated-charge-3")), "does not open the vault", Some(&key_text(1)));
    assert_usage_error(&old.run(&["resume"]), "does not open the vault", Some(&key_text(1)));
    assert_usage_error(&keel(None).run(&["resume"]), "keeps payment methods in a vault", None);
    assert_usage_error(&keel(None).run(&charge("rotated-charge-3")), "keeps payment methods in a vault", None);
    // `keel serve` recovers and resends charges too: it is refused like `resume` and `worker`.
    let serve = ["serve", "--addr", "127.0.0.1:0"];
    assert_usage_error(&refused_in_time(keel(None).command(&serve)), "keeps payment methods in a vault", None);
    assert_usage_error(&refused_in_time(old.command(&serve)), "does not open the vault", Some(&key_text(1)));
    assert_eq!(events(&old.db()), before, "nothing written by a refused key");
    // The new key opens the rotated entry, and finishes the crashed charge with it.
    let new = keel(Some(key_text(2)));
    new.heal();
    assert_eq!(new.intent("rotated-charge-2").expect("exists").status.as_str(), "validated");
    assert_eq!(new.effects_on("rotated-charge-2"), 1);
}

#[test]
fn purge_removes_old_entries_and_their_charges_then_wait_for_their_callers() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let keel = Keel { dir: dir.path(), url: sim.url(), key: Some(key_text(9)) };
    keel.crash_charge("purged-charge-01", "after_attempt_started");
    assert_eq!(keel.vault_rows(), 1);
    assert_eq!(keel.json(&["vault", "purge", "--older-than", "1d"])["purged"], 0, "younger than a day");
    let bad = keel.run(&["vault", "purge", "--older-than", "a while"]);
    assert_eq!(bad.status.code(), Some(64));
    assert_eq!(keel.vault_rows(), 1, "a bad duration purges nothing");
    assert_eq!(keel.json(&["vault", "purge", "--older-than", "0s"])["purged"], 1);
    keel.heal();
    let shown = keel.json(&["show", &intent_key("purged-charge-01")]);
    assert_eq!(shown["status"], "reserved");
    assert!(shown["waiting"]["reason"].as_str().is_some_and(|r| r.contains("holds no payment method")), "{shown:#}");
    assert_eq!(keel.effects_on("purged-charge-01"), 0);
}
