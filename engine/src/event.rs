//! The stored event format: Keel's ground truth.
//!
//! Owns [`Event`], every fact Keel ever records, the [`Cause`] each fact names, and
//! [`StoredEvent`], the envelope the store hands back (global sequence, stream, sequence in
//! the stream, UTC time, hash chain). Everything else — intents, runs, budgets — is folded
//! from these by [`crate::ledger::Ledger::apply`].
//!
//! # Compatibility
//!
//! A released variant is never edited: its name and fields are the on-disk format (the
//! variant name is the `type` column, the fields are the JSON payload). New facts get new
//! variants; new optional fields must default when absent. `fixtures/golden/` holds logs
//! that must keep decoding and folding to the same state.

use crate::facts::{ConversationId, Fact, Ticket};
use crate::provider::{Capability, EffectKind, Evidence, UnknownReason};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// An intent key: `operation:tenant:intent_id`. Never regenerated on retry or replay.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IntentKey(String);

impl IntentKey {
    /// Builds the key from its caller-supplied triple.
    pub fn new(kind: EffectKind, tenant: &str, intent_id: &str) -> Self {
        Self(format!("{}:{tenant}:{intent_id}", kind.as_str()))
    }

    /// Parses a key typed by an operator; `None` unless it has the `operation:tenant:id` shape.
    /// A tenant that is a UUID is lower-cased, as the input path stores it, so a key copied
    /// with an upper-case UUID finds its intent.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, ':');
        let operation = parts.next()?;
        let tenant = parts.next()?;
        let intent_id = parts.next()?;
        let kind = [EffectKind::Charge, EffectKind::Refund].into_iter().find(|k| k.as_str() == operation)?;
        if tenant.is_empty() || intent_id.is_empty() {
            return None;
        }
        let tenant = if is_uuid(tenant) { tenant.to_ascii_lowercase() } else { tenant.to_owned() };
        Some(Self::new(kind, &tenant, intent_id))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stream the intent's events live on.
    pub fn stream(&self) -> StreamId {
        StreamId(format!("intent:{}", self.0))
    }

    /// The tenant the key names.
    pub fn tenant(&self) -> &str {
        self.0.split(':').nth(1).expect("a key is built as operation:tenant:intent_id")
    }

    /// The name of the journal step that links a run to this intent (reserved or found): the
    /// run's replay asks for it at the same position.
    pub fn journal_step(&self) -> String {
        format!("intent:{}", self.0)
    }

    /// The intent a journal step named `name` links its run to; `None` for any other step.
    pub fn from_journal_step(name: &str) -> Option<Self> {
        name.strip_prefix("intent:").and_then(Self::parse)
    }

    /// SHA-256 of the key, for traces: a key names a tenant, so traces carry its hash only.
    pub fn hash(&self) -> String {
        crate::canonical::sha256_hex(self.0.as_bytes())
    }
}

impl fmt::Display for IntentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `text` is a UUID in its 8-4-4-4-12 hex form (either case).
pub fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A run id, chosen by whoever starts the run (the binary uses random UUIDs).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(String);

