//! The payment-method vault's wiring: where the key comes from, the checks made at start, and
//! `keel vault purge|rotate`.
//!
//! Owns [`VaultArgs`] (`--vault-key-file`), the reading of `KEEL_VAULT_KEY`, the key of this
//! process ([`key`], set once by `main`), the start-up check against the log's key check
//! value ([`preflight`]), and the `keel vault` commands. The sealing itself is the store's
//! (`store::vault`). Every message here says what is wrong with a key, never the key: it is
//! read into zeroized memory and handed to the store as a `VaultKey`, which prints as `***`.

use crate::exit;
use crate::output::Output;
use anyhow::Context as _;
use base64::Engine as _;
use clap::{Args, Subcommand};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use store::vault::VaultKey;
use zeroize::Zeroizing;

/// The environment variable holding the vault key (base64 of 32 bytes).
pub const KEY_ENV: &str = "KEEL_VAULT_KEY";

/// Where the vault key comes from (or `KEEL_VAULT_KEY`, base64 of 32 bytes).
#[derive(Args, Debug, Clone)]
pub struct VaultArgs {
    /// Keep charges' payment methods in an encrypted vault (AES-256-GCM), so `keel resume` and
    /// `keel reconcile` can resend a charge whose caller is gone: the key, base64 of 32 bytes,
    /// in FILE (readable by its owner only: chmod 600). Or set KEEL_VAULT_KEY. Once a log
    /// has a vault, the commands that send (charge, reconcile, resume) need its key.
    #[arg(long, global = true, value_name = "FILE")]
    vault_key_file: Option<PathBuf>,

    /// How long a charge may wait for its caller (ready for its next attempt, but no payment
    /// method at hand) before `keel resume` / `keel reconcile --due` end it: rejected
    /// `abandoned`, its money and order reference freed, when it was never sent or its effect
    /// is proven absent; escalated otherwise. Counted from its latest attempt's send. E.g.
    /// 90m, 30s. Default 24h (`engine::limits::ABANDON_AFTER_DEFAULT_MS`: the provider's key
    /// window); at most 30d.
    #[arg(long, global = true, value_name = "D", value_parser = parse_abandon_window)]
    abandon_waiting_after: Option<u64>,
}

fn parse_abandon_window(text: &str) -> Result<u64, String> {
    let ms = parse_duration_ms(text)?;
    if ms > engine::limits::ABANDON_AFTER_MAX_MS {
        return Err(format!("{text:?} is above the maximum of 30d"));
    }
    Ok(ms)
}

/// `keel vault …`: the payment-method vault's maintenance.
#[derive(Subcommand, Debug)]
pub enum VaultCommand {
    /// Delete the vault entries kept longer ago than D (e.g. 30d, 12h, 90m, 45s, 500ms):
    /// their intents then wait for their callers. Entries of final intents are already gone.
    Purge {
        /// Age above which an entry is deleted.
        #[arg(long, value_name = "D", value_parser = parse_duration_ms)]
        older_than: u64,
    },
    /// Re-encrypt every vault entry under the key in FILE (base64 of 32 bytes, chmod 600), in
    /// one transaction; the current key (KEEL_VAULT_KEY or --vault-key-file) must open them
    /// all, or nothing changes. Stop every process using the old key first: from now on only
    /// the new key opens the vault.
    Rotate {
        /// The new key.
        #[arg(long, value_name = "FILE")]
        new_key_file: PathBuf,
    },
}

static KEY: OnceLock<Option<VaultKey>> = OnceLock::new();
static ABANDON_AFTER_MS: OnceLock<u64> = OnceLock::new();

/// Reads this process's vault key once, from `--vault-key-file` or `env_key` (the value of
/// `KEEL_VAULT_KEY`, read by `main`).
///
/// # Errors
///
/// What is wrong with the key (never the key): both sources given, not base64, not 32
/// bytes, a file others may read.
pub fn init(args: &VaultArgs, env_key: Option<Zeroizing<String>>) -> Result<(), String> {
    let key = match (&args.vault_key_file, env_key.filter(|text| !text.trim().is_empty())) {
        (Some(_), Some(_)) => {
            return Err(format!("both {KEY_ENV} and --vault-key-file are set: give the vault key once"));
        }
        (Some(path), None) => Some(read_key_file(path)?),
        (None, Some(text)) => Some(decode(&text, KEY_ENV)?),
        (None, None) => None,
    };
    let _ = KEY.set(key);
    let _ = ABANDON_AFTER_MS.set(args.abandon_waiting_after.unwrap_or(engine::limits::ABANDON_AFTER_DEFAULT_MS));
    Ok(())
}

/// The abandonment window this process applies (`--abandon-waiting-after`).
pub fn abandon_after_ms() -> u64 {
    ABANDON_AFTER_MS.get().copied().unwrap_or(engine::limits::ABANDON_AFTER_DEFAULT_MS)
}

/// This process's vault key, if one was given.
pub fn key() -> Option<VaultKey> {
    KEY.get().cloned().flatten()
}

