//! Verified bearer tokens (`identity.jwt`): a JWT's signature checked against a JWKS, its
//! algorithm against an allow-list (never `none`), its `iss`, `aud`, `exp` and `nbf` with a
//! leeway. A valid token's subject claim is the request's identity after an API key; a tier
//! claim picks its tier. The verification is `jsonwebtoken`'s; floodgate picks the key (by the
//! token's `kid`, else every key of the token's algorithm) and reads the two claims.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

use http::{HeaderMap, HeaderName};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// What to do with a request that carries no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenMissing {
    /// Identify it as before: the trusted user id, then the address.
    #[default]
    FallThrough,
    /// 401 `invalid_token`.
    Reject,
}

/// The HMAC algorithms, taken only with `identity.jwt.hmac_secret_file` (a JWKS of public keys
/// carries no shared secret).
pub const HMAC_ALGORITHMS: [(&str, Algorithm); 3] = [
    ("HS256", Algorithm::HS256),
    ("HS384", Algorithm::HS384),
    ("HS512", Algorithm::HS512),
];

/// The shortest HMAC secret taken: as long as HS256's hash (RFC 7518 §3.2).
pub const MIN_HMAC_SECRET: usize = 32;

/// The algorithms a JWKS key may verify, by name, as `identity.jwt.algorithms` takes them.
/// HMAC (`HS256`…) needs a shared secret, which a JWKS of public keys does not carry: those are
/// [`HMAC_ALGORITHMS`].
pub const ALGORITHMS: [(&str, Algorithm); 7] = [
    ("RS256", Algorithm::RS256),
    ("RS384", Algorithm::RS384),
    ("RS512", Algorithm::RS512),
    ("PS256", Algorithm::PS256),
    ("ES256", Algorithm::ES256),
    ("ES384", Algorithm::ES384),
    ("EdDSA", Algorithm::EdDSA),
];

/// The default allow-list.
pub const DEFAULT_ALGORITHMS: [Algorithm; 3] =
    [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// One key of the set, with the algorithms it may verify.
struct Key {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

/// `identity.jwt`, validated, with its keys: a file's, read once per load (SIGHUP re-reads it),
/// or a URL's, fetched and refreshed (`jwks.rs`).
pub struct JwtConfig {
    pub header: HeaderName,
    keys: ArcSwap<Vec<Key>>,
    /// Where the keys come from when `jwks_url` is set.
    remote: Option<super::jwks::Remote>,
    /// The shared secret of `hmac_secret_file`, verifying the HMAC algorithms only.
    hmac: Option<Key>,
    allowed: Vec<Algorithm>,
    issuer: Option<String>,
    audiences: Vec<String>,
    leeway_secs: u64,
    pub subject_claim: String,
    pub tier_claim: Option<String>,
    pub when_missing: WhenMissing,
}

impl std::fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtConfig")
            .field("header", &self.header)
            .field("keys", &self.keys.load().len())
            .field("allowed", &self.allowed)
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

/// A verified token's identity: its subject, and its tier if the tier claim is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub subject: String,
    pub tier: Option<String>,
    /// Every claim of the token, for `claim:` keys.
    pub claims: serde_json::Map<String, serde_json::Value>,
}

/// Why a token was refused. The message is for the log (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid bearer token: {0}")]
pub struct InvalidToken(pub String);

/// Why a token did not verify with the keys at hand: no key of the set is its (a fetched set
/// may have gained it since), or it is invalid.
enum Unverified {
    NoKey(InvalidToken),
    Invalid(InvalidToken),
}

impl Unverified {
    fn into_invalid(self) -> InvalidToken {
        match self {
            Unverified::NoKey(why) | Unverified::Invalid(why) => why,
        }
    }
}

/// The keys of a JWKS document (its text). Err names the first key that cannot be used, or says
/// the document does not parse or holds none.
fn parse_keys(jwks: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_str(jwks).map_err(|e| format!("is not a JWKS document: {e}"))?;
    let mut keys = Vec::with_capacity(set.keys.len());
    for (n, jwk) in set.keys.iter().enumerate() {
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("keys[{n}]: {e}"))?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            algorithms: algorithms_of(jwk),
            key,
        });
    }
    if keys.is_empty() {
        return Err("holds no keys".into());
    }
    Ok(keys)
}

/// The settings `identity.jwt` was validated into, before its keys are read.
pub struct JwtSettings {
    pub header: HeaderName,
    pub allowed: Vec<Algorithm>,
    pub issuer: Option<String>,
    pub audiences: Vec<String>,
    pub leeway_secs: u64,
    pub subject_claim: String,
    pub tier_claim: Option<String>,
    pub when_missing: WhenMissing,
    /// `hmac_secret_file`'s bytes, if set.
    pub hmac_secret: Option<Vec<u8>>,
}

impl JwtConfig {
    /// The config with the keys of `jwks` (a JWKS document's text). Err names the first key
    /// that cannot be used, or says the document does not parse.
    pub fn new(settings: JwtSettings, jwks: &str) -> Result<JwtConfig, String> {
        let keys = parse_keys(jwks)?;
        Ok(JwtConfig::with_keys(settings, keys, None))
    }

