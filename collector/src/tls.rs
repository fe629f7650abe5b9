//! TLS for the collector's port (`stallscope collector --tls-cert FILE --tls-key FILE`).
//!
//! The challenge (an HMAC of a fresh nonce, [`stallscope_analysis::wire::prove`]) already
//! keeps the token off the network, but without TLS everything after it — the records, the
//! live model a viewer is sent — crosses the network in the clear and a man in the middle
//! could alter it. On a network that is not trusted the collector can be given a certificate:
//! every connection then starts with a TLS handshake and the stallscope protocol runs inside
//! it. rustls with the *ring* provider: no C toolchain or cmake at build time, and no OpenSSL
//! at run time.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate or key cannot be used; the message names the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(String);

/// The rustls configuration of a TLS collector: the certificate chain in `cert` (PEM, the
/// collector's certificate first) and its private key in `key` (PEM: PKCS#8, PKCS#1 or SEC1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let certs = read_certs(cert, "--tls-cert")?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        let why = match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "it holds no PEM private key (-----BEGIN PRIVATE KEY-----)".into()
            }
            e => pem_error(e),
        };
        TlsSetupError(format!(
            "cannot read a private key from --tls-key {}: {why}",
            key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError(format!("TLS cannot be set up: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            TlsSetupError(format!(
                "the key in --tls-key {} does not go with the certificate in --tls-cert {}: {e}",
                key.display(),
                cert.display()
            ))
        })?;
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (at least one); `flag` names the option it came from.
pub fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let what = |e: String| {
        TlsSetupError(format!(
            "cannot read certificates from {flag} {}: {e}",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| what(pem_error(e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| what(pem_error(e)))?;
    if certs.is_empty() {
        return Err(what(
            "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(certs)
}

/// A PEM error as a user reads it (an unreadable file says why, the OS's words).
fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(e) => e.to_string(),
        rustls_pki_types::pem::Error::NoItemsFound => "it holds no PEM certificate".into(),
        other => format!("not valid PEM ({other})"),
    }
}

/// Why a TLS handshake with a peer failed, as the collector's log says it: which side
/// refused and what the peer should change.
pub fn explain_accept(e: &std::io::Error) -> String {
    let tls = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::AlertReceived(alert)) => format!(
            "the peer refused this collector's certificate in the TLS handshake ({alert:?}): check its --tls-ca and --tls-name"
        ),
        Some(rustls::Error::InvalidMessage(_)) | Some(rustls::Error::InappropriateMessage { .. }) => {
            format!("the peer does not speak TLS ({e}): give the agent or viewer --tls-ca, since this collector uses --tls-cert")
        }
        _ => format!("no TLS handshake ({e})"),
    }
}
