// A user's own agent, as the kit sees it: it pays a supplier invoice.
//
// Two tools: `read_invoice` (read-only) and `pay_invoice` (an irreversible effect: a charge
// of the invoice's amount, reserved and driven through Keel's intent lifecycle by the kit's
// `IntentGate`, with the card the host bound). An irreversible tool that names no approval
// policy waits for a human unless the operator's policy lowers it for the operation: the kit
// approves nothing, so the agent runs under a policy that lowers it for charges. The model's
// answers are a scripted transcript: read the invoice, pay it, say so. This file is both the crate docs' example
// (`testkit::agents`) and the agent of `tests/pay_invoice.rs`; it never calls a provider.

use agent::{
    AgentState, ApprovalPolicy, EffectClass, EffectIntent, EffectOutcome, Registry, Tool, ToolContext, ToolOutput,
    ToolSpec,
};
use engine::executor::OutcomeStatus;
use engine::ledger::IntentStatus;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use testkit::{Agent, AgentHost};

/// The invoice the agent is asked to pay, and what it costs.
const INVOICE: &str = "inv_2041";
const CENTS: i64 = 12_000;

/// Both tools take the invoice's id, and nothing else.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InvoiceArgs {
    invoice: String,
}

/// How `pay_invoice` names its charge: the right way, or the bug the kit must catch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// From the run and the invoice: a replayed call finds the charge it reserved.
    FromTheRun,
    /// Drawn anew in each process (like a UUID made at start-up): a call replayed after a
    /// crash reserves a second charge of the same invoice.
    PerProcess,
}

fn spec(name: &str, description: &str, effect: EffectClass) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        version: "1".into(),
        schema: json!({"type": "object", "properties": {"invoice": {"type": "string"}},
                       "required": ["invoice"], "additionalProperties": false}),
        capability: format!("invoice.{}", name.trim_end_matches("_invoice")),
        effect,
        approval: ApprovalPolicy::Never,
    }
}

/// The two tools, for one process of the run.
fn tools(host: &AgentHost<'_>, keys: Keys, processes: &AtomicU32) -> Registry {
    let process = processes.fetch_add(1, Ordering::SeqCst);
    let run_id = host.run_id.to_owned();
    let read = Tool::new(
        spec("read_invoice", "Reads a supplier invoice: its amount and currency.", EffectClass::Read),
        |args: InvoiceArgs, _: ToolContext| async move {
            if args.invoice != INVOICE {
                return ToolOutput::error("no such invoice");
            }
            ToolOutput::ok(json!({"invoice": INVOICE, "cents": CENTS, "currency": "EUR"}).to_string())
        },
    );
    let gate = Arc::clone(host.gate);
    let pay = Tool::new(
        spec("pay_invoice", "Pays a supplier invoice in full, once. Irreversible.", EffectClass::Irreversible),
        move |_: InvoiceArgs, ctx: ToolContext| {
            let gate = Arc::clone(&gate);
            async move {
                let Some(ticket) = ctx.effect else { return ToolOutput::error("not reserved; nothing was paid") };
                match gate.drive(&ticket).await {
                    Ok(outcome) if outcome.status == OutcomeStatus::Intent(IntentStatus::Validated) => {
                        let receipt = outcome.provider_ref.unwrap_or_default();
                        ToolOutput::ok(format!("paid, receipt {receipt}"))
                            .with_effect(EffectOutcome::Validated { evidence: receipt })
                    }
                    Ok(outcome) if outcome.status == OutcomeStatus::Intent(IntentStatus::Declined) => {
                        let code = outcome.code.map_or("declined".to_owned(), |c| c.as_str().to_owned());
                        ToolOutput::error(format!("declined ({code})")).with_effect(EffectOutcome::Declined { code })
                    }
                    Ok(outcome) => ToolOutput::error(format!("the payment is {}", outcome.status.as_str()))
                        .with_effect(EffectOutcome::Unknown { detail: outcome.status.as_str().to_owned() }),
                    Err(error) => ToolOutput::error(format!("the payment's outcome is unknown: {error}"))
                        .with_effect(EffectOutcome::Unknown { detail: error.to_string() }),
                }
            }
        },
    )
    .invariant(|a: &InvoiceArgs| if a.invoice == INVOICE { Ok(()) } else { Err("not an invoice of ours".into()) })
    .intent(move |a: &InvoiceArgs| EffectIntent {
        operation: "charge".into(),
        tenant: testkit::sample::TENANT.into(),
        intent_id: match keys {
            Keys::FromTheRun => format!("{run_id}-pay-{}", a.invoice),
            Keys::PerProcess => format!("{run_id}-pay-{}-{}-{process}", a.invoice, std::process::id()),
        },
        reference: a.invoice.clone(),
        payload: json!({"invoice": a.invoice, "cents": CENTS, "currency": "EUR"}),
        amount_minor: Some(CENTS),
        currency: Some("EUR".into()),
    });
    let mut registry = Registry::new();
    registry.register(read).expect("read_invoice's schema is closed");
    registry.register(pay).expect("pay_invoice's schema is closed and its name is its own");
    registry
}

/// The model's answers: read the invoice, pay it, say so.
fn transcript() -> adapters::model::scripted::Transcript {
    let answer = |id: &str, stop: &str, content: serde_json::Value| {
        json!({"id": id, "type": "message", "role": "assistant", "model": "scripted", "stop_reason": stop,
               "content": content, "usage": {"input_tokens": 300, "output_tokens": 20}})
    };
    let call = |id: &str, tool: &str| json!([{"type": "tool_use", "id": id, "name": tool, "input": {"invoice": INVOICE}}]);
    let answers = json!([
        answer("m1", "tool_use", call("t1", "read_invoice")),
        answer("m2", "tool_use", call("t2", "pay_invoice")),
        answer("m3", "end_turn", json!([{"type": "text", "text": "Invoice inv_2041 is paid."}])),
    ]);
    adapters::model::scripted::Transcript::parse(&answers.to_string()).expect("the transcript is well-formed")
}

/// The operator's policy the agent runs under: its charges are irreversible and run without a
/// human (each reservation records this policy's stamp).
fn paying_without_a_human() -> engine::policy::InForce {
    let document = json!({"version": "invoices-1", "operations": {"charge": {"irreversible_without_approval": true}}});
    let bytes = document.to_string();
    let document = serde_json::from_str(&bytes).expect("the policy decodes");
    let door = |code: &str| engine::money::Currency::parse(code).map_err(|e| e.to_string());
    let policy = engine::policy::Policy::from_document(document, &door).expect("the policy is valid");
    let stamp = engine::policy::PolicyStamp::of_file(&policy, bytes.as_bytes());
    engine::policy::InForce { policy, stamp }
}

/// The agent for the kit: done once `pay_invoice` succeeded.
fn pay_invoice_agent(keys: Keys) -> Agent {
    let processes = Arc::new(AtomicU32::new(0));
    let tools = move |host: &AgentHost<'_>| tools(host, keys, &processes);
    let paid = |state: &AgentState| state.tool_succeeded("pay_invoice");
    Agent::new("pay-invoice", transcript(), tools, paid)
        .prompt("You pay supplier invoices: read one, then pay it once.", "Pay invoice inv_2041.")
        .capabilities(["invoice.read", "invoice.pay"])
        .paying_with(testkit::sample::CARD_TOKEN)
        .under_policy(paying_without_a_human())
}
