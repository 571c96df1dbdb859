//! The tools of a run: their contracts, strict schemas, and bodies only the guard can reach.
//!
//! Owns [`Tool`] (a name, description, version, closed JSON schema, required capability,
//! effect class, approval policy, business invariants and a body over typed arguments) and
//! [`Registry`]. Registering compiles the schema with a real JSON-schema validator and
//! refuses a schema that is not closed to unknown properties.
//!
//! # The raw body is reachable only through the guard
//!
//! A [`Tool`]'s body is a private field with no accessor. Once registered, the only code
//! that can run it is [`Registry::invoke`] (the guard, `super::guard`), which the loop uses
//! too: there is no other path, whether a call comes from a model or from a test.

use super::budget::LimitsError;
use super::delegation::{DelegateArgs, Delegation};
use super::event::{CorrectionCode, ToolStamp};
use super::gate::{ApprovalAsk, EffectIntent, EffectOutcome, EffectTicket};
use super::model::ToolDescriptor;
use engine::canonical::{self, StrictJsonErrorKind};
use engine::limits;
use engine::provider::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

/// What a tool does to the world.
/// Ordered from the weakest to the strongest: a delegation's class is its tools' strongest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectClass {
    /// Reads only.
    Read,
    /// Changes state that can be changed back.
    Mutation,
    /// Changes state that cannot be taken back (a refund, a message sent).
    Irreversible,
}

/// When a human must approve a call (through the effect gate, bound to the fingerprint).
/// `Never` is the tool's own word only: an irreversible tool's class still asks a human
/// unless the operator's policy lowers it ([`ApprovalPolicy::ask`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Never.
    Never,
    /// Always.
    Always,
    /// When the intent's amount is above this many minor units.
    AboveMinor(i64),
}

impl ApprovalPolicy {
    /// What a call of a tool of class `effect` moving `amount_minor` asks of a human at
    /// reservation: this policy, except that an irreversible tool whose policy is `Never`
    /// asks what its effect class decides — a human, unless the operator's policy lowers it
    /// for the operation ([`ApprovalAsk::ByEffectClass`]). No tool registers its way out of
    /// it: the guard asks this for every effect call, whatever the tool's options say.
    pub fn ask(&self, effect: EffectClass, amount_minor: Option<i64>) -> ApprovalAsk {
        match (effect, self) {
            (EffectClass::Irreversible, Self::Never) => ApprovalAsk::ByEffectClass,
            _ if self.requires(amount_minor) => ApprovalAsk::Required,
            _ => ApprovalAsk::NotRequired,
        }
    }

    /// True when a call moving `amount_minor` needs approval by this policy alone.
    pub fn requires(&self, amount_minor: Option<i64>) -> bool {
        match self {
            Self::Never => false,
            Self::Always => true,
            Self::AboveMinor(threshold) => amount_minor.is_none_or(|amount| amount > *threshold),
        }
    }
}

/// A tool's contract.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// Name the model uses; one implementation and one type per run.
    pub name: String,
    /// What it does, when to use it, what it does not do.
    pub description: String,
    /// Version of the contract (schema + semantics).
    pub version: String,
    /// Strict JSON schema of the arguments, closed to unknown properties.
    pub schema: Value,
    /// Capability the run must be granted for the body to run.
    pub capability: String,
    /// What the tool does to the world.
    pub effect: EffectClass,
    /// When a human must approve, by the tool's own policy (an irreversible tool's class adds
    /// to `Never`: see [`ApprovalPolicy::ask`]).
    pub approval: ApprovalPolicy,
}

/// What the body is given besides its typed arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolContext {
    /// The call id.
    pub call_id: String,
    /// The reserved intent, for effect tools.
    pub effect: Option<EffectTicket>,
}

/// What a body returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    /// What the model reads.
    pub content: String,
    /// True when the call failed (the model reads an error result).
    pub is_error: bool,
    /// The result is new evidence or a state change.
    pub progress: bool,
    /// Where third-party text came from; `Some` marks the content as untrusted data.
    pub provenance: Option<String>,
    /// For effect tools: how the effect ended.
    pub effect: Option<EffectOutcome>,
}

impl ToolOutput {
    /// A successful result that made progress.
    pub fn ok(content: impl Into<String>) -> Self {
        Self { content: content.into(), is_error: false, progress: true, provenance: None, effect: None }
    }

    /// An error result the model may read and act on; no progress.
    pub fn error(content: impl Into<String>) -> Self {
        Self { content: content.into(), is_error: true, progress: false, provenance: None, effect: None }
    }

