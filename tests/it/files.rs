//! The files Keel creates and reads: the log and its companions (`-wal`, `-shm`, the vault's
//! `-vault-keys`) are created readable by their owner only, whatever the umask; every file
//! named on the command line is read up to a bound, and one past it (`/dev/zero`) is refused
//! with a clear error, writing nothing.

use crate::cli::{charge_args, start_sim, temp};
use crate::serve::{Serve, create_key};
use base64::Engine as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// The log's file and each companion of it that exists now.
fn log_files(db: &Path) -> Vec<PathBuf> {
    let mut files = vec![db.to_owned()];
    for suffix in ["-wal", "-shm", "-vault-keys"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = PathBuf::from(name);
        if path.exists() {
            files.push(path);
        }
    }
    files
}

fn assert_owner_only(db: &Path) {
    for file in log_files(db) {
        assert_eq!(mode(&file), 0o600, "{} must be readable by its owner only", file.display());
    }
}

#[test]
fn a_charge_with_the_vault_creates_the_log_and_its_keys_file_owner_only() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["--json", "--provider", sim.url()])
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env("KEEL_VAULT_KEY", key)
        .args(charge_args("files_vault_charge", "4900"))
        .output()
        .expect("keel runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let keys = store::vault::keys_path(&db);
    assert!(keys.exists(), "the vault kept the payment method's data key");
    assert_owner_only(&db);
    let slots = std::fs::read(&keys).expect("the keys file");
    assert!(slots[32..].iter().all(|&byte| byte == 0), "the charge is final: its data key is shredded");
}

#[test]
fn keys_create_and_serve_create_the_log_owner_only() {
    let (dir, db) = temp();
    create_key(&db, testkit::sample::TENANT, "submit", "files-key");
    assert_owner_only(&db);
    let served = dir.path().join("served.db");
    let sim = start_sim(dir.path(), None);
    let serve = Serve::start(&served, &sim, &[]);
    let files = log_files(&served);
    assert!(files.len() >= 3, "the log, its -wal and -shm while serving: {files:?}");
    assert_owner_only(&served);
    drop(serve);
}
