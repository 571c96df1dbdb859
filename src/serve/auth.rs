//! Who may do what: the key a request presents, its role, its rate.
//!
//! Owns [`Need`] (what a route asks of a key), [`authorize`] (authenticate through
//! `crate::keys`, then [`admit`]: the per-key token bucket, then the role), [`Buckets`],
//! [`login_attempt`] (the console's login, limited per client address before any secret is
//! checked) and [`login_failed`] (failed logins, limited per key id). Roles do not
//! nest upwards: `read` reads; `submit` reads and charges or refunds; `operator` reads and
//! makes operator decisions. It never looks at a request's body and never names the tenant of
//! an intent: handlers compare that with the key's own.

use super::error::{ApiError, Code};
use crate::keys::{self, Refused};
use axum::http::{HeaderMap, header};
use engine::limits::{API_RATE_BURST_S, CONSOLE_LOGIN_BURST, CONSOLE_LOGINS_PER_MIN, RATE_BUCKETS_MAX};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use store::keys::{ApiKey, KeyBook, Role};
use tokio::time::Instant;

/// What a route asks of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Reading intents.
    Read,
    /// Charging or refunding.
    Submit,
    /// Reconciling, cancelling, resolving, approving, denying.
    Operate,
}

impl Need {
    /// Whether a key of `role` may do what this asks.
    pub fn allows(self, role: Role) -> bool {
        match self {
            Self::Read => true,
            Self::Submit => role == Role::Submit,
            Self::Operate => role == Role::Operator,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::Read => "read intents",
            Self::Submit => "charge or refund (role submit)",
            Self::Operate => "make operator decisions (role operator)",
        }
    }
}

/// One key's token bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A token bucket per caller (a key id, a client address). At most `RATE_BUCKETS_MAX`: past
/// it the buckets full again are dropped, and while none is, a new caller is refused.
pub struct Buckets {
    rate_per_s: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Buckets {
    /// Buckets refilled at `rate_per_s`, holding `API_RATE_BURST_S` seconds of it.
    pub fn new(rate_per_s: u32) -> Self {
        let rate_per_s = f64::from(rate_per_s);
        Self::with(rate_per_s, rate_per_s * f64::from(API_RATE_BURST_S))
    }

    /// The console's login buckets: `CONSOLE_LOGINS_PER_MIN` a minute, `CONSOLE_LOGIN_BURST`
    /// at once.
    pub fn logins() -> Self {
        Self::with(f64::from(CONSOLE_LOGINS_PER_MIN) / 60.0, f64::from(CONSOLE_LOGIN_BURST))
    }

    fn with(rate_per_s: f64, burst: f64) -> Self {
        Self { rate_per_s, burst, buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one token from `id`'s bucket, or says in how many seconds one will be there.
    fn take(&self, id: &str, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= RATE_BUCKETS_MAX && !buckets.contains_key(id) {
            let (rate, burst) = (self.rate_per_s, self.burst);
            buckets.retain(|_, bucket| {
                bucket.tokens + now.saturating_duration_since(bucket.at).as_secs_f64() * rate < burst
            });
            if buckets.len() >= RATE_BUCKETS_MAX {
                // Until the oldest bucket fills again at the latest.
                return Err(((burst / rate).ceil() as u64).max(1));
            }
        }
        let bucket = buckets.entry(id.to_owned()).or_insert(Bucket { tokens: self.burst, at: now });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * self.rate_per_s;
        bucket.tokens = (bucket.tokens + refill).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            // Whole seconds, at least one: `Retry-After` has no fractions.
            Err((((1.0 - bucket.tokens) / self.rate_per_s).ceil() as u64).max(1))
        }
    }

    /// Spends one of `id`'s tokens now, or the 429 (with `Retry-After`) saying `who` is over
    /// its rate.
    fn spend(&self, id: &str, who: &str) -> Result<(), ApiError> {
        self.take(id, Instant::now()).map_err(|seconds| {
            ApiError::new(Code::RateLimited, format!("{who} is over its rate limit; try again in {seconds} s"))
                .retry_after(seconds)
        })
    }
}

/// A console login attempt from `client`, if the client's bucket is not spent: checked before
/// any secret is, so a guesser at one address is slowed whatever key it names.
///
/// # Errors
///
/// 429 with `Retry-After`, saying how an operator still gets in.
pub fn login_attempt(logins: &Buckets, client: IpAddr) -> Result<(), ApiError> {
    logins.take(&format!("client {client}"), Instant::now()).map_err(|seconds| {
        ApiError::new(
            Code::RateLimited,
            format!(
                "too many console logins from {client}; try again in {seconds} s (the keel command on the \
                 server needs no login, and `keel keys create` makes another key)"
            ),
        )
        .retry_after(seconds)
    })
}

/// A console login that presented `token` and failed: counted against the key id it names
/// (the token's public part, whether or not such a key exists). Only failures count, so
/// someone who knows a key's id but not its secret cannot lock its owner out: the right secret
/// always signs in, whatever was tried before.
///
/// # Errors
///
/// 429 with `Retry-After` once that key id's failures are over the rate.
pub fn login_failed(logins: &Buckets, token: &str) -> Result<(), ApiError> {
    match keys::token_id(token) {
        Some(id) => logins.spend(&format!("key {id}"), &format!("failed logins with key {id}")),
        None => Ok(()),
    }
}

/// The key behind `headers`, if it may do what `need` asks and its rate allows one more.
///
/// # Errors
///
/// 401 (no key, an invalid or revoked one), 429 with `Retry-After`, 403 (the wrong role).
pub fn authorize(book: &KeyBook, buckets: &Buckets, headers: &HeaderMap, need: Need) -> Result<ApiKey, ApiError> {
    let authorization = match headers.get(header::AUTHORIZATION).map(|value| value.to_str()) {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(_)) => return Err(refused(Refused::Invalid)),
    };
    let key = keys::authenticate(book, authorization).map_err(|error| ApiError::internal(&error))?.map_err(refused)?;
    admit(buckets, key, need)
}

/// An authenticated `key`, if its rate allows one more request and its role what `need` asks:
/// the part of [`authorize`] the console shares (its key comes from a session, not a header).
///
/// # Errors
///
/// 429 with `Retry-After`, 403 (the wrong role).
pub fn admit(buckets: &Buckets, key: ApiKey, need: Need) -> Result<ApiKey, ApiError> {
    buckets.spend(&key.id, &format!("key {}", key.name))?;
    if !need.allows(key.role) {
        return Err(ApiError::new(
            Code::Forbidden,
            format!("key {} has role {} and may not {}", key.name, key.role.as_str(), need.what()),
        ));
    }
    Ok(key)
}

fn refused(why: Refused) -> ApiError {
    let code = match why {
        Refused::Missing => Code::MissingApiKey,
        Refused::Invalid => Code::InvalidApiKey,
        Refused::Revoked => Code::RevokedApiKey,
    };
    ApiError::new(code, why.message())
}

#[cfg(test)]
mod tests {
    use super::{Buckets, login_attempt, login_failed};
    use engine::limits::{CONSOLE_LOGIN_BURST, RATE_BUCKETS_MAX};
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn a_full_table_drops_the_buckets_full_again_and_refuses_while_none_is() {
        let buckets = Buckets::new(1);
        let start = Instant::now();
        for id in 0..RATE_BUCKETS_MAX {
            assert_eq!(buckets.take(&id.to_string(), start), Ok(()));
        }
        assert_eq!(buckets.take("new", start), Err(2), "every bucket is partly spent: a newcomer waits");
        assert_eq!(buckets.take("0", start), Ok(()), "a caller already held is served");
        let later = start + Duration::from_secs(2);
        assert_eq!(buckets.take("new", later), Ok(()), "once full again, the old buckets are dropped");
        assert_eq!(buckets.buckets.lock().map(|held| held.len()).ok(), Some(1));
    }

