//! `keel migrate --to postgres://…` through the real binary, on the throwaway PostgreSQL of
//! `store_postgres::cluster` (installed when missing; a cluster that cannot start fails the
//! test, never skips it): a log made by real commands copied and checked equal, a non-empty
//! target, an interrupted migration resumed (cut short in process, and a real `keel migrate`
//! SIGKILLed with a batch written but not committed), another source on a half-migrated
//! target, a tampered source, a bad or unreachable URL, the vault.

use crate::cli::{charge_args, keel, start_sim, temp};
use engine::event::StreamId;
use engine::ledger::Ledger;
use serde_json::Value;
use std::path::Path;
use store_postgres::{Import, PgReader, Source};
use testkit::sample::TENANT;

const LOST_ANSWER: &str =
    r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;

/// A new database of the test binary's one throwaway cluster.
fn pg_url(label: &str) -> String {
    let cluster =
        store_postgres::cluster::shared().unwrap_or_else(|e| panic!("the migrate suite needs PostgreSQL: {e}"));
    cluster.database(label).unwrap_or_else(|e| panic!("{e}"))
}

fn refund_args<'a>(intent_id: &'a str, amount: &'a str) -> Vec<&'a str> {
    let order = "order_1842";
    vec!["refund", "--tenant", TENANT, "--intent-id", intent_id, "--order", order, "--amount-minor", amount]
        .into_iter()
        .chain(["--currency", "EUR"])
        .collect()
}

/// A log made by real commands: charges, a deduplicated one, refunds, a refund over the
/// charge refused, an answer lost then reconciled.
fn real_log(dir: &Path, db: &Path) {
    // fixtures/faults/timeout_after_effect.json, its answer held 1.5 s instead of 30.
    let sim = start_sim(dir, Some(LOST_ANSWER));
    let url = Some(sim.url());
    let timeout = ["--provider-timeout-ms", "300"];
    let lost_charge: Vec<&str> = charge_args("migrate_lost", "2500")
        .into_iter()
        .map(|a| if a == "order_1842" { "order_1900" } else { a })
        .collect();
    let (code, lost, _) = keel(db, url, &[&timeout[..], &lost_charge].concat());
    assert_eq!((code, lost["status"].as_str()), (2, Some("outcome_unknown")), "{lost}");
    for intent in ["migrate_charge_1", "migrate_charge_1"] {
        let (code, out, _) = keel(db, url, &charge_args(intent, "4900"));
        assert_eq!((code, out["status"].as_str()), (0, Some("validated")), "{out}");
    }
    let (code, out, _) = keel(db, url, &refund_args("migrate_refund_1", "3000"));
    assert_eq!((code, out["status"].as_str()), (0, Some("validated")), "{out}");
    let (code, over, _) = keel(db, url, &refund_args("migrate_refund_over", "99999"));
    assert_eq!((code, over["status"].as_str()), (2, Some("rejected")), "a refund over the charge: {over}");
    let key = lost["intent_key"].as_str().expect("a key");
    let (code, out, _) = keel(db, url, &["reconcile", key]);
    assert_eq!((code, out[0]["source"].as_str()), (0, Some("reconciled")), "{out}");
}

fn migrate(db: &Path, to: &str, extra: &[&str]) -> (i32, Value, String) {
    keel(db, None, &[&["migrate", "--to", to][..], extra].concat())
}

/// Every intent's and run's state, and the event count, folded from the whole log.
fn folded(ledger: &Ledger) -> (Vec<String>, Vec<String>) {
    let show = |value: serde_json::Result<Value>| value.expect("entities serialize").to_string();
    let intents = ledger.intents().iter().map(|i| show(serde_json::to_value(i))).collect();
    let runs = ledger.runs().iter().map(|r| show(serde_json::to_value(r))).collect();
    (intents, runs)
}

fn assert_target_empty(url: &str) {
    let mut client = postgres::Client::connect(url, postgres::NoTls).expect("connects");
    let exists: bool = client.query_one("SELECT to_regclass('events') IS NOT NULL", &[]).expect("reads").get(0);
    if exists {
        let n: i64 = client.query_one("SELECT count(*) FROM events", &[]).expect("counts").get(0);
        assert_eq!(n, 0, "nothing written");
    }
}

