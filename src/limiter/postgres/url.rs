//! A PostgreSQL URL as libpq users write it, TLS parameters included, turned into what
//! tokio-postgres takes: its own `Config`, and the rustls client config when the URL asks for TLS.
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` and nothing of libpq's certificate
//! parameters, so these are taken out of the query string here:
//!
//! | parameter | floodgate |
//! | --- | --- |
//! | `sslmode=disable`, `allow`, `prefer` (the default) | plain connections (TLS only when the URL demands it) |
//! | `sslmode=require`, `verify-full` | TLS; the server's certificate verified against the roots and the URL's host |
//! | `sslmode=verify-ca` | TLS; the certificate verified against the roots, its host name not checked |
//! | `sslrootcert=FILE` | the roots: the CA certificates (PEM) in FILE; `system` or absent: the system's |
//! | `sslcert=FILE`, `sslkey=FILE` | a client certificate (PEM chain) and its key, for `cert` authentication |
//!
//! libpq's `require` encrypts without verifying unless a root file exists; floodgate never
//! connects to a server it cannot verify, so its `require` is `verify-full`. Files are read when
//! the config is loaded: a missing or malformed one is a config error naming `storage.url`.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;

use crate::tls;

/// What a PostgreSQL URL says: the driver's config, and TLS (`None`: plain connections).
pub struct Options {
    pub config: tokio_postgres::Config,
    pub tls: Option<rustls::ClientConfig>,
}

enum Verify {
    /// The chain and the host name.
    Full,
    /// The chain only.
    Ca,
}

/// Parses `url` (`postgres://…` or `postgresql://…`), reading the certificate files it names.
/// The error says what is wrong, never with the URL's password.
pub fn options(url: &str) -> Result<Options, String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut verify = None;
    let (mut root, mut cert, mut key) = (None, None, None);
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = || percent_decode(value).ok_or(format!("{name}: invalid percent-encoding"));
        match name {
            "sslmode" => {
                verify = match decoded()?.as_str() {
                    "disable" | "allow" | "prefer" => None,
                    "require" | "verify-full" => Some(Verify::Full),
                    "verify-ca" => Some(Verify::Ca),
                    other => {
                        return Err(format!(
                            "sslmode={other}: expected disable, allow, prefer, require, verify-ca or verify-full"
                        ));
                    }
                }
            }
            "sslrootcert" => root = Some(decoded()?),
            "sslcert" => cert = Some(decoded()?),
            "sslkey" => key = Some(decoded()?),
            _ => rest.push(pair),
        }
    }
    let driver_url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config: tokio_postgres::Config =
        driver_url.parse().map_err(|e: tokio_postgres::Error| {
            // The driver's own message is "invalid connection string"; its source says which part.
            match std::error::Error::source(&e) {
                Some(why) => format!("{e}: {why}"),
                None => e.to_string(),
            }
        })?;
    let Some(verify) = verify else {
        if root.is_some() || cert.is_some() || key.is_some() {
            return Err(
                "sslrootcert, sslcert and sslkey need TLS: add sslmode=verify-full (or verify-ca)"
                    .into(),
            );
        }
        config.ssl_mode(SslMode::Disable);
        return Ok(Options { config, tls: None });
    };
    config.ssl_mode(SslMode::Require);
    let roots = match root.as_deref() {
        None | Some("system") => tls::system_roots("PostgreSQL"),
        Some(path) => tls::root_store(Path::new(path)).map_err(|e| format!("sslrootcert: {e}"))?,
    };
    let builder = tls::client_builder();
    let builder = match verify {
        Verify::Full => builder.with_root_certificates(roots),
        Verify::Ca => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName::new(roots)?)),
    };
    let tls = match (cert, key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = tls::certificates(Path::new(&cert)).map_err(|e| format!("sslcert: {e}"))?;
            let key_der = tls::private_key(Path::new(&key)).map_err(|e| format!("sslkey: {e}"))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("sslkey {key} does not fit sslcert {cert}: {e}"))?
        }
        _ => return Err("sslcert and sslkey go together: give both, or neither".into()),
    };
    Ok(Options {
        config,
        tls: Some(tls),
    })
}

