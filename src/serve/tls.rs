//! `keel serve --tls-cert FILE --tls-key FILE`: HTTPS with rustls.
//!
//! Owns [`Tls::load`] (the certificate chain and private key read from PEM files and checked
//! to belong together before anything listens: a file that is missing, holds no certificate or
//! no key, or a key that does not match the certificate, is a clear error at start) and
//! [`Tls::accept`], the handshake `serve::listen` runs on each accepted connection before it
//! hands it to the same router plain HTTP uses. TLS 1.2 and 1.3, ring's cipher suites, no
//! client certificates.
//!
//! It never logs or echoes a key's bytes, and never decides anything about a request: a
//! handshake that fails ends that connection only.

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

/// A checked TLS configuration, ready to accept connections.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls { .. }")
    }
}

/// Why a certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Unreadable {
        /// `--tls-cert` or `--tls-key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no PEM item of the kind expected.
    #[error("{} holds no {expected} in PEM form ({detail})", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        expected: &'static str,
        /// The parser's reason.
        detail: String,
    },
    /// rustls refused the pair (a key that does not match the certificate, an unsupported key).
    #[error("the certificate in {} and the key in {} cannot be used together: {detail}", cert.display(), key.display())]
    Refused {
        /// `--tls-cert`.
        cert: PathBuf,
        /// `--tls-key`.
        key: PathBuf,
        /// rustls's reason.
        detail: String,
    },
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::File::open(path)
        .and_then(|file| engine::limits::read_at_most(file, engine::limits::TLS_PEM_FILE_MAX_BYTES))
        .map_err(|source| TlsError::Unreadable { what, path: path.to_owned(), source })
}

impl Tls {
    /// Reads the certificate chain in `cert` and the private key in `key` (PEM) and checks
    /// that they belong together.
    ///
    /// # Errors
    ///
    /// [`TlsError`] saying which file and why; nothing listens.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = read("--tls-cert", cert)?;
        let not_pem =
            |path: &Path, expected, detail: String| TlsError::NotPem { path: path.to_owned(), expected, detail };
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| not_pem(cert, "certificate", e.to_string()))?;
        if chain.is_empty() {
            return Err(not_pem(cert, "certificate", "no CERTIFICATE section".to_owned()));
        }
        let key_pem = read("--tls-key", key)?;
        let private =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| not_pem(key, "private key", e.to_string()))?;
        let refused = |detail: String| TlsError::Refused { cert: cert.to_owned(), key: key.to_owned(), detail };
        let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| refused(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| refused(e.to_string()))?;
        Ok(Self { acceptor: TlsAcceptor::from(Arc::new(config)) })
    }
}

impl Tls {
    /// The TLS handshake on an accepted connection (the caller bounds how long it takes).
    pub fn accept(&self, tcp: TcpStream) -> tokio_rustls::Accept<TcpStream> {
        self.acceptor.accept(tcp)
    }
}
