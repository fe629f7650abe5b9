//! TLS to a collector started with `--tls-cert` (`stallscope agent --tls-ca FILE
//! [--tls-name NAME]`, and the viewers: `stallscope feed`, `stallscope top --collector`).
//!
//! The challenge keeps the token off the network; TLS also keeps the records and the live
//! model private and unaltered on a network that is not trusted. The client trusts only the
//! certificates in `--tls-ca` (the collector's own self-signed certificate, or the CA that
//! signed it), not the system's store: a job's collector is not a public web site, and a
//! certificate from any public CA for the same name must not pass for it.
//!
//! Failures are said in the user's terms, naming the flag to change: a certificate not signed
//! by the given CA, one for another name, a collector that does not speak TLS.

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// What a TLS client of the collector needs: whom to trust and the name to expect.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    ca: PathBuf,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("ca", &self.ca)
            .field("name", &self.name)
            .finish()
    }
}

/// Why `--tls-ca` or `--tls-name` cannot be used; the message names the file or name.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(String);

/// The host part of `HOST:PORT` (`[v6]:PORT` too): the name the collector's certificate is
/// checked against by default.
pub fn host_of(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => addr,
    };
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

impl TlsClient {
    /// Trusts the certificates in `ca` (PEM) for a collector at `addr` (HOST:PORT), whose
    /// certificate must be for `name` (default: the host part of `addr`; an IP address is
    /// checked against the certificate's IP addresses).
    pub fn new(ca: &Path, name: Option<&str>, addr: &str) -> Result<TlsClient, TlsSetupError> {
        let what = |e: String| {
            TlsSetupError(format!(
                "cannot read certificates from --tls-ca {}: {e}",
                ca.display()
            ))
        };
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| what(pem_error(e)))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| what(pem_error(e)))?;
        if certs.is_empty() {
            return Err(what(
                "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| what(format!("a certificate that cannot be trusted: {e}")))?;
        }
        let name_text = name.unwrap_or_else(|| host_of(addr)).to_string();
        let name = ServerName::try_from(name_text.clone()).map_err(|_| {
            TlsSetupError(format!(
                "{name_text:?} is neither a DNS name nor an IP address: give the name in the collector's certificate with --tls-name"
            ))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError(format!("TLS cannot be set up: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsClient {
            config: Arc::new(config),
            name,
            ca: ca.to_path_buf(),
        })
    }

    /// The name the collector's certificate must hold.
    pub fn name(&self) -> String {
        self.name.to_str().into_owned()
    }

    /// The TLS handshake over `tcp` (async, for the shipper); `Err` says why for the user.
    pub async fn connect(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(self.name.clone(), tcp)
            .await
            .map_err(|e| self.explain(&e))
    }

    /// The TLS handshake over `tcp` (blocking, for the viewers), done before it returns so
    /// that a refused certificate is said at once; `Err` says why for the user.
    pub fn connect_sync(
        &self,
        mut tcp: std::net::TcpStream,
    ) -> Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>, String> {
        let mut conn = rustls::ClientConnection::new(self.config.clone(), self.name.clone())
            .map_err(|e| format!("TLS cannot start: {e}"))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).map_err(|e| self.explain(&e))?;
        }
        Ok(rustls::StreamOwned::new(conn, tcp))
    }

    /// A failed TLS handshake as the user should read it: what is wrong and which flag fixes it.
    pub fn explain(&self, e: &std::io::Error) -> String {
        let ca = self.ca.display();
        let name = self.name();
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => format!(
                    "the collector closed the connection during the TLS handshake ({e}): is it started with --tls-cert?"
                ),
                _ => format!("TLS handshake failed: {e}"),
            };
        };
        use rustls::CertificateError as C;
        match tls {
            rustls::Error::InvalidCertificate(C::NotValidForName)
            | rustls::Error::InvalidCertificate(C::NotValidForNameContext { .. }) => format!(
                "the collector's certificate is not for {name}: {tls} (give the agent --tls-name with a name the certificate holds, or make the certificate with subjectAltName={name})"
            ),
            rustls::Error::InvalidCertificate(C::Expired)
            | rustls::Error::InvalidCertificate(C::ExpiredContext { .. })
            | rustls::Error::InvalidCertificate(C::NotValidYet)
            | rustls::Error::InvalidCertificate(C::NotValidYetContext { .. }) => format!(
                "the collector's certificate is out of its validity period: {tls} (make a new one, or check this node's clock)"
            ),
            rustls::Error::InvalidCertificate(C::Other(o))
                if o.to_string().contains("CaUsedAsEndEntity") =>
            {
                format!(
                    "the collector's certificate is a CA certificate (basicConstraints CA:TRUE, openssl req -x509's default) and cannot be a server's: make it with -addext basicConstraints=critical,CA:FALSE ({tls})"
                )
            }
            rustls::Error::InvalidCertificate(_) => format!(
                "the collector's certificate is not signed by --tls-ca {ca}: {tls}"
            ),
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => format!(
                "the collector does not speak TLS ({tls}): start it with --tls-cert and --tls-key, or leave out --tls-ca"
            ),
            _ => format!("TLS handshake with the collector failed: {tls}"),
        }
    }
}

/// A PEM error as a user reads it (an unreadable file says why, in the OS's words).
fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(e) => e.to_string(),
        rustls_pki_types::pem::Error::NoItemsFound => "it holds no PEM certificate".into(),
        other => format!("not valid PEM ({other})"),
    }
}

/// A byte stream a blocking viewer reads: plain TCP, or TLS over it.
pub trait SyncStream: Read + Write + Send {}
impl<T: Read + Write + Send> SyncStream for T {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_name_is_the_host_of_the_collectors_address() {
        assert_eq!(host_of("collector.example:7571"), "collector.example");
        assert_eq!(host_of("10.0.0.5:7571"), "10.0.0.5");
        assert_eq!(host_of("[fd00::5]:7571"), "fd00::5");
        assert_eq!(host_of("collector"), "collector");
        let ip = ServerName::try_from(host_of("10.0.0.5:7571").to_string()).unwrap();
        assert!(matches!(ip, ServerName::IpAddress(_)), "{ip:?}");
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = TlsClient::new(&missing, None, "localhost:7571").unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "cannot read certificates from --tls-ca {}",
                missing.display()
            )),
            "{err}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = TlsClient::new(&empty, None, "localhost:7571").unwrap_err();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
    }
}
