//! The operator's policy: what a caller may do, per tenant and per operation.
//!
//! Owns [`Document`] (the versioned file an operator writes, as it decodes: unknown fields
//! refused), [`Policy`] (that document checked and typed: bounded amounts, canonical
//! currencies, lower-case tenant UUIDs), [`Rules`] (what applies to one tenant's one
//! operation), [`Requested`] (a caller's per-invocation flags, which may tighten a rule and
//! never loosen it) and [`PolicyStamp`] (what a run records of the policy it was decided
//! under: its version and hash), [`InForce`] (the policy a process runs under) and
//! [`Governing`] (its rules for one intent, which a run resumed under a newer policy is held
//! to beside its own: the stricter of each limit wins).
//!
//! It never reads a file nor parses TOML (the binary does, and hashes the bytes it read), and
//! never decides an intent's transition (the workflows and the ledger enforce the rules it
//! resolves).
//!
//! # Resolution
//!
//! The most specific section wins, field by field: the built-in defaults of
//! [`crate::limits`], then `[defaults]`, then `[operations.OP]`, then `[tenants.T.defaults]`,
//! then `[tenants.T.operations.OP]`. Without a policy file the built-in policy applies,
//! recorded as version [`BUILTIN_VERSION`].
//!
//! ```
//! use engine::policy::{Document, Policy, Requested};
//! use engine::provider::EffectKind;
//! let document: Document = serde_json::from_value(serde_json::json!({
//!     "version": "2026-12-01",
//!     "defaults": {"max_amount_minor": 10000, "currencies": ["eur"]},
//! })).unwrap();
//! let door = |code: &str| engine::money::Currency::parse(code).map_err(|e| e.to_string());
//! let policy = Policy::from_document(document, &door).unwrap();
//! let rules = policy.rules("8f14e45f-ceea-467f-a0e6-1a2b3c4d5e6f", EffectKind::Charge);
//! assert_eq!(rules.max_amount_minor, 10000);
//! // A caller may lower the maximum, never raise it.
//! assert!(rules.tightened(&Requested { max_amount_minor: Some(500), ..Requested::default() }).is_ok());
//! assert!(rules.tightened(&Requested { max_amount_minor: Some(20000), ..Requested::default() }).is_err());
//! ```

use crate::event::is_uuid;
use crate::limits;
use crate::money::Currency;
use crate::provider::EffectKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The version a run records when no policy file was given.
pub const BUILTIN_VERSION: &str = "builtin";

/// One section of a policy file: every field optional, an absent one inherited from the
/// section above it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    /// Largest amount one effect may move, in minor units (`policy_denied` above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_amount_minor: Option<i64>,
    /// Amount above which a human must approve, in minor units (0: every effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_threshold_minor: Option<i64>,
    /// Money one run may move, in minor units (`budget_exhausted` above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_budget_minor: Option<i64>,
    /// Currencies allowed (`policy_denied` for another), ISO 4217 codes in any case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currencies: Option<Vec<String>>,
    /// `true` lowers the effect-class default for this operation: an agent's irreversible
    /// tool that names no approval policy of its own runs without a human (the approval
    /// threshold still applies), and its reservation records this policy's stamp. Absent or
    /// `false`: such a call waits for a human. Only an operation's section may set it
    /// (`[operations.OP]`, `[tenants.T.operations.OP]`): a lowering is explicit per operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irreversible_without_approval: Option<bool>,
}

/// Per-operation sections.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operations {
    /// `[…operations.charge]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<Section>,
    /// `[…operations.refund]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund: Option<Section>,
}

/// One tenant's sections.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSections {
    /// `[tenants.T.defaults]`.
    #[serde(default)]
    pub defaults: Section,
    /// `[tenants.T.operations.OP]`.
    #[serde(default)]
    pub operations: Operations,
}

