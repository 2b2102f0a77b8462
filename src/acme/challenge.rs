//! Answers to the CA's challenges, from whichever instance it reaches: this instance's own
//! (kept in memory while its order waits) or, on a shared store, another's (read from the store).
//!
//! - HTTP-01 (RFC 8555 §8.3): `GET /.well-known/acme-challenge/TOKEN` on `http_listen` answers
//!   the key authorization; every other request there is sent to https with a 308, as Caddy and
//!   Traefik do.
//! - TLS-ALPN-01 (RFC 8737): a handshake on `listen` that offers only `acme-tls/1` gets a
//!   self-signed certificate for the name it asks for, carrying the key authorization's SHA-256
//!   in the critical `acmeIdentifier` extension; nothing else is served on that connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{Response, StatusCode};
use rustls::sign::CertifiedKey;

use super::Keep;
use crate::answer::Body;

/// The ALPN protocol of TLS-ALPN-01.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Where HTTP-01 tokens are asked for.
const HTTP_PATH: &str = "/.well-known/acme-challenge/";

/// The challenges under way.
pub struct Challenges {
    /// Where other instances' answers are read (the shared store), if anywhere.
    keep: Option<Keep>,
    /// What keys are kept under (the directory's).
    prefix: String,
    http: Mutex<HashMap<String, (String, Vec<u8>)>>,
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl Challenges {
    /// Challenges answered from memory and, with `keep` (a shared store), from what other
    /// instances kept under `prefix`.
    pub fn new(keep: Option<Keep>, prefix: String) -> Challenges {
        Challenges {
            keep,
            prefix,
            http: Mutex::default(),
            alpn: Mutex::default(),
        }
    }

    /// Answers HTTP-01's `token` for `domain` with `value`.
    pub(super) fn http(&self, domain: &str, token: &str, value: Vec<u8>) {
        let mut http = self.http.lock().unwrap_or_else(|p| p.into_inner());
        http.insert(token.to_owned(), (domain.to_owned(), value));
    }

    /// Answers TLS-ALPN-01 for `domain` with a certificate carrying `digest`.
    pub(super) fn alpn(&self, domain: &str, digest: &[u8]) -> Result<(), String> {
        let key = challenge_certificate(domain, digest)?;
        let mut alpn = self.alpn.lock().unwrap_or_else(|p| p.into_inner());
        alpn.insert(domain.to_owned(), key);
        Ok(())
    }

    /// Stops answering `domain`'s challenges.
    pub(super) fn forget(&self, domain: &str) {
        let mut http = self.http.lock().unwrap_or_else(|p| p.into_inner());
        http.retain(|_, (d, _)| d != domain);
        drop(http);
        let mut alpn = self.alpn.lock().unwrap_or_else(|p| p.into_inner());
        alpn.remove(domain);
    }

    /// The key authorization for HTTP-01's `token`, if a challenge under way has it.
    async fn http_answer(&self, token: &str) -> Option<Vec<u8>> {
        let local = {
            let http = self.http.lock().unwrap_or_else(|p| p.into_inner());
            http.get(token).map(|(_, v)| v.clone())
        };
        if local.is_some() {
            return local;
        }
        let keep = self.keep.as_ref()?;
        // A token is base64url (RFC 8555 §8.1): anything else is not one.
        if token.is_empty()
            || !token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
        keep.read(&format!("{}http:{token}", self.prefix))
            .await
            .ok()
            .flatten()
    }

    /// The TLS config answering TLS-ALPN-01 for `name`, if a challenge under way has it.
    pub async fn alpn_config(&self, name: &str) -> Option<Arc<rustls::ServerConfig>> {
        let name = name.to_ascii_lowercase();
        let local = {
            let alpn = self.alpn.lock().unwrap_or_else(|p| p.into_inner());
            alpn.get(&name).cloned()
        };
        let key = match local {
            Some(key) => key,
            None => {
                crate::config::acme_domain(&name).ok()?;
                let digest = (self.keep.as_ref()?)
                    .read(&format!("{}alpn:{name}", self.prefix))
                    .await
                    .ok()
                    .flatten()?;
                challenge_certificate(&name, &digest).ok()?
            }
        };
        let resolver = rustls::sign::SingleCertAndKey::from(key);
        let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .ok()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = vec![ACME_TLS_ALPN.to_vec()];
        Some(Arc::new(config))
    }

    /// The answer on `http_listen` to a request for `path` on `host`: a challenge's key
    /// authorization, else a 308 to the same place on https (`https_port` when it is not 443).
    pub async fn http_listen_answer(
        &self,
        host: Option<&str>,
        path_and_query: &str,
        https_port: u16,
    ) -> Response<Body> {
        if let Some(token) = path_and_query.strip_prefix(HTTP_PATH) {
            return match self.http_answer(token).await {
                Some(value) => Response::builder()
                    .status(StatusCode::OK)
                    .header(http::header::CONTENT_TYPE, "application/octet-stream")
                    .body(crate::answer::full(value))
                    .unwrap_or_default(),
                None => status(StatusCode::NOT_FOUND),
            };
        }
        let Some(host) = host.and_then(host_only) else {
            return status(StatusCode::BAD_REQUEST);
        };
        let port = match https_port {
            443 => String::new(),
            port => format!(":{port}"),
        };
        let location = format!("https://{host}{port}{path_and_query}");
        match http::HeaderValue::try_from(location) {
            Ok(location) => Response::builder()
                .status(StatusCode::PERMANENT_REDIRECT)
                .header(http::header::LOCATION, location)
                .body(crate::answer::full(bytes::Bytes::new()))
                .unwrap_or_default(),
            Err(_) => status(StatusCode::BAD_REQUEST),
        }
    }
}

fn status(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(crate::answer::full(bytes::Bytes::new()));
    *response.status_mut() = status;
    response
}

/// The host of a `Host` value without its port; none when it is not a plausible host (an
/// open redirect must not be made from a client's junk).
fn host_only(host: &str) -> Option<&str> {
    let name = match host.strip_prefix('[') {
        Some(v6) => return v6.split_once(']').map(|(ip, _)| &host[..ip.len() + 2]),
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            match port.bytes().all(|b| b.is_ascii_digit()) {
                true => name,
                false => host,
            }
        }),
    };
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    ok.then_some(name)
}

