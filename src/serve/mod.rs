//! `keel serve`: Keel as an authenticated HTTP API, for services in any language.
//!
//! Owns the long-lived process: one [`Node`] (one store, so the writer's group commit is
//! shared by every request, one provider client, one executor), the key table, readers for
//! the queries, recovery before `/readyz` says ready, and the graceful stop. The routes and
//! their handlers are in `api` (effects, intents, decisions) and `reads` (runs, traces,
//! metrics), the error shape in `error`, the body door in `body`, keys, roles and rates in
//! `auth`, the operator console in `console`.
//!
//! # Start
//!
//! The listener is bound first and `listening on http://ADDR` printed (port 0 picks a free
//! one); `/healthz` answers at once, and every `/v1` route and `/readyz` answer 503
//! `not_ready` until recovery (`Executor::recover_and_resume`: attempts left in flight by a
//! crash become `outcome_unknown`, unfinished runs are replayed, due reconciliations run) is
//! done.
//!
//! # Stop
//!
//! On SIGTERM or SIGINT the server stops accepting connections and lets the requests in
//! flight finish (each at most `SHUTDOWN_GRACE_MS` after the signal; past it the process
//! stops anyway, whatever was acknowledged being durable), gives back every run lease it still
//! holds, lets the store commit what is queued and record its verified point, and exits 0.
//!
//! While it serves, the intents due for reconciliation are reconciled in the background every
//! `API_RECONCILE_EVERY_MS`, so a caller that only reads an unknown outcome sees it settle.
//!
//! It never decides a transition, never touches SQL, and never reads a secret back.

mod api;
mod auth;
mod body;
mod console;
mod error;
mod listen;
mod openapi;
mod reads;
mod tls;

use crate::output::Output;
use crate::policy::Loaded;
use crate::wiring::Node;
use crate::{LimitArgs, ProviderArgs, exit};
use anyhow::Context as _;
use axum::Router;
use axum::http::Method;
use axum::routing::{MethodRouter, get, post};
use engine::event::Cause;
use engine::limits::{API_RATE_PER_S_DEFAULT, API_RATE_PER_S_MAX, API_RECONCILE_EVERY_MS, SHUTDOWN_GRACE_MS};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use store::keys::KeyBook;

/// `keel serve`'s flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where to listen. Port 0 picks a free port; the address is printed as
    /// `listening on http://ADDR` (`https://` with `--tls-cert`).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM, the server's certificate first); needs
    /// `--tls-key`. The console's cookie is then `Secure`.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of `--tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1); needs `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Requests per second each API key may make (a token bucket holding two seconds of it;
    /// past it 429 with Retry-After).
    #[arg(long, default_value_t = API_RATE_PER_S_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(API_RATE_PER_S_MAX)))]
    rate_per_s: u32,
    /// The limits of every run a request starts.
    #[command(flatten)]
    limits: LimitArgs,
}

impl ServeArgs {
    /// The TLS configuration `--tls-cert` and `--tls-key` name, checked; `None` for plain HTTP.
    ///
    /// # Errors
    ///
    /// A file missing or unreadable, no certificate or key in it, or a pair that does not
    /// belong together: the caller refuses to start (nothing listens, nothing is opened).
    pub fn tls(&self) -> Result<Option<tls::Tls>, tls::TlsError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => tls::Tls::load(cert, key).map(Some),
            // clap requires both or neither.
            _ => Ok(None),
        }
    }
}

/// What every handler shares.
pub struct Server {
    node: Node,
    keys: KeyBook,
    buckets: auth::Buckets,
    /// The console's login attempts, per client address and per presented key id.
    logins: auth::Buckets,
    limits: LimitArgs,
    /// The operator's policy, loaded at start: every request's run is held to its tenant's
    /// rules and records the policy's version and hash.
    policy: Loaded,
    ready: AtomicBool,
    /// Read connections, reused across requests (one is opened when none is free).
    readers: Mutex<Vec<store::Reader>>,
    /// The console's sessions.
    sessions: console::Sessions,
}

impl Server {
    /// Runs `query` on a pooled reader.
    fn read<T>(&self, query: impl FnOnce(&store::Reader) -> anyhow::Result<T>) -> anyhow::Result<T> {
        let pooled = self.readers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
        let reader = match pooled {
            Some(reader) => reader,
            None => self.node.store.reader()?,
        };
        let result = query(&reader);
        self.readers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(reader);
        result
    }
}

