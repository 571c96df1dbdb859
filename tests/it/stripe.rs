//! Keel's Stripe format end to end: the real `keel` binary against localstripe, a
//! Stripe fake nobody here wrote (PyPI `localstripe` 1.15.10), and the bad inputs the Stripe
//! format adds (its key, its URL), each refused before anything is written.
//!
//! The localstripe test installs it itself (`adapters/stripe-fake/localstripe.sh`: a venv under
//! the build directory, `target/localstripe-venv`) and fails — never skips — when it cannot.
//! localstripe keeps one store for every instance on the machine (`/tmp/localstripe.pickle`),
//! so its scenarios run in sequence in one test, from an emptied store.
//!
//! What localstripe lacks, which the provider simulator covers instead: it has no
//! `/v1/payment_intents/search` (Keel's lookup of a charge: its 404 must read as unavailable,
//! never as absent — a unit test of the adapter checks that row), and it does not deduplicate
//! on `Idempotency-Key` (a re-submission here is deduplicated by Keel's own log before any
//! request; a resend under the same key is the simulator's to answer). It also declines
//! differently from Stripe: `pm_card_visa_chargeDeclined` is charged (localstripe declines that
//! card only when attaching it to a customer), and the card it declines on charge,
//! `pm_card_chargeCustomerFail`, is answered 402 with `type: invalid_request_error` and
//! `code: card_declined` where Stripe sends `type: card_error` (the adapter reads both).

use crate::cli::temp;
use serde_json::Value;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

/// A test secret key localstripe accepts (any `sk_test_…`).
const KEY: &str = "sk_test_keel_localstripe_4eC39HqLyjWDarjtT1zdp7dc";

/// How long installing and starting localstripe may take: a first run downloads it.
const START_MAX: Duration = Duration::from_secs(600);

/// localstripe, serving on a loopback port until dropped.
struct Localstripe {
    child: Child,
    url: String,
    http: reqwest::blocking::Client,
}

impl Drop for Localstripe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Localstripe {
    /// Installs (once) and starts localstripe, waits until it answers, and empties its store.
    fn start() -> Self {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target tmp dir is inside the target dir")
            .join("localstripe-venv");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("adapters/stripe-fake/localstripe.sh");
        let mut child = Command::new("sh")
            .arg(&script)
            .arg(&venv)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, port) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        let line = port.recv_timeout(START_MAX).unwrap_or_default();
        let port: u16 = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("localstripe did not start (see its setup's stderr above); it printed {line:?}")
        });
        let http = reqwest::blocking::Client::builder().no_proxy().build().expect("a client builds");
        let server = Self { child, url: format!("http://127.0.0.1:{port}"), http };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.http.delete(format!("{}/_config/data", server.url)).send().map(|r| r.status().is_success()).ok()
            != Some(true)
        {
            assert!(Instant::now() < deadline, "localstripe on port {port} never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn get(&self, path: &str) -> Value {
        let response =
            self.http.get(format!("{}{path}", self.url)).bearer_auth(KEY).send().expect("localstripe answers");
        assert!(response.status().is_success(), "GET {path}: {}", response.status());
        response.json().expect("localstripe answers JSON")
    }

    /// How many PaymentIntents localstripe holds.
    fn payment_intents(&self) -> usize {
        self.get("/v1/payment_intents?limit=100")["data"].as_array().map_or(0, Vec::len)
    }
}

/// Runs `keel --json ARGS` on `db` with `key` in the environment (none when `None`) and nothing
/// else of the caller's.
fn keel(db: &Path, key: Option<&str>, args: &[&str]) -> (i32, Value, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--db")
        .arg(db)
        .arg("--json")
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env_remove("KEEL_STRIPE_SECRET_KEY");
    if let Some(key) = key {
        command.env("KEEL_STRIPE_SECRET_KEY", key);
    }
    let output = command.args(args).output().expect("keel runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), json, format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)))
}

fn charge<'a>(url: &'a str, intent: &'a str, order: &'a str, amount: &'a str, method: &'a str) -> Vec<&'a str> {
    vec![
        "charge",
        "--provider",
        url,
        "--tenant",
        TENANT,
        "--intent-id",
        intent,
        "--order",
        order,
        "--amount-minor",
        amount,
        "--currency",
        "EUR",
        "--payment-method-token",
        method,
    ]
}

