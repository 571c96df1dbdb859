//! Where the event log lives: `--store sqlite:PATH | postgres://…` (or `KEEL_STORE`), and
//! `--db PATH`, parsed once at the edge into a [`Location`].
//!
//! Owns [`Location`], [`PgUrl`] (a PostgreSQL URL that prints without its password) and
//! [`locate`], the one place the two flags are reconciled. It never opens a connection nor
//! a file, and never prints a URL's password: only [`PgUrl::url`] holds it, handed to the
//! store.

use std::fmt;
use std::path::{Path, PathBuf};

/// The SQLite log used when neither `--store` nor `--db` is given.
pub const DEFAULT_DB: &str = "./keel.db";

/// The forms `--store` accepts, for the usage error's message.
const ACCEPTED: &str = "sqlite:PATH or postgres://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE";

/// Where the event log lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An embedded SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(PgUrl),
}

/// A `postgres://` (or `postgresql://`) URL. Its `Display` and `Debug` name the server and
/// database without the password: `***` stands for the one after `USER:` and for the value
/// of every parameter of the query that names one (`?password=…`, as libpq takes it too).
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl {
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    host: String,
    port: u16,
    database: String,
    query: Option<String>,
}

impl PgUrl {
    /// Parses `text`; `Err` says what is wrong, never quoting the password.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let (scheme, rest) = text
            .split_once("://")
            .filter(|(scheme, _)| ["postgres", "postgresql"].contains(scheme))
            .ok_or_else(|| format!("--store must be {ACCEPTED}"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query.to_owned())),
            None => (rest, None),
        };
        let (authority, database) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => match info.split_once(':') {
                Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
                None => (Some(info.to_owned()), None),
            },
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((host, port)) => {
                let port =
                    port.parse().map_err(|_| format!("the port of a --store URL must be a number: {ACCEPTED}"))?;
                (host, port)
            }
            None => (hostport, 5432),
        };
        if host.is_empty() {
            return Err(format!("a --store URL names its server: {ACCEPTED}"));
        }
        if database.is_empty() || database.contains('/') {
            return Err(format!("a --store URL names one database: {ACCEPTED}"));
        }
        Ok(Self {
            scheme: scheme.to_owned(),
            user: user.filter(|u| !u.is_empty()),
            password,
            host: host.to_owned(),
            port,
            database: database.to_owned(),
            query,
        })
    }

    /// The full URL, password included: for the store's connections only, never printed.
    pub fn url(&self) -> String {
        self.render(Password::Kept)
    }

    /// `HOST:PORT`.
    pub fn server(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The same server and credentials, another database.
    pub fn with_database(&self, database: &str) -> Self {
        Self { database: database.to_owned(), ..self.clone() }
    }

    /// The same database and credentials reached at `host:port` (a proxy in front of the
    /// server: what `keel soak` hands its children).
    pub fn through(&self, host: &str, port: u16) -> Self {
        Self { host: host.to_owned(), port, ..self.clone() }
    }

    fn render(&self, password: Password) -> String {
        let mut text = format!("{}://", self.scheme);
        if let Some(user) = &self.user {
            text.push_str(user);
            if let Some(kept) = &self.password {
                text.push(':');
                text.push_str(match password {
                    Password::Kept => kept,
                    Password::Hidden => "***",
                });
            }
            text.push('@');
        }
        text.push_str(&format!("{}:{}/{}", self.host, self.port, self.database));
        if let Some(query) = &self.query {
            text.push('?');
            match password {
                Password::Kept => text.push_str(query),
                Password::Hidden => text.push_str(&hidden_query(query)),
            }
        }
        text
    }
}

/// Whether a rendering of a [`PgUrl`] keeps its password (for the store) or hides it.
#[derive(Clone, Copy)]
enum Password {
    Kept,
    Hidden,
}

/// `query` with the value of every parameter whose name says `password` (`password`,
/// libpq's `sslpassword`; whatever its case and percent-encoding) replaced by `***`.
fn hidden_query(query: &str) -> String {
    let hidden = query.split('&').map(|pair| {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let decoded = form_urlencoded::parse(name.as_bytes()).next().map(|(name, _)| name.to_ascii_lowercase());
        if decoded.is_some_and(|name| name.contains("password")) { format!("{name}=***") } else { pair.to_owned() }
    });
    hidden.collect::<Vec<_>>().join("&")
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(Password::Hidden))
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({self})")
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Postgres(url) => write!(f, "{url}"),
        }
    }
}

/// Parses one `--store` value.
fn parse_store(text: &str) -> Result<Location, String> {
    if let Some(path) = text.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err(format!("--store sqlite: needs a path: {ACCEPTED}"));
        }
        return Ok(Location::Sqlite(PathBuf::from(path)));
    }
    if text.contains("://") {
        return PgUrl::parse(text).map(Location::Postgres);
    }
    Err(format!("--store {:?} is not a store: it must be {ACCEPTED}", shown(text)))
}

