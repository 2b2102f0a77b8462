//! A JWKS fetched from `identity.jwt.jwks_url`: over HTTPS (or HTTP, for a sidecar on
//! loopback), with a timeout, kept in memory, fetched again every [`REFRESH`] and when a token
//! names a key the set does not hold, never more often than once per [`MIN_GAP`] (a flood of
//! tokens with made-up `kid`s costs the issuer one request per gap, not one per token). A fetch
//! that fails keeps the keys there were, and is retried after [`RETRY`].
//!
//! A fetch never holds a request: it runs in a task of its own, one at a time (an issuer that
//! hangs costs one connection, for [`TIMEOUT`] at most), and requests are decided with the keys
//! held. Only a token whose key the set lacks waits for the fetch in flight, and for
//! [`WAIT_FOR_KEYS`] at most: a key rotated in at the issuer is usually found by its first
//! token, and a slow issuer costs that token a 401 in a bounded time, not the fetch's timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How often the set is fetched when nothing asks sooner (Envoy's `remote_jwks` default).
pub const REFRESH: Duration = Duration::from_secs(300);
/// The least time between two fetches.
pub const MIN_GAP: Duration = Duration::from_secs(5);
/// How soon a failed fetch is tried again.
pub const RETRY: Duration = Duration::from_secs(10);
/// How long one fetch may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a token whose key the set lacks waits for the fetch that may bring it.
pub const WAIT_FOR_KEYS: Duration = Duration::from_millis(500);
/// The largest JWKS document taken.
const MAX_BYTES: usize = 1 << 20;

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The keys a [`Remote`] set is fetched into: the token verifier that owns it (`jwt.rs`'s
/// config). The fetch tasks hold it by this trait, so this file needs nothing of the verifier.
pub(super) trait KeySet: Send + Sync + 'static {
    /// The remote set, if the keys come from one.
    fn remote(&self) -> Option<&Remote>;
    /// Fetches the set now and takes its keys: how many it has, or why not.
    fn fetch(&self) -> std::pin::Pin<Box<dyn Future<Output = Result<usize, String>> + Send + '_>>;
}

/// Where a remote set comes from, and when it was last asked for.
pub struct Remote {
    url: http::Uri,
    client: OnceLock<HttpClient>,
    /// When the last fetch started (`None`: never).
    last: Mutex<Option<Instant>>,
    /// True while a fetch runs (there is at most one).
    running: AtomicBool,
    /// Counts finished fetches (and says whether the last one succeeded): what requests
    /// waiting for keys and the refresh loop wait on.
    finished: tokio::sync::watch::Sender<(u64, bool)>,
    /// The config this set belongs to, for the fetch task (set by `keep_fresh`).
    owner: OnceLock<Weak<dyn KeySet>>,
}

impl Remote {
    pub fn new(url: http::Uri) -> Remote {
        Remote {
            url,
            client: OnceLock::new(),
            last: Mutex::new(None),
            running: AtomicBool::new(false),
            finished: tokio::sync::watch::channel((0, false)).0,
            owner: OnceLock::new(),
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

/// Starts a fetch of `jwt`'s set in a task of its own, unless one is running; returns at once.
/// False when none could be started (one is running, or no runtime).
fn start_fetch(jwt: Arc<dyn KeySet>) -> bool {
    let Some(remote) = jwt.remote() else {
        return false;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    if remote.running.swap(true, Ordering::AcqRel) {
        return false;
    }
    runtime.spawn(async move {
        let fetched = jwt.fetch().await;
        let Some(remote) = jwt.remote() else {
            return;
        };
        let ok = match fetched {
            Ok(n) => {
                tracing::debug!(url = %remote.url(), keys = n, "JWKS fetched");
                true
            }
            Err(why) => {
                tracing::warn!(url = %remote.url(), %why, "JWKS fetch failed; keeping the keys there were");
                false
            }
        };
        remote.running.store(false, Ordering::Release);
        remote.finished.send_modify(|(count, last_ok)| {
            *count += 1;
            *last_ok = ok;
        });
    });
    true
}

/// For a token whose key `jwt`'s set lacks: starts a fetch if none ran in the last [`MIN_GAP`],
/// and waits for the fetch in flight (this one or another's) for [`WAIT_FOR_KEYS`] at most.
/// Returns at once when no fetch is in flight.
pub(super) async fn refetch(jwt: &dyn KeySet) {
    let Some(remote) = jwt.remote() else {
        return;
    };
    let mut finished = remote.finished.subscribe();
    finished.mark_unchanged();
    if !remote.running.load(Ordering::Acquire) {
        if remote.fetched_within(MIN_GAP) {
            return;
        }
        let Some(owner) = remote.owner.get().and_then(Weak::upgrade) else {
            return;
        };
        if start_fetch(owner) {
            tracing::info!(url = %remote.url(), "JWKS fetched again for an unknown key");
        }
    }
    let _ = tokio::time::timeout(WAIT_FOR_KEYS, finished.changed()).await;
}

/// Fetches the set now and every [`REFRESH`] ([`RETRY`] after a failure) while `jwt` lives. No
/// runtime (`floodgate check`): nothing.
pub(super) fn keep_fresh<K: KeySet>(jwt: &Arc<K>) {
    let Some(remote) = jwt.remote() else {
        return;
    };
    let owner: Weak<dyn KeySet> = Arc::downgrade(jwt) as Weak<K>;
    let _ = remote.owner.set(owner);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let jwt = Arc::downgrade(jwt);
    runtime.spawn(async move {
        loop {
            let mut finished = {
                let Some(jwt) = jwt.upgrade() else {
                    return;
                };
                let Some(remote) = jwt.remote() else {
                    return;
                };
                let mut finished = remote.finished.subscribe();
                finished.mark_unchanged();
                start_fetch(jwt.clone());
                finished
            };
            // The fetch in flight (this loop's or a request's) ends within its timeout.
            let ok = match tokio::time::timeout(TIMEOUT * 2, finished.changed()).await {
                Ok(Ok(())) => finished.borrow().1,
                Ok(Err(_)) => return, // the config is gone
                Err(_) => false,
            };
            tokio::time::sleep(if ok { REFRESH } else { RETRY }).await;
        }
    });
}
