//! Databases on the server of a log: what `keel bench` needs to run in a fresh database of
//! its own, never in an operator's log.
//!
//! Owns [`create_database`] and [`drop_database`]. It never touches a Keel log's tables; a
//! name is refused unless it is a plain identifier (it is spliced into the statement).

use crate::error::{Error, Result};

fn checked(name: &str) -> Result<&str> {
    let plain = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if plain { Ok(name) } else { Err(Error::Options(format!("{name:?} is not a plain database name"))) }
}

/// Creates the empty database `name` on the server of `url` (connecting to `url`'s own
/// database to do so). Needs the `CREATEDB` privilege.
///
/// # Errors
///
/// [`Error::Options`] for a name that is not a plain identifier; PostgreSQL's.
pub fn create_database(url: &str, name: &str) -> Result<()> {
    let name = checked(name)?;
    crate::writer::connect(url)?.batch_execute(&format!("CREATE DATABASE {name}"))?;
    Ok(())
}

/// Drops the database `name` on the server of `url`, ending its sessions first.
///
/// # Errors
///
/// [`Error::Options`] for a name that is not a plain identifier; PostgreSQL's.
pub fn drop_database(url: &str, name: &str) -> Result<()> {
    let name = checked(name)?;
    crate::writer::connect(url)?.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
    Ok(())
}