/// A policy file as it decodes (TOML in the binary): unknown fields refused, nothing checked
/// yet. [`Policy::from_document`] checks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// The operator's name for this version of the policy, recorded on every run.
    pub version: String,
    /// `[defaults]`: what applies to every tenant and operation.
    #[serde(default)]
    pub defaults: Section,
    /// `[operations.OP]`.
    #[serde(default)]
    pub operations: Operations,
    /// `[tenants."UUID"…]`.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantSections>,
}

/// A section checked: amounts in range, currencies canonical.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Checked {
    max_amount_minor: Option<i64>,
    approval_threshold_minor: Option<i64>,
    run_budget_minor: Option<i64>,
    currencies: Option<BTreeSet<Currency>>,
    irreversible_without_approval: Option<bool>,
}

/// How a door reads a currency code (the workflows' `supported_currency`): the policy accepts
/// a code exactly when a charge or a refund would, with the same words for one it refuses.
pub type CurrencyDoor<'a> = &'a dyn Fn(&str) -> Result<Currency, String>;

impl Checked {
    fn of(section: &Section, path: &str, currency_door: CurrencyDoor<'_>) -> Result<Self, PolicyError> {
        let amount = |field: &str, value: Option<i64>, max: i64| match value {
            Some(v) if !(0..=max).contains(&v) => Err(PolicyError::OutOfRange {
                field: format!("{path}.{field}"),
                value: v.to_string(),
                range: format!("0..={max}"),
            }),
            other => Ok(other),
        };
        let currencies = match &section.currencies {
            None => None,
            Some(codes) => {
                let mut set = BTreeSet::new();
                for code in codes {
                    let currency = currency_door(code)
                        .map_err(|detail| PolicyError::Invalid { field: format!("{path}.currencies"), detail })?;
                    set.insert(currency);
                }
                Some(set)
            }
        };
        Ok(Self {
            max_amount_minor: amount("max_amount_minor", section.max_amount_minor, limits::AMOUNT_MINOR_MAX)?,
            approval_threshold_minor: amount(
                "approval_threshold_minor",
                section.approval_threshold_minor,
                limits::AMOUNT_MINOR_MAX,
            )?,
            run_budget_minor: amount("run_budget_minor", section.run_budget_minor, limits::AMOUNT_MINOR_MAX)?,
            currencies,
            irreversible_without_approval: section.irreversible_without_approval,
        })
    }

    /// `self`, with every field `over` sets taken from `over`.
    fn under(&self, over: &Self) -> Self {
        Self {
            max_amount_minor: over.max_amount_minor.or(self.max_amount_minor),
            approval_threshold_minor: over.approval_threshold_minor.or(self.approval_threshold_minor),
            run_budget_minor: over.run_budget_minor.or(self.run_budget_minor),
            currencies: over.currencies.clone().or_else(|| self.currencies.clone()),
            irreversible_without_approval: over.irreversible_without_approval.or(self.irreversible_without_approval),
        }
    }
}

/// The checked sections of one level (the file's or one tenant's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Level {
    defaults: Checked,
    charge: Checked,
    refund: Checked,
}

impl Level {
    fn of(
        defaults: &Section,
        operations: &Operations,
        path: &str,
        currency_door: CurrencyDoor<'_>,
    ) -> Result<Self, PolicyError> {
        let operation = |section: &Option<Section>, name: &str| {
            section
                .as_ref()
                .map_or(Ok(Checked::default()), |s| Checked::of(s, &format!("{path}operations.{name}"), currency_door))
        };
        if defaults.irreversible_without_approval.is_some() {
            return Err(PolicyError::Invalid {
                field: format!("{path}defaults.irreversible_without_approval"),
                detail: "an irreversible effect waits for a human unless one operation's section lowers it: set it \
                         under [operations.OP] or [tenants.T.operations.OP], not in defaults"
                    .to_owned(),
            });
        }
        Ok(Self {
            defaults: Checked::of(defaults, &format!("{path}defaults"), currency_door)?,
            charge: operation(&operations.charge, "charge")?,
            refund: operation(&operations.refund, "refund")?,
        })
    }

