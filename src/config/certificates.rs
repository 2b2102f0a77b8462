//! `tls:` (the proxy listener's certificates, ACME, client certificates) and `http_listen:`,
//! checked at load: every file is read and every certificate matched with its key here, so a
//! reload with a bad file is refused and the server gets ready-built rustls objects.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;

use super::file::{AcmeFile, ClientAuthFile, TlsFile};
use super::validate::Validator;
use crate::tls;
use crate::tls::certs::{Certificate, Issued, Resolver, Table};

/// The proxy listener's TLS: its certificates from files, those ACME orders, and the client
/// certificates it asks for. Built only by the config's validation.
#[derive(Clone)]
pub struct TlsConfig {
    /// Each file certificate's `(cert, key)` files, in the order of `table`.
    files: Vec<(PathBuf, PathBuf)>,
    table: Arc<Table>,
    /// Presented before anything is issued when no file certificate is given (ACME only): a
    /// self-signed certificate made at load.
    fallback: Option<Arc<CertifiedKey>>,
    client_auth: Option<ClientAuth>,
    /// `tls.acme`.
    pub acme: Option<AcmeConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("files", &self.files)
            .field("client_auth", &self.client_auth)
            .field("acme", &self.acme)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// The certificates read from files, in the config's order.
    pub fn file_certificates(&self) -> &[Arc<Certificate>] {
        self.table.certificates()
    }

    /// The listener's rustls config: the files' certificates, then those in `issued` (ACME's),
    /// client certificates as `tls.client_auth` says, ALPN `h2`, `http/1.1`.
    pub fn server_config(&self, issued: &Issued) -> Arc<rustls::ServerConfig> {
        tls::listener_config(Arc::new(self.resolver(issued)), self.verifier())
    }

    /// What chooses a handshake's certificate.
    pub fn resolver(&self, issued: &Issued) -> Resolver {
        Resolver::new(self.table.clone(), issued.clone(), self.fallback.clone())
    }

    fn verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.client_auth.as_ref().map(|c| c.verifier.clone())
    }

    /// `tls.client_auth`, if set.
    pub fn client_auth(&self) -> Option<&ClientAuth> {
        self.client_auth.as_ref()
    }

    /// True when a certificate floodgate holds (a file's or one in `issued`) is valid for
    /// `name`, a DNS name or an IP address (IP SANs for addresses).
    pub fn serves(&self, name: &str, issued: &Issued) -> bool {
        let Ok(server_name) = rustls::pki_types::ServerName::try_from(name) else {
            return false;
        };
        let verifies = |c: &Arc<Certificate>| {
            c.certified_key().end_entity_cert().is_ok_and(|leaf| {
                webpki::EndEntityCert::try_from(leaf)
                    .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&server_name).is_ok())
            })
        };
        self.table.certificates().iter().any(verifies)
            || issued.load().certificates().iter().any(verifies)
    }
}

/// `tls.client_auth`: client certificates verified against `ca`.
#[derive(Clone)]
pub struct ClientAuth {
    pub ca: PathBuf,
    /// A handshake without a valid certificate fails.
    pub required: bool,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("ca", &self.ca)
            .field("required", &self.required)
            .finish()
    }
}

/// `tls.acme`: certificates ordered from an ACME CA (RFC 8555).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeConfig {
    pub directory: String,
    pub email: Option<String>,
    /// Given in the config; none: every exact name in the routes' hosts.
    pub domains: Option<Vec<String>>,
    pub challenge: AcmeChallenge,
    /// The CA certificate the directory's HTTPS certificate chains to (a test CA's).
    pub ca: Option<PathBuf>,
    /// Where the account and certificates are kept on the memory store.
    pub dir: Option<PathBuf>,
}

/// How the CA checks that floodgate serves a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcmeChallenge {
    /// A token at `http://NAME/.well-known/acme-challenge/` (on `http_listen`).
    Http01,
    /// A certificate made for the challenge, on `listen` with ALPN `acme-tls/1` (RFC 8737).
    TlsAlpn01,
}

impl AcmeChallenge {
    pub fn as_str(self) -> &'static str {
        match self {
            AcmeChallenge::Http01 => "http-01",
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
        }
    }
}

