//! Who may do what: the key a request presents, its role, its rate.
//!
//! Owns [`Need`] (what a route asks of a key), [`authorize`] (authenticate through
//! `crate::keys`, then [`admit`]: the per-key token bucket, then the role) and [`Buckets`]. Roles do not
//! nest upwards: `read` reads; `submit` reads and charges or refunds; `operator` reads and
//! makes operator decisions. It never looks at a request's body and never names the tenant of
//! an intent: handlers compare that with the key's own.

use super::error::{ApiError, Code};
use crate::keys::{self, Refused};
use axum::http::{HeaderMap, header};
use engine::limits::API_RATE_BURST_S;
use std::collections::HashMap;
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

/// Every key's token bucket. One entry per key that ever made a request: bounded by the key
/// table, which only an operator grows.
pub struct Buckets {
    rate_per_s: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Buckets {
    /// Buckets refilled at `rate_per_s`, holding `API_RATE_BURST_S` seconds of it.
    pub fn new(rate_per_s: u32) -> Self {
        let rate_per_s = f64::from(rate_per_s);
        Self { rate_per_s, burst: rate_per_s * f64::from(API_RATE_BURST_S), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one token from `key_id`'s bucket, or says in how many seconds one will be there.
    fn take(&self, key_id: &str, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let bucket = buckets.entry(key_id.to_owned()).or_insert(Bucket { tokens: self.burst, at: now });
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
    if let Err(seconds) = buckets.take(&key.id, Instant::now()) {
        return Err(ApiError::new(
            Code::RateLimited,
            format!("key {} is over its rate limit; try again in {seconds} s", key.name),
        )
        .retry_after(seconds));
    }
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
    use super::Buckets;
    use std::time::Duration;
    use tokio::time::Instant;

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
