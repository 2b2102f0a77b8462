//! The proxy listener's certificates: several, each serving the names written in it (its
//! subject alternative names), chosen per handshake by the name the client asks for (SNI).
//!
//! A [`Table`] is built once per config load (the files) or per issuance (ACME's), never on a
//! handshake: choosing is one hash lookup for the exact name, then one for the wildcard that
//! covers it (`*.example.com` covers `api.example.com`, not `example.com` nor `a.b.example.com`,
//! as RFC 6125 §6.4.3 has it). A handshake with no SNI, or a name no certificate serves, gets the
//! first certificate: nginx's `default_server`, Caddy's and Traefik's default.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// One certificate chain and its key, with what was read from its leaf.
pub struct Certificate {
    /// Its DNS names, lowercased, wildcards as written (`*.example.com`).
    names: Vec<String>,
    /// The subject's common name, if any (shown when the certificate has no DNS name).
    common_name: Option<String>,
    /// Its validity, in seconds since the Unix epoch.
    not_before: i64,
    not_after: i64,
    key: Arc<CertifiedKey>,
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("names", &self.names)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Certificate {
    /// The chain `chain` (leaf first) and its private key, checked to belong together.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        provider: &CryptoProvider,
    ) -> Result<Certificate, CertificateError> {
        let leaf = chain.first().ok_or(CertificateError::Empty)?;
        let facts = Facts::read(leaf).map_err(CertificateError::Unreadable)?;
        let key = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => CertificateError::KeyMismatch,
            e => CertificateError::Key(e.to_string()),
        })?;
        Ok(Certificate {
            names: facts.names,
            common_name: facts.common_name,
            not_before: facts.not_before,
            not_after: facts.not_after,
            key: Arc::new(key),
        })
    }

    /// A chain and key in PEM (ACME's issued chain and the key made for it).
    pub fn from_pem(chain: &[u8], key: &[u8]) -> Result<Certificate, CertificateError> {
        use rustls::pki_types::pem::PemObject;
        let chain = CertificateDer::pem_slice_iter(chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertificateError::Unreadable(e.to_string()))?;
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| CertificateError::Key(e.to_string()))?;
        Certificate::new(chain, key, &super::crypto_provider())
    }

    /// Its DNS names, lowercased (`*.example.com` for a wildcard).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The name it is shown by: its first DNS name, else its subject's common name.
    pub fn label(&self) -> &str {
        self.names
            .first()
            .or(self.common_name.as_ref())
            .map_or("", String::as_str)
    }

    /// When it stops being valid, in seconds since the Unix epoch.
    pub fn not_after(&self) -> i64 {
        self.not_after
    }

    /// When it became valid, in seconds since the Unix epoch.
    pub fn not_before(&self) -> i64 {
        self.not_before
    }

    /// The chain and key rustls presents.
    pub fn certified_key(&self) -> &Arc<CertifiedKey> {
        &self.key
    }

    /// True when it serves `name` (lowercase): one of its names, or a wildcard covering it.
    pub fn covers(&self, name: &str) -> bool {
        self.names.iter().any(|n| {
            n == name || wildcard_of(name).is_some_and(|w| n.strip_prefix("*.") == Some(w))
        })
    }
}

/// Why a certificate and key cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateError {
    Empty,
    Unreadable(String),
    KeyMismatch,
    Key(String),
}

impl fmt::Display for CertificateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertificateError::Empty => f.write_str("no certificate"),
            CertificateError::Unreadable(e) => write!(f, "the certificate cannot be read: {e}"),
            CertificateError::KeyMismatch => f.write_str("the key does not match the certificate"),
            CertificateError::Key(e) => write!(f, "unusable private key: {e}"),
        }
    }
}

/// What the leaf says of itself.
struct Facts {
    names: Vec<String>,
    common_name: Option<String>,
    not_before: i64,
    not_after: i64,
}