/// `upstream_tls:` on a route: how its `https://` upstreams are reached. Files read at load.
#[derive(Clone)]
pub struct UpstreamTls {
    /// The roots the upstream's certificate must chain to; none: `upstream_ca`, else the
    /// system's.
    pub roots: Option<Arc<rustls::RootCertStore>>,
    /// The certificate chain and key presented to the upstream.
    pub client: Option<(
        Vec<rustls::pki_types::CertificateDer<'static>>,
        Arc<rustls::pki_types::PrivateKeyDer<'static>>,
    )>,
    /// Sent as SNI and verified in the upstream's certificate instead of the URL's host.
    pub server_name: Option<rustls::pki_types::ServerName<'static>>,
    /// The files, as the config names them (for the reload's comparison and `Debug`).
    files: [Option<PathBuf>; 3],
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("files", &self.files)
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Validator {
    /// A route's `upstream_tls` at `path`.
    pub(super) fn upstream_tls(
        &mut self,
        path: &str,
        t: super::file::UpstreamTlsFile,
    ) -> Option<UpstreamTls> {
        let before = self.problems.len();
        let roots = t.ca.as_ref().and_then(|ca| {
            tls::root_store(std::path::Path::new(ca))
                .map_err(|m| self.problem(format!("{path}.ca"), m))
                .ok()
                .map(Arc::new)
        });
        let client = match (&t.cert, &t.key) {
            (Some(cert), Some(key)) => {
                match tls::file_certificate(std::path::Path::new(cert), std::path::Path::new(key)) {
                    Ok(_) => {
                        // Checked to match; kept as rustls' client side takes them.
                        let chain = tls::certificates(std::path::Path::new(cert)).ok();
                        let key = tls::private_key(std::path::Path::new(key)).ok();
                        chain.zip(key).map(|(c, k)| (c, Arc::new(k)))
                    }
                    Err(problems) => {
                        for p in problems {
                            self.problem(format!("{path}.{}", p.field), p.message);
                        }
                        None
                    }
                }
            }
            (None, None) => None,
            (Some(_), None) => {
                self.problem(format!("{path}.key"), "`cert` needs its `key`");
                None
            }
            (None, Some(_)) => {
                self.problem(format!("{path}.cert"), "`key` needs its `cert`");
                None
            }
        };
        let server_name = t.server_name.as_ref().and_then(|name| {
            rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|_| {
                    self.problem(
                        format!("{path}.server_name"),
                        format!("{name:?} is not a DNS name or an address"),
                    )
                })
                .ok()
        });
        (self.problems.len() == before).then(|| UpstreamTls {
            roots,
            client,
            server_name,
            files: [t.ca, t.cert, t.key].map(|f| f.map(PathBuf::from)),
        })
    }

    /// `tls:`.
    pub(super) fn tls(&mut self, t: TlsFile) -> Option<TlsConfig> {
        let before = self.problems.len();
        let mut pairs = Vec::new();
        match (t.cert, t.key) {
            (Some(cert), Some(key)) => pairs.push(("tls".to_owned(), cert, key)),
            (None, None) => {}
            (Some(_), None) => self.problem("tls.key", "`cert` needs its `key`"),
            (None, Some(_)) => self.problem("tls.cert", "`key` needs its `cert`"),
        }
        for (i, c) in t.certificates.into_iter().enumerate() {
            pairs.push((format!("tls.certificates[{i}]"), c.cert, c.key));
        }
        let acme = t.acme.and_then(|a| self.acme(a));
        if pairs.is_empty() && acme.is_none() && self.problems.len() == before {
            self.problem(
                "tls",
                "give `cert` and `key`, `certificates`, or `acme`: no certificate to serve",
            );
        }
        let mut files = Vec::new();
        let mut certificates = Vec::new();
        for (path, cert, key) in pairs {
            let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
            match tls::file_certificate(&cert, &key) {
                Ok(c) => {
                    if c.names().is_empty() {
                        tracing::debug!(cert = %cert.display(), "a certificate names no DNS name: it serves only as the default");
                    }
                    certificates.push(Arc::new(c));
                    files.push((cert, key));
                }
                Err(problems) => {
                    for p in problems {
                        self.problem(format!("{path}.{}", p.field), p.message);
                    }
                }
            }
        }
        let client_auth = t.client_auth.and_then(|c| self.client_auth(c));
        if self.problems.len() > before {
            return None;
        }
        let fallback = match certificates.is_empty() {
            true => Some(self_signed_fallback()?),
            false => None,
        };
        Some(TlsConfig {
            files,
            table: Arc::new(Table::new(certificates)),
            fallback,
            client_auth,
            acme,
        })
    }

