//! The console's server-side sessions and their CSRF tokens.
//!
//! Owns [`Sessions`]: a bounded table from a random session id (the cookie's value) to the
//! key signed in, the session's own CSRF token and its expiry. A login form's session is kept
//! nowhere: its id carries its expiry and a random nonce, signed (HMAC-SHA-256 under a key
//! drawn at start), and its CSRF token is derived from the id under the same key — so opening
//! the login form writes nothing, and a flood of `GET /console/login` can neither grow memory
//! nor push out anyone's session or pending login. Only a sign-in writes: the new session, and
//! the spent login id (refused from then on, until it would have expired anyway). Ids and
//! tokens are `keys::new_secret`'s 244 random bits; a login replaces the form's session with a
//! new id (the id a browser held before signing in is never the signed-in one). The cookie is
//! `HttpOnly; SameSite=Strict; Path=/`, plus `Secure` when `keel serve` speaks TLS (a browser
//! then never sends it over plain HTTP). It never stores a key's secret, only the key's public
//! id, and never decides what a key may do.

use crate::keys::{constant_time_eq, new_secret};
use axum::http::{HeaderMap, header};
use engine::limits::{CONSOLE_LOGIN_TTL_MS, CONSOLE_SESSION_TTL_MS, CONSOLE_SESSIONS_MAX};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The cookie's name.
const COOKIE: &str = "keel_session";

/// What a login form's id starts with (a signed-in session's id is hex: it never does).
const LOGIN_PREFIX: &str = "login.";

/// One signed-in session.
struct Session {
    /// The signed-in key's public id.
    key_id: String,
    csrf: String,
    expires: Instant,
}

/// What a request's cookie names, while it lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Current {
    /// The session id (the cookie's value).
    pub id: String,
    /// The signed-in key's public id; `None` before login.
    pub key_id: Option<String>,
    /// The token every form of this session posts back.
    pub csrf: String,
}

impl Current {
    /// Whether `presented` (a form's `csrf` field) is this session's token.
    pub fn csrf_matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|token| constant_time_eq(token.as_bytes(), self.csrf.as_bytes()))
    }
}

/// Every live session, at most `CONSOLE_SESSIONS_MAX`.
pub struct Sessions {
    live: Mutex<Live>,
    /// Signs login forms' ids and derives their CSRF tokens; drawn at start, never shown.
    login_key: ring::hmac::Key,
    /// The instant login forms' expiries count from.
    epoch: Instant,
    /// The server speaks TLS: its cookies are `Secure`.
    secure: bool,
}

/// The table's contents.
#[derive(Default)]
struct Live {
    signed_in: HashMap<String, Session>,
    /// Login ids already used to sign in, with when they would have expired.
    spent: HashMap<String, Instant>,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Sessions {
    /// No session yet; `secure` when the server speaks TLS (its cookies are then `Secure`).
    pub fn new(secure: bool) -> Self {
        let login_key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .expect("the system's random source gives 32 bytes (it failing is the OS failing)");
        Self { live: Mutex::default(), login_key, epoch: Instant::now(), secure }
    }

    /// The `Set-Cookie` value that gives the browser `session`.
    pub fn set_cookie(&self, session: &Current) -> String {
        format!("{COOKIE}={}; {}", session.id, self.attributes())
    }

    /// The `Set-Cookie` value that makes the browser forget its session.
    pub fn clear_cookie(&self) -> String {
        format!("{COOKIE}=; {}; Max-Age=0", self.attributes())
    }

    fn attributes(&self) -> &'static str {
        if self.secure { "HttpOnly; SameSite=Strict; Path=/; Secure" } else { "HttpOnly; SameSite=Strict; Path=/" }
    }

    /// The session `headers`' cookie names, if it exists and has not expired at `now` (an
    /// expired one is dropped).
    pub fn current(&self, headers: &HeaderMap, now: Instant) -> Option<Current> {
        let id = cookie(headers)?;
        if id.starts_with(LOGIN_PREFIX) {
            return self.login_form(id, now);
        }
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match live.signed_in.get(&id) {
            Some(session) if session.expires > now => {
                Some(Current { id, key_id: Some(session.key_id.clone()), csrf: session.csrf.clone() })
            }
            Some(_) => {
                live.signed_in.remove(&id);
                None
            }
            None => None,
        }
    }

    /// A login form's session: no key, a CSRF token, `CONSOLE_LOGIN_TTL_MS` to live. Nothing
    /// is stored: the id is signed, the token derived from it.
    pub fn begin(&self, now: Instant) -> Current {
        let expires = now + Duration::from_millis(CONSOLE_LOGIN_TTL_MS);
        let unsigned = format!("{LOGIN_PREFIX}{}.{}", expires.duration_since(self.epoch).as_millis(), new_secret());
        let id = format!("{unsigned}.{}", hex::encode(ring::hmac::sign(&self.login_key, unsigned.as_bytes())));
        let csrf = self.login_csrf(&id);
        Current { id, key_id: None, csrf }
    }

