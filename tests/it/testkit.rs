//! The user test kit, used as a user would: a workflow that is not one of Keel's own (paying
//! supplier invoices) and Keel's built-in charge and refund, each under seeded crashes and
//! provider faults. A failure prints its seed; `KEEL_SEED=N` replays it.

use engine::executor::{
    Context, IntentRequest, Prepared, Registered, Rejection, Workflow, WorkflowEnd, WorkflowError, end_with,
};
use engine::ledger::RejectCode;
use engine::provider::{BoxFuture, EffectKind, Secret};
use provider_sim::faults::Fault;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use testkit::Tier;
use testkit::sample::{CARD_TOKEN, TENANT};

/// Pays a supplier invoice from a stored card: one intent per invoice, two lines of payload.
struct PayInvoice;

/// An invoice as stored: the card is a secret of the invocation, never stored.
#[derive(Serialize, Deserialize)]
struct Invoice {
    invoice: String,
    cents: i64,
    supplier: String,
}

impl Workflow for PayInvoice {
    type Input = Invoice;

    fn name(&self) -> &'static str {
        "pay_invoice"
    }

    fn prepare(&self, raw: &Value) -> Result<Prepared<Invoice>, Rejection> {
        let invalid = |detail: &str| Rejection { code: RejectCode::InvalidArguments, details: vec![detail.to_owned()] };
        let text = |name: &str| raw.get(name).and_then(Value::as_str).map(str::to_owned);
        let card = text("card").ok_or_else(|| invalid("card is required"))?;
        let invoice = text("invoice").ok_or_else(|| invalid("invoice is required"))?;
        let supplier = text("supplier").ok_or_else(|| invalid("supplier is required"))?;
        let cents = raw.get("cents").and_then(Value::as_i64).filter(|c| *c > 0);
        let cents = cents.ok_or_else(|| invalid("cents must be a positive integer"))?;
        Ok(Prepared {
            input: Invoice { invoice, cents, supplier },
            secrets: [("card".to_owned(), Secret::new(card))].into(),
        })
    }

    fn run<'a>(&'a self, ctx: &'a mut Context, input: Invoice) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let outcome = ctx
                .intent(IntentRequest {
                    kind: EffectKind::Charge,
                    tenant: TENANT.to_owned(),
                    intent_id: format!("invoice_{}", input.invoice),
                    order_id: input.invoice.clone(),
                    business_ref: input.invoice.clone(),
                    amount_minor: input.cents,
                    currency: "EUR".to_owned(),
                    payload: json!({"invoice": input.invoice, "cents": input.cents, "supplier": input.supplier}),
                    payment_method: ctx.secret("card"),
                    tool: None,
                })
                .await?;
            end_with(&outcome)
        })
    }
}

/// Four invoices, one of a single cent.
fn invoices(kit: testkit::Kit) -> testkit::Kit {
    kit.submit("pay_invoice", invoice("inv_0001", 12_000))
        .submit("pay_invoice", invoice("inv_0002", 800))
        .submit("pay_invoice", invoice("inv_0003", 55_500))
        .submit("pay_invoice", invoice("inv_0004", 1))
}

fn invoice(id: &str, cents: i64) -> Value {
    json!({"invoice": id, "cents": cents, "supplier": "ACME Tools", "card": "pm_card_mastercard_5555"})
}

#[test]
fn a_users_invoice_workflow_keeps_every_invariant_under_seeded_crashes() {
    let kit = invoices(testkit::Kit::new(vec![Registered::new(PayInvoice)]))
        .mismatch(|input| {
            let mut other = input.clone();
            other["cents"] = json!(input["cents"].as_i64().unwrap_or_default() + 1);
            other
        })
        .seeds(1, 6);
    let reports = kit.run().unwrap_or_else(|failure| panic!("{failure}"));
    let crashes: u64 = reports.iter().map(|r| r.crashes).sum();
    assert!(crashes > 0, "the schedule crashed something: {reports:?}");
    assert!(reports.iter().all(|r| r.report.effects <= r.report.intents));
    for fault in Fault::NAMES {
        assert!(reports.iter().any(|r| r.faults.contains(&fault)), "no seed drew {fault}: {reports:?}");
    }
    assert!(reports.iter().any(|r| r.tier != "dedup+lookup"), "some seed played a weaker provider: {reports:?}");
}

/// SPEC, tier (b): a provider that ignores `Idempotency-Key` but answers lookups truthfully
/// (within its declared consistency window) gets no second effect: Keel writes every attempt
/// ahead and resends only on a proven absence.
#[test]
fn a_provider_without_idempotency_gets_one_effect_per_invoice() {
    let kit = invoices(testkit::Kit::new(vec![Registered::new(PayInvoice)]))
        .tier(Tier { idempotency: false, lookup: true })
        .fault_probability(0.5)
        .seeds(20, 6);
    let reports = kit.run().unwrap_or_else(|failure| panic!("{failure}"));
    assert!(reports.iter().all(|r| r.report.double_effects == 0 && r.tier == "lookup"), "{reports:?}");
}

#[test]
fn keels_charge_and_refund_keep_every_invariant_under_seeded_crashes() {
    let charge = |id: &str, order: &str, amount: i64| {
        json!({"tenant_id": TENANT, "intent_id": id, "order_id": order, "amount_minor": amount, "currency": "EUR",
               "payment_method_token": CARD_TOKEN})
    };
    let refund = |id: &str, order: &str, amount: i64| json!({"tenant_id": TENANT, "intent_id": id, "order_id": order, "amount_minor": amount, "currency": "EUR"});
    let kit = testkit::Kit::new(workflows::builtin(None))
        .submit("charge", charge("order_7001_charge", "order_7001", 4_900))
        .submit("charge", charge("order_7002_charge", "order_7002", 1_500))
        .submit("refund", refund("order_7001_refund_1", "order_7001", 4_000))
        .submit("refund", refund("order_7001_refund_2", "order_7001", 2_000))
        .submit("refund", refund("order_7002_refund_1", "order_7002", 1_500))
        .seeds(100, 6);
    kit.run().unwrap_or_else(|failure| panic!("{failure}"));
}

/// Real kills: every submission and every recovery runs in a child process (this test
/// binary, re-executed on this very test) that the kit SIGKILLs after a seeded delay or at a
/// seeded failpoint; then it restarts, heals, reconciles and checks the invariants.
#[test]
fn a_users_invoice_workflow_keeps_every_invariant_under_real_sigkills() {
    let kit = invoices(testkit::Kit::new(vec![Registered::new(PayInvoice)]))
        .killing("testkit::a_users_invoice_workflow_keeps_every_invariant_under_real_sigkills")
        .crash_probability(0.7)
        .seeds(300, 3);
    let reports = kit.run().unwrap_or_else(|failure| panic!("{failure}"));
    let kills: u64 = reports.iter().map(|r| r.kills).sum();
    assert!(kills > 0, "the schedule SIGKILLed a child: {reports:?}");
    assert!(reports.iter().all(|r| r.report.effects <= r.report.intents), "{reports:?}");
}

/// A kit told to re-execute a test that does not exist reports it rather than pass with
/// nothing run.
#[test]
fn a_killing_kit_that_names_no_test_says_so() {
    let kit = invoices(testkit::Kit::new(vec![Registered::new(PayInvoice)]))
        .killing("testkit::no_such_test")
        .crash_probability(0.0)
        .seeds(1, 1);
    let failure = kit.run().expect_err("the child never played its part");
    assert!(failure.message.contains("without playing its part"), "{failure}");
}
