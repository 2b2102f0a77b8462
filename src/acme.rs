//! Certificates ordered and renewed from an ACME CA (RFC 8555), with instant-acme as the client.
//!
//! One task per instance ([`Acme::run`]) looks after every domain: it installs the certificate
//! kept for the domain (in the shared store, or in `tls.acme.dir` on the memory store) into the
//! table the listener's resolver reads, and when none is kept or a third of its lifetime is
//! left, orders one. On a shared store the order is made under a claim (`acme:lock:DOMAIN`):
//! one instance orders, the others wait and install what it kept; a restart finds the kept
//! certificate and orders nothing. Challenge answers are kept there too, so whichever instance
//! the CA reaches answers it: HTTP-01 on `http_listen` (`src/acme/challenge.rs`), TLS-ALPN-01
//! on `listen` (RFC 8737: a certificate made for the challenge, presented to a handshake that
//! offers only `acme-tls/1`). A failed order is logged with the CA's error, counted, and tried
//! again with backoff (10 s doubling to an hour, never past a tenth of the time left); the
//! certificate in use keeps serving. Nothing here is on a request's path: a handshake for a
//! name not yet issued gets the fallback certificate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use sha2::Digest as _;

use crate::config::{AcmeChallenge, AcmeConfig, Config};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::tls::certs::{Certificate, Issued, Table, unix_now};

pub mod challenge;

pub use challenge::Challenges;

/// How long an ordering instance holds a domain's claim: an order takes seconds; a crashed
/// orderer's claim ends by itself.
const ORDER_CLAIM: Duration = Duration::from_secs(180);
/// How often a domain without a usable certificate is looked at again (another instance may
/// have ordered it).
const WAITING_POLL: Duration = Duration::from_secs(2);
/// The longest sleep between two looks at a domain that is fine.
const IDLE_POLL: Duration = Duration::from_secs(60);
/// The first retry after a failed order, doubling to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Where the account, certificates and challenge answers are kept.
#[derive(Clone)]
pub enum Keep {
    /// The shared store (Redis, PostgreSQL): every instance reads and writes the same.
    Store(Limiter),
    /// Files in `tls.acme.dir` (the memory store: one instance).
    Dir(PathBuf),
}

impl Keep {
    /// The bytes kept under `key`.
    pub async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        match self {
            Keep::Store(limiter) => limiter.blob_read(key).await.map_err(|e| e.to_string()),
            Keep::Dir(dir) => match std::fs::read(dir.join(file_name(key))) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("{}: {e}", dir.display())),
            },
        }
    }

    /// Keeps `bytes` under `key` (a file is written whole, then renamed into place).
    pub async fn write(&self, key: &str, bytes: &[u8]) -> Result<(), String> {
        match self {
            Keep::Store(limiter) => limiter
                .blob_write(key, bytes)
                .await
                .map_err(|e| e.to_string()),
            Keep::Dir(dir) => {
                let path = dir.join(file_name(key));
                let temporary = dir.join(format!(".{}.new", file_name(key)));
                write_private(&temporary, bytes)
                    .and_then(|()| std::fs::rename(&temporary, &path))
                    .map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }

    /// Forgets `key`.
    pub async fn remove(&self, key: &str) {
        let removed = match self {
            Keep::Store(limiter) => limiter.blob_remove(key).await.map_err(|e| e.to_string()),
            Keep::Dir(dir) => match std::fs::remove_file(dir.join(file_name(key))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
                _ => Ok(()),
            },
        };
        if let Err(e) = removed {
            tracing::debug!(error = %e, key, "acme: could not forget a kept value");
        }
    }

    /// Claims `key` for every instance for `ttl`: true when this instance may go on. The
    /// memory store's instance is alone.
    async fn claim(&self, key: &str, ttl: Duration) -> Result<bool, String> {
        match self {
            Keep::Store(limiter) => limiter
                .claim(key, ttl.as_micros() as u64)
                .await
                .map_err(|e| e.to_string()),
            Keep::Dir(_) => Ok(true),
        }
    }

    async fn unclaim(&self, key: &str) {
        if let Keep::Store(limiter) = self
            && let Err(e) = limiter.unclaim(key).await
        {
            tracing::debug!(error = %e, key, "acme: a claim could not be given up");
        }
    }
}

/// A key as a file name: letters, digits, `.`, `-` and `_` kept, anything else `_`.
fn file_name(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .collect()
}

/// Writes a file only its owner can read (account and certificate keys).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// A certificate and its key as kept.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    chain_pem: String,
    key_pem: String,
}

