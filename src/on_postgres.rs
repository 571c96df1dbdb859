//! The commands that run on a PostgreSQL log (`--store postgres://…`): charge, refund,
//! resume, reconcile, worker, intents (not `--stuck`), show, the operator's decisions
//! (resolve, approve, deny, cancel), runs, run show, verify, bench and soak (with its hidden
//! soak-worker).
//!
//! Owns the dispatch of a parsed command when the log is in PostgreSQL: each supported
//! command opens a `PgLog` (or a `PgReader`) and runs the same `ops`, `worker` and `harness`
//! code the SQLite path runs. It must never fall back to SQLite: every other command, and a
//! vault key (the vault is SQLite's for now), is a usage error naming what does run here. Nor
//! may it start what only a command that does not run here could end: a refund waiting on a
//! signal is refused too.

use crate::backend::PgUrl;
use crate::output::{Failure, Outcome, Output};
use crate::wiring::{self, Node};
use crate::{Cli, Command, harness, ops, policy_rules, refund_input, required_provider, worker};
use anyhow::Context as _;
use engine::event::{IntentKey, RunId};
use engine::ledger::Intent;
use engine::provider::{BoxFuture, EffectKind};
use std::sync::Arc;
use store_postgres::PgLog;

/// The commands that run on PostgreSQL today, as the usage error lists them.
pub const SUPPORTED: &str = "charge, refund, resume, reconcile, worker, intents, show, resolve, approve, deny, cancel, \
                             runs, run show, verify, bench and soak";

/// Why an agent run found on PostgreSQL is left as it is.
pub const AGENT_RUNS_ON_SQLITE_ONLY: &str = "agent runs run on SQLite only for now: nothing was done for it";