impl RunId {
    /// Wraps an id.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stream the run's events live on.
    pub fn stream(&self) -> StreamId {
        StreamId(format!("run:{}", self.0))
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The name of a signal a workflow waits for (`Context::wait_signal`) and an operator
/// delivers (`keel signal RUN_ID NAME`): 1 to [`crate::limits::SIGNAL_NAME_MAX_CHARS`] ASCII
/// letters, digits, `_`, `-` or `.`, so that it reads the same in a journal step's name
/// (`signal:NAME`), a command line and a log line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SignalName(String);

impl SignalName {
    /// Checks a name typed by an operator or written by a workflow.
    ///
    /// # Errors
    ///
    /// What is wrong with it, in words.
    pub fn parse(text: &str) -> Result<Self, String> {
        let max = crate::limits::SIGNAL_NAME_MAX_CHARS;
        if text.is_empty() || text.chars().count() > max {
            return Err(format!("a signal name has 1 to {max} characters (got {})", text.chars().count()));
        }
        if let Some(bad) = text.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
            return Err(format!(
                "a signal name is ASCII letters, digits, '_', '-' and '.' only (found {bad:?} in {text:?})"
            ));
        }
        Ok(Self(text.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an operator writes with a decision — their name (`--by`), why (`--reason`, an
/// `--override` reason, the API's `reason`): recorded in the log for whoever audits it later,
/// so never empty nor blank. Every door (the CLI's commands, the HTTP API, the console) checks
/// it with [`OperatorText::parse`], so each refuses the same text with the same words, before
/// anything is opened or written. The text is kept as typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorText(String);

/// An operator's text that says nothing: empty, or white space only.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: required, and not blank")]
pub struct BlankText {
    /// The field or flag, as the door names it (`reason`, `--by`).
    pub field: String,
}

impl OperatorText {
    /// Checks `text`, given in `field` (named as the door names it, for the error).
    ///
    /// ```
    /// use engine::event::OperatorText;
    /// assert_eq!(OperatorText::parse("--by", "ana").map(|t| t.as_str().to_owned()), Ok("ana".to_owned()));
    /// assert_eq!(OperatorText::parse("reason", " \t").unwrap_err().to_string(), "reason: required, and not blank");
    /// ```
    ///
    /// # Errors
    ///
    /// [`BlankText`] for an empty or white-space-only text.
    pub fn parse(field: &str, text: &str) -> Result<Self, BlankText> {
        if text.trim().is_empty() {
            return Err(BlankText { field: field.to_owned() });
        }
        Ok(Self(text.to_owned()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// The stream an event belongs to: `intent:<key>` or `run:<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamId(String);

impl StreamId {
    /// Wraps a stream id read back from storage.
    pub fn from_stored(id: String) -> Self {
        Self(id)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who or what caused an event: every event names one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// `command:<name>` for a CLI or API command, `operator:<name>` for a human,
    /// `recovery` for start-up recovery, `run` for a workflow's own progress.
    pub actor: String,
    /// The run on whose behalf the event was written, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// The global sequence of the event that caused this one, set when it is sealed (see
    /// [`crate::append::seal`]): a run's first event has none; an intent's reservation was
    /// caused by its run's latest event (the journal step or the agent's tool call); every
    /// other event by the latest event of its own stream. `keel trace` builds a run's causal
    /// tree from these links. Absent from events written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
}

impl Cause {
    /// An event written by a command (`keel charge`, `keel reconcile`, …).
    pub fn command(name: &str) -> Self {
        Self { actor: format!("command:{name}"), run_id: None, parent: None }
    }

    /// An event written by a named human operator.
    pub fn operator(name: &str) -> Self {
        Self { actor: format!("operator:{name}"), run_id: None, parent: None }
    }

    /// An event written by start-up recovery.
    pub fn recovery() -> Self {
        Self { actor: "recovery".to_owned(), run_id: None, parent: None }
    }

    /// The same cause, acting for `run`.
    pub fn for_run(mut self, run: &RunId) -> Self {
        self.run_id = Some(run.clone());
        self
    }
}

/// How a validated intent came to be validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The provider confirmed the attempt.
    Provider,
    /// A lookup (or an operator with evidence) proved the effect after an unknown outcome.
    Reconciled,
}

/// What a lookup found, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupStatus {
    /// The effect exists and matches the intent.
    Found,
    /// The provider says the effect does not exist.
    Absent,
    /// The lookup could not be answered.
    Unavailable,
    /// The provider answered something that contradicts the intent (wrong amount, kind…).
    Inconsistent,
    /// The process died during the lookup (recorded by recovery).
    Interrupted,
}

impl LookupStatus {
    /// Stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::Absent => "absent",
            Self::Unavailable => "unavailable",
            Self::Inconsistent => "inconsistent",
            Self::Interrupted => "interrupted",
        }
    }
}

/// What Keel decided after a lookup. Recorded, so replay never re-decides with a new clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "next", rename_all = "snake_case")]
pub enum AfterLookup {
    /// The effect is proven: an `IntentValidated` (reconciled) follows in the same commit.
    Validated,
    /// Absence is proven past the consistency window: the next attempt may go, same key.
    ResendAllowed,
    /// Still unknown: look again at `reconcile_after`.
    RetryAt {
        /// When the next reconciliation is due.
        reconcile_after: DateTime<Utc>,
    },
    /// No further automatic step: an `IntentEscalated` follows in the same commit.
    Escalated,
}

/// How an operator's manual resolution was checked against the provider, as recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum ResolutionCheck {
    /// Recorded before Keel checked resolutions (logs older than the field): nothing is known.
    /// Never written: it is what an `IntentResolved` without `check` decodes to.
    #[default]
    Unrecorded,
    /// The provider's lookup agrees: the effect it holds is the one named, or it holds none
    /// past the window in which a lookup may still miss one.
    Confirmed,
    /// The provider could not check it (no lookup in its tier, or an absence too early to be
    /// proof): the operator's word alone.
    Unverified {
        /// Why it could not be checked.
        detail: String,
    },
    /// The provider contradicted the operator (or its lookup could not answer), who recorded
    /// the answer anyway.
    Overridden {
        /// What the provider said.
        provider_says: String,
        /// The operator's reason for overriding it.
        reason: String,
    },
}

impl ResolutionCheck {
    /// Whether this is the default of logs older than the field (not written back).
    pub fn is_unrecorded(&self) -> bool {
        *self == Self::Unrecorded
    }

    /// How the intent's note shows it: nothing for old logs, ` (confirmed by the provider)`…
    pub fn annotation(&self) -> String {
        match self {
            Self::Unrecorded => String::new(),
            Self::Confirmed => " (confirmed by the provider)".to_owned(),
            Self::Unverified { detail } => format!(" (unverified: {detail})"),
            Self::Overridden { provider_says, reason } => {
                format!(" (overriding the provider, which says {provider_says}, because {reason})")
            }
        }
    }
}

/// Why Keel released an intent without an effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ReleaseReason {
    /// The agent run that reserved it stopped before sending it; nobody else can.
    RunEnded {
        /// How the run ended.
        status: RunStatus,
    },
    /// Its effect was proven absent after the agent run that reserved it had ended.
    AbsentAfterRunEnded,
    /// The run acting for it had too little time left to send it and reconcile it before
    /// its deadline (`limits::reconciliation_reserve_ms`): it was never sent.
    DeadlineReserve {
        /// Time the run had left.
        left_ms: u64,
        /// Time an attempt needs: the provider's request timeout plus the reconciliation
        /// backoff.
        needed_ms: u64,
    },
}

impl fmt::Display for ReleaseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RunEnded { status } => {
                write!(f, "its agent run stopped ({}) before sending it; nothing will", status.as_str())
            }
            Self::AbsentAfterRunEnded => f.write_str("proven absent after its agent run ended; nothing will send it"),
            Self::DeadlineReserve { left_ms, needed_ms } => write!(
                f,
                "its run had {left_ms} ms left before its deadline, fewer than the {needed_ms} ms an attempt needs \
                 (the provider's request timeout plus the reconciliation backoff); it was never sent"
            ),
        }
    }
}

/// A definitive answer that arrived after its attempt stopped being awaited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum LateAnswer {
    /// The provider confirmed the effect.
    Succeeded {
        /// Its evidence.
        evidence: Evidence,
    },
    /// The provider definitively refused it.
    Declined {
        /// The provider's code.
        code: String,
    },
}

/// What a late answer meant for its intent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum LateVerdict {
    /// It settles an intent that was still open (unknown, reconciling, proven absent…).
    Settled,
    /// It agrees with what the intent already says.
    Consistent,
    /// It contradicts the intent (an effect Keel recorded as absent, a second receipt for
    /// one key, another amount): the intent escalates to an operator.
    Contradicted {
        /// What disagrees.
        detail: String,
    },
}