/// A value as it may be quoted back: the part after `@` only when it may hold a password, and
/// nothing of a query (`?password=…`).
fn shown(text: &str) -> String {
    let (text, query) = match text.split_once('?') {
        Some((text, _)) => (text, "?…"),
        None => (text, ""),
    };
    match text.rsplit_once('@') {
        Some((_, host)) => format!("…@{host}{query}"),
        None => format!("{text}{query}"),
    }
}

/// The log `--store` and `--db` name together: `--store` wins when alone, `--db PATH` is
/// `sqlite:PATH`, neither is [`DEFAULT_DB`].
///
/// # Errors
///
/// The usage error's message: a malformed or unknown `--store`, or both given and naming
/// different logs.
pub fn locate(store: Option<&str>, db: Option<&Path>) -> Result<Location, String> {
    match (store, db) {
        (None, None) => Ok(Location::Sqlite(PathBuf::from(DEFAULT_DB))),
        (None, Some(db)) => Ok(Location::Sqlite(db.to_owned())),
        (Some(store), None) => parse_store(store),
        (Some(store), Some(db)) => {
            let location = parse_store(store)?;
            match &location {
                Location::Sqlite(path) if path == db => Ok(location),
                _ => Err(format!(
                    "--db {} and --store {location} name two different logs: give one (--db PATH is --store \
                     sqlite:PATH)",
                    db.display()
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_flags_name_one_log() {
        assert_eq!(locate(None, None), Ok(Location::Sqlite(DEFAULT_DB.into())));
        assert_eq!(locate(None, Some(Path::new("a.db"))), Ok(Location::Sqlite("a.db".into())));
        assert_eq!(locate(Some("sqlite:a.db"), Some(Path::new("a.db"))), Ok(Location::Sqlite("a.db".into())));
        assert!(locate(Some("sqlite:b.db"), Some(Path::new("a.db"))).is_err_and(|e| e.contains("two different")));
        let pg = locate(Some("postgres://u:pw@h/k"), Some(Path::new("a.db")));
        assert!(pg.is_err_and(|e| e.contains("two different") && !e.contains("pw")));
    }

    #[test]
    fn a_url_prints_without_its_password_and_keeps_it_for_the_store() {
        let Ok(Location::Postgres(url)) =
            locate(Some("postgres://keel:s3cret@db.example:6543/ledger?sslmode=disable"), None)
        else {
            panic!("a postgres URL")
        };
        assert_eq!(url.to_string(), "postgres://keel:***@db.example:6543/ledger?sslmode=disable");
        assert_eq!(format!("{url:?}"), "PgUrl(postgres://keel:***@db.example:6543/ledger?sslmode=disable)");
        assert_eq!(url.url(), "postgres://keel:s3cret@db.example:6543/ledger?sslmode=disable");
        assert_eq!(url.server(), "db.example:6543");
        let Ok(Location::Postgres(query)) = locate(
            Some(
                "postgres://keel@h/k?sslmode=disable&password=s3cret&PassWord=s3cret&pass%77ord=s3cret&sslpassword=s3cret",
            ),
            None,
        ) else {
            panic!("a postgres URL")
        };
        assert_eq!(
            format!("{query} {query:?}"),
            "postgres://keel@h:5432/k?sslmode=disable&password=***&PassWord=***&pass%77ord=***&sslpassword=*** \
             PgUrl(postgres://keel@h:5432/k?sslmode=disable&password=***&PassWord=***&pass%77ord=***&sslpassword=***)"
        );
        assert!(query.url().ends_with("&password=s3cret&PassWord=s3cret&pass%77ord=s3cret&sslpassword=s3cret"));
        assert_eq!(url.with_database("other").url(), "postgres://keel:s3cret@db.example:6543/other?sslmode=disable");
        let Ok(Location::Postgres(plain)) = locate(Some("postgresql://h/k"), None) else { panic!("a postgres URL") };
        assert_eq!((plain.server(), plain.url()), ("h:5432".to_owned(), "postgresql://h:5432/k".to_owned()));
    }

    #[test]
    fn a_malformed_store_names_the_accepted_forms_and_never_the_password() {
        for bad in [
            "mysql://u:pw@h/k",
            "keel.db",
            "sqlite:",
            "postgres://u:pw@h:port/k",
            "postgres://u:pw@h",
            "postgres://u:pw@/k",
        ] {
            let error = locate(Some(bad), None).expect_err(bad);
            assert!(error.contains("sqlite:PATH") && error.contains("postgres://"), "{bad}: {error}");
            assert!(!error.contains("pw"), "{bad}: {error}");
        }
    }
}