/// Runs `cli`'s command on the PostgreSQL log at `url`.
pub async fn dispatch(cli: Cli, url: &PgUrl, out: &Output) -> Outcome {
    if crate::vault::key().is_some() {
        return Err(Failure::Usage(format!(
            "the payment-method vault is SQLite-only for now: drop the vault key (KEEL_VAULT_KEY, --vault-key-file) \
             to use --store {url}"
        )));
    }
    let before = cli.before;
    let provider_of = |store: Option<&crate::StoreFlags>, provider: Option<&crate::ProviderFlags>| {
        wiring::init_lease_ttl(before.lease_ttl_ms(store));
        before.provider(provider)
    };
    match cli.command {
        Command::Charge { effect, payment_method_token, limits, store, provider } => {
            let provider = provider_of(Some(&store), Some(&provider));
            required_provider(&provider, "charge")?;
            let input = ops::effect_input(&effect, payment_method_token.as_deref()).map_err(Failure::Usage)?;
            let (rules, stamp) = policy_rules(&cli.policy, EffectKind::Charge, &input, &limits)?;
            let node = node(url, &provider, Some(rules.clone()))?;
            ops::run_effect(&node, out, "charge", &input, &limits, (&rules, stamp)).await
        }
        Command::Refund { effect, hold, limits, store, provider } => {
            let provider = provider_of(Some(&store), Some(&provider));
            required_provider(&provider, "refund")?;
            let input = refund_input(&effect, hold)?;
            refuse_a_wait_only_sqlite_ends(&input)?;
            let (rules, stamp) = policy_rules(&cli.policy, EffectKind::Refund, &input, &limits)?;
            let node = node(url, &provider, Some(rules.clone()))?;
            ops::run_effect(&node, out, "refund", &input, &limits, (&rules, stamp)).await
        }
        Command::Reconcile { key, due, create, store, provider } => {
            let key = key.as_deref().map(ops::parse_key).transpose()?;
            let provider = provider_of(Some(&store), Some(&provider));
            required_provider(&provider, "reconcile")?;
            existing_log(url, create)?;
            ops::reconcile(&node(url, &provider, None)?, out, key.as_ref(), due).await
        }
        Command::Resume { create, store, provider } => {
            let provider = provider_of(Some(&store), Some(&provider));
            required_provider(&provider, "resume")?;
            let policy = cli.policy.in_force()?;
            existing_log(url, create)?;
            let mut node = node(url, &provider, None)?;
            node.executor = node.executor.clone().with_policy(policy);
            ops::resume_postgres(&node, out).await
        }
        Command::Worker { concurrency, poll_ms, health_ms, grace_ms, once, create, store, provider } => {
            let provider = provider_of(Some(&store), Some(&provider));
            required_provider(&provider, "worker")?;
            existing_log(url, create)?;
            let settings = worker::Settings::from_flags(concurrency, poll_ms, health_ms, grace_ms, once);
            let policy = cli.policy.in_force()?;
            let node = node(url, &provider, None)?;
            let executor = node.executor.clone().with_policy(policy);
            let worker = worker::Worker::new(executor, Arc::new(SqliteOnlyAgents), settings);
            let outcome = worker.run(out, worker::stop()).await;
            node.shutdown()?;
            outcome
        }
        Command::Show { key, create } => {
            let key = ops::parse_key(&key)?;
            wiring::postgres_blocking(|| ops::show_postgres(&mut reader(url, create)?, out, &key))
        }
        Command::Intents { stuck: true, .. } => Err(Failure::Usage(
            "intents --stuck does not run on PostgreSQL yet (it reads the vault, which is SQLite's); \
             `keel intents --state escalated` and `--state awaiting_approval` list what waits for a human"
                .to_owned(),
        )),
        Command::Intents { state, create, .. } => {
            let state = ops::parse_state(state.as_deref())?;
            wiring::postgres_blocking(|| ops::list_intents_postgres(&mut reader(url, create)?, out, state))
        }
        Command::Cancel { key, decided: crate::Decided { by, reason }, create, store } => {
            let key = ops::parse_key(&key)?;
            provider_of(Some(&store), None);
            existing_log(url, create)?;
            ops::operator(|| decision_log(url), agent_run_in(url), out, key, ops::OperatorAsk::Cancel { by, reason })
                .await
        }
        Command::Approve { key, by, fingerprint, ttl_ms, create, store } => {
            let key = ops::parse_key(&key)?;
            provider_of(Some(&store), None);
            existing_log(url, create)?;
            ops::operator(
                || decision_log(url),
                agent_run_in(url),
                out,
                key,
                ops::OperatorAsk::Approve { by, ttl_ms, fingerprint },
            )
            .await
        }
        Command::Deny { key, decided: crate::Decided { by, reason }, create, store } => {
            let key = ops::parse_key(&key)?;
            provider_of(Some(&store), None);
            existing_log(url, create)?;
            ops::operator(|| decision_log(url), agent_run_in(url), out, key, ops::OperatorAsk::Deny { by, reason })
                .await
        }
        Command::Resolve {
            key,
            landed,
            absent: _,
            override_reason,
            decided: crate::Decided { by, reason },
            create,
            store,
            provider,
        } => {
            let key = ops::parse_key(&key)?;
            let provider = provider_of(Some(&store), Some(&provider));
            existing_log(url, create)?;
            let decision = ops::Resolution { landed, by, reason, override_reason };
            let intent_of = |key: &IntentKey| -> Result<Option<Intent>, Failure> {
                wiring::postgres_blocking(|| Ok(reader(url, create)?.intent(key)?))
            };
            ops::resolve(|| decision_log(url), intent_of, &provider, out, &key, decision).await
        }
        Command::Runs { status, workflow, since, create } => {
            let filter = crate::runs::filter(status.as_deref(), workflow, since.as_deref())?;
            wiring::postgres_blocking(|| crate::runs::list_postgres(&mut reader(url, create)?, out, &filter))
        }
        Command::Run { command: crate::RunCommand::Show { run_id, create } } => {
            let run_id = RunId::new(run_id);
            wiring::postgres_blocking(|| crate::runs::show_postgres(&mut reader(url, create)?, out, &run_id))
        }
        Command::Verify { create } => {
            wiring::postgres_blocking(|| ops::verify_postgres(&mut reader(url, create)?, out))
        }
        Command::Bench { intents, concurrency, keep, first, durability, processes, in_place, provider } => {
            let processes = usize::try_from(processes).expect("--processes is at most 64");
            let provider = crate::bench_provider(&before, &provider);
            let args = harness::bench::Args { intents, concurrency, keep, first, processes, in_place, provider };
            let location = crate::backend::Location::Postgres(url.clone());
            Ok(harness::bench::run(out, &location, wiring::durability(&durability), args).await?)
        }
        Command::Soak { kills, seed, dir, keep, vault } => {
            Ok(harness::soak::run(out, Some(url), harness::soak::Args { kills, seed, dir, keep, vault }).await?)
        }
        Command::SoakWorker { seed, round } => {
            let provider = provider_of(None, None);
            Ok(harness::soak::worker(&node(url, &provider, None)?, seed, round).await?)
        }
        _ => Err(Failure::Usage(format!(
            "this command does not run on PostgreSQL yet (the ones that do: {SUPPORTED}); give it a SQLite log: \
             --store sqlite:PATH or --db PATH"
        ))),
    }
}