/// The ACME task's state.
pub struct Acme {
    config: AcmeConfig,
    domains: Vec<String>,
    keep: Keep,
    /// What the listener's resolver serves beside the files' certificates.
    issued: Issued,
    challenges: Arc<Challenges>,
    metrics: Arc<Metrics>,
    /// The certificates installed, by domain.
    installed: Mutex<HashMap<String, Arc<Certificate>>>,
    /// Key prefix of everything kept: the directory's digest, so two CAs never mix.
    prefix: String,
}

/// What became of one look at a domain.
enum Looked {
    /// Fine until this many seconds before it is due.
    Fine(Duration),
    /// Another instance holds the order: look again soon.
    Waiting,
    /// This instance's order failed.
    Failed,
}

impl Acme {
    /// The ACME task for `config`'s `tls.acme`, keeping its state in `keep` and answering its
    /// challenges through `challenges`; none without `tls.acme`.
    pub fn new(
        config: &Config,
        keep: Keep,
        issued: Issued,
        challenges: Arc<Challenges>,
        metrics: Arc<Metrics>,
    ) -> Option<Acme> {
        let acme = config.tls.as_ref()?.acme.clone()?;
        let domains = domains(config, &acme);
        if domains.is_empty() {
            tracing::warn!(
                "tls.acme: no domain to order (no tls.acme.domains, and no route names an exact host)"
            );
        }
        let prefix = prefix_of(&acme);
        Some(Acme {
            config: acme,
            domains,
            keep,
            issued,
            challenges,
            metrics,
            installed: Mutex::new(HashMap::new()),
            prefix,
        })
    }

    /// The domains it looks after.
    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// Looks after every domain until the process ends.
    pub async fn run(self: Arc<Self>) {
        let mut next: HashMap<String, tokio::time::Instant> = HashMap::new();
        let mut backoff: HashMap<String, Duration> = HashMap::new();
        loop {
            let now = tokio::time::Instant::now();
            for domain in &self.domains {
                if next.get(domain).is_some_and(|at| *at > now) {
                    continue;
                }
                let wait = match self.look(domain).await {
                    Looked::Fine(wait) => {
                        backoff.remove(domain);
                        wait.min(IDLE_POLL)
                    }
                    Looked::Waiting => WAITING_POLL,
                    Looked::Failed => {
                        let b = backoff.entry(domain.clone()).or_insert(FIRST_BACKOFF / 2);
                        *b = (*b * 2).min(MAX_BACKOFF);
                        // Within the time left: a tenth of it, so several tries fit.
                        let left = self.seconds_left(domain).map_or(*b, |s| {
                            Duration::from_secs((s.max(0) as u64) / 10).max(Duration::from_secs(1))
                        });
                        (*b).min(left)
                    }
                };
                next.insert(domain.clone(), now + wait);
            }
            let soonest = next.values().min().copied().unwrap_or(now + IDLE_POLL);
            tokio::time::sleep_until(soonest.max(now + Duration::from_millis(200))).await;
        }
    }

    /// Seconds until the installed certificate of `domain` expires.
    fn seconds_left(&self, domain: &str) -> Option<i64> {
        let installed = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        installed.get(domain).map(|c| c.not_after() - unix_now())
    }

    /// One look at `domain`: install what is kept; order when nothing is or it is due.
    async fn look(&self, domain: &str) -> Looked {
        let kept = match self.kept(domain).await {
            Ok(kept) => kept,
            Err(e) => {
                tracing::warn!(domain, error = %e, "acme: the kept certificate cannot be read");
                return Looked::Waiting;
            }
        };
        if let Some(cert) = &kept {
            self.install(domain, cert.clone());
            let due = due_at(cert);
            let now = unix_now();
            if now < due {
                return Looked::Fine(Duration::from_secs((due - now) as u64));
            }
        }
        let lock = format!("{}lock:{domain}", self.prefix);
        match self.keep.claim(&lock, ORDER_CLAIM).await {
            Ok(true) => {}
            Ok(false) => return Looked::Waiting,
            Err(e) => {
                tracing::warn!(domain, error = %e, "acme: the store cannot be asked who orders");
                return Looked::Waiting;
            }
        }
        // Another instance may have finished an order between the read and the claim.
        if let Ok(Some(cert)) = self.kept(domain).await
            && kept
                .as_ref()
                .is_none_or(|k| cert.not_after() != k.not_after())
        {
            self.install(domain, cert);
            self.keep.unclaim(&lock).await;
            return Looked::Fine(Duration::ZERO);
        }
        // Bounded: a CA that accepts connections and never answers must not hold the claim
        // (and this task) for ever.
        let ordered = match tokio::time::timeout(ORDER_CLAIM / 2, self.order(domain)).await {
            Ok(ordered) => ordered,
            Err(_) => Err(format!(
                "no answer from the CA within {:?}",
                ORDER_CLAIM / 2
            )),
        };
        self.keep.unclaim(&lock).await;
        match ordered {
            Ok(cert) => {
                self.metrics.acme_order(true);
                tracing::info!(
                    domain,
                    not_after = cert.not_after(),
                    "acme: certificate issued"
                );
                let due = due_at(&cert);
                self.install(domain, cert);
                Looked::Fine(Duration::from_secs((due - unix_now()).max(0) as u64))
            }
            Err(e) => {
                self.metrics.acme_order(false);
                match kept {
                    Some(_) => {
                        tracing::warn!(domain, error = %e, "acme: renewal failed; the current certificate keeps serving")
                    }
                    None => {
                        tracing::warn!(domain, error = %e, "acme: order failed; the fallback certificate serves the name")
                    }
                }
                Looked::Failed
            }
        }
    }