/// The versions a run ran under, recorded in its `RunStarted` so metrics can be segmented
/// by them (seed 004: `release.version`, `prompt.version`, `policy.version`, `model`). Each
/// is `None` when the starter has none (a workflow run calls no model and has no prompt).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunVersions {
    /// `release.version`: the build that started the run (the package version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// `prompt.version`: the fingerprint of the agent's instructions and request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// `policy.version`: the version of the policy the run was checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// `model`: the model that answered (`scripted` for a replayed transcript).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The release this process names, when its operator named one ([`RunVersions::name_release`]).
static RELEASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

impl RunVersions {
    /// This process's release and nothing else: what a workflow run records. The release the
    /// operator named ([`RunVersions::name_release`]), else this build's version.
    pub fn this_release() -> Self {
        let release = RELEASE.get().cloned().unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
        Self { release: Some(release), ..Self::default() }
    }

    /// Names this process's release (the binary reads it from `KEEL_RELEASE`: a deployment's
    /// own name for what it runs), recorded as `release.version` by every run it starts from
    /// then on, so metrics can be segmented and drift found by release. Set once, before any
    /// run starts; a later call changes nothing.
    pub fn name_release(release: String) {
        let _ = RELEASE.set(release);
    }

    /// Whether nothing is known (a row written before versions were recorded).
    pub fn is_unknown(&self) -> bool {
        *self == Self::default()
    }
}

/// Limits a run starts with. Part of `RunStarted`, so a restart never refills them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLimits {
    /// Money the run may move, in minor units (reserved at reservation). Every run Keel starts
    /// now records one (`RUN_COST_DEFAULT_MINOR` when nothing tighter is named); `None`,
    /// unbounded, is only read back from runs recorded before that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_minor_max: Option<i64>,
    /// Attempts per intent (the first one included).
    pub attempts_per_intent_max: u32,
    /// Reconciliations per intent before it escalates.
    pub reconciliations_per_intent_max: u32,
    /// Amount above which a human must approve an effect. `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_threshold_minor: Option<i64>,
    /// The operator's policy these limits were decided under (version and hash). Absent in
    /// runs recorded before policies, and in runs a library caller started without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::policy::PolicyStamp>,
    /// Network retries the run may make, across its intents (attempts started again after one
    /// proven never sent). Absent in older runs: `limits::NETWORK_RETRIES_PER_RUN_MAX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_retries_max: Option<u32>,
    /// Automatic reconciliations the run's intents may make together; past it an intent whose
    /// outcome is still unknown escalates, naming this budget. Absent in older runs: only the
    /// per-intent bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciliations_max: Option<u32>,
}