fn refund<'a>(url: &'a str, intent: &'a str, order: &'a str, amount: &'a str) -> Vec<&'a str> {
    vec![
        "refund",
        "--provider",
        url,
        "--tenant",
        TENANT,
        "--intent-id",
        intent,
        "--order",
        order,
        "--amount-minor",
        amount,
        "--currency",
        "EUR",
    ]
}

fn event_types(shown: &Value) -> Vec<String> {
    shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str().map(str::to_owned)).collect()
}

#[test]
fn charges_declines_refunds_and_deduplication_against_localstripe() {
    let stripe = Localstripe::start();
    let (_dir, db) = temp();
    let url = stripe.url.as_str();

    // A charge with Stripe's test card id, as is.
    let (code, charged, out) =
        keel(&db, Some(KEY), &charge(url, "order_1842_charge", "order_1842", "4900", "pm_card_visa"));
    assert_eq!(code, 0, "{out}");
    assert_eq!(charged["status"], "validated", "{charged}");
    assert_eq!(charged["source"], "provider");
    let pi = charged["provider_ref"].as_str().expect("a provider reference").to_owned();
    assert!(pi.starts_with("pi_"), "the evidence is the PaymentIntent: {pi}");
    let intent = stripe.get(&format!("/v1/payment_intents/{pi}"));
    assert_eq!(
        (intent["status"].as_str(), intent["amount"].as_i64(), intent["currency"].as_str()),
        (Some("succeeded"), Some(4900), Some("eur"))
    );
    let key = format!("charge:{TENANT}:order_1842_charge");
    assert_eq!(intent["metadata"]["keel_intent_key"], key.as_str(), "{intent}");
    assert_eq!(intent["metadata"]["keel_fingerprint"].as_str().map(str::len), Some(64), "{intent}");
    let (_, shown, _) = keel(&db, None, &["show", &key]);
    assert_eq!(event_types(&shown), ["IntentReserved", "AttemptStarted", "IntentValidated"], "{shown}");
    assert!(!out.contains(KEY), "the key is never printed");

    // A card localstripe declines on charge: definitive, and the money is released.
    let (code, declined, out) =
        keel(&db, Some(KEY), &charge(url, "order_1843_charge", "order_1843", "2500", "pm_card_chargeCustomerFail"));
    assert_eq!(code, 2, "{out}");
    assert_eq!(
        (declined["status"].as_str(), declined["code"].as_str()),
        (Some("declined"), Some("card_declined")),
        "{declined}"
    );
    let (_, shown, _) = keel(&db, None, &["show", &format!("charge:{TENANT}:order_1843_charge")]);
    assert_eq!(event_types(&shown), ["IntentReserved", "AttemptStarted", "IntentDeclined"], "{shown}");
    assert_eq!(shown["status"], "declined");
    // Released: the order is no longer pending, so another key may charge it.
    let (code, retried, out) =
        keel(&db, Some(KEY), &charge(url, "order_1843_charge_2", "order_1843", "2500", "pm_card_visa"));
    assert_eq!((code, retried["status"].as_str()), (0, Some("validated")), "{out}");

    // A refund names the charge's PaymentIntent; partial refunds add up to the charge.
    let refunds_of = |pi: &str| {
        stripe.get(&format!("/v1/refunds?payment_intent={pi}"))["data"].as_array().cloned().unwrap_or_default()
    };
    let (code, refunded, out) = keel(&db, Some(KEY), &refund(url, "order_1842_refund_1", "order_1842", "1000"));
    assert_eq!(code, 0, "{out}");
    assert_eq!(refunded["status"], "validated", "{refunded}");
    assert!(refunded["provider_ref"].as_str().is_some_and(|r| r.starts_with("re_")), "{refunded}");
    let (code, _, out) = keel(&db, Some(KEY), &refund(url, "order_1842_refund_2", "order_1842", "3900"));
    assert_eq!(code, 0, "{out}");
    let amounts: Vec<i64> = refunds_of(&pi).iter().filter_map(|r| r["amount"].as_i64()).collect();
    assert_eq!(amounts.iter().sum::<i64>(), 4900, "two partial refunds at localstripe: {amounts:?}");

    // One more cent is refused by Keel's ledger before Stripe is asked.
    let (code, over, out) = keel(&db, Some(KEY), &refund(url, "order_1842_refund_3", "order_1842", "1"));
    assert_eq!(code, 2, "{out}");
    assert_eq!(
        (over["status"].as_str(), over["code"].as_str()),
        (Some("rejected"), Some("invariant_violated")),
        "{over}"
    );
    assert_eq!(refunds_of(&pi).len(), 2, "localstripe was not asked");

    // The same charge again is Keel's stored result: no second PaymentIntent.
    let before = stripe.payment_intents();
    let (code, again, out) =
        keel(&db, Some(KEY), &charge(url, "order_1842_charge", "order_1842", "4900", "pm_card_visa"));
    assert_eq!(code, 0, "{out}");
    assert_eq!((again["source"].as_str(), again["provider_ref"].as_str()), (Some("deduplicated"), Some(pi.as_str())));
    assert_eq!(stripe.payment_intents(), before, "no second PaymentIntent at localstripe");
}

