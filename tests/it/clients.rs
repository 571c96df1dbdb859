//! Keel from Python, through its generated client (`adapters/clients/python`: `keel_client`
//! generated from the OpenAPI document by PyPI `openapi-python-client`, and `keel.py`, the
//! retry-with-the-same-key and ask-again layer), against a real `keel serve` and the provider
//! simulator. The client is regenerated from the running server's document and must be the copy
//! kept in the repository, byte for byte. The scenarios (`tests/clients/python/scenarios.py`):
//! a charge, its re-submission, a mismatch, a refund over the charge, another tenant's key, an
//! operator's approval; the server SIGKILLed while a charge is in flight and restarted, the
//! client's bounded retry ending with one effect; a provider answer lost, the client asking
//! again until the charge is reconciled.
//!
//! The Python environment is installed by the test itself (`tests/tools/python-venv.sh`,
//! `target/py-client-venv`); the test fails, never skips, when it cannot be.

use crate::cli::{start_sim, temp};
use crate::serve::{OTHER_TENANT, Serve, create_key};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The client's environment, with the generator; regenerates the client from `document` into
/// `out`.
fn generate(document: &Path, out: &Path) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("inside the target dir").join("py-client-venv");
    let script = repository().join("adapters/clients/python/generate.sh");
    let made = Command::new("sh").arg(&script).arg(&venv).arg(document).arg(out).status().expect("sh runs");
    assert!(made.success(), "{} failed (see its stderr above)", script.display());
    venv
}

/// Every file under `dir`, by its path inside it, with its bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("a directory").map(|e| e.expect("an entry")) {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "__pycache__") {
                    pending.push(path);
                }
            } else {
                let inside = path.strip_prefix(dir).expect("under dir").to_owned();
                files.push((inside, std::fs::read(&path).expect("readable")));
            }
        }
    }
    files.sort();
    files
}

struct Keys {
    submit: String,
    operator: String,
    stranger: String,
}

/// `python scenarios.py SCENARIO` against `url`, started.
fn scenario(venv: &Path, url: &str, keys: &Keys, name: &str) -> Child {
    let python_path = format!(
        "{}:{}",
        repository().join("adapters/clients/python").display(),
        repository().join("tests/clients/python").display()
    );
    Command::new(venv.join("bin/python"))
        .arg(repository().join("tests/clients/python/scenarios.py"))
        .arg(name)
        .env("PYTHONPATH", python_path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("KEEL_URL", url)
        .env("KEEL_TENANT", TENANT)
        .env("KEEL_SUBMIT", &keys.submit)
        .env("KEEL_OPERATOR", &keys.operator)
        .env("KEEL_STRANGER", &keys.stranger)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs")
}

/// A scenario's report, once it passed.
fn passed(output: Output, name: &str) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "scenario {name} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Effects the simulator made for `key`.
fn effects_on(dir: &Path, key: &str) -> usize {
    provider_sim::list_effects(&dir.join("sim.db"))
        .expect("the effects")
        .iter()
        .filter(|e| e.idempotency_key == key)
        .count()
}

/// A free loopback port (the kernel picks it; it stays free for a moment after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("an address").port()
}

#[test]
fn python_through_its_generated_client_charges_once_whatever_fails() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let keys = Keys {
        submit: create_key(&db, TENANT, "submit", "py-svc"),
        operator: create_key(&db, TENANT, "operator", "py-ops"),
        stranger: create_key(&db, OTHER_TENANT, "submit", "py-other"),
    };
    let serve = Serve::start(&db, &sim, &["--approval-threshold-minor", "10000"]);

    // The client kept in the repository is what the running server's document generates.
    let (status, _, document) = serve.call_text("GET", "/openapi.json", &[], None);
    assert_eq!(status, 200);
    let document_file = dir.path().join("openapi.json");
    std::fs::write(&document_file, document).expect("written");
    let regenerated = dir.path().join("keel_client");
    let venv = generate(&document_file, &regenerated);
    let kept = repository().join("adapters/clients/python/keel_client");
    assert!(
        tree(&kept) == tree(&regenerated),
        "adapters/clients/python/keel_client differs from what the server's document generates: run \
         `adapters/clients/python/generate.sh target/py-client-venv DOCUMENT adapters/clients/python/keel_client`"
    );

    let url = format!("http://{}", serve.addr);
    let report = passed(scenario(&venv, &url, &keys, "basic").wait_with_output().expect("it ends"), "basic");
    for key in report["charged"].as_array().expect("charged").iter().filter_map(Value::as_str) {
        assert_eq!(effects_on(dir.path(), key), 1, "{key}: one effect at the provider");
    }
    assert_eq!(serve.stop(), 0);

    // The server dies after the provider answered and before the answer was recorded.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let start = |failpoint: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.arg("--db").arg(&db).args(["--provider", sim.url(), "serve", "--addr", &addr]);
        command.env_remove("KEEL_PROVIDER_URL").env_remove("KEEL_FAILPOINT").stdout(Stdio::null());
        if let Some(point) = failpoint {
            command.env("KEEL_FAILPOINT", point);
        }
        command.spawn().expect("keel serve starts")
    };
    let mut dying = start(Some("after_provider_answer"));
    let client = scenario(&venv, &format!("http://{addr}"), &keys, "crash");
    let deadline = Instant::now() + Duration::from_secs(30);
    while dying.try_wait().expect("polls").is_none() {
        assert!(Instant::now() < deadline, "the failpoint never fired");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut back = start(None);
    let report = passed(client.wait_with_output().expect("it ends"), "crash");
    let _ = back.kill();
    let _ = back.wait();
    let key = report["charged"][0].as_str().expect("the key");
    assert_eq!(effects_on(dir.path(), key), 1, "one effect after the crash and the client's retries: {report}");
}

#[test]
fn python_asks_again_until_a_lost_answer_is_reconciled() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let keys = Keys {
        submit: create_key(&db, TENANT, "submit", "py-svc"),
        operator: create_key(&db, TENANT, "operator", "py-ops"),
        stranger: create_key(&db, OTHER_TENANT, "submit", "py-other"),
    };
    let serve = Serve::start(&db, &sim, &["--provider-timeout-ms", "300", "--provider-consistency-window-ms", "0"]);
    let document_file = dir.path().join("openapi.json");
    std::fs::write(&document_file, serve.call_text("GET", "/openapi.json", &[], None).2).expect("written");
    let venv = generate(&document_file, &dir.path().join("keel_client"));
    let url = format!("http://{}", serve.addr);
    let report = passed(scenario(&venv, &url, &keys, "lost").wait_with_output().expect("it ends"), "lost");
    assert_eq!(effects_on(dir.path(), report["charged"][0].as_str().expect("the key")), 1, "{report}");
}