    fn operation(&self, kind: EffectKind) -> &Checked {
        match kind {
            EffectKind::Charge => &self.charge,
            EffectKind::Refund => &self.refund,
        }
    }
}

/// A policy, checked and typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    version: String,
    file: Level,
    tenants: BTreeMap<String, Level>,
}

impl Policy {
    /// The built-in policy: the defaults of [`crate::limits`], every currency the workflows
    /// accept, no approval threshold, no operation's irreversible effects lowered (they wait
    /// for a human).
    pub fn builtin() -> Self {
        Self { version: BUILTIN_VERSION.to_owned(), file: Level::default(), tenants: BTreeMap::new() }
    }

    /// Checks a decoded document as the doors would check the values it names: a version of
    /// 1 to [`limits::POLICY_VERSION_MAX_CHARS`] visible ASCII characters (and not
    /// `builtin`), amounts and budgets within `0..=AMOUNT_MINOR_MAX`, currencies the
    /// `currency_door` accepts (the one a charge's input goes through), tenants that are UUIDs
    /// as a charge's `tenant_id` must be (one section each, in any case), at most
    /// [`limits::POLICY_TENANTS_MAX`] of them, and for every tenant and operation an approval
    /// threshold no higher than the maximum amount (an approval that could never be asked).
    ///
    /// # Errors
    ///
    /// The first problem, naming its field and its value.
    pub fn from_document(document: Document, currency_door: CurrencyDoor<'_>) -> Result<Self, PolicyError> {
        let version = document.version.trim();
        let visible = version.bytes().all(|b| b.is_ascii_graphic());
        if version.is_empty() || version.len() > limits::POLICY_VERSION_MAX_CHARS || !visible {
            return Err(PolicyError::Invalid {
                field: "version".to_owned(),
                detail: format!(
                    "must be 1 to {} visible ASCII characters (got {:?})",
                    limits::POLICY_VERSION_MAX_CHARS,
                    document.version
                ),
            });
        }
        if version == BUILTIN_VERSION {
            return Err(PolicyError::Invalid {
                field: "version".to_owned(),
                detail: format!("{BUILTIN_VERSION:?} names the built-in policy; give the file its own version"),
            });
        }
        if document.tenants.len() > limits::POLICY_TENANTS_MAX {
            return Err(PolicyError::OutOfRange {
                field: "tenants".to_owned(),
                value: document.tenants.len().to_string(),
                range: format!("at most {} tenants", limits::POLICY_TENANTS_MAX),
            });
        }
        let file = Level::of(&document.defaults, &document.operations, "", currency_door)?;
        let mut tenants = BTreeMap::new();
        for (tenant, sections) in &document.tenants {
            if !is_uuid(tenant) {
                return Err(PolicyError::Invalid {
                    field: format!("tenants.{tenant:?}"),
                    detail: "a tenant is a UUID (8-4-4-4-12 hex digits)".to_owned(),
                });
            }
            let level =
                Level::of(&sections.defaults, &sections.operations, &format!("tenants.{tenant:?}."), currency_door)?;
            if tenants.insert(tenant.to_ascii_lowercase(), level).is_some() {
                return Err(PolicyError::Invalid {
                    field: format!("tenants.{tenant:?}"),
                    detail: "the same tenant has two sections (tenants are UUIDs, in any case)".to_owned(),
                });
            }
        }
        let policy = Self { version: version.to_owned(), file, tenants };
        policy.check_thresholds(&document)?;
        Ok(policy)
    }