    /// Third-party text, marked untrusted and carrying its provenance.
    pub fn untrusted(provenance: impl Into<String>, content: impl Into<String>) -> Self {
        Self { provenance: Some(provenance.into()), ..Self::ok(content) }
    }

    /// Sets whether the result made progress.
    pub fn with_progress(mut self, progress: bool) -> Self {
        self.progress = progress;
        self
    }

    /// Attaches an effect outcome.
    pub fn with_effect(mut self, effect: EffectOutcome) -> Self {
        self.effect = Some(effect);
        self
    }
}

type Body<A> = Arc<dyn Fn(A, ToolContext) -> BoxFuture<'static, ToolOutput> + Send + Sync>;
type Invariant<A> = Box<dyn Fn(&A) -> Result<(), String> + Send + Sync>;
type IntentOf<A> = Box<dyn Fn(&A) -> EffectIntent + Send + Sync>;

/// A tool over typed arguments `A`. Its body is private: register it, then call it through
/// the guard.
pub struct Tool<A> {
    spec: ToolSpec,
    body: Body<A>,
    invariants: Vec<Invariant<A>>,
    intent: Option<IntentOf<A>>,
}

impl<A> Tool<A>
where
    A: DeserializeOwned + Serialize + Send + 'static,
{
    /// A tool with its contract and body.
    pub fn new<F, Fut>(spec: ToolSpec, body: F) -> Self
    where
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        let body: Body<A> = Arc::new(move |args, ctx| Box::pin(body(args, ctx)));
        Self { spec, body, invariants: Vec::new(), intent: None }
    }

    /// Adds a business invariant over the bound arguments; its error is an error result the
    /// model may read (guard step 5).
    pub fn invariant(mut self, check: impl Fn(&A) -> Result<(), String> + Send + Sync + 'static) -> Self {
        self.invariants.push(Box::new(check));
        self
    }

    /// Declares the intent an effect tool's call asks for (guard step 8). Required for
    /// `mutation` and `irreversible` tools and for any approval policy.
    pub fn intent(mut self, of: impl Fn(&A) -> EffectIntent + Send + Sync + 'static) -> Self {
        self.intent = Some(Box::new(of));
        self
    }

    /// The contract.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }
}

/// A call bound to its tool: canonical arguments, invariant verdict, intent and the work,
/// ready to run. Crate-private: only the guard holds one.
pub(crate) struct Prepared {
    pub(crate) canonical_args: String,
    pub(crate) invariant: Result<(), String>,
    pub(crate) intent: Option<EffectIntent>,
    pub(crate) work: Work,
}

/// What guard step 10 runs for a call.
pub(crate) enum Work {
    /// A tool's body.
    Body(Box<dyn FnOnce(ToolContext) -> BoxFuture<'static, ToolOutput> + Send>),
    /// A sub-agent's loop, asked `question`: the request its `AgentRunStarted` records.
    Delegate {
        /// What the model asks the sub-agent.
        question: String,
    },
}

type Binder = Box<dyn Fn(Value) -> Result<Prepared, String> + Send + Sync>;

pub(crate) struct Entry {
    pub(crate) spec: ToolSpec,
    validator: jsonschema::Validator,
    binder: Binder,
    /// The sub-agent, when the tool is a delegation.
    pub(crate) delegation: Option<Arc<Delegation>>,
}

/// Why a tool could not be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two tools with one name.
    #[error("a tool named {name} is already registered")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// A name the vendors refuse (`^[a-zA-Z0-9_-]{1,64}$`).
    #[error("tool name {name:?} must match ^[a-zA-Z0-9_-]{{1,64}}$")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// A schema (or sub-schema) that accepts unknown properties.
    #[error("schema of {name} is not closed at {path}: set \"additionalProperties\": false")]
    SchemaNotClosed {
        /// Tool name.
        name: String,
        /// JSON pointer of the open object schema.
        path: String,
    },
    /// A schema the validator cannot compile.
    #[error("schema of {name} is invalid: {detail}")]
    SchemaInvalid {
        /// Tool name.
        name: String,
        /// Validator message.
        detail: String,
    },
    /// An effect tool (or a tool needing approval) without an intent mapping.
    #[error("{name} has effects or needs approval but declares no intent")]
    MissingIntent {
        /// Tool name.
        name: String,
    },
    /// A delegation whose sub-agent has delegations of its own: a sub-agent delegates nothing.
    #[error("{name} delegates to a sub-agent with tools that delegate ({nested}); a sub-agent delegates nothing")]
    NestedDelegation {
        /// The delegation's name.
        name: String,
        /// The sub-agent's delegation tool.
        nested: String,
    },
    /// A delegation whose requested limits are out of range.
    #[error("the sub-agent of {name}: {source}")]
    DelegationLimits {
        /// The delegation's name.
        name: String,
        /// Why.
        source: LimitsError,
    },
}

