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

/// Runs `binary` with `args` under a 4 GiB address-space limit (`ulimit -v`): a read without
/// bound of `/dev/zero` dies of it within seconds instead of exhausting the machine. Its
/// stdin is `/dev/zero` too.
fn run_bounded(binary: &str, args: &[&str]) -> (i32, String) {
    let mut script = String::from("ulimit -v 4194304; exec \"$0\"");
    for index in 1..=args.len() {
        script.push_str(&format!(" \"${{{index}}}\""));
    }
    let zeros = std::fs::File::open("/dev/zero").expect("/dev/zero");
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(binary)
        .args(args)
        .stdin(zeros)
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env_remove("KEEL_POLICY")
        .env_remove("KEEL_VAULT_KEY")
        .output()
        .expect("sh runs");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A FIFO at `path` fed zeros forever by a thread: a file whose metadata says nothing of its
/// length, and whose end never comes.
fn endless_fifo(path: &Path) {
    let made = Command::new("mkfifo").args(["-m", "600"]).arg(path).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo");
    let path = path.to_owned();
    std::thread::spawn(move || {
        use std::io::Write as _;
        if let Ok(mut fifo) = std::fs::OpenOptions::new().write(true).open(&path) {
            while fifo.write_all(&[0u8; 65_536]).is_ok() {}
        }
    });
}

/// Whether a refusal names `file` and says it was larger than a bound.
fn names_file_and_bound(stderr: &str, file: &str) -> bool {
    stderr.contains(file) && (stderr.contains("more than") || stderr.contains("larger than"))
}

#[test]
fn every_file_named_on_the_command_line_is_read_up_to_its_bound_and_refused_past_it() {
    let (dir, db) = temp();
    let db_arg = db.to_str().expect("a UTF-8 path");
    let fifo = dir.path().join("key.fifo");
    endless_fifo(&fifo);
    let fifo_arg = fifo.to_str().expect("a UTF-8 path");
    let provider = ["--provider", "http://127.0.0.1:9"];
    let zero = "/dev/zero";
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (zero, [&provider[..], &["charge", "--input", zero]].concat()),
        (zero, [&provider[..], &["refund", "--input", zero]].concat()),
        ("stdin", [&provider[..], &["charge", "--input", "-"]].concat()),
        (zero, vec!["facts", "apply", "conv-1", "--message", "a=b", "--candidates", zero]),
        ("stdin", vec!["facts", "apply", "conv-1", "--message", "a=b", "--candidates", "-"]),
        (zero, [&provider[..], &["agent", "run", "support", "--transcript", zero]].concat()),
        (zero, vec!["agent", "run", "ticket-review", "--transcript", zero]),
        (zero, [&provider[..], &["agent", "run", "support", "--scenario", "refund", "--ticket", zero]].concat()),
        (zero, [&provider[..], &["serve", "--addr", "127.0.0.1:0", "--tls-cert", zero, "--tls-key", zero]].concat()),
        (zero, [&provider[..], &["--policy", zero, "charge"], &charge_args("bounded", "100")[1..]].concat()),
        (fifo_arg, [&provider[..], &["--vault-key-file", fifo_arg], &charge_args("bounded", "100")[..]].concat()),
    ];
    for (file, args) in cases {
        let args = [&["--db", db_arg][..], &args].concat();
        let (code, stderr) = run_bounded(env!("CARGO_BIN_EXE_keel"), &args);
        assert_eq!(code, 64, "keel {args:?} must be refused as bad input: {stderr}");
        assert!(names_file_and_bound(&stderr, file), "keel {args:?} names the file and its bound: {stderr}");
        assert!(!db.exists(), "keel {args:?} wrote the log");
    }
    let (code, stderr) =
        run_bounded(env!("CARGO_BIN_EXE_keel-provider-sim"), &["serve", "--db", db_arg, "--faults", zero]);
    assert_ne!(code, 0, "{stderr}");
    assert!(names_file_and_bound(&stderr, zero), "the simulator names the plan and its bound: {stderr}");
    assert!(!db.exists(), "the simulator wrote its database");
}

#[test]
fn a_new_vault_key_file_past_its_bound_is_refused_and_the_log_is_unchanged() {
    let (dir, db) = temp();
    let key = base64::engine::general_purpose::STANDARD.encode([4u8; 32]);
    create_key(&db, testkit::sample::TENANT, "read", "rotate-bound");
    let before = std::fs::read(&db).expect("the log");
    let fifo = dir.path().join("new.fifo");
    endless_fifo(&fifo);
    let key_file = dir.path().join("current.key");
    std::fs::write(&key_file, key).expect("writes the key");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let path = |file: &Path| file.to_str().expect("a UTF-8 path").to_owned();
    let (code, stderr) = run_bounded(
        env!("CARGO_BIN_EXE_keel"),
        &["--db", &path(&db), "--vault-key-file", &path(&key_file), "vault", "rotate", "--new-key-file", &path(&fifo)],
    );
    assert_eq!(code, 64, "{stderr}");
    assert!(names_file_and_bound(&stderr, "new.fifo"), "{stderr}");
    assert!(std::fs::read(&db).expect("the log") == before, "the log's file is unchanged");
    let wal = std::fs::metadata(dir.path().join("keel.db-wal")).map_or(0, |meta| meta.len());
    assert_eq!(wal, 0, "nothing was appended to the WAL");
}