#[test]
fn a_log_of_real_commands_moves_into_postgres_equal_and_verified() {
    let (dir, db) = temp();
    real_log(dir.path(), &db);
    let url = pg_url("migrate_real");
    let (code, summary, stderr) = migrate(&db, &url, &[]);
    assert_eq!(code, 0, "{summary} {stderr}");
    let sqlite = store::Reader::open(&db).expect("reads");
    let source = sqlite.verify().expect("verifies");
    assert_eq!(summary["status"], "migrated");
    assert_eq!(summary["events"], source.events, "{summary}");
    assert_eq!(summary["intents"], source.intents);
    assert_eq!(summary["runs"], source.runs);
    assert_eq!(summary["resumed"], false);
    assert!(summary["events_per_second"].as_f64().is_some_and(|rate| rate > 0.0), "{summary}");

    let mut pg = PgReader::open(&url).expect("connects");
    let report = pg.verify().expect("verify reads");
    assert!(report.is_ok(), "{report}: {:?}", report.mismatches);
    let provenance = report.provenance.expect("a migrated log says where it came from");
    assert_eq!(provenance.source_head, source.last_hash);
    assert_eq!((provenance.source_events, provenance.copied_events), (source.events, source.events));
    assert!(provenance.finished_at.is_some());

    let (from, to) = (sqlite.ledger().expect("folds"), pg.ledger().expect("folds"));
    assert_eq!(folded(&from), folded(&to), "every intent and run the same on both sides");
    // Each event keeps its seq, instant, type, cause (its parent a seq) and payload.
    let originals = sqlite.events_since(0).expect("reads");
    let max_seq = originals.last().map_or(0, |e| e.seq);
    for original in &originals {
        let copied = pg.stream(&original.stream).expect("reads");
        let copy = &copied[usize::try_from(original.stream_seq - 1).expect("small")];
        assert_eq!(
            (copy.seq, copy.at, &copy.cause, &copy.event),
            (original.seq, original.at, &original.cause, &original.event)
        );
    }
    // A writer after the migration numbers after every migrated event.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
    let next: i64 = client.query_one("SELECT nextval('events_seq')", &[]).expect("a number").get(0);
    assert_eq!(next, i64::try_from(max_seq).expect("small") + 1);
}

#[test]
fn a_target_that_holds_anything_is_refused_and_nothing_is_written() {
    let (dir, db) = temp();
    real_log(dir.path(), &db);
    let url = pg_url("migrate_non_empty");
    let (code, first, stderr) = migrate(&db, &url, &[]);
    assert_eq!(code, 0, "{first} {stderr}");
    // Once migrated, the same source again: refused, nothing more written.
    let events = PgReader::open(&url).expect("connects").verify().expect("reads").events;
    let (code, again, stderr) = migrate(&db, &url, &[]);
    assert_eq!((code, again["status"].as_str()), (64, Some("usage_error")), "{again} {stderr}");
    assert!(stderr.contains("already holds a finished migration"), "{stderr}");
    assert_eq!(PgReader::open(&url).expect("connects").verify().expect("reads").events, events);

    // A database with a row someone else wrote.
    let foreign = pg_url("migrate_foreign_rows");
    store_postgres::schema::migrate(&mut postgres::Client::connect(&foreign, postgres::NoTls).expect("connects"))
        .expect("migrates");
    let mut client = postgres::Client::connect(&foreign, postgres::NoTls).expect("connects");
    client.execute("INSERT INTO leases (run_id, owner, token) VALUES ('r', '{}', 1)", &[]).expect("a foreign row");
    let (code, refused, stderr) = migrate(&db, &foreign, &[]);
    assert_eq!(code, 64, "{refused} {stderr}");
    assert!(stderr.contains("not empty") && stderr.contains("nothing written"), "{stderr}");
    assert_target_empty(&foreign);
}

/// Leaves `url` as a migration of `db` killed after its first batch leaves it: some streams
/// committed with the progress row, the rest never copied.
fn interrupted(db: &Path, url: &str) -> u64 {
    let reader = store::Reader::open(db).expect("reads");
    let report = reader.verify().expect("verifies");
    let source = Source { head_hash: report.last_hash, events: report.events };
    let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").expect("valid").to_utc();
    let (mut import, _) = Import::begin(url, &source, at).expect("begins");
    let runs = reader.streams_after(Some(&StreamId::from_stored("run:".to_owned())), 2).expect("names");
    assert_eq!(runs.len(), 2, "the log has runs");
    for name in runs {
        import.push_stream(reader.stream(&name).expect("reads")).expect("copies");
    }
    import.commit_pending().expect("commits");
    let copied = import.provenance().copied_events;
    assert!(copied > 0 && copied < source.events, "half copied: {copied} of {}", source.events);
    // The process dies here: no finish.
    copied
}

