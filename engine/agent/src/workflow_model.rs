//! Model calls from a workflow's journal: a workflow (not only the agent loop) that asks a
//! model never re-bills it on replay.
//!
//! Owns [`WorkflowModel`] (a transport, the budget its calls are held to and what they spent),
//! [`ModelBudget`], [`ModelSpent`], [`ModelHold`] and [`ModelAnswer`]. Each
//! [`WorkflowModel::ask`] is one [`Context::billed_call`]: its hold (one call, its output
//! token cap) is durable before the transport runs, the answer — or the transport's failure
//! — is journaled after, and replay hands the journaled answer back without calling the
//! transport. Every hold and answer the journal gives back is counted again as the workflow
//! replays, so a restarted run goes on with what was left, never with a fresh budget; a try
//! the process died during stays counted (it may have been billed).
//!
//! This module never reads a clock and does no I/O of its own: the transport is the caller's
//! and the journal the engine's. It never knows which workflow it serves.

use crate::model::{ModelRequest, ModelResponse, ModelTransport};
use engine::event::RunStatus;
use engine::executor::{Context, WorkflowError};
use serde::{Deserialize, Serialize};

/// What a workflow's model calls may spend, in total over the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelBudget {
    /// Calls, an interrupted try included.
    pub calls_max: u32,
    /// Input tokens, as the vendor reports them.
    pub input_tokens_max: u64,
    /// Output tokens: each call holds its cap until its answer says what it used.
    pub output_tokens_max: u64,
}

impl Default for ModelBudget {
    /// The agent harness's defaults (`engine::limits`), so an unconfigured workflow is bounded.
    fn default() -> Self {
        Self {
            calls_max: engine::limits::AGENT_MODEL_CALLS_DEFAULT,
            input_tokens_max: engine::limits::AGENT_INPUT_TOKENS_DEFAULT,
            output_tokens_max: engine::limits::AGENT_OUTPUT_TOKENS_DEFAULT,
        }
    }
}

/// What a workflow's model calls spent so far, rebuilt from the journal on replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModelSpent {
    /// Calls reserved.
    pub calls: u32,
    /// Input tokens reported.
    pub input_tokens: u64,
    /// Output tokens reported (or held, for a try with no answer or an unknown count).
    pub output_tokens: u64,
}

/// What one model call reserved before it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelHold {
    /// The call's output token cap: what it may spend before its answer says.
    pub output_tokens: u64,
}

/// A journaled model call's result: the answer, or why the transport gave none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ModelAnswer {
    /// The model answered.
    Answered {
        /// The normalised answer.
        response: ModelResponse,
    },
    /// The transport failed (unavailable, timeout, refused, unreadable): recorded too, so
    /// replay gives the same failure instead of calling again.
    Failed {
        /// The transport's error, in words (never a key: transports scrub them).
        detail: String,
    },
}

/// A transport held to a budget, for the model calls of one workflow run.
pub struct WorkflowModel<'a> {
    transport: &'a dyn ModelTransport,
    budget: ModelBudget,
    spent: ModelSpent,
}

impl<'a> WorkflowModel<'a> {
    /// A run's model calls through `transport`, held to `budget`. Build it at the top of the
    /// workflow's function: its counters start at zero and replay refills them from the
    /// journal.
    pub fn new(transport: &'a dyn ModelTransport, budget: ModelBudget) -> Self {
        Self { transport, budget, spent: ModelSpent::default() }
    }

    /// What the calls asked so far spent (replayed ones included).
    pub fn spent(&self) -> ModelSpent {
        self.spent
    }

