//! The global store, Redis or PostgreSQL: `take` and `give` (the scripts' docs say what they
//! do), each a call whose future owns what it needs, so that a call outliving its request can
//! finish on its own (`Global::take`).

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;

use super::postgres::PgGlobal;
use super::scripts;

/// One `take`: the budget's key and parameters, and what is asked.
#[derive(Debug, Clone)]
pub(super) struct TakeArgs {
    pub key: String,
    pub capacity: u32,
    pub interval_us: u64,
    pub need: u64,
    pub want: u64,
    pub region: String,
    pub ttl_ms: u64,
    pub held: u64,
}

pub(super) enum GlobalStore {
    Redis {
        connection: ConnectionManager,
        take: Arc<Script>,
        give: Arc<Script>,
    },
    Postgres(Arc<PgGlobal>),
}

impl GlobalStore {
    /// Connects lazily to `url` (`redis://`, `rediss://`, `postgres://`, `postgresql://`).
    /// Calls wait up to `timeout` to connect; an answer is waited for 10 s (a late answer is
    /// still read).
    pub(super) fn connect(url: &str, timeout: Duration) -> anyhow::Result<GlobalStore> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(GlobalStore::Postgres(PgGlobal::connect(url, timeout)?));
        }
        Ok(GlobalStore::Redis {
            connection: super::redis_connection(url, timeout, Duration::from_secs(10))?,
            take: Arc::new(Script::new(&scripts::take())),
            give: Arc::new(Script::new(&scripts::give())),
        })
    }

    /// Loads the scripts or installs the functions (which also connects).
    pub(super) async fn prepare(&self) -> Result<(), String> {
        match self {
            GlobalStore::Redis {
                connection,
                take,
                give,
            } => super::load_scripts(connection, &[take, give]).await,
            GlobalStore::Postgres(pg) => pg.install().await,
        }
    }

    /// The call for one `take`: (granted, left, lapsed).
    pub(super) fn take(
        &self,
        a: TakeArgs,
    ) -> impl Future<Output = Result<(u64, u64, u64), String>> + Send + 'static {
        let store = self.handle();
        async move {
            match store {
                Handle::Redis(mut connection, take, _) => take
                    .key(&a.key)
                    .arg(a.capacity)
                    .arg(a.interval_us)
                    .arg(a.need)
                    .arg(a.want)
                    .arg(&a.region)
                    .arg(a.ttl_ms)
                    .arg(a.held)
                    .invoke_async::<(u64, u64, u64)>(&mut connection)
                    .await
                    .map_err(|e| e.to_string()),
                Handle::Postgres(pg) => {
                    pg.take(
                        &a.key,
                        a.capacity,
                        a.interval_us,
                        a.need,
                        a.want,
                        &a.region,
                        a.ttl_ms,
                        a.held,
                    )
                    .await
                }
            }
        }
    }

    /// The call for one `give`: what is left.
    pub(super) fn give(
        &self,
        key: String,
        capacity: u32,
        interval_us: u64,
        units: u64,
        region: String,
    ) -> impl Future<Output = Result<u64, String>> + Send + 'static {
        let store = self.handle();
        async move {
            match store {
                Handle::Redis(mut connection, _, give) => give
                    .key(&key)
                    .arg(capacity)
                    .arg(interval_us)
                    .arg(units)
                    .arg(&region)
                    .invoke_async::<u64>(&mut connection)
                    .await
                    .map_err(|e| e.to_string()),
                Handle::Postgres(pg) => pg.give(&key, capacity, interval_us, units, &region).await,
            }
        }
    }

    fn handle(&self) -> Handle {
        match self {
            GlobalStore::Redis {
                connection,
                take,
                give,
            } => Handle::Redis(connection.clone(), take.clone(), give.clone()),
            GlobalStore::Postgres(pg) => Handle::Postgres(pg.clone()),
        }
    }
}

/// What a call needs of the store, owned.
enum Handle {
    Redis(ConnectionManager, Arc<Script>, Arc<Script>),
    Postgres(Arc<PgGlobal>),
}