impl Default for RunLimits {
    /// The default money budget, no approval threshold, and the default attempts and
    /// reconciliations of [`crate::limits`].
    fn default() -> Self {
        Self {
            cost_minor_max: Some(crate::limits::RUN_COST_DEFAULT_MINOR),
            attempts_per_intent_max: crate::limits::ATTEMPTS_PER_INTENT_DEFAULT,
            reconciliations_per_intent_max: crate::limits::RECONCILIATIONS_PER_INTENT_DEFAULT,
            approval_threshold_minor: None,
            policy: None,
            network_retries_max: Some(crate::limits::NETWORK_RETRIES_PER_RUN_MAX),
            reconciliations_max: Some(crate::limits::RECONCILIATIONS_PER_RUN_DEFAULT),
        }
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The host's completion condition holds.
    Completed,
    /// A proposal was rejected before any effect (invalid, policy, mismatch, budget…).
    Rejected,
    /// The provider definitively refused the effect.
    Declined,
    /// An effect is still ambiguous.
    OutcomeUnknown,
    /// An intent needs an operator.
    Escalated,
    /// Cancelled by an operator or the caller.
    Cancelled,
    /// The absolute deadline passed.
    DeadlineExceeded,
    /// Money budget spent.
    CostBudget,
    /// Replayed code asked for a different step than the one recorded.
    NondeterministicReplay,
    /// The workflow failed with an internal error.
    Failed,
    /// An agent stopped and the host's completion condition does not hold.
    Incomplete,
    /// An agent proposed a tool whose capability the run was not granted.
    PermissionDenied,
    /// An agent repeated a call past its repetition budget.
    RepeatedCall,
    /// An agent spent its tool-call budget.
    ToolBudget,
    /// An agent spent its model-call budget.
    ModelBudget,
    /// An agent spent its input or output token budget.
    TokenBudget,
    /// An agent spent its schema-correction budget.
    SchemaBudget,
    /// An agent made too many turns without progress.
    NoProgress,
    /// An agent's output was cut by the token limit.
    Truncated,
    /// An agent's model provider could not answer.
    ProviderUnavailable,
    /// An agent's model answered more than Keel keeps (a size bound named in the detail).
    AnswerTooLarge,
    /// An agent asked for more sub-agents than its delegation budget allows.
    DelegationBudget,
}

impl RunStatus {
    /// Every status, in declaration order.
    pub const ALL: [RunStatus; 22] = [
        Self::Completed,
        Self::Rejected,
        Self::Declined,
        Self::OutcomeUnknown,
        Self::Escalated,
        Self::Cancelled,
        Self::DeadlineExceeded,
        Self::CostBudget,
        Self::NondeterministicReplay,
        Self::Failed,
        Self::Incomplete,
        Self::PermissionDenied,
        Self::RepeatedCall,
        Self::ToolBudget,
        Self::ModelBudget,
        Self::TokenBudget,
        Self::SchemaBudget,
        Self::NoProgress,
        Self::Truncated,
        Self::ProviderUnavailable,
        Self::AnswerTooLarge,
        Self::DelegationBudget,
    ];

    /// The status named `name` (its [`RunStatus::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }

    /// Stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Rejected => "rejected",
            Self::Declined => "declined",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Escalated => "escalated",
            Self::Cancelled => "cancelled",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::CostBudget => "cost_budget",
            Self::NondeterministicReplay => "nondeterministic_replay",
            Self::Failed => "failed",
            Self::Incomplete => "incomplete",
            Self::PermissionDenied => "permission_denied",
            Self::RepeatedCall => "repeated_call",
            Self::ToolBudget => "tool_budget",
            Self::ModelBudget => "model_budget",
            Self::TokenBudget => "token_budget",
            Self::SchemaBudget => "schema_budget",
            Self::NoProgress => "no_progress",
            Self::Truncated => "truncated",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::AnswerTooLarge => "answer_too_large",
            Self::DelegationBudget => "delegation_budget",
        }
    }
}