    /// Refuses an approval threshold above the maximum amount, for any tenant's any
    /// operation as the sections resolve: no effect could reach it, so the operator's
    /// intent (a human approves large effects) would silently never apply.
    fn check_thresholds(&self, document: &Document) -> Result<(), PolicyError> {
        let scopes = std::iter::once((String::new(), None))
            .chain(document.tenants.keys().map(|tenant| (format!("tenants.{tenant:?}."), Some(tenant.as_str()))));
        for (path, tenant) in scopes {
            for kind in [EffectKind::Charge, EffectKind::Refund] {
                let rules = self.rules(tenant.unwrap_or_default(), kind);
                if let Some(threshold) = rules.approval_threshold_minor.filter(|t| *t > rules.max_amount_minor) {
                    return Err(PolicyError::Invalid {
                        field: format!("{path}operations.{}.approval_threshold_minor", kind.as_str()),
                        detail: format!(
                            "{threshold} is above the max_amount_minor of {} that applies there: the approval \
                             could never be asked",
                            rules.max_amount_minor
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The policy's version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// What applies to `tenant`'s `kind` of effect (a tenant is matched in any case).
    pub fn rules(&self, tenant: &str, kind: EffectKind) -> Rules {
        let mut checked = self.file.defaults.under(self.file.operation(kind));
        if let Some(level) = self.tenants.get(&tenant.to_ascii_lowercase()) {
            checked = checked.under(&level.defaults).under(level.operation(kind));
        }
        Rules {
            max_amount_minor: checked.max_amount_minor.unwrap_or(limits::EFFECT_AMOUNT_DEFAULT_MAX_MINOR),
            approval_threshold_minor: checked.approval_threshold_minor,
            run_budget_minor: checked.run_budget_minor.unwrap_or(limits::RUN_COST_DEFAULT_MINOR),
            currencies: checked.currencies,
            irreversible_without_approval: checked.irreversible_without_approval.unwrap_or(false),
        }
    }
}

/// What the policy allows one tenant's one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Largest amount of one effect, minor units.
    pub max_amount_minor: i64,
    /// Amount above which a human approves (`None`: no approval required by the policy).
    pub approval_threshold_minor: Option<i64>,
    /// Money one run may move, minor units.
    pub run_budget_minor: i64,
    /// Currencies allowed (`None`: every currency the workflows accept).
    pub currencies: Option<BTreeSet<Currency>>,
    /// The operator lowered the effect-class default for this operation: an irreversible
    /// effect whose tool names no approval policy runs without a human (`false`: it waits).
    pub irreversible_without_approval: bool,
}

/// A caller's per-invocation flags: each may only tighten its rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requested {
    /// `--max-charge-minor`.
    pub max_amount_minor: Option<i64>,
    /// `--approval-threshold-minor`.
    pub approval_threshold_minor: Option<i64>,
    /// `--cost-budget-minor`.
    pub run_budget_minor: Option<i64>,
}

impl Rules {
    /// The rules with the caller's tighter values.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Loosens`] for a flag above what the policy allows (a higher maximum or
    /// budget, a higher approval threshold): a caller cannot loosen the operator's policy.
    pub fn tightened(&self, requested: &Requested) -> Result<Self, PolicyError> {
        let mut rules = self.clone();
        let loosens = |flag: &'static str, asked: i64, allowed: String| PolicyError::Loosens { flag, asked, allowed };
        if let Some(asked) = requested.max_amount_minor {
            if asked > self.max_amount_minor {
                return Err(loosens("--max-charge-minor", asked, self.max_amount_minor.to_string()));
            }
            rules.max_amount_minor = asked;
        }
        if let Some(asked) = requested.run_budget_minor {
            if asked > self.run_budget_minor {
                return Err(loosens("--cost-budget-minor", asked, self.run_budget_minor.to_string()));
            }
            rules.run_budget_minor = asked;
        }
        if let Some(asked) = requested.approval_threshold_minor {
            if let Some(threshold) = self.approval_threshold_minor
                && asked > threshold
            {
                return Err(loosens("--approval-threshold-minor", asked, threshold.to_string()));
            }
            rules.approval_threshold_minor = Some(asked);
        }
        Ok(rules)
    }

    /// Why an effect of `amount_minor` in `currency` is outside these rules, if it is.
    pub fn denies(&self, amount_minor: i64, currency: &str) -> Option<String> {
        if amount_minor > self.max_amount_minor {
            return Some(format!(
                "amount_minor {amount_minor} is above the policy's maximum of {}",
                self.max_amount_minor
            ));
        }
        let allowed = self.currencies.as_ref()?;
        if allowed.iter().any(|c| c.as_str() == currency) {
            return None;
        }
        let names: Vec<&str> = allowed.iter().map(Currency::as_str).collect();
        Some(format!("currency {currency} is not allowed by the policy (allowed: {})", names.join(", ")))
    }
}

/// The operator's policy in force in this process, with its stamp: what a run started under
/// another policy is held to as well when it is resumed here (see [`Governing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InForce {
    /// The checked policy.
    pub policy: Policy,
    /// Its version and hash.
    pub stamp: PolicyStamp,
}

impl InForce {
    /// What this policy sets for one intent of `tenant`'s `kind`.
    pub fn governing(&self, tenant: &str, kind: EffectKind) -> Governing {
        Governing { rules: self.policy.rules(tenant, kind), stamp: self.stamp.clone(), approval_lowered: false }
    }
}

/// The rules the policy in force sets for one intent, with that policy's stamp. For a run
/// started under another policy (a refund that waited on a signal while the operator
/// installed a new one), the ledger holds the reservation to these rules AND to the run's own
/// (the stricter of each limit wins, never the looser) and records this stamp on it. For a
/// run started under this very policy they add nothing, and nothing more is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Governing {
    /// The rules for the intent's tenant and operation.
    pub rules: Rules,
    /// The policy they come from.
    pub stamp: PolicyStamp,
    /// This policy lowered the reservation's approval: its caller's effect class asked for a
    /// human (an agent's irreversible tool that names no approval policy) and the rules set
    /// `irreversible_without_approval`, so the caller asked for none. The reservation records
    /// the stamp as `approval_lowered_by`, whether or not the run started under this policy.
    pub approval_lowered: bool,
}

impl Governing {
    /// The same rules, recorded as having lowered the reservation's approval (see
    /// [`Governing::approval_lowered`]).
    pub fn lowering_approval(self) -> Self {
        Self { approval_lowered: true, ..self }
    }
}

/// The stricter of two approval thresholds (`None`: no approval required by that side): the
/// lower one, and any threshold over none.
pub fn stricter_threshold(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (one, other) => one.or(other),
    }
}

/// What a run records of the policy it was decided under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyStamp {
    /// The policy's version (`builtin` without a policy file).
    pub version: String,
    /// Lowercase hex SHA-256 of the policy file's bytes (of the built-in policy's canonical
    /// JSON rendering without one): `sha256sum keel.toml` gives the same digest.
    pub sha256: String,
}

impl PolicyStamp {
    /// The stamp of a policy read from a file's bytes.
    pub fn of_file(policy: &Policy, bytes: &[u8]) -> Self {
        Self { version: policy.version.clone(), sha256: crate::canonical::sha256_hex(bytes) }
    }