    /// Asks the model once, journaled as `name` at the workflow's next position: replayed,
    /// the recorded answer is returned and the transport is not called. A transport failure
    /// is an answer too ([`ModelAnswer::Failed`]): the workflow decides what it means.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Limit`] when the call budget or a token budget is spent (the run
    /// stops `model_budget` or `token_budget`; past a call, after its answer is recorded);
    /// anything [`Context::billed_call`] refuses.
    pub async fn ask(
        &mut self,
        ctx: &mut Context,
        name: &str,
        request: &ModelRequest,
    ) -> Result<ModelAnswer, WorkflowError> {
        let hold = ModelHold { output_tokens: u64::from(request.max_output_tokens) };
        let (budget, spent) = (self.budget, self.spent);
        let admit = |earlier: &[ModelHold]| admit(budget, spent, earlier, hold);
        let call = || async {
            match self.transport.complete(request).await {
                Ok(response) => ModelAnswer::Answered { response },
                Err(error) => ModelAnswer::Failed { detail: error.to_string() },
            }
        };
        let billed = ctx.billed_call(name, admit, call).await?;
        // Every try before the last one died with its process: it may have been billed, so
        // its hold stays spent.
        let (last, interrupted) = billed.holds.split_last().map_or((hold, &[][..]), |(last, rest)| (*last, rest));
        for earlier in interrupted {
            self.count(0, earlier.output_tokens);
        }
        let usage = match &billed.answer {
            ModelAnswer::Answered { response } => response.usage,
            // A failed call may still have been billed (a timeout after the model answered):
            // its hold stays spent.
            ModelAnswer::Failed { .. } => crate::model::Usage { input_tokens: Some(0), output_tokens: None },
        };
        self.count(usage.input_tokens.unwrap_or(0), usage.output_tokens.unwrap_or(last.output_tokens));
        let over = if usage.input_tokens.is_none() {
            Some(format!(
                "model call {name}: its input token count is unknown, so it cannot be counted against the budget"
            ))
        } else {
            (self.spent.input_tokens > self.budget.input_tokens_max).then(|| {
                format!(
                    "model call {name}: {} input tokens spent, above the budget of {}",
                    self.spent.input_tokens, self.budget.input_tokens_max
                )
            })
        };
        match over {
            Some(detail) => Err(WorkflowError::Limit { status: RunStatus::TokenBudget, detail }),
            None => Ok(billed.answer),
        }
    }

    fn count(&mut self, input_tokens: u64, output_tokens: u64) {
        self.spent.calls = self.spent.calls.saturating_add(1);
        self.spent.input_tokens = self.spent.input_tokens.saturating_add(input_tokens);
        self.spent.output_tokens = self.spent.output_tokens.saturating_add(output_tokens);
    }
}

