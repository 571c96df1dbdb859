//! A user's own agent under the kit: the pay-an-invoice agent of `pay_invoice/agent.rs`,
//! run with its scripted transcript under seeded crashes, real SIGKILLs and every provider
//! fault; and its broken twin — a payment keyed per process — which the kit must catch and
//! name the seed of.

include!("pay_invoice/agent.rs");

#[test]
fn an_invoice_agent_pays_once_under_crashes_and_faults() {
    let kit =
        testkit::Kit::new(Vec::new()).agent(pay_invoice_agent(Keys::FromTheRun)).seeds(1, 6).crash_probability(0.8);
    let reports = kit.run().unwrap_or_else(|failure| panic!("{failure}"));
    assert!(reports.iter().any(|r| r.crashes > 0), "some seed crashed the agent: {reports:#?}");
    assert!(reports.iter().all(|r| r.report.effects <= 1), "{reports:#?}");
    // Paid, without a human: its policy lowers the irreversible default for charges (without
    // it every payment would wait for an approval the kit never gives).
    assert!(reports.iter().any(|r| r.report.effects == 1), "some seed paid the invoice: {reports:#?}");
}

#[test]
fn an_invoice_agent_pays_once_under_real_sigkills() {
    let kit = testkit::Kit::new(Vec::new())
        .agent(pay_invoice_agent(Keys::FromTheRun))
        .seeds(1, 3)
        .crash_probability(0.8)
        .killing("an_invoice_agent_pays_once_under_real_sigkills");
    let reports = kit.run().unwrap_or_else(|failure| panic!("{failure}"));
    assert!(reports.iter().any(|r| r.kills > 0), "some seed killed the agent: {reports:#?}");
}

#[test]
fn a_payment_keyed_per_process_is_caught_and_its_seed_printed() {
    let kit =
        testkit::Kit::new(Vec::new()).agent(pay_invoice_agent(Keys::PerProcess)).seeds(1, 100).crash_probability(0.8);
    let failure = kit.run().expect_err("a payment replayed under a new key must fail some seed");
    let printed = failure.to_string();
    assert!(printed.contains(&format!("replay with KEEL_SEED={}", failure.seed)), "{printed}");
    let report = failure.report.as_ref().expect("the seed ran to its checks");
    assert!(report.report.effect_calls_rekeyed >= 1, "{printed}");
    assert_eq!(report.report.effects, 2, "the invoice was paid twice: {printed}");
    if std::env::var(testkit::SEED_ENV).is_err() {
        // The README shows this very failure: the seed it names is the first one that fails.
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README");
        assert!(readme.contains(&format!("KEEL_SEED={} cargo test -p testkit", failure.seed)), "{printed}");
    }
}