    /// The certificate kept for `domain`, if any (one that cannot be read is none, and said).
    async fn kept(&self, domain: &str) -> Result<Option<Arc<Certificate>>, String> {
        let Some(bytes) = self
            .keep
            .read(&format!("{}cert:{domain}", self.prefix))
            .await?
        else {
            return Ok(None);
        };
        let kept: Kept = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        Certificate::from_pem(kept.chain_pem.as_bytes(), kept.key_pem.as_bytes())
            .map(|c| Some(Arc::new(c)))
            .map_err(|e| e.to_string())
    }

    /// Serves `cert` for `domain` from now on (new handshakes).
    fn install(&self, domain: &str, cert: Arc<Certificate>) {
        let mut installed = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        if installed
            .get(domain)
            .is_some_and(|c| Arc::ptr_eq(c, &cert) || c.not_after() == cert.not_after())
        {
            return;
        }
        installed.insert(domain.to_owned(), cert);
        let table: Vec<Arc<Certificate>> = self
            .domains
            .iter()
            .filter_map(|d| installed.get(d).cloned())
            .collect();
        self.issued.store(Arc::new(Table::new(table)));
    }

    /// The account, made once and kept.
    async fn account(&self) -> Result<Account, String> {
        let builder = || match &self.config.ca {
            Some(ca) => Account::builder_with_root(ca),
            None => Account::builder(),
        };
        let key = format!("{}account", self.prefix);
        if let Some(bytes) = self.keep.read(&key).await? {
            let credentials: AccountCredentials =
                serde_json::from_slice(&bytes).map_err(|e| format!("the kept account: {e}"))?;
            return builder()
                .map_err(|e| e.to_string())?
                .from_credentials(credentials)
                .await
                .map_err(|e| format!("the kept account: {e}"));
        }
        let contact = self.config.email.as_ref().map(|e| format!("mailto:{e}"));
        let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
        let (account, credentials) = builder()
            .map_err(|e| e.to_string())?
            .create(
                &NewAccount {
                    contact: &contacts,
                    terms_of_service_agreed: true,
                    only_return_existing: false,
                },
                self.config.directory.clone(),
                None,
            )
            .await
            .map_err(|e| format!("the account could not be made: {e}"))?;
        let bytes = serde_json::to_vec(&credentials).map_err(|e| e.to_string())?;
        self.keep.write(&key, &bytes).await?;
        Ok(account)
    }