/// The tools of one run, in registration order.
#[derive(Default)]
pub struct Registry {
    entries: Vec<Entry>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.entries.iter().map(|e| &e.spec.name)).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool after checking its contract.
    pub fn register<A>(&mut self, tool: Tool<A>) -> Result<(), RegistryError>
    where
        A: DeserializeOwned + Serialize + Send + 'static,
    {
        let Tool { spec, body, invariants, intent } = tool;
        let needs_intent = spec.effect != EffectClass::Read || spec.approval != ApprovalPolicy::Never;
        if needs_intent && intent.is_none() {
            return Err(RegistryError::MissingIntent { name: spec.name });
        }
        let binder: Binder = Box::new(move |value: Value| {
            let args: A = canonical::decode(value).map_err(|e| e.to_string())?;
            let typed = serde_json::to_value(&args).map_err(|e| e.to_string())?;
            let canonical_args = canonical::to_string(&typed);
            let invariant = invariants.iter().try_for_each(|check| check(&args));
            let intent = intent.as_ref().map(|of| of(&args));
            let body = Arc::clone(&body);
            Ok(Prepared { canonical_args, invariant, intent, work: Work::Body(Box::new(move |ctx| body(args, ctx))) })
        });
        self.insert(spec, binder, None)
    }

    /// Registers a sub-agent as a tool named `name` (see [`Delegation`]): the model asks it
    /// one `question`; its effect class is the strongest of its tools'. Refused when one of
    /// the sub-agent's tools delegates, or its limits are out of range.
    pub fn delegate(
        &mut self,
        name: &str,
        description: &str,
        capability: &str,
        delegation: Delegation,
    ) -> Result<(), RegistryError> {
        if let Some(nested) = delegation.registry.entries.iter().find(|e| e.delegation.is_some()) {
            return Err(RegistryError::NestedDelegation { name: name.to_owned(), nested: nested.spec.name.clone() });
        }
        delegation
            .limits
            .validate()
            .map_err(|source| RegistryError::DelegationLimits { name: name.to_owned(), source })?;
        let effect = delegation.registry.entries.iter().map(|e| e.spec.effect).max().unwrap_or(EffectClass::Read);
        let spec = ToolSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            version: delegation.version.clone(),
            schema: DelegateArgs::schema(),
            capability: capability.to_owned(),
            effect,
            approval: ApprovalPolicy::Never,
        };
        let binder: Binder = Box::new(|value: Value| {
            let args: DelegateArgs = canonical::decode(value).map_err(|e| e.to_string())?;
            let canonical_args = canonical::to_string(&serde_json::to_value(&args).map_err(|e| e.to_string())?);
            Ok(Prepared {
                canonical_args,
                invariant: Ok(()),
                intent: None,
                work: Work::Delegate { question: args.question },
            })
        });
        self.insert(spec, binder, Some(Arc::new(delegation)))
    }

    /// Checks a tool's name and schema, then adds it.
    fn insert(
        &mut self,
        spec: ToolSpec,
        binder: Binder,
        delegation: Option<Arc<Delegation>>,
    ) -> Result<(), RegistryError> {
        let name = spec.name.clone();
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(RegistryError::InvalidName { name });
        }
        if self.by_name.contains_key(&name) {
            return Err(RegistryError::Duplicate { name });
        }
        if spec.schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(RegistryError::SchemaNotClosed { name, path: "/type (must be \"object\")".into() });
        }
        check_closed(&spec.schema, "").map_err(|path| RegistryError::SchemaNotClosed { name: name.clone(), path })?;
        let validator = jsonschema::draft202012::new(&spec.schema)
            .map_err(|e| RegistryError::SchemaInvalid { name: name.clone(), detail: e.to_string() })?;
        self.by_name.insert(name, self.entries.len());
        self.entries.push(Entry { spec, validator, binder, delegation });
        Ok(())
    }

    /// The contract of `name`.
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.entry(name).map(|e| &e.spec)
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// What the model is told about every tool (all registered tools are visible; being
    /// visible grants nothing).
    pub fn descriptors(&self) -> Vec<ToolDescriptor> {
        self.entries
            .iter()
            .map(|e| ToolDescriptor {
                name: e.spec.name.clone(),
                description: e.spec.description.clone(),
                input_schema: e.spec.schema.clone(),
            })
            .collect()
    }

    /// The tools and versions a run starts with.
    pub fn stamps(&self) -> Vec<ToolStamp> {
        self.entries
            .iter()
            .map(|e| ToolStamp {
                name: e.spec.name.clone(),
                version: e.spec.version.clone(),
                schema_fingerprint: canonical::fingerprint(&e.spec.schema),
            })
            .collect()
    }
}

