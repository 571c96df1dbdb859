//! `keel serve` against programs nobody here wrote: its OpenAPI document through an OpenAPI
//! validator (PyPI `openapi-spec-validator`), and the API through an API fuzzer driven by that
//! document (PyPI `schemathesis`), with a submit key and with an operator key: no 5xx, every
//! status returned is documented, every answer fits its documented schema, content type and
//! headers, and a request the document forbids is refused.
//!
//! Both are installed by the test itself into a virtual environment under the build directory
//! (`tests/tools/python-venv.sh`, `target/py-tools-venv`); it fails, never skips, when they
//! cannot be. The fuzzer's examples are bounded (`EXAMPLES` per operation, a fixed seed) so the
//! run stays in seconds. Left out: its `positive_data_acceptance` check, since what a request
//! needs beyond its schema depends on the log (a cursor the server gave, a body `intent_id`
//! equal to the `Idempotency-Key` header, a refund in its charge's currency).

use crate::cli::{start_sim, temp};
use crate::serve::{Serve, create_key};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::sample::TENANT;

/// The programs and their versions.
const PINS: [&str; 2] = ["schemathesis==4.32.5", "openapi-spec-validator==0.9.0"];

/// Examples a fuzzer phase generates per operation.
const EXAMPLES: &str = "10";

/// The virtual environment holding [`PINS`], made once per build directory.
fn tools() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target tmp dir is inside the target dir")
        .join("py-tools-venv");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/python-venv.sh");
    let made = Command::new("sh").arg(&script).arg(&venv).args(PINS).status().expect("sh runs");
    assert!(made.success(), "{} could not install {PINS:?} (see its stderr above)", script.display());
    venv
}

fn shown(output: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn the_document_validates_and_a_fuzzer_finds_no_error_no_undocumented_answer_and_no_loose_door() {
    let venv = tools();
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let keys = [create_key(&db, TENANT, "submit", "svc"), create_key(&db, TENANT, "operator", "ops")];
    // A rate far above what the fuzzer sends: its requests meet the doors, not the limiter.
    let serve = Serve::start(&db, &sim, &["--rate-per-s", "100000"]);
    let document_url = format!("http://{}/openapi.json", serve.addr);

    let (status, _, document) = serve.call_text("GET", "/openapi.json", &[], None);
    assert_eq!(status, 200);
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, document).expect("the document is written");
    let validated =
        Command::new(venv.join("bin/openapi-spec-validator")).arg(&file).output().expect("the validator runs");
    assert!(validated.status.success(), "the document is not valid OpenAPI:\n{}", shown(&validated));

    for key in &keys {
        let fuzzed = Command::new(venv.join("bin/schemathesis"))
            // It keeps a cache where it runs: the test's own directory, not the repository.
            .current_dir(dir.path())
            .args(["run", &document_url, "--header", &format!("Authorization: Bearer {key}")])
            .args(["--max-examples", EXAMPLES, "--seed", "1", "--exclude-checks", "positive_data_acceptance"])
            .args(["--no-color"])
            .output()
            .expect("schemathesis runs");
        let report = shown(&fuzzed);
        assert!(fuzzed.status.success(), "schemathesis found failures:\n{report}");
        assert!(!report.contains(&key[8..]), "the key is filtered out of its report");
    }
    assert_eq!(serve.stop(), 0);
}
