//! What the guard passes to the store besides decisions: the shared control list, claims,
//! resets (and forgetting what this instance kept of reset budgets), each within ten
//! decision timeouts (nobody waits on them but an operator or a background task).

use super::*;

impl<S: RemoteStore, C: Clock> Guarded<S, C> {
    /// The store's shared control list, within the decision timeout ten times over (nobody
    /// waits on it but the control feed).
    pub async fn control_read(
        &self,
        known: Option<String>,
    ) -> Result<Option<crate::limiter::store::ControlList>, LimiterError> {
        let timeout = self.timeout() * 10;
        tokio::time::timeout(timeout, self.store.control_read(known))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))?
    }

    /// Writes entries of the store's shared control list, all or none.
    pub async fn control_write(
        &self,
        changes: &[crate::limiter::store::ControlChange<'_>],
    ) -> Result<bool, LimiterError> {
        let timeout = self.timeout() * 10;
        tokio::time::timeout(timeout, self.store.control_write(changes))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))?
    }

    /// Claims `key` in the store for every instance for `ttl_us` (see [`RemoteStore::claim`]).
    pub async fn claim(&self, key: &str, ttl_us: u64) -> Result<bool, LimiterError> {
        let timeout = self.timeout() * 10;
        tokio::time::timeout(timeout, self.store.claim(key, ttl_us))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))?
    }

    /// Gives up the claim on `key`.
    pub async fn unclaim(&self, key: &str) -> Result<(), LimiterError> {
        let timeout = self.timeout() * 10;
        tokio::time::timeout(timeout, self.store.unclaim(key))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))?
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