/// Every route served: the one table the router is built from, and that a test holds equal
/// to the OpenAPI document's paths.
fn routes() -> Vec<(Method, &'static str, MethodRouter<Arc<Server>>)> {
    vec![
        (Method::GET, "/healthz", get(api::healthz)),
        (Method::GET, "/readyz", get(api::readyz)),
        (Method::GET, "/openapi.json", get(openapi::document)),
        (Method::POST, "/v1/charges", post(api::charge)),
        (Method::POST, "/v1/refunds", post(api::refund)),
        (Method::GET, "/v1/intents", get(api::list)),
        (Method::GET, "/v1/intents/{key}", get(api::show)),
        (Method::POST, "/v1/intents/{key}/reconcile", post(api::reconcile)),
        (Method::POST, "/v1/intents/{key}/cancel", post(api::cancel)),
        (Method::POST, "/v1/intents/{key}/resolve", post(api::resolve)),
        (Method::POST, "/v1/intents/{key}/approve", post(api::approve)),
        (Method::POST, "/v1/intents/{key}/deny", post(api::deny)),
        (Method::GET, "/v1/runs", get(reads::runs)),
        (Method::GET, "/v1/runs/{id}", get(reads::run)),
        (Method::GET, "/v1/runs/{id}/trace", get(reads::trace)),
        (Method::GET, "/v1/metrics", get(reads::metrics)),
        (Method::GET, "/metrics", get(reads::prometheus)),
    ]
}

/// The router of [`routes`] and the console's pages (`console::routes`: HTML for people, not
/// part of the API's document), on `server`.
fn router(server: Arc<Server>) -> Router {
    routes()
        .into_iter()
        .chain(console::routes())
        .fold(Router::new(), |router, (_, path, handler)| router.route(path, handler))
        .fallback(api::no_route)
        .method_not_allowed_fallback(api::no_method)
        // The body door reads at most `API_BODY_MAX_BYTES` itself, answering in the API's shape.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(body::headers_once))
        .with_state(server)
}

/// Resolves at the first SIGTERM or SIGINT.
async fn stop_signal() {
    let mut terminate = crate::wiring::sigterm();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate.recv() => {}
    }
}