/// RFC 8737 §3: a self-signed certificate for `domain` whose critical `acmeIdentifier`
/// extension holds `digest` (the key authorization's SHA-256).
fn challenge_certificate(domain: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(vec![domain.to_owned()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| e.to_string())?;
    // Not through `Certificate::new`: webpki refuses to parse a certificate with a critical
    // extension it does not know (this one), so the key is loaded without that check.
    let key = crate::tls::crypto_provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(vec![cert.der().clone()], key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_is_made_only_from_a_plausible_host() {
        assert_eq!(host_only("api.example.test"), Some("api.example.test"));
        assert_eq!(host_only("api.example.test:80"), Some("api.example.test"));
        assert_eq!(host_only("[::1]:80"), Some("[::1]"));
        assert_eq!(host_only("evil.test/x"), None);
        assert_eq!(host_only(""), None);
        assert_eq!(host_only("a b"), None);
    }

    #[tokio::test]
    async fn http_01_answers_its_token_and_sends_the_rest_to_https() {
        let challenges = Challenges::new(None, "acme:x:".into());
        challenges.http("a.test", "tok_en-1", b"tok_en-1.thumb".to_vec());
        let r = challenges
            .http_listen_answer(Some("a.test"), "/.well-known/acme-challenge/tok_en-1", 8443)
            .await;
        assert_eq!(r.status(), 200);
        let r = challenges
            .http_listen_answer(Some("a.test"), "/.well-known/acme-challenge/other", 8443)
            .await;
        assert_eq!(r.status(), 404);
        let r = challenges
            .http_listen_answer(Some("a.test:80"), "/rides?x=1", 8443)
            .await;
        assert_eq!(r.status(), 308);
        assert_eq!(r.headers()["location"], "https://a.test:8443/rides?x=1");
        let r = challenges
            .http_listen_answer(Some("a.test"), "/", 443)
            .await;
        assert_eq!(r.headers()["location"], "https://a.test/");
        challenges.forget("a.test");
        let r = challenges
            .http_listen_answer(Some("a.test"), "/.well-known/acme-challenge/tok_en-1", 8443)
            .await;
        assert_eq!(r.status(), 404);
    }

    #[tokio::test]
    async fn tls_alpn_01_presents_a_certificate_carrying_the_digest() {
        let challenges = Challenges::new(None, "acme:x:".into());
        assert!(challenges.alpn_config("a.test").await.is_none());
        let digest = [7u8; 32];
        challenges.alpn("a.test", &digest).unwrap();
        let config = challenges.alpn_config("A.test").await.expect("a config");
        assert_eq!(config.alpn_protocols, vec![ACME_TLS_ALPN.to_vec()]);
        let key = challenge_certificate("a.test", &digest).unwrap();
        let (_, cert) =
            x509_parser::parse_x509_certificate(key.end_entity_cert().unwrap()).unwrap();
        let ext = cert
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.31")
            .expect("acmeIdentifier");
        assert!(ext.critical);
        // An OCTET STRING of the 32 bytes.
        assert_eq!(&ext.value[2..], &digest);
    }
}