#[test]
fn an_interrupted_migration_resumes_and_finishes_equal() {
    let (dir, db) = temp();
    real_log(dir.path(), &db);
    let url = pg_url("migrate_resume");
    let copied = interrupted(&db, &url);
    // A half-migrated log is not opened for writing.
    let clock = std::sync::Arc::new(engine::clock::ManualClock::new(chrono::DateTime::UNIX_EPOCH));
    let opened = store_postgres::PgLog::open(&url, store_postgres::Options::default(), clock);
    assert!(matches!(opened, Err(store_postgres::Error::ImportUnfinished { .. })), "a writer is refused");

    let (code, summary, stderr) = migrate(&db, &url, &[]);
    assert_eq!(code, 0, "{summary} {stderr}");
    assert_eq!(summary["resumed"], true, "{summary}");
    let total = summary["events"].as_u64().expect("a count");
    assert_eq!(summary["copied_events"].as_u64(), Some(total - copied), "only the rest copied: {summary}");
    let mut pg = PgReader::open(&url).expect("connects");
    let report = pg.verify().expect("reads");
    assert!(report.is_ok(), "{report}");
    let sqlite = store::Reader::open(&db).expect("reads");
    assert_eq!(folded(&sqlite.ledger().expect("folds")), folded(&pg.ledger().expect("folds")));
}

/// Extends the log at `db` with `charges` charges of `keel bench` (ten events each, over
/// runs and intents).
fn bench_log(db: &Path, charges: usize) {
    let n = charges.to_string();
    let keep = db.to_str().expect("a utf-8 path");
    let (code, out, stderr) = keel(db, None, &["bench", "--intents", &n, "--durability", "normal", "--keep", keep]);
    assert_eq!(code, 0, "{out} {stderr}");
}

/// The advisory lock the hold on the second batch waits at (the test's own number).
const SECOND_BATCH_HOLD: i64 = 4_242;

/// Makes every progress update after the first batch's wait at [`SECOND_BATCH_HOLD`]: a
/// batch past the first writes its events and rows, then stops inside its transaction until
/// the lock is free. The migration of `db` is begun first, as `keel migrate` begins it (its
/// schema and its provenance row, nothing copied: the command then resumes it), since a
/// target holding anything else is refused.
fn hold_batches_after_the_first(db: &Path, url: &str) -> postgres::Client {
    let report = store::Reader::open(db).expect("reads").verify().expect("verifies");
    let source = Source { head_hash: report.last_hash, events: report.events };
    let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").expect("valid").to_utc();
    drop(Import::begin(url, &source, at).expect("begins"));
    let mut client = postgres::Client::connect(url, postgres::NoTls).expect("connects");
    client
        .batch_execute(&format!(
            "CREATE FUNCTION test_hold_batch() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN PERFORM pg_advisory_xact_lock({SECOND_BATCH_HOLD}); RETURN NEW; END $$; \
             CREATE TRIGGER test_hold_batch BEFORE UPDATE ON keel_provenance FOR EACH ROW \
             WHEN (OLD.copied_events > 0) EXECUTE FUNCTION test_hold_batch();"
        ))
        .expect("the hold's trigger");
    let mut holder = postgres::Client::connect(url, postgres::NoTls).expect("connects");
    holder.execute("SELECT pg_advisory_lock($1)", &[&SECOND_BATCH_HOLD]).expect("holds");
    holder
}

fn events_in(url: &str) -> u64 {
    let mut client = postgres::Client::connect(url, postgres::NoTls).expect("connects");
    let n: i64 = client.query_one("SELECT count(*) FROM events", &[]).expect("counts").get(0);
    u64::try_from(n).expect("a count")
}