    /// Orders a certificate for `domain`, answers its challenge, and keeps what is issued.
    async fn order(&self, domain: &str) -> Result<Arc<Certificate>, String> {
        let account = self.account().await?;
        let identifiers = [Identifier::Dns(domain.to_owned())];
        let mut order = match account.new_order(&NewOrder::new(&identifiers)).await {
            Ok(order) => order,
            Err(instant_acme::Error::Api(problem))
                if problem.r#type.as_deref()
                    == Some("urn:ietf:params:acme:error:accountDoesNotExist") =>
            {
                // The CA forgot the account (a test CA restarted, a staging wipe): the next
                // try makes a new one.
                self.keep.remove(&format!("{}account", self.prefix)).await;
                return Err(format!(
                    "new order: the CA does not know the kept account: {problem}"
                ));
            }
            Err(e) => return Err(format!("new order: {e}")),
        };
        let kind = match self.config.challenge {
            AcmeChallenge::Http01 => ChallengeType::Http01,
            AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        };
        let mut published = Vec::new();
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(|e| format!("authorization: {e}"))?;
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                status => return Err(format!("authorization is {status:?}")),
            }
            let mut challenge = authz.challenge(kind.clone()).ok_or_else(|| {
                format!(
                    "the CA offers no {} challenge",
                    self.config.challenge.as_str()
                )
            })?;
            let key_authorization = challenge.key_authorization();
            let answer = match self.config.challenge {
                AcmeChallenge::Http01 => {
                    let token = challenge.token.clone();
                    let key = format!("{}http:{token}", self.prefix);
                    let value = key_authorization.as_str().as_bytes().to_vec();
                    self.challenges.http(domain, &token, value.clone());
                    (key, value)
                }
                AcmeChallenge::TlsAlpn01 => {
                    let key = format!("{}alpn:{domain}", self.prefix);
                    let digest = key_authorization.digest().as_ref().to_vec();
                    self.challenges.alpn(domain, &digest)?;
                    (key, digest)
                }
            };
            if matches!(self.keep, Keep::Store(_)) {
                self.keep.write(&answer.0, &answer.1).await?;
            }
            published.push(answer.0);
            challenge
                .set_ready()
                .await
                .map_err(|e| format!("challenge: {e}"))?;
        }
        let retries = RetryPolicy::default();
        let status = order.poll_ready(&retries).await;
        for key in &published {
            self.keep.remove(key).await;
        }
        self.challenges.forget(domain);
        let status = status.map_err(|e| format!("waiting for validation: {e}"))?;
        if status != OrderStatus::Ready {
            // The CA's own word on why: the failed authorization's problem.
            let why = order
                .refresh()
                .await
                .ok()
                .and_then(|s| s.error.as_ref().map(|e| e.to_string()));
            return Err(format!(
                "the order is {status:?}{}",
                why.map(|w| format!(": {w}")).unwrap_or_default()
            ));
        }
        let key_pem = order
            .finalize()
            .await
            .map_err(|e| format!("finalize: {e}"))?;
        let chain_pem = order
            .poll_certificate(&retries)
            .await
            .map_err(|e| format!("certificate: {e}"))?;
        let cert = Certificate::from_pem(chain_pem.as_bytes(), key_pem.as_bytes())
            .map_err(|e| format!("the issued certificate: {e}"))?;
        let bytes = serde_json::to_vec(&Kept { chain_pem, key_pem }).map_err(|e| e.to_string())?;
        self.keep
            .write(&format!("{}cert:{domain}", self.prefix), &bytes)
            .await?;
        Ok(Arc::new(cert))
    }
}

/// What everything kept for `acme`'s directory is named under: `acme:` and 6 bytes of the
/// directory URL's digest, so two CAs' accounts and certificates never mix.
pub fn prefix_of(acme: &AcmeConfig) -> String {
    format!(
        "acme:{}:",
        crate::limiter::hex(&sha2::Sha256::digest(acme.directory.as_bytes())[..6])
    )
}

/// When `cert` is to be renewed: when a third of its lifetime is left.
fn due_at(cert: &Certificate) -> i64 {
    let lifetime = cert.not_after() - cert.not_before();
    cert.not_after() - lifetime / 3
}

/// `tls.acme.domains`, else every exact host of the routes.
fn domains(config: &Config, acme: &AcmeConfig) -> Vec<String> {
    if let Some(domains) = &acme.domains {
        return domains.clone();
    }
    let mut out: Vec<String> = Vec::new();
    for route in &config.routes {
        for host in &route.hosts {
            if let crate::config::HostPattern::Exact(name) = host
                && crate::config::acme_domain(name).is_ok()
                && !out.contains(name)
            {
                out.push(name.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_due_when_a_third_of_its_life_is_left() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 4, 1);
        let pem = params.self_signed(&key).unwrap().pem();
        let cert = Certificate::from_pem(pem.as_bytes(), key.serialize_pem().as_bytes()).unwrap();
        // 90 days: due 30 days before the end, on 2026-03-02.
        let lifetime = 90 * 86_400;
        assert_eq!(due_at(&cert), cert.not_before() + lifetime - lifetime / 3);
    }

    #[test]
    fn kept_files_are_named_from_their_keys_without_a_path() {
        assert_eq!(
            file_name("acme:ab12:cert:a.example.test"),
            "acme_ab12_cert_a.example.test"
        );
        assert_eq!(file_name("acme:x:http:../../etc"), "acme_x_http_.._.._etc");
    }
}