/// Reads a key file: refused unless only its owner may read it.
fn read_key_file(path: &Path) -> Result<VaultKey, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the vault key file {shown}: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "the vault key file {shown} has mode {mode:04o}: others may read it; it must be readable by its owner \
             only (chmod 600 {shown})"
        ));
    }
    let text = Zeroizing::new(
        std::fs::File::open(path)
            .and_then(|file| engine::limits::read_text_at_most(file, engine::limits::VAULT_KEY_FILE_MAX_BYTES))
            .map_err(|e| format!("cannot read the vault key file {shown}: {e}"))?,
    );
    decode(&text, &format!("the vault key file {shown}"))
}

fn decode(text: &str, source: &str) -> Result<VaultKey, String> {
    let bytes = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| format!("{source} is not base64 (a vault key is base64 of 32 bytes)"))?,
    );
    VaultKey::from_bytes(&bytes).map_err(|error| format!("{source}: {error}"))
}

/// Checks, before a command opens the log `db`, that the vault key fits it: a key must open
/// the log's key check value, and a command that sends (`needs_key`) on a log that has a
/// vault must have its key — never a silent fall back to waiting for callers.
///
/// # Errors
///
/// What is wrong, for the usage error (exit 64).
pub fn preflight(db: &Path, needs_key: bool) -> anyhow::Result<Result<(), String>> {
    if !db.exists() {
        return Ok(Ok(()));
    }
    let reader = match store::Reader::open(db) {
        Ok(reader) => reader,
        // A log this build has not migrated yet has no vault; the writer migrates it.
        Err(store::Error::SchemaTooOld { .. }) => return Ok(Ok(())),
        // A process killed while it created the log leaves a hot journal, which only a
        // read-write open rolls back: a command that writes next opens the writer first.
        Err(_) if needs_key => {
            crate::wiring::open_store(db, store::Durability::Full)?.shutdown()?;
            store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?
        }
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", db.display())),
    };
    let configured = reader.vault_configured()?;
    Ok(match key() {
        Some(key) if configured && !reader.vault_key_opens(&key)? => Err(format!(
            "the vault key does not open the vault of {} (it was set up, or rotated, with another key)",
            db.display()
        )),
        None if configured && needs_key => Err(format!(
            "{} keeps payment methods in a vault: give its key ({KEY_ENV} or --vault-key-file FILE)",
            db.display()
        )),
        _ => Ok(()),
    })
}

/// `keel vault purge|rotate`.
pub fn dispatch(
    db: &Path,
    out: &Output,
    command: VaultCommand,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<u8> {
    if !db.exists() {
        return Ok(out.usage_error(&format!("{} does not exist", db.display())));
    }
    match command {
        VaultCommand::Purge { older_than } => {
            // An age longer than time itself holds nothing older.
            let before =
                engine::clock::checked_minus_ms(now, older_than).unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
            let purged = store::vault::purge(db, before)?;
            out.emit(&serde_json::json!({"status": "ok", "purged": purged, "kept_before": before}), || {
                outln!("purged {purged} vault entr{} kept before {before}", if purged == 1 { "y" } else { "ies" });
            });
            Ok(exit::OK)
        }
        VaultCommand::Rotate { new_key_file } => {
            let Some(old) = key() else {
                return Ok(out
                    .usage_error(&format!("rotate needs the current vault key ({KEY_ENV} or --vault-key-file FILE)")));
            };
            let new = match read_key_file(&new_key_file) {
                Ok(new) => new,
                Err(message) => return Ok(out.usage_error(&message)),
            };
            match store::vault::rotate(db, &old, &new) {
                Ok(rotation) => {
                    out.emit(&serde_json::json!({"status": "ok", "rotated": rotation.entries}), || {
                        outln!(
                            "re-encrypted {} vault entr{} under the new key",
                            rotation.entries,
                            if rotation.entries == 1 { "y" } else { "ies" }
                        );
                    });
                    Ok(exit::OK)
                }
                Err(error @ (store::Error::VaultKeyRejected { .. } | store::Error::Vault { .. })) => {
                    Ok(out.usage_error(&format!("{error}; nothing changed")))
                }
                Err(other) => Err(other.into()),
            }
        }
    }
}

/// Parses a duration such as `30d`, `12h`, `90m`, `45s` or `500ms` into milliseconds.
///
/// # Errors
///
/// What is wrong with it.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let count: u64 =
        digits.parse().map_err(|_| format!("{text:?} is not a duration (e.g. 30d, 12h, 90m, 45s, 500ms)"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: the unit must be one of ms, s, m, h, d (e.g. 30d)")),
    };
    count.checked_mul(unit_ms).ok_or_else(|| format!("{text:?} is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ms;

    #[test]
    fn durations_parse_with_their_unit_and_refuse_the_rest() {
        assert_eq!(parse_duration_ms("30d"), Ok(30 * 86_400_000));
        assert_eq!(parse_duration_ms("12h"), Ok(12 * 3_600_000));
        assert_eq!(parse_duration_ms("90m"), Ok(90 * 60_000));
        assert_eq!(parse_duration_ms("45s"), Ok(45_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
        for bad in ["", "d", "30", "30 days", "-1d", "1.5h", "99999999999999999999d", "18446744073709551615d"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