/// Asserts a refused invocation: the usage exit code, `needle` in its message, no log
/// created, and `secret` nowhere in its output.
fn assert_refused(db: &Path, (code, json, out): (i32, Value, String), needle: &str, secret: &str) {
    assert_eq!(code, 64, "{out}");
    assert_eq!(json["status"], "usage_error", "{out}");
    assert!(out.contains(needle), "{needle:?} in {out}");
    assert!(!db.exists(), "nothing is written: {}", db.display());
    assert!(secret.is_empty() || !out.contains(secret), "the key is never printed: {out}");
}

#[test]
fn a_missing_empty_or_malformed_key_is_a_usage_error_and_writes_nothing() {
    let (_dir, db) = temp();
    // An https:// provider is a real one: without a key Keel refuses to start. (A plain
    // http:// loopback one, the simulator, is sent the public loopback test key instead.)
    let url = "https://127.0.0.1:9";
    let args = charge(url, "order_1842_charge", "order_1842", "4900", "pm_card_visa");
    assert_refused(&db, keel(&db, None, &args), "KEEL_STRIPE_SECRET_KEY", "");
    assert_refused(&db, keel(&db, Some(""), &args), "empty", "");
    let publishable = "pk_test_keel_never_printed_51HqLyjWDarjtT1zdp7dc";
    assert_refused(&db, keel(&db, Some(publishable), &args), "must start with sk_", publishable);
    let spaced = "sk_test_keel never printed";
    assert_refused(&db, keel(&db, Some(spaced), &args), "a letter, a digit or _", "never printed");
}

#[test]
fn a_plain_http_url_off_loopback_is_a_usage_error_and_writes_nothing() {
    let (_dir, db) = temp();
    let args = refund("http://api.stripe.com", "order_1842_refund", "order_1842", "100");
    assert_refused(&db, keel(&db, Some(KEY), &args), "only for a loopback address", KEY);
}

#[test]
fn an_unreadable_key_file_is_a_usage_error_and_writes_nothing() {
    let (dir, db) = temp();
    let missing: PathBuf = dir.path().join("no-such-key");
    let mut args = charge("http://127.0.0.1:9", "order_1842_charge", "order_1842", "4900", "pm_card_visa");
    let path = missing.to_str().expect("a UTF-8 temp path");
    args.extend(["--stripe-key-file", path]);
    assert_refused(&db, keel(&db, Some(KEY), &args), "cannot read the Stripe key file", KEY);
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "rk_live with spaces\n").expect("writes the file");
    let mut args = charge("http://127.0.0.1:9", "order_1842_charge", "order_1842", "4900", "pm_card_visa");
    let path = garbage.to_str().expect("a UTF-8 temp path");
    args.extend(["--stripe-key-file", path]);
    assert_refused(&db, keel(&db, None, &args), "Stripe key file", "with spaces");
    // A file without an end (no metadata length) is read up to its bound, never further.
    let mut args = charge("http://127.0.0.1:9", "order_1842_charge", "order_1842", "4900", "pm_card_visa");
    args.extend(["--stripe-key-file", "/dev/zero"]);
    assert_refused(&db, keel(&db, Some(KEY), &args), "is larger than", KEY);
}