/// `%XX` escapes decoded (what a path with spaces or `&` needs in a URL); `None` if malformed.
fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `verify-ca`: the server's chain must lead to a trusted root (and be valid now, and the
/// handshake signed by its key), but the name it was issued for need not be the URL's host, for
/// a server reached by an address its certificate does not name.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl AnyName {
    fn new(roots: RootCertStore) -> Result<Self, String> {
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), tls::crypto_provider())
            .build()
            .map(AnyName)
            .map_err(|e| format!("sslrootcert: {e}"))
    }
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // The name is checked last, once the chain has been verified.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("floodgate-pgurl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write");
        path
    }

    #[test]
    fn plain_unless_the_url_demands_tls() {
        for url in [
            "postgres://u@db/app",
            "postgres://u@db/app?sslmode=prefer",
            "postgres://u@db/app?sslmode=disable&connect_timeout=5",
        ] {
            let options = options(url).expect(url);
            assert!(options.tls.is_none(), "{url}");
            assert_eq!(options.config.get_ssl_mode(), SslMode::Disable, "{url}");
        }
        // Options the driver knows pass through.
        let options = options("postgres://u@db/app?connect_timeout=5&sslmode=disable").unwrap();
        assert_eq!(
            options.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(5))
        );
    }

    #[test]
    fn verify_modes_and_a_root_file_make_tls() {
        let ca = rcgen::generate_simple_self_signed(vec!["db".to_string()]).unwrap();
        // A path with a space, percent-encoded as a URL needs it.
        let root = temp_file("root ca.pem", &ca.cert.pem());
        let encoded = root.to_str().unwrap().replace(' ', "%20");
        for mode in ["require", "verify-ca", "verify-full"] {
            let url = format!("postgresql://u@db/app?sslmode={mode}&sslrootcert={encoded}");
            let options = options(&url).expect(&url);
            assert!(options.tls.is_some(), "{mode}");
            assert_eq!(options.config.get_ssl_mode(), SslMode::Require, "{mode}");
        }
    }

    #[test]
    fn bad_tls_parameters_say_what_is_wrong() {
        let ca = rcgen::generate_simple_self_signed(vec!["db".to_string()]).unwrap();
        let cert = temp_file("client.pem", &ca.cert.pem());
        let key = temp_file("client.key", &ca.signing_key.serialize_pem());
        let other = rcgen::generate_simple_self_signed(vec!["db".to_string()]).unwrap();
        let other_key = temp_file("other.key", &other.signing_key.serialize_pem());
        let not_pem = temp_file("not.pem", "hello");
        let (cert, key, other_key, not_pem) = (
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
            other_key.to_str().unwrap(),
            not_pem.to_str().unwrap(),
        );
        let cases = [
            ("sslmode=verify-everything", "sslmode=verify-everything"),
            (
                "sslmode=verify-full&sslrootcert=/nowhere/ca.pem",
                "sslrootcert: cannot read /nowhere/ca.pem",
            ),
            (
                &format!("sslmode=verify-full&sslrootcert={not_pem}")[..],
                "sslrootcert: no certificate found",
            ),
            (
                &format!("sslmode=verify-full&sslcert={cert}")[..],
                "sslcert and sslkey go together",
            ),
            (
                &format!("sslmode=verify-full&sslcert={cert}&sslkey={other_key}")[..],
                "does not fit sslcert",
            ),
            (&format!("sslrootcert={cert}")[..], "need TLS"),
            (
                "sslmode=verify-full&sslkey=%zz",
                "sslkey: invalid percent-encoding",
            ),
            ("sslcompression=1", "sslcompression"),
        ];
        for (query, expected) in cases {
            let url = format!("postgres://u:secret@db/app?{query}");
            let error = options(&url)
                .err()
                .unwrap_or_else(|| panic!("{query} was accepted"));
            assert!(error.contains(expected), "{query}: {error}");
            assert!(!error.contains("secret"), "{query}: {error}");
        }
        // A key that fits its certificate is taken.
        let url = format!("postgres://u@db/app?sslmode=verify-full&sslcert={cert}&sslkey={key}");
        assert!(options(&url).expect("cert and key").tls.is_some());
    }
}