/// Every `API_RECONCILE_EVERY_MS`, the intents due for reconciliation are reconciled (as a
/// `keel worker` pass does), so that an unknown outcome settles while its caller only reads it
/// (`GET /v1/intents/{key}`). A failed pass is logged and the next one tries again.
async fn reconcile_in_background(server: Arc<Server>) {
    let mut every = tokio::time::interval(std::time::Duration::from_millis(API_RECONCILE_EVERY_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(error) = server.node.executor.reconcile_due(Cause::command("serve")).await {
            tracing::warn!(%error, "keel serve: a background reconciliation pass failed; the next one tries again");
        }
    }
}

/// `keel serve`: serves until SIGTERM or SIGINT, then stops gracefully (exit 0).
pub async fn run(
    db: &Path,
    durability: store::Durability,
    provider: &ProviderArgs,
    policy: Loaded,
    out: &Output,
    args: ServeArgs,
    tls: Option<tls::Tls>,
) -> anyhow::Result<u8> {
    // The operator's rules differ by tenant: each request is held to its tenant's
    // (`api::effect`), not the node to one tenant's.
    let mut node = Node::open(db, durability, provider, None)?;
    // The runs it resumes are held to this policy too (and to the one each started under).
    node.executor = node.executor.clone().with_policy(policy.clone().in_force());
    let keys = KeyBook::open(db).with_context(|| format!("cannot open the key table of {}", db.display()))?;
    let listener =
        tokio::net::TcpListener::bind(args.addr).await.with_context(|| format!("cannot listen on {}", args.addr))?;
    let local = listener.local_addr()?;
    let server = Arc::new(Server {
        node,
        keys,
        buckets: auth::Buckets::new(args.rate_per_s),
        logins: auth::Buckets::logins(),
        limits: args.limits,
        policy,
        ready: AtomicBool::new(false),
        readers: Mutex::new(Vec::new()),
        sessions: console::Sessions::new(tls.is_some()),
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    outln!("listening on {scheme}://{local}");
    std::io::stdout().flush()?;

    let stopping = Arc::new(tokio::sync::Notify::new());
    let notify = Arc::clone(&stopping);
    let app = router(Arc::clone(&server));
    let stop = async move {
        stop_signal().await;
        notify.notify_one();
    };
    let listener = listen::Listener::new(listener, tls);
    errln!(
        "keel serve: at most {} connection(s) at once (descriptor limit {})",
        listener.bound(),
        listener.descriptors().map_or_else(|| "unlimited".to_owned(), |limit| limit.to_string())
    );
    let serving = tokio::spawn(listener.serve(app, stop));

    let report = server.node.executor.recover_and_resume(Cause::command("serve")).await?;
    server.ready.store(true, Ordering::Release);
    errln!(
        "keel serve: ready (recovered {} in-flight intent(s), resumed {} run(s), reconciled {})",
        report.recovered.len(),
        report.resumed.len(),
        report.reconciled.len()
    );
    let reconciler = tokio::spawn(reconcile_in_background(Arc::clone(&server)));

    let grace = async {
        stopping.notified().await;
        tokio::time::sleep(std::time::Duration::from_millis(SHUTDOWN_GRACE_MS)).await;
    };
    tokio::select! {
        served = serving => served.context("the server task failed")?,
        () = grace => errln!("keel serve: requests still in flight after the grace period; stopping anyway"),
    }
    reconciler.abort();
    let runtime = server.node.executor.runtime();
    let held = runtime.lessee.grants();
    engine::executor::release_runs(&*runtime.log, &runtime.lessee, &Cause::command("serve"), held).await?;
    server.node.shutdown()?;
    out.emit(&serde_json::json!({"status": "stopped", "addr": local.to_string()}), || {
        errln!("keel serve: stopped; whatever was acknowledged is durable");
    });
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::{openapi, routes};
    use std::collections::BTreeSet;
    use utoipa::OpenApi as _;

    #[test]
    fn every_route_served_is_documented_and_every_documented_route_is_served() {
        let document = serde_json::to_value(openapi::Document::openapi()).expect("the document serialises");
        assert!(document["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{}", document["openapi"]);
        let documented: BTreeSet<(String, String)> = document["paths"]
            .as_object()
            .expect("paths")
            .iter()
            .flat_map(|(path, item)| {
                item.as_object().expect("a path item").keys().map(move |method| (method.clone(), path.clone()))
            })
            .collect();
        let served: BTreeSet<(String, String)> =
            routes().iter().map(|(method, path, _)| (method.as_str().to_lowercase(), (*path).to_owned())).collect();
        assert_eq!(served, documented);
    }

    #[test]
    fn the_document_states_the_constraints_the_doors_enforce() {
        use engine::limits::{AMOUNT_MINOR_MAX, API_PAGE_LIMIT_MAX, INTENT_ID_MAX_CHARS, INTENT_ID_MIN_CHARS};
        let document = serde_json::to_value(openapi::Document::openapi()).expect("the document serialises");
        let charge = &document["components"]["schemas"]["ChargeRequest"]["properties"];
        assert_eq!(charge["amount_minor"]["minimum"], 1, "{charge}");
        assert_eq!(charge["amount_minor"]["maximum"], AMOUNT_MINOR_MAX, "{charge}");
        assert_eq!(charge["payment_method_token"]["pattern"], "^pm_[A-Za-z0-9_]+$", "{charge}");
        let currency = regex_free_match(charge["currency"]["pattern"].as_str().expect("a pattern"));
        assert!(currency.iter().any(|code| code == "[Ee][Uu][Rr]"), "{currency:?}");
        let reason = &document["components"]["schemas"]["ReasonRequest"]["properties"]["reason"];
        assert_eq!(reason["pattern"], "\\S", "{reason}");

        let post = &document["paths"]["/v1/charges"]["post"];
        let key = post["parameters"].as_array().expect("parameters").iter().find(|p| p["name"] == "Idempotency-Key");
        let key = &key.expect("the Idempotency-Key header")["schema"];
        assert_eq!(
            (key["minLength"].as_u64(), key["maxLength"].as_u64()),
            (Some(INTENT_ID_MIN_CHARS as u64), Some(INTENT_ID_MAX_CHARS as u64))
        );
        let list = &document["paths"]["/v1/intents"]["get"]["parameters"];
        let limit = list.as_array().expect("parameters").iter().find(|p| p["name"] == "limit").expect("limit");
        assert_eq!(
            (limit["schema"]["minimum"].as_u64(), limit["schema"]["maximum"].as_u64()),
            (Some(1), Some(API_PAGE_LIMIT_MAX as u64))
        );
        let state = list.as_array().expect("parameters").iter().find(|p| p["name"] == "state").expect("state");
        assert!(
            state["schema"]["enum"].as_array().is_some_and(|states| states.contains(&"outcome_unknown".into())),
            "{state}"
        );
        for path in
            ["/v1/charges", "/v1/intents/{key}/approve", "/v1/intents/{key}/resolve", "/v1/intents/{key}/cancel"]
        {
            let responses = &document["paths"][path]["post"]["responses"];
            for status in ["400", "405", "408", "413", "415"] {
                assert!(responses.get(status).is_some(), "{path} documents {status}: {responses}");
            }
        }
    }

    /// The alternatives of a `^(a|b|c)$` pattern.
    fn regex_free_match(pattern: &str) -> Vec<String> {
        pattern.trim_start_matches("^(").trim_end_matches(")$").split('|').map(str::to_owned).collect()
    }

    #[test]
    fn every_request_schema_refuses_unknown_fields_as_the_handlers_do() {
        let document = serde_json::to_value(openapi::Document::openapi()).expect("the document serialises");
        let schemas = document["components"]["schemas"].as_object().expect("schemas");
        for name in
            ["ChargeRequest", "RefundRequest", "ReasonRequest", "ResolveRequest", "ApproveRequest", "EmptyRequest"]
        {
            assert_eq!(schemas[name]["additionalProperties"], false, "{name}: {}", schemas[name]);
        }
        assert_eq!(
            schemas["ChargeRequest"]["required"],
            serde_json::json!(["order_id", "amount_minor", "currency", "payment_method_token"])
        );
    }
}