#[test]
fn a_migrate_process_sigkilled_mid_batch_resumes_and_finishes_equal() {
    let (dir, db) = temp();
    real_log(dir.path(), &db);
    bench_log(&db, 700);
    let source = store::Reader::open(&db).expect("reads").verify().expect("verifies");
    let batch = engine::limits::PG_IMPORT_BATCH_EVENTS as u64;
    assert!(source.events > 3 * batch, "several batches: {} events", source.events);
    let url = pg_url("migrate_sigkill");
    let holder = hold_batches_after_the_first(&db, &url);

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["--json", "migrate", "--to", &url])
        .env_remove("KEEL_DB")
        .env_remove("KEEL_STORE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("keel migrate starts");
    let waiting = store_postgres::cluster::wait_for_lock_waiters(&url, 1).expect("reads pg_locks");
    assert_eq!(waiting, 1, "the second batch waits inside its transaction, its events written");
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reaped");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "killed, not finished");
    // The killed session's transaction ends once it may go on and finds its client gone;
    // then the hold is taken away, leaving the target as the kill left it.
    drop(holder);
    let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
    client
        .batch_execute("DROP TRIGGER test_hold_batch ON keel_provenance; DROP FUNCTION test_hold_batch()")
        .expect("drops");
    let provenance = PgReader::open(&url).expect("connects").verify().expect("reads").provenance.expect("begun");
    let copied = provenance.copied_events;
    assert!(copied > 0 && copied < source.events, "the first batch only: {copied} of {}", source.events);
    assert!(provenance.finished_at.is_none(), "unfinished");
    assert_eq!(events_in(&url), copied, "the second batch, never committed, left nothing");

    let (code, summary, stderr) = migrate(&db, &url, &[]);
    assert_eq!(code, 0, "{summary} {stderr}");
    assert_eq!(summary["resumed"], true, "{summary}");
    assert!(stderr.contains("resuming the migration"), "{stderr}");
    assert_eq!(summary["events"], source.events, "{summary}");
    assert_eq!(summary["copied_events"].as_u64(), Some(source.events - copied), "only the rest: {summary}");
    assert_eq!(events_in(&url), source.events);
    let mut pg = PgReader::open(&url).expect("connects");
    let report = pg.verify().expect("reads");
    assert!(report.is_ok(), "{report}");
    assert_eq!((report.intents, report.runs), (source.intents, source.runs), "{report}");
    let sqlite = store::Reader::open(&db).expect("reads");
    assert_eq!(folded(&sqlite.ledger().expect("folds")), folded(&pg.ledger().expect("folds")));
}

#[test]
fn another_source_onto_a_half_migrated_target_is_refused() {
    let (dir, db) = temp();
    real_log(dir.path(), &db);
    let url = pg_url("migrate_other_source");
    let copied = interrupted(&db, &url);
    let (other_dir, other) = temp();
    let sim = start_sim(other_dir.path(), None);
    let (code, _, _) = keel(&other, Some(sim.url()), &charge_args("another_log_charge", "4900"));
    assert_eq!(code, 0);
    let (code, refused, stderr) = migrate(&other, &url, &[]);
    assert_eq!(code, 64, "{refused} {stderr}");
    assert!(stderr.contains("unfinished migration of another log"), "{stderr}");
    let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
    let n: i64 = client.query_one("SELECT count(*) FROM events", &[]).expect("counts").get(0);
    assert_eq!(u64::try_from(n).expect("a count"), copied, "nothing written");
    drop(dir);
}

#[test]
fn a_tampered_log_is_refused_and_nothing_is_written() {
    let (dir, db) = temp();
    real_log(dir.path(), &db);
    let connection = rusqlite::Connection::open(&db).expect("opens");
    connection.execute_batch("DROP TRIGGER events_no_update").expect("drops the trigger");
    connection.execute("UPDATE events SET at = at + 1 WHERE seq = 3", []).expect("tampers");
    drop(connection);
    let url = pg_url("migrate_tampered");
    let (code, refused, stderr) = migrate(&db, &url, &[]);
    assert_eq!(code, 1, "{refused} {stderr}");
    assert!(stderr.contains("does not verify") && stderr.contains("nothing migrated"), "{stderr}");
    assert_target_empty(&url);
}

#[test]
fn a_bad_or_unreachable_url_is_a_clear_error_without_the_password() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, _, _) = keel(&db, Some(sim.url()), &charge_args("url_check_charge", "4900"));
    assert_eq!(code, 0);
    let (code, _, stderr) = migrate(&db, "mysql://keel:s3cret-pw@localhost/keel", &[]);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("postgres:// URL") && !stderr.contains("s3cret-pw"), "{stderr}");
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("bound").port();
    let unreachable = format!("postgres://keel:s3cret-pw@127.0.0.1:{port}/keel");
    let (code, failed, stderr) = migrate(&db, &unreachable, &[]);
    assert_eq!(code, 64, "{failed} {stderr}");
    assert!(stderr.contains("cannot migrate into postgres://keel:***@127.0.0.1"), "{stderr}");
    assert!(!stderr.contains("s3cret-pw") && !failed.to_string().contains("s3cret-pw"), "{stderr} {failed}");
}

