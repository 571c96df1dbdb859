//! The contract of seed 001, rule by rule, on the pure state (the binary's suite replays the
//! seed's sequence through the log).

use super::*;
use chrono::TimeZone;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("a valid instant")
}

/// Admits the host's own declarations of `message` and folds them.
fn say(conversation: &mut Conversation, message: &str) -> Result<Admitted, FactsRefusal> {
    let admitted = conversation.admit(conversation.ticket(), message, &declarations(message), now())?;
    if !admitted.facts.is_empty() {
        conversation.apply_admitted(&admitted.facts, &admitted.evicted);
    }
    Ok(admitted)
}

fn values(conversation: &Conversation) -> Vec<(String, String)> {
    conversation.facts.values().map(|f| (f.key.clone(), f.value.clone())).collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn the_seeds_sequence_corrects_two_keys_forgets_one_then_all_and_a_question_recreates_nothing() {
    let mut c = Conversation::default();
    say(&mut c, "module=Reporting; database=PostgreSQL").expect("admitted");
    assert_eq!(values(&c), pairs(&[("database", "PostgreSQL"), ("module", "Reporting")]));
    say(&mut c, "module=Billing; database=SQL Server 2022").expect("admitted");
    assert_eq!(values(&c), pairs(&[("database", "SQL Server 2022"), ("module", "Billing")]), "two keys corrected");
    assert_eq!(c.facts["database"].evidence, "database=SQL Server 2022", "the quote is the user's own words");
    assert_eq!(c.facts["module"].turn, 1);
    let asked = say(&mut c, "Where can I find logs?").expect("a question is not a refusal");
    assert!(asked.facts.is_empty(), "a question is never promoted");
    c.forget(c.ticket(), Some("module")).expect("forgotten");
    c.apply_forgotten(Some("module"));
    assert_eq!(values(&c), pairs(&[("database", "SQL Server 2022")]), "forget module keeps database");
    c.forget(c.ticket(), None).expect("forgotten");
    c.apply_forgotten(None);
    assert!(c.facts.is_empty());
    say(&mut c, "Which module did I say?").expect("a question");
    assert!(c.facts.is_empty(), "a later question does not recreate them");
}

/// What a refusal must be.
type Expected = fn(&FactsRefusal) -> bool;

#[test]
fn every_bad_batch_is_refused_whole_and_the_previous_facts_stay() {
    let mut c = Conversation::default();
    say(&mut c, "product=Keel").expect("admitted");
    let before = c.clone();
    let long = "x".repeat(limits::FACTS_VALUE_MAX_CHARS + 1);
    let message = "module=Billing; database=PostgreSQL";
    let candidate = |key: &str, value: &str, evidence: &str| Candidate {
        key: key.to_owned(),
        value: value.to_owned(),
        evidence: evidence.to_owned(),
    };
    let good = || declarations(message);
    let cases: Vec<(&str, String, Vec<Candidate>, Expected)> = vec![
        (
            "an unknown key",
            "module=Billing; colour=blue".into(),
            declarations("module=Billing; colour=blue"),
            |r| matches!(r, FactsRefusal::UnknownKey(k) if k == "colour"),
        ),
        ("a duplicate candidate", message.into(), [good(), vec![good()[0].clone()]].concat(), |r| {
            matches!(r, FactsRefusal::DuplicateKey(_))
        }),
        ("a missing evidence", message.into(), vec![candidate("module", "Billing", ""), good()[1].clone()], |r| {
            matches!(r, FactsRefusal::Invalid { .. })
        }),
        (
            "an evidence the user did not write",
            message.into(),
            vec![candidate("module", "Billing", "module=Billing, surely"), good()[1].clone()],
            |r| matches!(r, FactsRefusal::Invalid { why, .. } if why.contains("exact quote")),
        ),
        (
            "a value not in its evidence",
            message.into(),
            vec![candidate("module", "Billing", "database=PostgreSQL"), good()[1].clone()],
            |r| matches!(r, FactsRefusal::Invalid { why, .. } if why.contains("not in its evidence")),
        ),
        (
            "a semantic guess (a value the message does not declare)",
            message.into(),
            vec![candidate("module", "Bill", "module=Billing"), good()[1].clone()],
            |r| matches!(r, FactsRefusal::NotDeclared),
        ),
        ("a declaration left out", message.into(), vec![good()[0].clone()], |r| matches!(r, FactsRefusal::NotDeclared)),
        (
            "a value too long",
            format!("log={long}"),
            declarations(&format!("log={long}")),
            |r| matches!(r, FactsRefusal::Invalid { why, .. } if why.contains("256")),
        ),
        (
            "six facts in one batch",
            "product=a; module=b; priority=c; database=d; version=e; log=f".into(),
            declarations("product=a; module=b; priority=c; database=d; version=e; log=f"),
            |r| matches!(r, FactsRefusal::TooMany { count: 6 }),
        ),
        (
            "a message too long",
            format!("module=Billing; {}", " ".repeat(limits::FACTS_MESSAGE_MAX_CHARS)),
            good()[..1].to_vec(),
            |r| matches!(r, FactsRefusal::MessageTooLong { .. }),
        ),
    ];
    for (name, message, candidates, expected) in cases {
        let refused = c.admit(c.ticket(), &message, &candidates, now()).expect_err(name);
        assert!(expected(&refused), "{name}: {refused:?}");
        assert!(refused.to_string().contains("no fallback"), "{name}: the refusal says there is no fallback");
        assert_eq!(c, before, "{name}: the previous facts are kept");
    }
    let evidence = "e".repeat(limits::FACTS_EVIDENCE_MAX_CHARS + 1);
    let too_long = candidate("log", "e", &evidence);
    let refused = c.admit(c.ticket(), &evidence, &[too_long], now()).expect_err("evidence too long");
    assert!(matches!(&refused, FactsRefusal::Invalid { why, .. } if why.contains("512")), "{refused:?}");
}

#[test]
fn the_last_declaration_of_a_key_wins_and_prose_declares_nothing() {
    let found = declarations("hello\nmodule=Reporting; module = Billing ;is it version=3?");
    assert_eq!(
        found,
        vec![Candidate { key: "module".into(), value: "Billing".into(), evidence: "module = Billing".into() }]
    );
}

#[test]
fn a_new_key_evicts_the_oldest_turn_ties_broken_by_ordinal_key() {
    let mut c = Conversation::default();
    say(&mut c, "version=1; product=Keel").expect("turn 0");
    say(&mut c, "module=Billing; database=PG; log=none").expect("turn 1");
    let admitted = say(&mut c, "symptom=slow").expect("turn 2");
    // Turn 0 holds product and version: product goes first, ordinally.
    assert_eq!(admitted.evicted, ["product"]);
    assert_eq!(c.facts.len(), limits::FACTS_MAX);
    let admitted = say(&mut c, "priority=high").expect("turn 3");
    assert_eq!(admitted.evicted, ["version"]);
    // A correction replaces its key and evicts nothing.
    let admitted = say(&mut c, "module=Reporting").expect("turn 4");
    assert!(admitted.evicted.is_empty());
    assert_eq!(c.facts["module"].value, "Reporting");
}

#[test]
fn a_stale_or_pre_forget_ticket_is_refused() {
    let mut c = Conversation::default();
    let taken = c.ticket();
    say(&mut c, "module=Billing").expect("admitted");
    let refused = c.admit(taken, "module=Reporting", &declarations("module=Reporting"), now());
    assert!(matches!(refused, Err(FactsRefusal::Stale { .. })), "another turn came first: {refused:?}");
    let taken = c.ticket();
    c.apply_forgotten(None);
    let refused = c.admit(taken, "module=Reporting", &declarations("module=Reporting"), now());
    assert!(matches!(refused, Err(FactsRefusal::Stale { .. })), "an update from before forget: {refused:?}");
    assert!(c.facts.is_empty());
    assert!(matches!(c.forget(c.ticket(), Some("colour")), Err(FactsRefusal::UnknownKey(_))));
    assert_eq!(Ticket::parse("1:4"), Some(Ticket { epoch: 1, turn: 4 }));
    assert_eq!(Ticket::parse("1-4"), None);
}
