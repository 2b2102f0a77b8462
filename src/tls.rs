//! TLS material named in the config: the proxy listener's certificate and key (`tls:`), the
//! roots trusted for HTTPS upstreams (`upstream_ca:`), and (through `limiter::postgres::url`)
//! the files a PostgreSQL URL names (`sslrootcert`, `sslcert`, `sslkey`). Files are read and
//! checked when the config is loaded, so `floodgate check` names a bad file by its field and the
//! server and forwarder get ready-built rustls objects. Relative paths are relative to the
//! working directory.
//!
//! PEM is parsed with `rustls::pki_types::pem::PemObject` (rustls-pemfile is unmaintained).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ResolvesServerCert;
use rustls::server::danger::ClientCertVerifier;
use rustls::{RootCertStore, ServerConfig};

pub mod certs;

use certs::{Certificate, CertificateError};

/// ALPN protocols the proxy listener offers, in order of preference.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The crypto provider of every rustls config floodgate builds: aws-lc-rs, named explicitly so
/// that no process-wide default has to be installed or guessed.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A TLS client config trusting `roots`, with no client certificate.
pub fn client_config(roots: impl Into<Arc<RootCertStore>>) -> rustls::ClientConfig {
    client_builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// Every TLS client config's start (aws-lc-rs, default protocol versions), for a caller that
/// verifies the server or authenticates itself otherwise than [`client_config`].
pub fn client_builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
    rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports the default TLS versions")
}

/// A connector for HTTP/1.1 to `peer` (what it is for, as [`system_roots`] names it) over
/// `http://`, or `https://` verified against the system's roots: the OTLP exporter's and the
/// alert webhooks'.
pub fn https_or_http(
    peer: &str,
    connect_timeout: Option<std::time::Duration>,
) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(connect_timeout);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config(system_roots(peer)))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// The system's root certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured). With none
/// readable, an empty store, and a warning that TLS to `peer` (what the roots are for) will fail.
pub fn system_roots(peer: &str) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "a system root certificate could not be read");
    }
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!("no system root certificates: TLS to {peer} will fail");
    }
    roots
}

/// The name a verified client certificate gives its client (`identity.client_cert`): its first
/// DNS or URI subject alternative name, else its subject's common name. Carried in each of the
/// connection's requests' extensions. It is the client's own text: logs show it escaped
/// (`{:?}`), the access log only its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerName(Arc<str>);

impl PeerName {
    /// The name of the certificate `leaf` (already verified by the handshake); none when it
    /// names nothing usable (no SAN of those kinds, no UTF-8 common name, or longer than 255
    /// bytes).
    pub fn of(leaf: &CertificateDer<'_>) -> Option<PeerName> {
        use x509_parser::prelude::*;
        let (_, cert) = X509Certificate::from_der(leaf).ok()?;
        let san = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .and_then(|san| {
                san.value.general_names.iter().find_map(|name| match name {
                    GeneralName::DNSName(n) | GeneralName::URI(n) => Some(n.to_string()),
                    _ => None,
                })
            });
        let name = san.or_else(|| {
            cert.subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_owned)
        })?;
        (!name.is_empty() && name.len() <= 255).then(|| PeerName(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One problem with a TLS file: which field (`cert`, `key`) and what is wrong.
#[derive(Debug)]
pub(super) struct TlsProblem {
    pub field: &'static str,
    pub message: String,
}

impl TlsProblem {
    fn new(field: &'static str, message: String) -> Self {
        TlsProblem { field, message }
    }
}

/// Reads a certificate chain and its private key, checked to belong together. Reports every
/// problem found, each with its field (`cert`, `key`).
pub(crate) fn file_certificate(cert: &Path, key: &Path) -> Result<Certificate, Vec<TlsProblem>> {
    let certs = certificates(cert).map_err(|m| TlsProblem::new("cert", m));
    let key_der = private_key(key).map_err(|m| TlsProblem::new("key", m));
    let (certs, key_der) = match (certs, key_der) {
        (Ok(certs), Ok(key_der)) => (certs, key_der),
        (certs, key_der) => {
            return Err([certs.err(), key_der.err()].into_iter().flatten().collect());
        }
    };
    Certificate::new(certs, key_der, &crypto_provider()).map_err(|e| {
        vec![match e {
            CertificateError::KeyMismatch => TlsProblem::new(
                "key",
                format!(
                    "{} does not match the certificate in {}",
                    key.display(),
                    cert.display()
                ),
            ),
            CertificateError::Key(e) => TlsProblem::new(
                "key",
                format!("{}: unusable private key: {e}", key.display()),
            ),
            e => TlsProblem::new("cert", format!("{}: {e}", cert.display())),
        }]
    })
}

/// A verifier of client certificates chaining to the CAs in `ca`; `required: false` lets a
/// client without one through (and still refuses one that does not verify).
pub(crate) fn client_verifier(
    ca: &Path,
    required: bool,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let roots = root_store(ca)?;
    let builder = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        crypto_provider(),
    );
    let builder = match required {
        true => builder,
        false => builder.allow_unauthenticated(),
    };
    builder
        .build()
        .map_err(|e| format!("{}: no usable CA: {e}", ca.display()))
}

/// A listener's rustls config: certificates from `resolver`, client certificates verified by
/// `verifier` when given, ALPN `h2`, `http/1.1`.
pub fn listener_config(
    resolver: Arc<dyn ResolvesServerCert>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports the default TLS versions");
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// One certificate and key, and when `client_ca` is given, clients must present a certificate
/// that chains to one of its CAs (mutual TLS: the rate-limit service's `service.tls.client_ca`).
pub(crate) fn service_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, Vec<TlsProblem>> {
    let verifier = match client_ca {
        None => None,
        Some(path) => {
            Some(client_verifier(path, true).map_err(|m| vec![TlsProblem::new("client_ca", m)])?)
        }
    };
    let certificate = file_certificate(cert, key)?;
    let resolver = rustls::sign::SingleCertAndKey::from(certificate.certified_key().clone());
    Ok(listener_config(Arc::new(resolver), verifier))
}

/// Reads a PEM bundle of CA certificates into a root store for verifying upstreams.
pub(crate) fn root_store(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for (n, cert) in certificates(path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            format!(
                "certificate #{} in {} is not a usable CA certificate: {e}",
                n + 1,
                path.display()
            )
        })?;
    }
    Ok(roots)
}

/// Every `CERTIFICATE` block of a PEM file; at least one.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = crate::files::read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_problem(path, e))?;
    if certs.is_empty() {
        return Err(format!(
            "no certificate found in {} (expected PEM \"BEGIN CERTIFICATE\" blocks)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub(crate) fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = crate::files::read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        pem::Error::NoItemsFound => format!(
            "no private key found in {} (expected a PEM PKCS#8, PKCS#1 or SEC1 key)",
            path.display()
        ),
        e => pem_problem(path, e),
    })
}

fn pem_problem(path: &Path, e: pem::Error) -> String {
    match e {
        pem::Error::Io(e) => format!("cannot read {}: {e}", path.display()),
        e => format!("{} is not valid PEM: {e}", path.display()),
    }
}