impl Facts {
    fn read(leaf: &CertificateDer<'_>) -> Result<Facts, String> {
        use x509_parser::prelude::*;
        let (_, cert) = X509Certificate::from_der(leaf).map_err(|e| e.to_string())?;
        let mut names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                if let GeneralName::DNSName(dns) = name {
                    let dns = dns.to_ascii_lowercase();
                    if !names.contains(&dns) {
                        names.push(dns);
                    }
                }
            }
        }
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        Ok(Facts {
            names,
            common_name,
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }
}

/// The domain a wildcard for `name` would be written under: `example.com` for
/// `api.example.com`; none for a name of one label.
fn wildcard_of(name: &str) -> Option<&str> {
    let (_, parent) = name.split_once('.')?;
    parent.contains('.').then_some(parent)
}

/// Certificates by the names they serve.
#[derive(Debug, Default)]
pub struct Table {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the domain under the `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// Every certificate, in the order given.
    certificates: Vec<Arc<Certificate>>,
}

impl Table {
    /// The certificates `certificates`; where two serve one name, the earlier is chosen.
    pub fn new(certificates: Vec<Arc<Certificate>>) -> Table {
        let mut table = Table {
            certificates,
            ..Table::default()
        };
        for cert in &table.certificates {
            for name in &cert.names {
                let (map, name) = match name.strip_prefix("*.") {
                    Some(parent) => (&mut table.wildcard, parent),
                    None => (&mut table.exact, name.as_str()),
                };
                map.entry(name.to_owned())
                    .or_insert_with(|| cert.key.clone());
            }
        }
        table
    }

    /// Every certificate, in the order given.
    pub fn certificates(&self) -> &[Arc<Certificate>] {
        &self.certificates
    }

    fn exact(&self, name: &str) -> Option<&Arc<CertifiedKey>> {
        self.exact.get(name)
    }

    fn wildcard(&self, name: &str) -> Option<&Arc<CertifiedKey>> {
        self.wildcard.get(wildcard_of(name)?)
    }

    fn first(&self) -> Option<&Arc<CertifiedKey>> {
        self.certificates.first().map(|c| &c.key)
    }
}

/// Certificates issued while floodgate runs (ACME's), shared by every config loaded after.
pub type Issued = Arc<ArcSwap<Table>>;

/// Chooses the certificate for each handshake: an exact name among the files', then among those
/// issued, then a wildcard in the same order, then the first file's (else the first issued).
pub struct Resolver {
    files: Arc<Table>,
    issued: Issued,
    /// Presented when no certificate serves anything yet (ACME before its first issuance).
    fallback: Option<Arc<CertifiedKey>>,
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver")
            .field("files", &self.files.certificates.len())
            .finish_non_exhaustive()
    }
}

impl Resolver {
    pub fn new(files: Arc<Table>, issued: Issued, fallback: Option<Arc<CertifiedKey>>) -> Self {
        Resolver {
            files,
            issued,
            fallback,
        }
    }

    /// The certificate for a handshake that asked for `name` (none: no SNI).
    pub fn choose(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let issued = self.issued.load();
        if let Some(name) = name {
            let lower;
            let name = match name.bytes().any(|b| b.is_ascii_uppercase()) {
                true => {
                    lower = name.to_ascii_lowercase();
                    lower.as_str()
                }
                false => name,
            };
            let found = (self.files.exact(name))
                .or_else(|| issued.exact(name))
                .or_else(|| self.files.wildcard(name))
                .or_else(|| issued.wildcard(name));
            if let Some(key) = found {
                return Some(key.clone());
            }
        }
        (self.files.first())
            .or_else(|| issued.first())
            .or(self.fallback.as_ref())
            .cloned()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.choose(hello.server_name())
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[&str]) -> Arc<Certificate> {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let made = params.self_signed(&key).unwrap();
        let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        Arc::new(
            Certificate::new(
                vec![made.der().clone()],
                key,
                &super::super::crypto_provider(),
            )
            .unwrap(),
        )
    }

    fn chosen(resolver: &Resolver, name: Option<&str>) -> Vec<String> {
        let key = resolver.choose(name).expect("a certificate");
        let all = [
            resolver.files.certificates(),
            resolver.issued.load().certificates(),
        ]
        .concat();
        let found = all
            .iter()
            .find(|c| Arc::ptr_eq(&c.key, &key))
            .expect("one of the table's");
        found.names().to_vec()
    }

    #[test]
    fn an_exact_name_beats_a_wildcard_and_the_first_serves_what_nothing_names() {
        let files = Table::new(vec![
            cert(&["default.test"]),
            cert(&["*.example.test"]),
            cert(&["api.example.test"]),
        ]);
        let resolver = Resolver::new(Arc::new(files), Issued::default(), None);
        assert_eq!(
            chosen(&resolver, Some("api.example.test")),
            ["api.example.test"]
        );
        assert_eq!(
            chosen(&resolver, Some("API.Example.test")),
            ["api.example.test"]
        );
        assert_eq!(
            chosen(&resolver, Some("www.example.test")),
            ["*.example.test"]
        );
        // A wildcard covers one label only.
        assert_eq!(
            chosen(&resolver, Some("a.b.example.test")),
            ["default.test"]
        );
        assert_eq!(chosen(&resolver, Some("example.test")), ["default.test"]);
        assert_eq!(chosen(&resolver, None), ["default.test"]);
    }

    #[test]
    fn an_issued_certificate_serves_its_names_after_the_files_exact_ones() {
        let files = Table::new(vec![cert(&["*.example.test"]), cert(&["a.example.test"])]);
        let issued = Issued::default();
        let resolver = Resolver::new(Arc::new(files), issued.clone(), None);
        assert_eq!(
            chosen(&resolver, Some("b.example.test")),
            ["*.example.test"]
        );
        issued.store(Arc::new(Table::new(vec![
            cert(&["b.example.test"]),
            cert(&["a.example.test", "c.example.test"]),
        ])));
        assert_eq!(
            chosen(&resolver, Some("b.example.test")),
            ["b.example.test"]
        );
        assert_eq!(
            chosen(&resolver, Some("a.example.test")),
            ["a.example.test"]
        );
        assert_eq!(
            chosen(&resolver, Some("c.example.test")),
            ["a.example.test", "c.example.test"]
        );
    }

    #[test]
    fn with_no_file_the_issued_then_the_fallback_serve() {
        let fallback = cert(&["fallback.invalid"]);
        let issued = Issued::default();
        let resolver = Resolver::new(
            Arc::new(Table::default()),
            issued.clone(),
            Some(fallback.key.clone()),
        );
        assert!(Arc::ptr_eq(
            &resolver.choose(Some("x.test")).unwrap(),
            &fallback.key
        ));
        issued.store(Arc::new(Table::new(vec![cert(&["x.test"])])));
        assert_eq!(chosen(&resolver, Some("y.test")), ["x.test"]);
    }

    #[test]
    fn names_and_dates_are_read_from_the_certificate() {
        let c = cert(&["Api.Example.test", "*.example.test"]);
        assert_eq!(c.names(), ["api.example.test", "*.example.test"]);
        assert!(c.covers("api.example.test"));
        assert!(c.covers("www.example.test"));
        assert!(!c.covers("example.test"));
        assert!(c.not_after() > c.not_before());
        let other = cert(&["other.test"]);
        let mismatched = Certificate::new(
            c.key.cert.clone(),
            PrivateKeyDer::try_from(rcgen::KeyPair::generate().unwrap().serialize_der()).unwrap(),
            &super::super::crypto_provider(),
        );
        assert_eq!(mismatched.unwrap_err(), CertificateError::KeyMismatch);
        drop(other);
    }
}