    fn client_auth(&mut self, c: ClientAuthFile) -> Option<ClientAuth> {
        let required = c.required.unwrap_or(false);
        let ca = PathBuf::from(c.ca);
        match tls::client_verifier(&ca, required) {
            Ok(verifier) => Some(ClientAuth {
                ca,
                required,
                verifier,
            }),
            Err(message) => {
                self.problem("tls.client_auth.ca", message);
                None
            }
        }
    }

    fn acme(&mut self, a: AcmeFile) -> Option<AcmeConfig> {
        let before = self.problems.len();
        match a.directory.parse::<http::Uri>() {
            Ok(u) if u.scheme_str() == Some("https") && u.host().is_some() => {}
            Ok(_) => self.problem(
                "tls.acme.directory",
                format!(
                    "{:?}: an ACME directory is served over https (RFC 8555 §6.1)",
                    a.directory
                ),
            ),
            Err(e) => self.problem("tls.acme.directory", format!("{:?}: {e}", a.directory)),
        }
        let challenge = match a.challenge.as_deref() {
            None | Some("http-01") => AcmeChallenge::Http01,
            Some("tls-alpn-01") => AcmeChallenge::TlsAlpn01,
            Some(other) => {
                self.problem(
                    "tls.acme.challenge",
                    format!("{other:?} is not http-01 or tls-alpn-01"),
                );
                AcmeChallenge::Http01
            }
        };
        if let Some(domains) = &a.domains {
            if domains.is_empty() {
                self.problem(
                    "tls.acme.domains",
                    "name at least one domain, or leave it out (every exact host of the routes)",
                );
            }
            for (i, d) in domains.iter().enumerate() {
                if let Err(why) = acme_domain(d) {
                    self.problem(format!("tls.acme.domains[{i}]"), why);
                }
            }
        }
        if let Some(email) = &a.email
            && !email.contains('@')
        {
            self.problem(
                "tls.acme.email",
                format!("{email:?} is not an email address"),
            );
        }
        let ca = a.ca.map(PathBuf::from);
        if let Some(ca) = &ca
            && let Err(message) = tls::root_store(ca)
        {
            self.problem("tls.acme.ca", message);
        }
        (self.problems.len() == before).then(|| AcmeConfig {
            directory: a.directory,
            email: a.email,
            domains: a
                .domains
                .map(|d| d.into_iter().map(|d| d.to_ascii_lowercase()).collect()),
            challenge,
            ca,
            dir: a.dir.map(PathBuf::from),
        })
    }
}

/// Whether `name` can be ordered: a DNS name of letters, digits and hyphens (no wildcard: the
/// challenges floodgate answers cannot prove one, RFC 8555 §7.1.3 asks DNS-01 for it).
pub fn acme_domain(name: &str) -> Result<(), String> {
    if name.starts_with("*.") {
        return Err(format!(
            "{name:?}: a wildcard needs the DNS-01 challenge, which floodgate does not answer"
        ));
    }
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.contains('.')
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    match ok {
        true => Ok(()),
        false => Err(format!("{name:?} is not a DNS name (like api.example.com)")),
    }
}

/// A self-signed certificate for `floodgate.invalid`: what a handshake gets before ACME's first
/// certificate is issued, as Traefik's default certificate.
fn self_signed_fallback() -> Option<Arc<CertifiedKey>> {
    let key = rcgen::KeyPair::generate().ok()?;
    let params = rcgen::CertificateParams::new(vec!["floodgate.invalid".to_owned()]).ok()?;
    let cert = params.self_signed(&key).ok()?;
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).ok()?;
    Certificate::new(vec![cert.der().clone()], der, &tls::crypto_provider())
        .ok()
        .map(|c| c.certified_key().clone())
}