    /// The login form `id` names, when its signature holds, it has not expired at `now` and
    /// it was not used to sign in.
    fn login_form(&self, id: String, now: Instant) -> Option<Current> {
        let (unsigned, signature) = id.rsplit_once('.')?;
        ring::hmac::verify(&self.login_key, unsigned.as_bytes(), &hex::decode(signature).ok()?).ok()?;
        let expires_ms: u64 = unsigned.strip_prefix(LOGIN_PREFIX)?.split('.').next()?.parse().ok()?;
        if self.epoch + Duration::from_millis(expires_ms) <= now {
            return None;
        }
        let live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.spent.contains_key(&id) {
            return None;
        }
        let csrf = self.login_csrf(&id);
        Some(Current { id, key_id: None, csrf })
    }

    /// A login form's CSRF token: its id, signed again under another label.
    fn login_csrf(&self, id: &str) -> String {
        hex::encode(ring::hmac::sign(&self.login_key, format!("csrf:{id}").as_bytes()))
    }

    /// Signs `key_id` in: `previous` (the login form's session) ends and a new session, with a
    /// new id and token, lives `CONSOLE_SESSION_TTL_MS`.
    pub fn sign_in(&self, previous: &Current, key_id: &str, now: Instant) -> Current {
        self.end(previous);
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if previous.id.starts_with(LOGIN_PREFIX) {
            live.spent.retain(|_, expires| *expires > now);
            live.spent.insert(previous.id.clone(), now + Duration::from_millis(CONSOLE_LOGIN_TTL_MS));
        }
        if live.signed_in.len() >= CONSOLE_SESSIONS_MAX {
            live.signed_in.retain(|_, session| session.expires > now);
        }
        if live.signed_in.len() >= CONSOLE_SESSIONS_MAX {
            let soonest = live.signed_in.iter().min_by_key(|(_, session)| session.expires).map(|(id, _)| id.clone());
            if let Some(id) = soonest {
                live.signed_in.remove(&id);
            }
        }
        let current = Current { id: new_secret(), key_id: Some(key_id.to_owned()), csrf: new_secret() };
        let expires = now + Duration::from_millis(CONSOLE_SESSION_TTL_MS);
        let session = Session { key_id: key_id.to_owned(), csrf: current.csrf.clone(), expires };
        live.signed_in.insert(current.id.clone(), session);
        current
    }

    /// Ends `session` (logout, or its key was revoked).
    pub fn end(&self, session: &Current) {
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).signed_in.remove(&session.id);
    }
}

/// The session id a request's `Cookie` headers carry.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::Sessions;
    use axum::http::{HeaderMap, HeaderValue, header};
    use engine::limits::{CONSOLE_LOGIN_TTL_MS, CONSOLE_SESSION_TTL_MS};
    use std::time::Duration;
    use tokio::time::Instant;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(value).expect("a header value"));
        headers
    }

    #[test]
    fn a_login_replaces_the_form_s_session_and_each_expires_on_time() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let form = sessions.begin(start);
        let cookie = sessions.set_cookie(&form);
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/"));
        assert!(!cookie.contains("Secure"), "plain HTTP: a Secure cookie would never come back");
        let over_tls = Sessions::new(true);
        assert!(over_tls.set_cookie(&form).ends_with("; Secure") && over_tls.clear_cookie().contains("; Secure;"));
        let headers = with_cookie(&format!("other=1; keel_session={}", form.id));
        assert_eq!(sessions.current(&headers, start).as_ref(), Some(&form));
        let login_ttl = Duration::from_millis(CONSOLE_LOGIN_TTL_MS);
        assert_eq!(sessions.current(&headers, start + login_ttl), None, "a login form's session expires");

        let form = sessions.begin(start);
        let signed = sessions.sign_in(&form, "key-id", start);
        assert_ne!((&signed.id, &signed.csrf), (&form.id, &form.csrf), "a new id and token at login");
        assert_eq!(sessions.current(&with_cookie(&format!("keel_session={}", form.id)), start), None);
        let headers = with_cookie(&format!("keel_session={}", signed.id));
        let ttl = Duration::from_millis(CONSOLE_SESSION_TTL_MS);
        assert_eq!(
            sessions.current(&headers, start + ttl - Duration::from_millis(1)).map(|c| c.key_id),
            Some(Some("key-id".to_owned()))
        );
        assert_eq!(sessions.current(&headers, start + ttl), None, "a session expires");
        assert_eq!(sessions.current(&with_cookie("keel_session=forged"), start), None);
    }

    #[test]
    fn a_csrf_token_matches_only_itself() {
        let sessions = Sessions::default();
        let current = sessions.begin(Instant::now());
        assert!(current.csrf_matches(Some(&current.csrf.clone())));
        assert!(!current.csrf_matches(None));
        assert!(!current.csrf_matches(Some("")));
        let mut wrong = current.csrf.clone();
        wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
        assert!(!current.csrf_matches(Some(&wrong)));
    }
}
