//! What the guard passes to the store besides decisions: the shared control list, claims,
//! resets (and forgetting what this instance kept of reset budgets), each within ten
//! decision timeouts (nobody waits on them but an operator or a background task).

use super::*;
use crate::limiter::store::{
    CacheScope, CacheVariant, CacheWrite, ControlChange, ControlList, RoomBounds, RoomEntered,
    Shared, StoreCall,
};

impl<C: Clock> Guarded<C> {
    /// `call` on what the store keeps for every instance, within the decision timeout ten
    /// times over; `none` when it keeps nothing of the kind.
    async fn shared<'a, T: Send + 'a>(
        &'a self,
        none: T,
        call: impl FnOnce(&'a dyn Shared) -> StoreCall<'a, T>,
    ) -> Result<T, LimiterError> {
        self.shared_within(self.timeout() * 10, none, call).await
    }

    /// `call` on what the store keeps for every instance, within `timeout`.
    async fn shared_within<'a, T: Send + 'a>(
        &'a self,
        timeout: Duration,
        none: T,
        call: impl FnOnce(&'a dyn Shared) -> StoreCall<'a, T>,
    ) -> Result<T, LimiterError> {
        let Some(shared) = self.store.shared() else {
            return Ok(none);
        };
        tokio::time::timeout(timeout, call(shared))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))?
    }

    /// The store's shared control list (see [`Shared::control_read`]); `None` when the store
    /// keeps none.
    pub async fn control_read(
        &self,
        known: Option<String>,
    ) -> Result<Option<ControlList>, LimiterError> {
        self.shared(None, |s| s.control_read(known)).await
    }

    /// Writes entries of the store's shared control list, all or none: false when the store
    /// keeps none.
    pub async fn control_write(&self, changes: &[ControlChange<'_>]) -> Result<bool, LimiterError> {
        let written = self.shared(None, |s| {
            let write = s.control_write(changes);
            Box::pin(async move { write.await.map(Some) })
        });
        Ok(written.await?.is_some())
    }

    /// Claims `key` in the store for every instance for `ttl_us` (see [`Shared::claim`]); a
    /// store that keeps no claims grants every one.
    pub async fn claim(&self, key: &str, ttl_us: u64) -> Result<bool, LimiterError> {
        self.shared(true, |s| s.claim(key, ttl_us)).await
    }

    /// [`Guarded::claim`] on a request's path (`cache.shared`'s fill claim): within twice the
    /// decision timeout.
    pub async fn cache_claim(&self, key: &str, ttl_us: u64) -> Result<bool, LimiterError> {
        let timeout = self.timeout() * 2;
        self.shared_within(timeout, true, |s| s.claim(key, ttl_us))
            .await
    }

    /// A waiting room's answer to `client` (see [`Shared::room_enter`]), on a request's path:
    /// within twice the decision timeout. `None` when the store keeps no rooms.
    pub async fn room_enter(
        &self,
        room: &str,
        client: &str,
        bounds: RoomBounds,
    ) -> Result<Option<RoomEntered>, LimiterError> {
        let timeout = self.timeout() * 2;
        self.shared_within(timeout, None, |s| {
            let entered = s.room_enter(room, client, bounds);
            Box::pin(async move { entered.await.map(Some) })
        })
        .await
    }

    /// Gives up the claim on `key`.
    pub async fn unclaim(&self, key: &str) -> Result<(), LimiterError> {
        self.shared((), |s| s.unclaim(key)).await
    }

    /// The bytes kept under `key` for every instance (see [`Shared::blob_read`]).
    pub async fn blob_read(&self, key: &str) -> Result<Option<Vec<u8>>, LimiterError> {
        self.shared(None, |s| s.blob_read(key)).await
    }

    /// Keeps `bytes` under `key` for every instance.
    pub async fn blob_write(&self, key: &str, bytes: &[u8]) -> Result<(), LimiterError> {
        self.shared((), |s| s.blob_write(key, bytes)).await
    }

    /// Forgets what is kept under `key`.
    pub async fn blob_remove(&self, key: &str) -> Result<(), LimiterError> {
        self.shared((), |s| s.blob_remove(key)).await
    }

    /// `cache.shared`: the variants of `route`'s cache entry `key` (see [`Shared::cache_read`]),
    /// read on a request's path: within twice the decision timeout.
    pub async fn cache_read(
        &self,
        route: &str,
        key: &str,
    ) -> Result<Vec<CacheVariant>, LimiterError> {
        let timeout = self.timeout() * 2;
        self.shared_within(timeout, Vec::new(), |s| s.cache_read(route, key))
            .await
    }

    /// Stores a shared cache entry's variant (behind a request: within ten decision timeouts).
    pub async fn cache_write(&self, write: CacheWrite<'_>) -> Result<(), LimiterError> {
        self.shared((), |s| s.cache_write(write)).await
    }

    /// Removes `route`'s shared cache entries that `scope` names.
    pub async fn cache_remove(
        &self,
        route: &str,
        scope: CacheScope<'_>,
    ) -> Result<(), LimiterError> {
        self.shared((), |s| s.cache_remove(route, scope)).await
    }

    /// Resets `asks`' budgets in the store, and forgets what this instance knows of them.
    pub async fn reset(&self, asks: &[Ask<'_>]) -> Result<(), LimiterError> {
        let timeout = self.timeout() * 10;
        let result = tokio::time::timeout(timeout, self.store.reset(asks))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))
            .and_then(|r| r);
        let keys: Vec<_> = asks.iter().map(|a| a.key).collect();
        self.forget(&keys);
        result
    }

    /// Forgets what this instance knows of the budgets `keys` (another instance reset them):
    /// cached denials, leases, and the local fallback's state.
    pub fn forget(&self, keys: &[crate::limiter::BudgetKey<'_>]) {
        self.deny_cache.forget(keys);
        if let Some(leases) = self.leases.load().as_ref() {
            leases.forget(keys);
        }
        self.local.forget(keys);
    }
}