    /// The config whose only key is its HMAC secret (`hmac_secret_file` without a JWKS).
    pub fn with_secret_only(settings: JwtSettings) -> JwtConfig {
        JwtConfig::with_keys(settings, Vec::new(), None)
    }

    /// The config whose keys are fetched from `url` (none until the first fetch: see
    /// [`JwtConfig::keep_fresh`]).
    pub fn from_url(settings: JwtSettings, url: http::Uri) -> JwtConfig {
        JwtConfig::with_keys(settings, Vec::new(), Some(super::jwks::Remote::new(url)))
    }

    fn with_keys(
        settings: JwtSettings,
        keys: Vec<Key>,
        remote: Option<super::jwks::Remote>,
    ) -> JwtConfig {
        let hmac = settings.hmac_secret.as_deref().map(|secret| Key {
            kid: None,
            algorithms: HMAC_ALGORITHMS.map(|(_, alg)| alg).to_vec(),
            key: DecodingKey::from_secret(secret),
        });
        JwtConfig {
            header: settings.header,
            keys: ArcSwap::from_pointee(keys),
            remote,
            hmac,
            allowed: settings.allowed,
            issuer: settings.issuer,
            audiences: settings.audiences,
            leeway_secs: settings.leeway_secs,
            subject_claim: settings.subject_claim,
            tier_claim: settings.tier_claim,
            when_missing: settings.when_missing,
        }
    }

    /// With `jwks_url`: fetches the keys now and every [`jwks::REFRESH`](super::jwks::REFRESH)
    /// in a task that ends when this config is dropped (a reload made another). Takes over the
    /// keys `previous` fetched from the same URL, so that a reload verifies as before from its
    /// first request. Without a runtime (`floodgate check`), or with a file, does nothing.
    pub fn keep_fresh(self: &Arc<Self>, previous: Option<&JwtConfig>) {
        let Some(remote) = &self.remote else {
            return;
        };
        if let Some(previous) = previous
            && previous
                .remote
                .as_ref()
                .is_some_and(|p| p.url() == remote.url())
        {
            self.keys.store(previous.keys.load_full());
        }
        super::jwks::keep_fresh(self);
    }

    /// Fetches the keys from `jwks_url` now; Err says why not (the keys are then unchanged).
    async fn fetch_keys(&self) -> Result<usize, String> {
        let Some(remote) = &self.remote else {
            return Ok(self.keys.load().len());
        };
        let text = remote.fetch().await?;
        let keys = parse_keys(&text)?;
        let n = keys.len();
        self.keys.store(Arc::new(keys));
        Ok(n)
    }