    #[test]
    fn logins_are_limited_per_client_and_failures_per_key_id_whatever_the_client() {
        let logins = Buckets::logins();
        let client = |n: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, n));
        let token = "keel_0123456789abcdef_wrongsecret";
        for n in 0..CONSOLE_LOGIN_BURST {
            let from = client(u8::try_from(n).unwrap_or(u8::MAX));
            assert!(login_attempt(&logins, from).is_ok(), "attempt {n} from its own address");
            assert!(login_failed(&logins, token).is_ok(), "failure {n} with the key id");
        }
        assert!(login_attempt(&logins, client(200)).is_ok(), "a new address may try");
        let refused = login_failed(&logins, token).expect_err("the key id's failures are spent");
        assert_eq!(refused.status().as_u16(), 429);
        assert!(login_failed(&logins, "keel_fedcba9876543210_wrong").is_ok(), "another key id is not");
        for _ in 0..CONSOLE_LOGIN_BURST {
            assert!(login_attempt(&logins, client(201)).is_ok());
        }
        let refused = login_attempt(&logins, client(201)).expect_err("the client's burst is spent");
        assert!(refused.message().contains("keel keys create"), "says how else to get in: {}", refused.message());
    }

    #[test]
    fn a_bucket_spends_its_burst_then_refills_at_its_rate() {
        let buckets = Buckets::new(2);
        let start = Instant::now();
        for _ in 0..4 {
            assert_eq!(buckets.take("k", start), Ok(()));
        }
        assert_eq!(buckets.take("k", start), Err(1), "the burst is two seconds of two per second");
        assert_eq!(buckets.take("other", start), Ok(()), "each key has its own bucket");
        assert_eq!(buckets.take("k", start + Duration::from_millis(500)), Ok(()), "half a second refills one");
        assert_eq!(buckets.take("k", start + Duration::from_millis(500)), Err(1));
    }
}
