//! Loading the operator's policy file, and resolving it for one invocation.
//!
//! Owns where the policy comes from — `--policy FILE` (or `KEEL_POLICY`), else `keel.toml` in
//! the working directory when there is one, else the built-in policy — and turning its bytes
//! into an `engine::policy::Policy` with its stamp (version and SHA-256 of the bytes read).
//! Every refusal is a message naming the file and the line or field, which `main` reports as a
//! usage error (exit 64) before anything is written. A command that resumes runs holds them
//! to the policy it loads as well as to their own ([`PolicyArgs::in_force`]). It never
//! decides what the rules mean (`engine::policy` does) nor enforces them (the workflows and
//! the ledger do).

use crate::LimitArgs;
use engine::event::RunLimits;
use engine::policy::{Document, InForce, Policy, PolicyStamp, Requested, Rules};
use engine::provider::EffectKind;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The file read when `--policy` is not given, in the working directory.
pub const DEFAULT_FILE: &str = "keel.toml";

/// Where the operator's policy comes from.
#[derive(clap::Args, Debug, Clone)]
pub struct PolicyArgs {
    /// The operator's policy (TOML): per-tenant and per-operation maximum amount, approval
    /// threshold, run money budget and allowed currencies. Default: ./keel.toml when it exists,
    /// else the built-in policy (version "builtin"). Every run records its version and hash;
    /// a flag may tighten it, never loosen it. See the README's "Policy" section.
    #[arg(long = "policy", global = true, env = "KEEL_POLICY", value_name = "FILE")]
    path: Option<PathBuf>,
}

/// A policy as loaded, with the stamp runs record.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The checked policy.
    pub policy: Policy,
    /// Its version and hash.
    pub stamp: PolicyStamp,
}

impl PolicyArgs {
    /// Loads the policy this invocation runs under.
    ///
    /// # Errors
    ///
    /// A message naming the file and what is wrong in it (line and column for TOML errors and
    /// unknown fields, the field's path for a value out of range).
    pub fn load(&self) -> Result<Loaded, String> {
        let path = match &self.path {
            Some(path) => path.clone(),
            None if Path::new(DEFAULT_FILE).exists() => PathBuf::from(DEFAULT_FILE),
            None => return Ok(Loaded { policy: Policy::builtin(), stamp: PolicyStamp::builtin() }),
        };
        let shown = path.display();
        let text = std::fs::File::open(&path)
            .and_then(|file| engine::limits::read_text_at_most(file, engine::limits::POLICY_FILE_MAX_BYTES))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::FileTooLarge => format!(
                    "policy {shown}: larger than {} bytes; a policy is a short file",
                    engine::limits::POLICY_FILE_MAX_BYTES
                ),
                _ => format!("policy {shown}: cannot read it: {e}"),
            })?;
        let document: Document =
            toml::from_str(&text).map_err(|e| format!("policy {shown}: {}", e.to_string().trim_end()))?;
        let policy = Policy::from_document(document, &workflows::input::supported_currency)
            .map_err(|e| format!("policy {shown}: {e}"))?;
        let stamp = PolicyStamp::of_file(&policy, text.as_bytes());
        Ok(Loaded { policy, stamp })
    }

    /// Loads the policy a command that resumes runs (`resume`, `worker`) holds them to, as a
    /// usage error when the file is refused (nothing is opened before).
    ///
    /// # Errors
    ///
    /// [`Failure::Usage`] with [`PolicyArgs::load`]'s message.
    pub fn in_force(&self) -> Result<InForce, crate::output::Failure> {
        self.load().map(Loaded::in_force).map_err(crate::output::Failure::Usage)
    }
}

impl Loaded {
    /// The policy as the executor holds it in force: a run resumed under it that started
    /// under another policy is held to both (the stricter of each limit).
    pub fn in_force(self) -> InForce {
        InForce { policy: self.policy, stamp: self.stamp }
    }

    /// The rules for one charge or refund: the policy's for the input's tenant and the
    /// operation, tightened by the caller's flags. An input without a valid tenant gets the
    /// policy's general rules (the workflow then rejects it `invalid_arguments`).
    ///
    /// # Errors
    ///
    /// The message for a flag that would loosen the policy.
    pub fn rules_for(&self, kind: EffectKind, input: &Value, flags: &LimitArgs) -> Result<Rules, String> {
        let tenant = workflows::input::tenant_of(input).unwrap_or_default();
        let requested = Requested {
            max_amount_minor: flags.max_charge_minor,
            approval_threshold_minor: flags.approval_threshold_minor,
            run_budget_minor: flags.cost_budget_minor,
        };
        self.policy
            .rules(&tenant, kind)
            .tightened(&requested)
            .map_err(|e| format!("{e} (policy version {}, sha256 {})", self.stamp.version, self.stamp.sha256))
    }
}

/// The limits a new charge or refund run starts with: the operator's rules for it (already
/// tightened by the caller's flags), the caller's counts, and the policy's stamp to record.
pub fn run_limits(flags: &LimitArgs, rules: &Rules, stamp: &PolicyStamp) -> RunLimits {
    RunLimits {
        cost_minor_max: Some(rules.run_budget_minor),
        attempts_per_intent_max: flags.max_attempts,
        reconciliations_per_intent_max: flags.max_reconciliations,
        approval_threshold_minor: rules.approval_threshold_minor,
        policy: Some(stamp.clone()),
        network_retries_max: Some(flags.max_network_retries),
        reconciliations_max: Some(flags.max_run_reconciliations),
    }
}