    /// The request's bearer token, verified: `Ok(None)` when it carries none.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<Option<Verified>, InvalidToken> {
        let mut values = headers.get_all(&self.header).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(InvalidToken(format!(
                "more than one {} header",
                self.header
            )));
        }
        let value = value
            .to_str()
            .map_err(|_| InvalidToken("the header is not ASCII".into()))?;
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            // Another scheme (Basic…) is not a bearer token: no token.
            _ => return Ok(None),
        };
        self.verify_token(token).await.map(Some)
    }

    /// `token` verified: its signature by a key of the set, its algorithm allowed, its claims
    /// in time and for this issuer and audience.
    ///
    /// A token whose key the set does not hold, under `jwks_url`, has the set fetched again
    /// (once for every request waiting on it, and no sooner than
    /// [`jwks::MIN_GAP`](super::jwks::MIN_GAP) after the last fetch), waits for that fetch
    /// [`jwks::WAIT_FOR_KEYS`](super::jwks::WAIT_FOR_KEYS) at most, then is tried once more: a
    /// key rotated in at the issuer is found at its first token when the issuer answers in
    /// time.
    pub async fn verify_token(&self, token: &str) -> Result<Verified, InvalidToken> {
        match self.verify_with_keys(token) {
            Err(Unverified::NoKey(_)) if self.remote.is_some() => {
                super::jwks::refetch(self).await;
                self.verify_with_keys(token)
                    .map_err(Unverified::into_invalid)
            }
            other => other.map_err(Unverified::into_invalid),
        }
    }

    fn verify_with_keys(&self, token: &str) -> Result<Verified, Unverified> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Unverified::Invalid(InvalidToken(format!("malformed: {e}"))))?;
        no_extensions(token).map_err(Unverified::Invalid)?;
        if !self.allowed.contains(&header.alg) {
            return Err(Unverified::Invalid(InvalidToken(format!(
                "algorithm {:?} is not allowed",
                header.alg
            ))));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway_secs;
        validation.validate_nbf = true;
        validation.required_spec_claims = HashSet::from(["exp".to_string()]);
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
        }
        if self.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.audiences);
        }
        let keys = self.keys.load();
        // An HMAC token is verified by the secret alone, whatever `kid` it names; the set's
        // public keys never verify an HMAC algorithm, nor the secret another.
        let candidates = keys.iter().chain(&self.hmac).filter(|k| {
            k.algorithms.contains(&header.alg)
                && match (&header.kid, &k.kid) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                }
        });
        let mut last = Unverified::NoKey(InvalidToken(
            "no key of the set verifies its algorithm or kid".into(),
        ));
        for key in candidates {
            match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                token,
                &key.key,
                &validation,
            ) {
                Ok(data) => {
                    self.strict_claims(&data.claims)
                        .map_err(Unverified::Invalid)?;
                    return self.identity_of(data.claims).map_err(Unverified::Invalid);
                }
                Err(e) => last = Unverified::Invalid(InvalidToken(e.to_string())),
            }
        }
        Err(last)
    }

    /// The registered claims of a verified token, as RFC 7519 §4.1 types them (`iss` a string,
    /// `aud` a string or an array of strings, `exp`, `nbf` and `iat` numbers), and `iat` not
    /// beyond the leeway in the future (a token issued ten years from now was not issued by a
    /// clock anyone trusts).
    fn strict_claims(
        &self,
        claims: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), InvalidToken> {
        use serde_json::Value;
        let wrong =
            |name: &str, what: &str| InvalidToken(format!("its {name} claim is not {what}"));
        if claims.get("iss").is_some_and(|v| !v.is_string()) {
            return Err(wrong("iss", "a string"));
        }
        match claims.get("aud") {
            None | Some(Value::String(_)) => {}
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
            Some(_) => return Err(wrong("aud", "a string or an array of strings")),
        }
        for name in ["exp", "nbf", "iat"] {
            if claims.get(name).is_some_and(|v| !v.is_number()) {
                return Err(wrong(name, "a number"));
            }
        }
        if let Some(iat) = claims.get("iat").and_then(Value::as_f64) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            if iat > now + self.leeway_secs as f64 {
                return Err(InvalidToken("it was issued in the future (iat)".into()));
            }
        }
        Ok(())
    }

    fn identity_of(
        &self,
        claims: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Verified, InvalidToken> {
        let text = |name: &str| match claims.get(name) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let subject = text(&self.subject_claim).ok_or_else(|| {
            InvalidToken(format!(
                "no {:?} claim to identify it by",
                self.subject_claim
            ))
        })?;
        let tier = self.tier_claim.as_deref().and_then(text);
        Ok(Verified {
            subject,
            tier,
            claims,
        })
    }
}

/// A token's header names no extension floodgate would have to understand: no `crit` (RFC 7515
/// §4.1.11: a recipient that does not implement a listed extension must refuse the token, and
/// floodgate implements none) and no `b64` other than `true` (RFC 7797: an unencoded payload
/// changes what was signed).
fn no_extensions(token: &str) -> Result<(), InvalidToken> {
    use base64::Engine;
    let malformed = || InvalidToken("malformed header".into());
    let encoded = token.split('.').next().ok_or_else(malformed)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded.trim_end_matches('='))
        .map_err(|_| malformed())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes).map_err(|_| malformed())?;
    if let Some(crit) = header.get("crit") {
        return Err(InvalidToken(format!(
            "its header names critical extensions floodgate does not implement: {crit}"
        )));
    }
    if header
        .get("b64")
        .is_some_and(|b64| b64 != &serde_json::Value::Bool(true))
    {
        return Err(InvalidToken(
            "its payload is not base64url-encoded (b64)".into(),
        ));
    }
    Ok(())
}

/// The algorithms a JWK may verify: its `alg` if it names one, else every algorithm of its key
/// type (an RSA key: RS*, PS*; a P-256 key: ES256; a P-384 key: ES384; an Ed25519 key: EdDSA).
fn algorithms_of(jwk: &Jwk) -> Vec<Algorithm> {
    if let Some(alg) = jwk.common.key_algorithm {
        let named = match alg {
            KeyAlgorithm::RS256 => Some(Algorithm::RS256),
            KeyAlgorithm::RS384 => Some(Algorithm::RS384),
            KeyAlgorithm::RS512 => Some(Algorithm::RS512),
            KeyAlgorithm::PS256 => Some(Algorithm::PS256),
            KeyAlgorithm::PS384 => Some(Algorithm::PS384),
            KeyAlgorithm::PS512 => Some(Algorithm::PS512),
            KeyAlgorithm::ES256 => Some(Algorithm::ES256),
            KeyAlgorithm::ES384 => Some(Algorithm::ES384),
            KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
            _ => None,
        };
        return named.into_iter().collect();
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => Vec::new(),
        },
        AlgorithmParameters::OctetKeyPair(_) => vec![Algorithm::EdDSA],
        // A shared secret (`oct`) is never taken from a JWKS; nor is anything newer.
        _ => Vec::new(),
    }
}

impl super::jwks::KeySet for JwtConfig {
    fn remote(&self) -> Option<&super::jwks::Remote> {
        self.remote.as_ref()
    }

    fn fetch(&self) -> std::pin::Pin<Box<dyn Future<Output = Result<usize, String>> + Send + '_>> {
        Box::pin(self.fetch_keys())
    }
}