impl Entry {
    /// Guard step 4: parse the raw text (never guessing), normalise numbers canonically,
    /// validate against the strict schema, bind to the Rust type.
    pub(crate) fn bind(&self, raw: &str) -> Result<Prepared, (CorrectionCode, String)> {
        let name = &self.spec.name;
        if raw.len() > limits::AGENT_TOOL_ARGUMENTS_MAX_BYTES {
            return Err((
                CorrectionCode::InvalidArguments,
                format!(
                    "invalid arguments for {name}: {} bytes, more than the {} allowed.",
                    raw.len(),
                    limits::AGENT_TOOL_ARGUMENTS_MAX_BYTES
                ),
            ));
        }
        // The strict reader: a duplicate key (which one would bind?), a number that is not
        // exactly an integer yet reads as one (41.99999999999999999 is not 42) or too deep a
        // nesting is a correction the model may make, never a guess.
        let value: Value = match canonical::parse_strict(raw) {
            Ok(value) => value,
            Err(e) if e.kind == StrictJsonErrorKind::UnexpectedEnd => {
                return Err((
                    CorrectionCode::TruncatedArguments,
                    format!(
                        "protocol error for {name}: the arguments are cut before the end of their JSON; nothing was executed. Send the complete arguments."
                    ),
                ));
            }
            Err(e) if matches!(e.kind, StrictJsonErrorKind::Syntax(_)) => {
                return Err((
                    CorrectionCode::MalformedArguments,
                    format!("protocol error for {name}: the arguments are not valid JSON ({e}); nothing was executed."),
                ));
            }
            Err(e) => {
                return Err((
                    CorrectionCode::InvalidArguments,
                    format!("invalid arguments for {name}: {e}. Nothing was executed; send them again, exactly."),
                ));
            }
        };
        // Canonical numbers first, so that 42, 42.0 and 4.2e1 bind to the same integer and
        // give the same signature.
        let value: Value = serde_json::from_str(&canonical::to_string(&value))
            .expect("canonical JSON of a parsed value is valid JSON: canonical::to_string only writes JSON");
        if !self.validator.is_valid(&value) {
            let errors: Vec<String> = self
                .validator
                .iter_errors(&value)
                .take(limits::AGENT_SCHEMA_ERRORS_SHOWN_MAX)
                .map(|e| {
                    let path = e.instance_path.to_string();
                    if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
                })
                .collect();
            return Err((
                CorrectionCode::InvalidArguments,
                format!(
                    "invalid arguments for {name}: {}. Nothing was executed; correct the arguments to match the schema.",
                    errors.join("; ")
                ),
            ));
        }
        (self.binder)(value).map_err(|e| {
            (CorrectionCode::InvalidArguments, format!("invalid arguments for {name}: {e}. Nothing was executed."))
        })
    }
}

/// Returns the JSON pointer of the first object schema that does not set
/// `additionalProperties: false`.
fn check_closed(schema: &Value, path: &str) -> Result<(), String> {
    let Some(map) = schema.as_object() else {
        return Ok(());
    };
    let is_object = map.get("type").and_then(Value::as_str) == Some("object") || map.contains_key("properties");
    if is_object && map.get("additionalProperties") != Some(&Value::Bool(false)) {
        return Err(if path.is_empty() { "/".to_owned() } else { path.to_owned() });
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(children) = map.get(key).and_then(Value::as_object) {
            for (child, sub) in children {
                check_closed(sub, &format!("{path}/{key}/{child}"))?;
            }
        }
    }
    for key in ["items", "additionalItems", "not", "if", "then", "else"] {
        if let Some(sub) = map.get(key) {
            check_closed(sub, &format!("{path}/{key}"))?;
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(list) = map.get(key).and_then(Value::as_array) {
            for (i, sub) in list.iter().enumerate() {
                check_closed(sub, &format!("{path}/{key}/{i}"))?;
            }
        }
    }
    Ok(())
}