#[test]
fn a_log_whose_vault_holds_payment_methods_needs_without_vault() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(LOST_ANSWER));
    let key_file = dir.path().join("vault.key");
    std::fs::write(&key_file, base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [1_u8; 32]))
        .expect("writes the key");
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let vault = ["--vault-key-file", key_file.to_str().expect("utf-8"), "--provider-timeout-ms", "300"];
    let (code, out, _) = keel(&db, Some(sim.url()), &[&vault[..], &charge_args("vaulted_charge_1", "2500")].concat());
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "kept in the vault: {out}");
    let url = pg_url("migrate_vault");
    let (code, refused, stderr) = migrate(&db, &url, &[]);
    assert_eq!(code, 64, "{refused} {stderr}");
    assert!(stderr.contains("vault holds 1 payment method") && stderr.contains("--without-vault"), "{stderr}");
    assert_target_empty(&url);
    let (code, summary, stderr) = migrate(&db, &url, &["--without-vault"]);
    assert_eq!(code, 0, "{summary} {stderr}");
    assert_eq!(summary["vault_entries_left"], 1);
    assert!(stderr.contains("1 payment method of the SQLite vault not migrated"), "{stderr}");
}

#[test]
fn a_target_holding_a_table_of_another_application_is_refused_and_left_as_it_was() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, _, _) = keel(&db, Some(sim.url()), &charge_args("unrelated_table_charge", "4900"));
    assert_eq!(code, 0);
    for (label, setup, named) in [
        ("migrate_unrelated_table", "CREATE TABLE unrelated (x int)", "public.unrelated"),
        ("migrate_unrelated_schema", "CREATE SCHEMA app; CREATE SEQUENCE app.ids", "app.ids"),
    ] {
        let url = pg_url(label);
        postgres::Client::connect(&url, postgres::NoTls).expect("connects").batch_execute(setup).expect("set up");
        let (code, refused, stderr) = migrate(&db, &url, &[]);
        assert_eq!(code, 64, "{refused} {stderr}");
        assert!(
            stderr.contains("not empty") && stderr.contains(named) && stderr.contains("nothing written"),
            "{stderr}"
        );
        let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connects");
        let keel_schema: bool =
            client.query_one("SELECT to_regclass('keel_meta') IS NOT NULL", &[]).expect("reads").get(0);
        assert!(!keel_schema, "{label}: nothing of Keel's schema was created");
    }
}

/// Every output of `keel ARGS` (stdout and stderr, `--json` or not, at `RUST_LOG=trace`).
fn outputs(args: &[&str]) -> String {
    let mut all = String::new();
    for json in [false, true] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
        command.env("RUST_LOG", "trace").env_remove("KEEL_PROVIDER_URL").env_remove("KEEL_DB").env_remove("KEEL_STORE");
        if json {
            command.arg("--json");
        }
        let mut child = command
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("keel runs");
        // `serve` on a reachable database would run on: its start is all that is read.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while child.try_wait().expect("waits").is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let output = child.wait_with_output().expect("output");
        all.push_str(&String::from_utf8_lossy(&output.stdout));
        all.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    all
}

#[test]
fn a_password_in_a_postgres_url_is_never_printed_by_any_command() {
    const SECRET: &str = "pw-never-printed-42";
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, _, _) = keel(&db, Some(sim.url()), &charge_args("password_url_charge", "4900"));
    assert_eq!(code, 0);
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("bound").port();
    let cluster = pg_url("migrate_password_printed");
    let (server, database) = cluster.rsplit_once('/').expect("a database");
    let real = server.trim_start_matches("postgres://postgres@");
    let urls = [
        format!("postgres://keel:{SECRET}@127.0.0.1:{port}/keel"),
        format!("postgres://keel@127.0.0.1:{port}/keel?password={SECRET}"),
        format!("postgresql://127.0.0.1:{port}/keel?sslmode=disable&password={SECRET}&port=x"),
        // A real server, a role it does not know.
        format!("postgres://intruder:{SECRET}@{real}/{database}"),
        format!("postgres://intruder@{real}/{database}?password={SECRET}"),
    ];
    let db_arg = db.to_str().expect("a UTF-8 path");
    for url in &urls {
        let printed = [
            outputs(&["--db", db_arg, "migrate", "--to", url]),
            outputs(&["--store", url, "intents"]),
            outputs(&["--store", url, "verify"]),
            outputs(&["--store", url, "show", "charge:t:i"]),
            outputs(&["--store", url, "--provider", sim.url(), "resume"]),
            outputs(&["--store", url, "--provider", sim.url(), "serve", "--addr", "127.0.0.1:0"]),
        ];
        for text in printed {
            assert!(!text.is_empty(), "{url}: every command says something");
            assert!(!text.contains(SECRET), "the password of a URL was printed: {text}");
        }
    }
}
