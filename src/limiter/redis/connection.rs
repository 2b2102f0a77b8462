//! Where Redis is and how floodgate reaches it: one server, a cluster, or the master Sentinel
//! names (followed through failovers).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
    /// The master that these sentinels name `master_name`, followed through failovers.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

/// A connection to Redis or Redis Cluster.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The one-connection settings: the decision budget bounds a connection attempt and a reply.
pub(super) fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
        .set_response_timeout(Some(timeout.max(Duration::from_millis(250))))
        .set_max_delay(Duration::from_secs(2))
        .set_number_of_retries(1)
}

/// Finds the master through Sentinel, and again after a failed decision (at most once a
/// second): after a failover the old address is dead, or back as a replica that refuses writes
/// with READONLY, and either failure sends floodgate to ask the sentinels anew. Sentinel's
/// answer is checked with `ROLE` by redis-rs, so a replica is never taken for the master.
pub(super) struct MasterFollower {
    pub(super) client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
    pub(super) timeout: Duration,
    /// When the sentinels were last asked.
    pub(super) asked: std::sync::Mutex<Option<std::time::Instant>>,
    /// True while a lookup is retrying: at most one at a time.
    pub(super) running: std::sync::atomic::AtomicBool,
}

impl MasterFollower {
    /// Asks the sentinels for the master (retrying with backoff until one answers) and swaps
    /// in a connection to it.
    pub(super) fn ask(self: Arc<Self>, slot: Arc<ArcSwapOption<Connection>>) {
        if self.running.swap(true, Ordering::AcqRel) {
            return; // a lookup is already retrying
        }
        if let Ok(mut asked) = self.asked.lock() {
            *asked = Some(std::time::Instant::now());
        }
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                let found = self.client.lock().await.async_get_client().await;
                let manager = found.and_then(|client| {
                    ConnectionManager::new_lazy_with_config(client, manager_config(self.timeout))
                });
                match manager {
                    Ok(manager) => {
                        slot.store(Some(Arc::new(Connection::Single(manager))));
                        tracing::info!("connected to the master Sentinel names");
                        self.running.store(false, Ordering::Release);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "no master from Sentinel yet; asking again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// A decision failed: ask again, unless the sentinels were asked less than a second ago.
    pub(super) fn after_failure(self: &Arc<Self>, slot: &Arc<ArcSwapOption<Connection>>) {
        let recent = self
            .asked
            .lock()
            .map(|asked| asked.is_some_and(|at| at.elapsed() < Duration::from_secs(1)))
            .unwrap_or(true);
        if !recent {
            self.clone().ask(slot.clone());
        }
    }
}

/// One command on either kind of connection.
pub(super) async fn query<T: redis::FromRedisValue>(
    connection: &Connection,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match connection.clone() {
        Connection::Single(mut c) => cmd.query_async(&mut c).await,
        Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
    }
}

/// What an error from Redis means to floodgate. Redis sends most of these as `ERR` replies
/// with no code of their own, so they are told apart by the code, then the start of the detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorReply {
    /// The server does not know the command (`FCALL` or `FUNCTION` before Redis 7, or renamed).
    UnknownCommand,
    /// `FCALL` of a function the server has not loaded (a restart, `FUNCTION FLUSH`).
    FunctionNotFound,
    /// About this request's keys: a key of another type, an error raised in the script.
    AboutTheKeys,
    /// Anything else: the connection, the server's state.
    Other,
}

impl ErrorReply {
    pub(super) fn of(e: &redis::RedisError) -> ErrorReply {
        let detail = e.detail().unwrap_or("").trim_start();
        let starts = |prefix: &str| {
            detail
                .get(..prefix.len())
                .is_some_and(|d| d.eq_ignore_ascii_case(prefix))
        };
        let response = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError);
        match e.code() {
            Some("WRONGTYPE") => ErrorReply::AboutTheKeys,
            Some("ERR") if starts("unknown command") => ErrorReply::UnknownCommand,
            Some("ERR") if starts("function not found") => ErrorReply::FunctionNotFound,
            _ if response && detail.contains("script") => ErrorReply::AboutTheKeys,
            _ => ErrorReply::Other,
        }
    }
}