/// The definition of an intent, as reserved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentDefinition {
    /// The intent key.
    pub key: IntentKey,
    /// Charge or refund.
    pub kind: EffectKind,
    /// The tenant (part of the key).
    pub tenant: String,
    /// The caller's intent id (part of the key).
    pub intent_id: String,
    /// The order the effect is for.
    pub order_id: String,
    /// The business reference a second key may not use while this intent is pending.
    pub business_ref: String,
    /// Lowercase hex SHA-256 of the canonical effect-defining payload.
    pub fingerprint: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The effect-defining payload, secrets replaced by their hashes.
    pub payload: Value,
    /// The agent tool whose call proposed the intent (its `tool.name`), when an agent's did; a
    /// workflow's intent names none. Not part of the fingerprint (added after release: absent
    /// from older rows, and not written when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// Every fact Keel records. Variant names are the stored `type`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    /// A run started, with its limits and absolute deadline.
    RunStarted {
        /// The run.
        run_id: RunId,
        /// The workflow's registered name.
        workflow: String,
        /// The workflow input, secrets replaced by their hashes.
        input: Value,
        /// Absolute UTC deadline fixed at start.
        deadline_at: DateTime<Utc>,
        /// The run's limits.
        limits: RunLimits,
        /// The versions the run ran under, to segment metrics by (added after release:
        /// absent from older rows, and not written when every one is unknown).
        #[serde(default, skip_serializing_if = "RunVersions::is_unknown")]
        versions: RunVersions,
    },
    /// A run waited for a human (outside its working time): its deadline moved by the time
    /// waited.
    RunDeadlineExtended {
        /// The run.
        run_id: RunId,
        /// The new absolute deadline (never earlier than the previous one).
        deadline_at: DateTime<Utc>,
    },
    /// A journaled step produced its output (replay returns it instead of re-running).
    StepRecorded {
        /// The run.
        run_id: RunId,
        /// Position in the run's journal, from 0.
        position: u32,
        /// The step's name; replay must ask for the same name at the same position.
        name: String,
        /// The recorded output.
        output: Value,
    },
    /// A durable timer started; replay waits until `fire_at` instead of a fresh delay.
    TimerStarted {
        /// The run.
        run_id: RunId,
        /// Position in the run's journal.
        position: u32,
        /// When the timer fires.
        fire_at: DateTime<Utc>,
    },
    /// A signal (an approval, an operator decision) was delivered to a run.
    SignalDelivered {
        /// The run.
        run_id: RunId,
        /// The signal's name.
        name: String,
        /// Its payload.
        payload: Value,
    },
    /// A run ended.
    RunFinished {
        /// The run.
        run_id: RunId,
        /// How.
        status: RunStatus,
        /// Human detail.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// What the run spent on models, in minor units, as its harness counted it (added
        /// after release; absent from older rows, from runs that call no model, and from an
        /// agent run whose cost is unknown — an answer from a model without a price).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_minor: Option<i64>,
    },
    /// An intent was reserved: key + fingerprint + money, atomically.
    IntentReserved {
        /// What the intent is.
        intent: IntentDefinition,
        /// The run that reserved it (its money budget holds the amount).
        run_id: RunId,
        /// The provider's declared capability, fixed for the intent's life.
        capability: Capability,
        /// Attempts allowed, the first one included.
        attempts_max: u32,
        /// Reconciliations allowed before escalation.
        reconciliations_max: u32,
        /// Whether a human must approve before the first attempt.
        approval_required: bool,
        /// The operator's policy this reservation was decided under, when it is not the one
        /// its run started under (recorded in `RunStarted`'s limits): a run resumed after the
        /// operator installed a new policy is held to both, the stricter of each limit
        /// winning. Absent: the run's own policy (and in every row written before this field).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<crate::policy::PolicyStamp>,
        /// The operator's policy that lowered the effect-class default for this intent's
        /// operation (`irreversible_without_approval`): an agent's irreversible tool that names
        /// no approval policy of its own would have waited for a human, and this policy let it
        /// run without one (the run's approval threshold still applied). Absent: nothing was
        /// lowered (and in every row written before this field).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_lowered_by: Option<crate::policy::PolicyStamp>,
    },
    /// The same key and fingerprint were proposed again; the stored outcome was returned.
    IntentDeduplicated {
        /// The intent.
        key: IntentKey,
        /// The run that proposed it again.
        run_id: RunId,
    },
    /// The same key and fingerprint were proposed again by another run while the intent could
    /// not take a new attempt from it — an attempt went out and its effect is not proven (in
    /// flight, unknown, reconciling, escalated), or the intent ended without one (declined,
    /// cancelled, rejected): no request was sent, the proposer is told where the intent stands.
    /// A resend refused: seed 004's "retries prevented" counts it.
    ResendRefused {
        /// The intent.
        key: IntentKey,
        /// The run that proposed it again.
        run_id: RunId,
    },
    /// A human approved the intent, bound to its fingerprint, until `expires_at`.
    ApprovalGranted {
        /// The intent.
        key: IntentKey,
        /// The fingerprint approved; dispatch checks it again.
        fingerprint: String,
        /// The approver.
        by: String,
        /// After this instant the approval releases nothing.
        expires_at: DateTime<Utc>,
    },
    /// A human denied the intent: it ends rejected, money released.
    ApprovalDenied {
        /// The intent.
        key: IntentKey,
        /// The approver.
        by: String,
        /// Why.
        reason: String,
    },
    /// Write-ahead: attempt `attempt` is about to be sent. Durable before the provider call.
    AttemptStarted {
        /// The intent.
        key: IntentKey,
        /// 1, 2, …
        attempt: u32,
        /// The run driving it.
        run_id: RunId,
    },
    /// The attempt was proven never sent: no effect, the intent may try again.
    AttemptNotSent {
        /// The intent.
        key: IntentKey,
        /// Which attempt.
        attempt: u32,
        /// What stopped it.
        detail: String,
    },
    /// The effect is proven.
    IntentValidated {
        /// The intent.
        key: IntentKey,
        /// The attempt that made it, when known.
        attempt: u32,
        /// How it was proven.
        source: Source,
        /// The proof.
        evidence: Evidence,
    },
    /// The provider definitively refused: no effect, money released.
    IntentDeclined {
        /// The intent.
        key: IntentKey,
        /// Which attempt.
        attempt: u32,
        /// The provider's code.
        code: String,
    },
    /// The attempt's outcome is unknown: reconcile before acting again.
    OutcomeUnknown {
        /// The intent.
        key: IntentKey,
        /// Which attempt.
        attempt: u32,
        /// Why the answer is missing.
        reason: UnknownReason,
        /// Human detail.
        detail: String,
        /// When the first reconciliation is due; `None` when the tier forbids any (escalation
        /// follows in the same commit).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reconcile_after: Option<DateTime<Utc>>,
    },
    /// A reconciliation lookup is about to be made.
    ReconciliationStarted {
        /// The intent.
        key: IntentKey,
        /// 1, 2, …
        reconciliation: u32,
        /// The run on whose behalf the lookup is made (its lease holder makes it). Absent in
        /// logs written before leases: the intent's own run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_id: Option<RunId>,
    },
    /// A reconciliation lookup answered, and what Keel decided.
    ReconciliationResolved {
        /// The intent.
        key: IntentKey,
        /// Which reconciliation.
        reconciliation: u32,
        /// What the lookup said.
        status: LookupStatus,
        /// The evidence when found.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evidence: Option<Evidence>,
        /// Detail for the log.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
        /// The decision.
        after: AfterLookup,
    },
    /// No automatic step is left: an operator must resolve the intent.
    IntentEscalated {
        /// The intent.
        key: IntentKey,
        /// Why (reconciliations spent, key window over, provider without keys or lookup…).
        reason: String,
        /// Whether the effect is proven absent (then its money is released).
        absence_proven: bool,
    },
    /// The approval expired before dispatch: the intent waits for a new one.
    ApprovalExpired {
        /// The intent.
        key: IntentKey,
    },
    /// An operator cancelled the intent before any attempt was in flight or unknown.
    IntentCancelled {
        /// The intent.
        key: IntentKey,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
    },
    /// One fact of an agent run's journal, on the run's stream: the harness's own event,
    /// opaque to the spine, which only checks its position in the run. What a batch means for
    /// the run (its end, an approval window, a deadline moved) the harness asks in the same
    /// commit, and the spine records it as its own events.
    AgentRecorded {
        /// The run.
        run_id: RunId,
        /// The agent fact, as the harness serialises it (`{"type": …, …}`).
        event: Value,
    },
    /// The run waiting on this intent's approval opened its approval window: an approval is
    /// refused once it closes, and the intent is then released.
    ApprovalRequested {
        /// The intent.
        key: IntentKey,
        /// When the window closes.
        closes_at: DateTime<Utc>,
    },
    /// Keel released an intent that was never sent (or proven absent) and that nothing will
    /// send any more: no effect, its money and its order reference freed.
    IntentReleased {
        /// The intent.
        key: IntentKey,
        /// Why nothing will send it.
        reason: ReleaseReason,
    },
    /// Nobody re-submitted a charge that waited for its caller (ready for its next attempt,
    /// no payment method at hand) within the abandonment window, and it has no effect: it was
    /// never sent, or its effect is proven absent. Rejected `abandoned`; its money and its
    /// order reference freed.
    IntentAbandoned {
        /// The intent.
        key: IntentKey,
        /// Since when it waited: its latest attempt's send, or its run's start if never sent.
        waiting_since: DateTime<Utc>,
        /// The window it was given, in ms.
        window_ms: u64,
        /// Whether no attempt of it ever reached the provider (otherwise its absence was
        /// proven by a lookup).
        never_sent: bool,
    },
    /// A definitive provider answer arrived for an attempt Keel no longer awaited — its
    /// worker was presumed dead, or its lease was taken — and was kept as evidence. What it
    /// did to the intent is `verdict`; a settling or contradicting answer is followed, in the
    /// same commit, by the `IntentValidated`, `IntentDeclined` or `IntentEscalated` it implies.
    LateAnswerRecorded {
        /// The intent.
        key: IntentKey,
        /// The attempt the answer is for.
        attempt: u32,
        /// What the provider said.
        answer: LateAnswer,
        /// What it means for the intent.
        verdict: LateVerdict,
    },
    /// An operator asked a run to stop: it stops `cancelled` at its next guard (the next
    /// reservation, attempt, journal step or agent fact it would write is refused, and the run
    /// records its end instead). What it holds is left where it stands: an attempt in flight is
    /// reconciled as usual, never abandoned.
    RunCancelRequested {
        /// The run.
        run_id: RunId,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
    },
    /// A batch of controlled facts (seed 001) was admitted for a conversation, whole: new
    /// keys and corrections, and the keys evicted to stay within five. On the conversation's
    /// own stream (`facts:<id>`).
    FactsAdmitted {
        /// The conversation.
        conversation: ConversationId,
        /// The conversation's ticket the batch was admitted under (its turn is the facts').
        ticket: Ticket,
        /// The facts admitted, with their evidence.
        facts: Vec<Fact>,
        /// Keys evicted (oldest turn first, ties by key).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        evicted: Vec<String>,
    },
    /// A conversation's facts were forgotten: one key, or all of them. A new epoch starts, so
    /// no update taken before it is admitted.
    FactsForgotten {
        /// The conversation.
        conversation: ConversationId,
        /// The ticket the forget was decided under.
        ticket: Ticket,
        /// The key forgotten; absent: every fact.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// An operator resolved an unknown or escalated intent by hand.
    IntentResolved {
        /// The intent.
        key: IntentKey,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
        /// The provider reference proving the effect, or `None` for "proven absent".
        #[serde(default, skip_serializing_if = "Option::is_none")]
        landed: Option<String>,
        /// How the resolution was checked against the provider (absent in older logs).
        #[serde(default, skip_serializing_if = "ResolutionCheck::is_unrecorded")]
        check: ResolutionCheck,
    },
}

