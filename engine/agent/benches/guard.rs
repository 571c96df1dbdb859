//! The guard's cost per tool-call decision (steps 1–7: cancellation, registry, capability,
//! strict schema + typed binding, invariants, tool budget, canonical repetition signature),
//! excluding durable I/O. Run: `cargo bench -p agent --bench guard`.
//!
//! No benchmark framework: many iterations timed with `std::time::Instant`, best of five
//! rounds, printed as nanoseconds per decision.

use agent::{
    AgentEvent, AgentLimits, AgentState, ApprovalPolicy, EffectClass, ModelResponse, Registry, ResponseBlock,
    StopReason, Tool, ToolCall, ToolContext, ToolOutput, ToolSpec, Usage, Verdict, decide,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::hint::black_box;
use std::time::Instant;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundArgs {
    order: String,
    amount_minor: i64,
    currency: String,
    reason: Option<String>,
}

fn registry() -> Registry {
    let mut registry = Registry::new();
    let spec = ToolSpec {
        name: "read_refund_policy".into(),
        description: "Reads the refund policy for an amount.".into(),
        version: "1".into(),
        schema: json!({"type":"object","properties":{
            "order":{"type":"string","pattern":"^C-[0-9]{4}$"},
            "amount_minor":{"type":"integer","minimum":1},
            "currency":{"type":"string","enum":["EUR","USD"]},
            "reason":{"type":["string","null"],"maxLength":200}},
            "required":["order","amount_minor","currency"],"additionalProperties":false}),
        capability: "policy.read".into(),
        effect: EffectClass::Read,
        approval: ApprovalPolicy::Never,
    };
    let tool = Tool::new(spec, |_: RefundArgs, _: ToolContext| async { ToolOutput::ok("ok") })
        .invariant(|a: &RefundArgs| if a.amount_minor <= 1_000_000 { Ok(()) } else { Err("too much".into()) });
    registry.register(tool).expect("the bench schema is closed");
    registry
}

fn state(registry: &Registry, call: &ToolCall) -> AgentState {
    let start = DateTime::<Utc>::UNIX_EPOCH;
    let limits = AgentLimits { tool_calls_max: 1_000, ..AgentLimits::default() };
    AgentState::from_events(&[
        AgentEvent::AgentRunStarted {
            run_id: "bench".into(),
            workflow: "bench".into(),
            started_at: start,
            deadline: engine::clock::plus_ms(start, 120_000),
            limits,
            capabilities: ["policy.read".to_owned()].into(),
            tools: registry.stamps(),
            system: String::new(),
            prompt: String::new(),
            script: None,
        },
        AgentEvent::ModelCallReserved { call: 1, hold: None },
        AgentEvent::ModelAnswerRecorded {
            call: 1,
            response: ModelResponse {
                id: None,
                model: "m".into(),
                content: vec![ResponseBlock::ToolUse {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                }],
                stop_reason: StopReason::ToolUse,
                usage: Usage::default(),
            },
            cost_minor: None,
        },
    ])
}

fn measure(label: &str, registry: &Registry, arguments: &str, expect_admit: bool) {
    const ITERATIONS: u32 = 100_000;
    let call = ToolCall { id: "c1".into(), name: "read_refund_policy".into(), arguments: arguments.into() };
    let state = state(registry, &call);
    let now = DateTime::<Utc>::UNIX_EPOCH;
    let admitted = matches!(decide(&state, registry, &call, now, false, None), Verdict::Admit(_));
    assert_eq!(admitted, expect_admit, "{label}: unexpected verdict");
    let mut best = f64::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..ITERATIONS {
            black_box(decide(black_box(&state), registry, black_box(&call), now, false, None));
        }
        best = best.min(started.elapsed().as_nanos() as f64 / f64::from(ITERATIONS));
    }
    println!("guard decision, {label:<32} {best:>8.0} ns");
}

fn main() {
    let registry = registry();
    measure(
        "admitted",
        &registry,
        r#"{"order":"C-1042","amount_minor":8990,"currency":"EUR","reason":"damaged"}"#,
        true,
    );
    measure(
        "unknown property (refused)",
        &registry,
        r#"{"order":"C-1042","amount_minor":8990,"currency":"EUR","x":1}"#,
        false,
    );
    measure("malformed JSON (refused)", &registry, r#"{"order":"C-1042","amount_minor":89"#, false);
}
