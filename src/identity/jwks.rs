//! A JWKS fetched from `identity.jwt.jwks_url`: over HTTPS (or HTTP, for a sidecar on
//! loopback), with a timeout, kept in memory, fetched again every [`REFRESH`] and when a token
//! names a key the set does not hold, never more often than once per [`MIN_GAP`] (a flood of
//! tokens with made-up `kid`s costs the issuer one request per gap, not one per token). A fetch
//! that fails keeps the keys there were, and is retried after [`RETRY`].

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::jwt::JwtConfig;

/// How often the set is fetched when nothing asks sooner (Envoy's `remote_jwks` default).
pub const REFRESH: Duration = Duration::from_secs(300);
/// The least time between two fetches.
pub const MIN_GAP: Duration = Duration::from_secs(5);
/// How soon a failed fetch is tried again.
pub const RETRY: Duration = Duration::from_secs(10);
/// How long one fetch may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWKS document taken.
const MAX_BYTES: usize = 1 << 20;

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Where a remote set comes from, and when it was last asked for.
pub struct Remote {
    url: http::Uri,
    client: std::sync::OnceLock<HttpClient>,
    /// When the last fetch started (`None`: never).
    last: Mutex<Option<Instant>>,
    /// Held while a fetch runs: the requests that wait for one share it.
    fetching: tokio::sync::Mutex<()>,
}

impl Remote {
    pub fn new(url: http::Uri) -> Remote {
        Remote {
            url,
            client: std::sync::OnceLock::new(),
            last: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    pub fn url(&self) -> &http::Uri {
        &self.url
    }

    /// True when a fetch started less than `gap` ago.
    fn fetched_within(&self, gap: Duration) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < gap)
    }

    /// The document's text, fetched now (within [`TIMEOUT`], at most 1 MiB, status 200).
    pub async fn fetch(&self) -> Result<String, String> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let client = self.client.get_or_init(|| {
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.set_connect_timeout(Some(TIMEOUT));
            let tls = crate::tls::client_config(crate::tls::system_roots("the JWKS URL"));
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .enable_http2()
                .wrap_connector(http);
            Client::builder(TokioExecutor::new()).build(https)
        });
        let get = async {
            let response = client
                .get(self.url.clone())
                .await
                .map_err(|e| format!("cannot fetch it: {e}"))?;
            if response.status() != http::StatusCode::OK {
                return Err(format!("it answered {}", response.status()));
            }
            let body = Limited::new(response.into_body(), MAX_BYTES)
                .collect()
                .await
                .map_err(|e| format!("cannot read it: {e}"))?
                .to_bytes();
            String::from_utf8(body.to_vec()).map_err(|_| "it is not UTF-8 text".to_string())
        };
        tokio::time::timeout(TIMEOUT, get)
            .await
            .map_err(|_| format!("no answer within {TIMEOUT:?}"))?
    }
}

/// Fetches `jwt`'s set again for a token whose key it lacks: at once if no fetch started in the
/// last [`MIN_GAP`]; a request that finds a fetch running waits for it and fetches no more.
pub(super) async fn refetch(jwt: &JwtConfig) {
    let Some(remote) = jwt.remote() else {
        return;
    };
    let _one_at_a_time = remote.fetching.lock().await;
    if remote.fetched_within(MIN_GAP) {
        return;
    }
    match jwt.fetch().await {
        Ok(n) => tracing::info!(url = %remote.url(), keys = n, "JWKS fetched for an unknown key"),
        Err(why) => tracing::warn!(url = %remote.url(), %why, "JWKS fetch failed"),
    }
}

/// Fetches the set now and every [`REFRESH`] ([`RETRY`] after a failure) while `jwt` lives. No
/// runtime (`floodgate check`): nothing.
pub(super) fn keep_fresh(jwt: Weak<JwtConfig>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        loop {
            let wait = {
                let Some(jwt) = jwt.upgrade() else {
                    return;
                };
                let Some(remote) = jwt.remote() else {
                    return;
                };
                let _one_at_a_time = remote.fetching.lock().await;
                match jwt.fetch().await {
                    Ok(n) => {
                        tracing::debug!(url = %remote.url(), keys = n, "JWKS fetched");
                        REFRESH
                    }
                    Err(why) => {
                        tracing::warn!(url = %remote.url(), %why, "JWKS fetch failed; keeping the keys there were");
                        RETRY
                    }
                }
            };
            tokio::time::sleep(wait).await;
        }
    });
}