impl Event {
    /// The stored `type` name of this event.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "RunStarted",
            Self::RunDeadlineExtended { .. } => "RunDeadlineExtended",
            Self::ApprovalRequested { .. } => "ApprovalRequested",
            Self::IntentReleased { .. } => "IntentReleased",
            Self::IntentAbandoned { .. } => "IntentAbandoned",
            Self::StepRecorded { .. } => "StepRecorded",
            Self::TimerStarted { .. } => "TimerStarted",
            Self::SignalDelivered { .. } => "SignalDelivered",
            Self::RunFinished { .. } => "RunFinished",
            Self::IntentReserved { .. } => "IntentReserved",
            Self::IntentDeduplicated { .. } => "IntentDeduplicated",
            Self::ResendRefused { .. } => "ResendRefused",
            Self::ApprovalGranted { .. } => "ApprovalGranted",
            Self::ApprovalDenied { .. } => "ApprovalDenied",
            Self::AttemptStarted { .. } => "AttemptStarted",
            Self::AttemptNotSent { .. } => "AttemptNotSent",
            Self::IntentValidated { .. } => "IntentValidated",
            Self::IntentDeclined { .. } => "IntentDeclined",
            Self::OutcomeUnknown { .. } => "OutcomeUnknown",
            Self::ReconciliationStarted { .. } => "ReconciliationStarted",
            Self::ReconciliationResolved { .. } => "ReconciliationResolved",
            Self::IntentEscalated { .. } => "IntentEscalated",
            Self::ApprovalExpired { .. } => "ApprovalExpired",
            Self::IntentCancelled { .. } => "IntentCancelled",
            Self::IntentResolved { .. } => "IntentResolved",
            Self::LateAnswerRecorded { .. } => "LateAnswerRecorded",
            Self::AgentRecorded { .. } => "AgentRecorded",
            Self::RunCancelRequested { .. } => "RunCancelRequested",
            Self::FactsAdmitted { .. } => "FactsAdmitted",
            Self::FactsForgotten { .. } => "FactsForgotten",
        }
    }

    /// The stream this event belongs on.
    pub fn stream(&self) -> StreamId {
        if let Some(conversation) = self.conversation() {
            return conversation.stream();
        }
        match (self.subject(), self.intent_key()) {
            (_, Some(key)) => key.stream(),
            (Some(run_id), None) => run_id.stream(),
            (None, None) => unreachable!("every event is about an intent, a run or a conversation"),
        }
    }

    /// The conversation this event is about, when it is a facts event.
    pub fn conversation(&self) -> Option<&ConversationId> {
        match self {
            Self::FactsAdmitted { conversation, .. } | Self::FactsForgotten { conversation, .. } => Some(conversation),
            _ => None,
        }
    }

    /// The intent this event is about, when it is on an intent's stream.
    pub fn intent_key(&self) -> Option<&IntentKey> {
        match self {
            Self::IntentReserved { intent, .. } => Some(&intent.key),
            Self::IntentDeduplicated { key, .. }
            | Self::ResendRefused { key, .. }
            | Self::ApprovalGranted { key, .. }
            | Self::ApprovalDenied { key, .. }
            | Self::AttemptStarted { key, .. }
            | Self::AttemptNotSent { key, .. }
            | Self::IntentValidated { key, .. }
            | Self::IntentDeclined { key, .. }
            | Self::OutcomeUnknown { key, .. }
            | Self::ReconciliationStarted { key, .. }
            | Self::ReconciliationResolved { key, .. }
            | Self::IntentEscalated { key, .. }
            | Self::ApprovalExpired { key, .. }
            | Self::IntentCancelled { key, .. }
            | Self::IntentResolved { key, .. }
            | Self::LateAnswerRecorded { key, .. }
            | Self::ApprovalRequested { key, .. }
            | Self::IntentReleased { key, .. }
            | Self::IntentAbandoned { key, .. } => Some(key),
            Self::RunStarted { .. }
            | Self::RunDeadlineExtended { .. }
            | Self::StepRecorded { .. }
            | Self::TimerStarted { .. }
            | Self::SignalDelivered { .. }
            | Self::RunFinished { .. }
            | Self::RunCancelRequested { .. }
            | Self::AgentRecorded { .. }
            | Self::FactsAdmitted { .. }
            | Self::FactsForgotten { .. } => None,
        }
    }

    /// The run this event is on, when it is on a run's stream.
    pub fn subject(&self) -> Option<&RunId> {
        match self {
            Self::RunStarted { run_id, .. }
            | Self::RunDeadlineExtended { run_id, .. }
            | Self::StepRecorded { run_id, .. }
            | Self::TimerStarted { run_id, .. }
            | Self::SignalDelivered { run_id, .. }
            | Self::RunFinished { run_id, .. }
            | Self::RunCancelRequested { run_id, .. }
            | Self::AgentRecorded { run_id, .. } => Some(run_id),
            _ => None,
        }
    }

    /// The JSON payload stored for this event (its fields, without the `type` tag).
    pub fn payload(&self) -> Value {
        let mut value = serde_json::to_value(self).expect("events serialize: every field is plain data");
        if let Value::Object(map) = &mut value {
            map.remove("type");
        }
        value
    }

    /// Rebuilds an event from its stored type and payload.
    pub fn from_stored(type_name: &str, payload: &Value) -> Result<Self, serde_json::Error> {
        let mut tagged = payload.clone();
        if let Value::Object(map) = &mut tagged {
            map.insert("type".to_owned(), Value::String(type_name.to_owned()));
        }
        serde_json::from_value(tagged)
    }
}

