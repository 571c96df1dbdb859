//! Irreversible means a human, by construction (issue 29): through the real `keel` binary and a
//! real simulator, the support agent's refund — an irreversible effect — waits for a human
//! under the built-in policy and runs once approved; a policy that lowers the default for the
//! desk's refunds lets it run without one, and every reservation that lowering affected
//! records the policy's stamp; a bad value for the new key is a usage error with nothing
//! written. The full matrix (tool policy × class × threshold × lowering, a mutation
//! unaffected) is `workflows/tests/support_agent.rs`'s, in process.

use crate::approvals::Desk;
use engine::event::Event;
use engine::policy::PolicyStamp;
use std::path::Path;
use workflows::support_agent::TENANT;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("the policy is written");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// What each refund reservation of the log recorded as the policy that lowered its approval.
fn lowered_by(desk: &Desk) -> Vec<Option<PolicyStamp>> {
    let reader = store::Reader::open(&desk.db).expect("opens");
    let events = reader.events_since(0).expect("reads");
    events
        .into_iter()
        .filter_map(|stored| match stored.event {
            Event::IntentReserved { intent, approval_lowered_by, .. }
                if intent.kind == engine::provider::EffectKind::Refund =>
            {
                Some(approval_lowered_by)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_irreversible_refund_waits_for_a_human_unless_the_policy_lowers_it_and_then_says_which() {
    let desk = Desk::new();
    // The built-in policy lowers nothing: the refund waits, nothing is sent until a human
    // approves, then it is sent once.
    let (run_id, key) = desk.suspended_refund("{}");
    assert_eq!(desk.refunds_at_provider(), 0, "nothing is refunded before a human says yes");
    let (code, approved) = desk.keel(&["approve", &key, "--by", "ana"]);
    assert_eq!(code, 0, "{approved}");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!((code, report["status"].as_str()), (0, Some("completed")), "{report}");
    assert_eq!(desk.refunds_at_provider(), 1);
    assert_eq!(lowered_by(&desk), [None], "nothing was lowered");

    desk.verify();

    // The operator lowers it for this desk's refunds: a run refunds at once, and its
    // reservation records the policy that let it.
    let desk = Desk::new();
    let text = format!(
        "version = \"desk-lowered\"\n[tenants.\"{TENANT}\".operations.refund]\nirreversible_without_approval = true\n"
    );
    let policy = write(desk.dir.path(), "lowered.toml", &text);
    let (code, report) = desk.keel(&["--policy", &policy, "agent", "run", "support", "--scenario", "refund"]);
    assert_eq!((code, report["status"].as_str()), (0, Some("completed")), "no human needed: {report}");
    assert_eq!(desk.refunds_at_provider(), 1);
    let stamp = PolicyStamp { version: "desk-lowered".into(), sha256: engine::canonical::sha256_hex(text.as_bytes()) };
    assert_eq!(lowered_by(&desk), [Some(stamp)]);
    desk.verify();
}

#[test]
fn a_bad_lowering_is_a_usage_error_naming_file_and_key_with_nothing_written() {
    let desk = Desk::new();
    let before = desk.event_count();
    for (name, body, needles) in [
        (
            "not a boolean",
            "[operations.refund]\nirreversible_without_approval = \"yes\"\n",
            &["bad.toml", "irreversible_without_approval"][..],
        ),
        (
            "in a defaults section, for every operation at once",
            "[defaults]\nirreversible_without_approval = true\n",
            &["bad.toml", "defaults.irreversible_without_approval", "[operations.OP]"][..],
        ),
    ] {
        let policy = write(desk.dir.path(), "bad.toml", &format!("version = \"v\"\n{body}"));
        let (code, out) = desk.keel(&["--policy", &policy, "agent", "run", "support", "--scenario", "refund"]);
        assert_eq!(code, 64, "{name}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        for needle in needles {
            assert!(error.contains(needle), "{name}: the error names {needle:?}: {error}");
        }
        assert_eq!(desk.event_count(), before, "{name}: nothing is written");
    }
}