/// Whether one more try may be reserved, given what the run spent before this call and the
/// tries of this call a dead process reserved: its hold, or the stop naming the budget.
fn admit(
    budget: ModelBudget,
    spent: ModelSpent,
    earlier: &[ModelHold],
    hold: ModelHold,
) -> Result<ModelHold, WorkflowError> {
    let calls = u64::from(spent.calls) + earlier.len() as u64;
    if calls >= u64::from(budget.calls_max) {
        let detail = format!("{calls} model calls reserved, the budget of {} is spent", budget.calls_max);
        return Err(WorkflowError::Limit { status: RunStatus::ModelBudget, detail });
    }
    let held: u64 = earlier.iter().map(|h| h.output_tokens).sum();
    let output = spent.output_tokens.saturating_add(held).saturating_add(hold.output_tokens);
    if output > budget.output_tokens_max {
        let detail = format!(
            "a model call holding {} output tokens would bring the run to {output}, above the budget of {}",
            hold.output_tokens, budget.output_tokens_max
        );
        return Err(WorkflowError::Limit { status: RunStatus::TokenBudget, detail });
    }
    Ok(hold)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ResponseBlock, StopReason, TransportError, Usage};
    use chrono::{TimeZone, Utc};
    use engine::clock::ManualClock;
    use engine::event::{Cause, Event, RunId, RunLimits};
    use engine::executor::{Executor, Prepared, Registered, Rejection, RunRequest, Runtime, Workflow, WorkflowEnd};
    use engine::failpoints::{Failpoints, Point};
    use engine::lease::{LeaseOwner, Lessee};
    use engine::memory::{MemoryLog, MemoryProvider};
    use engine::provider::{BoxFuture, Capability};
    use serde_json::{Value, json};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A transport that counts its calls and answers 100 output tokens; it can be told to
    /// die (panic, as a killed process would stop) during its first call, or to fail every
    /// call as an unreachable provider does.
    struct Counting {
        calls: AtomicUsize,
        die_on_first: bool,
        unavailable: bool,
    }

    impl ModelTransport for Counting {
        fn complete<'a>(&'a self, _: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(!(self.die_on_first && call == 1), "the process dies during its first model call");
            let unavailable = self.unavailable;
            Box::pin(async move {
                if unavailable {
                    return Err(TransportError::Unavailable { detail: "connection refused".into() });
                }
                Ok(ModelResponse {
                    id: Some(format!("msg_{call}")),
                    model: "m".into(),
                    content: vec![ResponseBlock::Text { text: format!("answer {call}") }],
                    stop_reason: StopReason::EndTurn,
                    usage: Usage { input_tokens: Some(10), output_tokens: Some(100) },
                })
            })
        }
    }

    /// Asks the model twice, each call holding 100 output tokens, under a budget of `.1`.
    struct TwoQuestions(Arc<Counting>, u64);

    impl Workflow for TwoQuestions {
        type Input = Value;
        fn name(&self) -> &'static str {
            "two-questions"
        }
        fn prepare(&self, raw: &Value) -> Result<Prepared<Value>, Rejection> {
            Ok(Prepared::plain(raw.clone()))
        }
        fn run<'a>(&'a self, ctx: &'a mut Context, _: Value) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
            Box::pin(async move {
                let budget = ModelBudget { calls_max: 5, input_tokens_max: 1_000, output_tokens_max: self.1 };
                let mut model = WorkflowModel::new(&*self.0, budget);
                let request = ModelRequest {
                    system: String::new(),
                    messages: Vec::new(),
                    tools: Vec::new(),
                    max_output_tokens: 100,
                };
                let first = model.ask(ctx, "first", &request).await?;
                let second = model.ask(ctx, "second", &request).await?;
                Ok(WorkflowEnd {
                    status: RunStatus::Completed,
                    output: json!({"first": first, "second": second}),
                    intent: None,
                })
            })
        }
    }

    fn executor(log: Arc<MemoryLog>, clock: Arc<ManualClock>, transport: &Arc<Counting>, budget: u64) -> Executor {
        let capability = Capability {
            dedup_by_key: true,
            lookup: true,
            key_window_ms: 86_400_000,
            consistency_window_ms: 0,
            request_timeout_ms: 0,
        };
        let runtime = Runtime {
            log,
            provider: Arc::new(MemoryProvider::new(capability)),
            clock,
            lessee: Lessee::new(LeaseOwner::named("test")),
        };
        Executor::new(runtime, vec![Registered::new(TwoQuestions(Arc::clone(transport), budget))])
    }

    fn request() -> RunRequest {
        RunRequest {
            run_id: RunId::new("run-1"),
            limits: RunLimits::default(),
            deadline_ms: 60_000,
            cause: Cause::command("test"),
        }
    }

    /// Runs `go` to its crash (a panic, caught), and gives the log as a restarted process
    /// finds it.
    async fn crash(
        log: &Arc<MemoryLog>,
        clock: &Arc<ManualClock>,
        go: impl Future<Output = ()> + Send + 'static,
    ) -> Arc<MemoryLog> {
        assert!(tokio::spawn(go).await.is_err(), "the process died");
        Arc::new(MemoryLog::from_events(clock.clone(), log.events()))
    }

    fn steps(log: &MemoryLog) -> Vec<String> {
        log.events()
            .into_iter()
            .filter_map(|e| match e.event {
                Event::StepRecorded { name, .. } => Some(name),
                _ => None,
            })
            .collect()
    }

    fn clock() -> Arc<ManualClock> {
        Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("a valid instant")))
    }

    #[tokio::test]
    async fn an_answer_journaled_before_a_crash_is_never_asked_again_and_its_tokens_stay_spent() {
        let clock = clock();
        let transport = Arc::new(Counting { calls: AtomicUsize::new(0), die_on_first: false, unavailable: false });
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let armed = Failpoints::armed(Point::AfterCallAnswered, 1, Arc::new(|p| panic!("crash at {p}")));
        let first = executor(log.clone(), clock.clone(), &transport, 150).with_failpoints(armed);
        let log = crash(&log, &clock, async move {
            let _ = first.start("two-questions", &json!({}), request()).await;
        })
        .await;
        assert_eq!(transport.calls.load(Ordering::SeqCst), 1);
        assert_eq!(steps(&log), vec!["reserve:first", "answer:first"], "reserved before the call, answered after");

        // The restarted process replays the first answer from the journal: the transport is
        // not asked again, and its 100 tokens count, so the second call (holding 100 more)
        // is over the budget of 150 — a fresh budget would have let it run.
        let resumed = executor(log.clone(), clock.clone(), &transport, 150);
        let run = log.ledger().run(&RunId::new("run-1")).expect("the run").clone();
        let outcome = resumed.resume(&run, Cause::command("resume")).await.expect("resumes");
        assert_eq!(outcome.status.as_str(), "token_budget", "{}", outcome.output);
        assert_eq!(transport.calls.load(Ordering::SeqCst), 1, "the model was billed once");
        assert_eq!(steps(&log), vec!["reserve:first", "answer:first"], "nothing reserved past the budget");
    }

    #[tokio::test]
    async fn a_try_the_process_died_during_stays_counted_and_the_call_is_reserved_again() {
        let clock = clock();
        let dying = Arc::new(Counting { calls: AtomicUsize::new(0), die_on_first: true, unavailable: false });
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let first = executor(log.clone(), clock.clone(), &dying, 250);
        let log = crash(&log, &clock, async move {
            let _ = first.start("two-questions", &json!({}), request()).await;
        })
        .await;
        assert_eq!(steps(&log), vec!["reserve:first"], "the reservation was durable before the call");

        let transport = Arc::new(Counting { calls: AtomicUsize::new(0), die_on_first: false, unavailable: false });
        let resumed = executor(log.clone(), clock.clone(), &transport, 250);
        let run = log.ledger().run(&RunId::new("run-1")).expect("the run").clone();
        let outcome = resumed.resume(&run, Cause::command("resume")).await.expect("resumes");
        // The retry is admitted (100 held by the dead try + 100 = 200 ≤ 250) and answered;
        // the second question would bring the run to 300: refused.
        assert_eq!(outcome.status.as_str(), "token_budget", "{}", outcome.output);
        assert_eq!(steps(&log), vec!["reserve:first", "reserve:first", "answer:first"]);
        assert_eq!(transport.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_call_is_journaled_replayed_as_failed_and_its_hold_stays_spent() {
        let clock = clock();
        let down = Arc::new(Counting { calls: AtomicUsize::new(0), die_on_first: false, unavailable: true });
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let armed = Failpoints::armed(Point::AfterCallAnswered, 1, Arc::new(|p| panic!("crash at {p}")));
        let first = executor(log.clone(), clock.clone(), &down, 150).with_failpoints(armed);
        let log = crash(&log, &clock, async move {
            let _ = first.start("two-questions", &json!({}), request()).await;
        })
        .await;
        let failed = log.events().into_iter().find_map(|e| match e.event {
            Event::StepRecorded { name, output, .. } if name == "answer:first" => Some(output),
            _ => None,
        });
        assert_eq!(failed.map(|o| o["outcome"].clone()), Some(json!("failed")), "the failure is journaled");
        // Resumed with a provider that is back: the failure is replayed, not retried, and its
        // hold (100) stays spent, so the second call (100 more) is over the 150 budget.
        let up = Arc::new(Counting { calls: AtomicUsize::new(0), die_on_first: false, unavailable: false });
        let resumed = executor(log.clone(), clock.clone(), &up, 150);
        let run = log.ledger().run(&RunId::new("run-1")).expect("the run").clone();
        let outcome = resumed.resume(&run, Cause::command("resume")).await.expect("resumes");
        assert_eq!(outcome.status.as_str(), "token_budget", "{}", outcome.output);
        assert_eq!((down.calls.load(Ordering::SeqCst), up.calls.load(Ordering::SeqCst)), (1, 0));
    }

    #[test]
    fn admit_refuses_past_the_call_budget_and_the_output_budget() {
        let budget = ModelBudget { calls_max: 2, input_tokens_max: 10, output_tokens_max: 300 };
        let hold = ModelHold { output_tokens: 100 };
        let spent = ModelSpent { calls: 1, input_tokens: 0, output_tokens: 100 };
        assert_eq!(admit(budget, spent, &[], hold).ok(), Some(hold));
        let calls = admit(budget, spent, &[hold], hold);
        assert!(matches!(calls, Err(WorkflowError::Limit { status: RunStatus::ModelBudget, .. })), "{calls:?}");
        let tokens = admit(ModelBudget { calls_max: 9, ..budget }, spent, &[hold, hold], hold);
        assert!(matches!(tokens, Err(WorkflowError::Limit { status: RunStatus::TokenBudget, .. })), "{tokens:?}");
    }
}