/// An event as stored: position in the global log and in its stream, time, cause, hashes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Global sequence, from 1, gap-free.
    pub seq: u64,
    /// The stream.
    pub stream: StreamId,
    /// Sequence within the stream, from 1, gap-free.
    pub stream_seq: u64,
    /// When the store appended it (stamped from the injected clock).
    pub at: DateTime<Utc>,
    /// Who or what caused it.
    pub cause: Cause,
    /// The fact.
    pub event: Event,
    /// Hash of the previous event (64 zeros for the first).
    pub prev_hash: String,
    /// SHA-256 over `prev_hash` and this event's canonical content.
    pub hash: String,
}

/// The hash of the chain before the first event.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The chained hash of one event: SHA-256 over the previous hash and the canonical JSON of
/// (seq, stream, stream_seq, at, type, cause, payload). Both the store (on append) and
/// `verify` (on replay) call this one function.
pub fn chain_hash(
    prev_hash: &str,
    seq: u64,
    stream: &StreamId,
    stream_seq: u64,
    at: DateTime<Utc>,
    cause: &Cause,
    event: &Event,
) -> String {
    let content = serde_json::json!({
        "prev": prev_hash,
        "seq": seq,
        "stream": stream.as_str(),
        "stream_seq": stream_seq,
        "at": at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "type": event.type_name(),
        "cause": cause,
        "payload": event.payload(),
    });
    crate::canonical::fingerprint(&content)
}