    /// The stamp of the built-in policy: its rules as canonical JSON, hashed.
    pub fn builtin() -> Self {
        let rules = serde_json::json!({
            "max_amount_minor": limits::EFFECT_AMOUNT_DEFAULT_MAX_MINOR,
            "run_budget_minor": limits::RUN_COST_DEFAULT_MINOR,
        });
        Self { version: BUILTIN_VERSION.to_owned(), sha256: crate::canonical::fingerprint(&rules) }
    }
}

/// Why a policy, or a caller's flag against it, was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A field whose value is not allowed.
    #[error("{field}: {detail}")]
    Invalid {
        /// The field, as a dotted path in the file.
        field: String,
        /// Why.
        detail: String,
    },
    /// A number outside its range.
    #[error("{field} = {value} is out of range ({range})")]
    OutOfRange {
        /// The field, as a dotted path in the file.
        field: String,
        /// The value refused.
        value: String,
        /// The range accepted.
        range: String,
    },
    /// A caller's flag would loosen the operator's policy.
    #[error(
        "{flag} {asked} would loosen the operator's policy, which allows at most {allowed}: a flag may only tighten it"
    )]
    Loosens {
        /// The flag.
        flag: &'static str,
        /// What the caller asked.
        asked: i64,
        /// What the policy allows.
        allowed: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T1: &str = "8f14e45f-ceea-467f-a0e6-1a2b3c4d5e6f";
    const T2: &str = "00000000-0000-4000-8000-000000000002";

    fn policy(document: serde_json::Value) -> Result<Policy, PolicyError> {
        let door = |code: &str| match Currency::parse(code) {
            Ok(currency) if ["EUR", "USD", "XOF"].contains(&currency.as_str()) => Ok(currency),
            _ => Err(format!("unsupported currency {code:?}")),
        };
        Policy::from_document(serde_json::from_value(document).expect("the document decodes"), &door)
    }

    #[test]
    fn the_most_specific_section_wins_field_by_field() {
        let p = policy(json!({
            "version": "v7",
            "defaults": {"max_amount_minor": 1000, "run_budget_minor": 5000, "currencies": ["EUR", "usd"]},
            "operations": {"refund": {"approval_threshold_minor": 0}},
            "tenants": {T1.to_ascii_uppercase(): {
                "defaults": {"max_amount_minor": 300},
                "operations": {"charge": {"currencies": ["XOF"]}},
            }},
        }))
        .expect("a valid policy");
        let other = p.rules(T2, EffectKind::Charge);
        assert_eq!(
            (other.max_amount_minor, other.run_budget_minor, other.approval_threshold_minor),
            (1000, 5000, None)
        );
        assert_eq!(other.denies(500, "USD"), None);
        assert!(other.denies(500, "XOF").is_some_and(|why| why.contains("EUR, USD")));
        assert_eq!(p.rules(T2, EffectKind::Refund).approval_threshold_minor, Some(0));
        let mine = p.rules(T1, EffectKind::Charge);
        assert_eq!((mine.max_amount_minor, mine.run_budget_minor), (300, 5000));
        assert!(mine.denies(100, "EUR").is_some(), "the tenant's charge section allows XOF only");
        assert_eq!(mine.denies(100, "XOF"), None);
        assert!(mine.denies(301, "XOF").is_some_and(|why| why.contains("300")));
        assert_eq!(p.rules(T1, EffectKind::Refund).approval_threshold_minor, Some(0));
    }

    #[test]
    fn an_operation_lowers_its_irreversible_effects_explicitly_and_a_tenant_may_raise_them_back() {
        let p = policy(json!({
            "version": "v1",
            "operations": {"refund": {"irreversible_without_approval": true}},
            "tenants": {T1: {"operations": {"refund": {"irreversible_without_approval": false}}}},
        }))
        .expect("a valid policy");
        assert!(p.rules(T2, EffectKind::Refund).irreversible_without_approval);
        assert!(!p.rules(T2, EffectKind::Charge).irreversible_without_approval, "only the operation named");
        assert!(!p.rules(T1, EffectKind::Refund).irreversible_without_approval, "the tenant's section wins");
        assert!(!Policy::builtin().rules(T2, EffectKind::Refund).irreversible_without_approval);
    }

    #[test]
    fn the_builtin_policy_is_bounded() {
        let rules = Policy::builtin().rules(T1, EffectKind::Charge);
        assert_eq!(rules.max_amount_minor, limits::EFFECT_AMOUNT_DEFAULT_MAX_MINOR);
        assert_eq!(rules.run_budget_minor, limits::RUN_COST_DEFAULT_MINOR);
        assert_eq!(PolicyStamp::builtin().version, BUILTIN_VERSION);
    }

    #[test]
    fn a_flag_tightens_and_never_loosens() {
        let rules = policy(json!({"version": "v1", "defaults": {
            "max_amount_minor": 1000, "run_budget_minor": 5000, "approval_threshold_minor": 200}}))
        .expect("valid")
        .rules(T1, EffectKind::Charge);
        let tight =
            Requested { max_amount_minor: Some(10), approval_threshold_minor: Some(5), run_budget_minor: Some(50) };
        let tightened = rules.tightened(&tight).expect("tighter is allowed");
        assert_eq!(
            (tightened.max_amount_minor, tightened.approval_threshold_minor, tightened.run_budget_minor),
            (10, Some(5), 50)
        );
        for (requested, flag) in [
            (Requested { max_amount_minor: Some(1001), ..Requested::default() }, "--max-charge-minor"),
            (Requested { run_budget_minor: Some(5001), ..Requested::default() }, "--cost-budget-minor"),
            (Requested { approval_threshold_minor: Some(201), ..Requested::default() }, "--approval-threshold-minor"),
        ] {
            let refused = rules.tightened(&requested).expect_err("looser is refused");
            assert!(matches!(&refused, PolicyError::Loosens { flag: f, .. } if *f == flag), "{refused}");
        }
        // Equal is not looser.
        assert!(rules.tightened(&Requested { max_amount_minor: Some(1000), ..Requested::default() }).is_ok());
    }

    #[test]
    fn a_bad_document_names_its_field() {
        for (document, field) in [
            (json!({"version": ""}), "version"),
            (json!({"version": "builtin"}), "version"),
            (json!({"version": "a b"}), "version"),
            (json!({"version": "v", "defaults": {"max_amount_minor": -1}}), "defaults.max_amount_minor"),
            (
                json!({"version": "v", "operations": {"charge": {"run_budget_minor": limits::AMOUNT_MINOR_MAX + 1}}}),
                "operations.charge.run_budget_minor",
            ),
            (json!({"version": "v", "defaults": {"currencies": ["EURO"]}}), "defaults.currencies"),
            (
                json!({"version": "v", "defaults": {"currencies": ["zzz"]}}),
                "defaults.currencies: unsupported currency \"zzz\"",
            ),
            (
                json!({"version": "v", "defaults": {"max_amount_minor": 100}, "operations": {"refund": {"approval_threshold_minor": 101}}}),
                "operations.refund.approval_threshold_minor: 101 is above the max_amount_minor of 100",
            ),
            (
                json!({"version": "v", "tenants": {T1: {"operations": {"charge": {"max_amount_minor": 5}}}}, "defaults": {"approval_threshold_minor": 10}}),
                "operations.charge.approval_threshold_minor: 10",
            ),
            (json!({"version": "v", "tenants": {"acme": {}}}), "tenants"),
            (json!({"version": "v", "tenants": {T1: {}, T1.to_ascii_uppercase(): {}}}), "tenants"),
            (
                json!({"version": "v", "tenants": {T1: {"defaults": {"approval_threshold_minor": -5}}}}),
                "approval_threshold_minor",
            ),
            (
                json!({"version": "v", "defaults": {"irreversible_without_approval": true}}),
                "defaults.irreversible_without_approval: an irreversible effect waits for a human unless one \
                 operation's section lowers it",
            ),
            (
                json!({"version": "v", "tenants": {T1: {"defaults": {"irreversible_without_approval": false}}}}),
                "defaults.irreversible_without_approval",
            ),
        ] {
            let refused = policy(document.clone()).expect_err("refused");
            assert!(refused.to_string().contains(field), "{document}: {refused}");
        }
        for unknown in [
            json!({"version": "v", "max_amount": 1}),
            json!({"version": "v", "defaults": {"max_amount": 1}}),
            json!({"version": "v", "operations": {"payout": {}}}),
            json!({"version": "v", "tenants": {T1: {"max_amount_minor": 1}}}),
            json!({"version": "v", "operations": {"refund": {"irreversible_without_approval": "yes"}}}),
            json!({"version": "v", "operations": {"refund": {"irreversible_without_approval": 1}}}),
        ] {
            assert!(serde_json::from_value::<Document>(unknown.clone()).is_err(), "{unknown} is refused");
        }
    }
}