/// Refuses a refund that would wait on a signal (`--after-signal`, or `after_signal` in its
/// `--input`): only `keel signal` continues it and only `keel run cancel` ends it early, and
/// neither runs on PostgreSQL yet, so it would wait forever. A usage error before anything is
/// opened, read as the refund workflow reads its input. A `--delay-ms` timer is not refused:
/// `keel resume` and `keel worker`, which run here, continue it once it fires.
fn refuse_a_wait_only_sqlite_ends(input: &serde_json::Value) -> Result<(), Failure> {
    use engine::executor::Workflow as _;
    let prepared = workflows::refund::Refund::default().prepare(input);
    match prepared.ok().and_then(|prepared| prepared.input.after_signal) {
        None => Ok(()),
        Some(signal) => Err(Failure::Usage(format!(
            "refund --after-signal {signal} does not run on PostgreSQL yet: `keel signal`, which would continue \
             it, and `keel run cancel`, which would end it, do not run here, so the refund could never finish; \
             nothing was written. Give it a SQLite log (--store sqlite:PATH or --db PATH), or refund without \
             --after-signal"
        ))),
    }
}

/// A node over the PostgreSQL log at `url`, reaching the provider the flags name.
fn node(
    url: &PgUrl,
    provider: &crate::ProviderArgs,
    rules: Option<engine::policy::Rules>,
) -> anyhow::Result<Node<PgLog>> {
    Ok(Node::over(wiring::open_postgres(url, None)?, wiring::http_provider(provider)?, rules))
}

/// The log an operator's decision is recorded on: one writer connection, as one command is
/// all it sends.
fn decision_log(url: &PgUrl) -> anyhow::Result<PgLog> {
    wiring::open_postgres(url, Some(1))
}

/// Whether the run `run_id` of the PostgreSQL log at `url` is an agent's (`false` when it
/// cannot be read: the hint it chooses is the plain one).
fn agent_run_in(url: &PgUrl) -> impl FnOnce(&RunId) -> bool + '_ {
    move |run_id| {
        let run = wiring::postgres_blocking(|| {
            store_postgres::PgReader::open(&url.url()).ok().and_then(|mut reader| reader.run(run_id).ok().flatten())
        });
        run.is_some_and(|run| run.is_agent())
    }
}

/// Refuses a database that holds no Keel log unless `--create` asks for one, as a missing
/// SQLite file is refused: a read or a recovery never makes a log by accident.
fn existing_log(url: &PgUrl, create: crate::CreateFlag) -> Result<(), Failure> {
    if create.create {
        return Ok(());
    }
    let holds = wiring::postgres_blocking(|| {
        store_postgres::PgReader::holds_log(&url.url())
            .with_context(|| format!("cannot reach the PostgreSQL database at {} ({url})", url.server()))
    })?;
    if holds { Ok(()) } else { Err(Failure::MissingPostgresLog(url.to_string())) }
}

/// A reader on the PostgreSQL log at `url` (refused when it holds none, unless `create`), its
/// schema migrated first (one connection).
fn reader(url: &PgUrl, create: crate::CreateFlag) -> Result<store_postgres::PgReader, Failure> {
    existing_log(url, create)?;
    wiring::open_postgres(url, Some(1))?.shutdown();
    Ok(store_postgres::PgReader::open(&url.url())
        .with_context(|| format!("cannot read the event log in PostgreSQL at {} ({url})", url.server()))?)
}

/// The agent runs of a PostgreSQL log, as `keel worker` meets them: left as they are, saying
/// why (agent runs run on SQLite only for now).
struct SqliteOnlyAgents;

impl worker::AgentRuns for SqliteOnlyAgents {
    fn resume<'a>(&'a self, _run_id: &'a RunId) -> BoxFuture<'a, Result<Option<String>, Failure>> {
        Box::pin(async { Ok(Some(AGENT_RUNS_ON_SQLITE_ONLY.to_owned())) })
    }
}
