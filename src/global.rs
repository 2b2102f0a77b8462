//! Budgets across regions (`scope: global`): one budget for every region, kept in the global
//! store (`storage.global`), spent through slices each region's store holds.
//!
//! The global store runs the budget as a token bucket on its own clock (`TIME`). A slice is
//! units taken out of it: the global store counts them spent the moment it grants them, so what
//! it has left plus every slice ever granted never exceeds the budget (plus its refill), and no
//! region can admit a unit it was not granted: **over-grant is 0**, whatever the clocks, the
//! delays or the failures. Unspent units a region gives back are refunded; units a slice holds
//! when it lapses (its region cut off, every instance gone) are lost, never spent twice:
//! under-grant is at most what slices hold unspent.
//!
//! In the region, a slice is a hash in the region's Redis (`units`, `demand`) that every
//! instance of the region spends atomically, one round trip to the near store per request,
//! and that lapses `lease_ttl` after it was last renewed. A request the slice cannot pay for
//! goes to the global store itself (a budget's first use in the region, and its last units),
//! taking its own units and some for the slice; a request is never made to wait on the global
//! store otherwise. When the global store said it had nothing left, requests are refused at
//! once until it may have refilled (or a quarter of `lease_ttl`), not sent to ask again.
//!
//! A keeper task renews the slices every quarter of `lease_ttl` (one instance per region and
//! budget, by a short claim in the region's store): it reads the demand since its last pass,
//! asks the global store for what 1.5 times the demand over a `lease_ttl` needs beyond what the
//! slice holds, and gives the slice back when no demand came. The global store grants at most
//! half of what it has left beyond the asker's own need, so near exhaustion slices shrink and
//! the last units go where the demand is. The choices (a quarter of the ttl, 1.5 times the
//! demand, half of what is left) are the simulation's (`bench/global_slices_sim.py`,
//! docs/stores.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::limiter::slices::{self, Give, GlobalStore, Grant, SliceRead, SliceStore, Take, Taken};
use crate::limiter::{Ask, Decision, Figures, Limit, LimiterError};
use crate::metrics::Metrics;

/// `storage.global`, in the global module's terms.
#[derive(Debug, Clone)]
pub struct GlobalSpec {
    /// The global store (Redis).
    pub url: String,
    /// This instance's region.
    pub region: String,
    /// The region's store (Redis), which holds its slices.
    pub region_url: String,
    /// How long a slice lasts unrenewed.
    pub lease_ttl: Duration,
    /// One call to the global store.
    pub timeout: Duration,
    /// What every key starts with.
    pub key_prefix: String,
}

/// Why a global limit could not be decided: a store did not answer in time or failed.
#[derive(Debug, thiserror::Error)]
pub enum GlobalError {
    #[error("the global store: {0}")]
    Global(#[source] LimiterError),
    #[error("the region's store: {0}")]
    Region(#[source] LimiterError),
    /// The global store failed less than [`DOWN_FOR`] ago: not asked again yet.
    #[error("the global store failed less than a second ago")]
    Down,
}

/// What this instance knows of one global budget it spent.
#[derive(Debug, Clone)]
struct Local {
    /// The budget's limit (its capacity, and µs per unit of refill).
    limit: Limit,
    /// When a request here last spent it (the keeper forgets a budget idle for 2 ttl).
    last_used: Instant,
    /// The global store had nothing left when last asked: refuse at once until then.
    empty_until: Option<Instant>,
    /// How many units a slice is asked for beyond a request's own (the keeper's sizing).
    want: u64,
    /// What the slice held at the last look, and the global store's units left.
    held: u64,
    global_left: u64,
    /// A windowed budget's window (its start is in the budget's keys: each window is a budget
    /// of its own), by the global store's clock; `None` for a token bucket.
    window: Option<(u64, u64)>,
}

/// One budget's keys: its name here, its key in the global store, and its slice's key in the
/// region's store.
struct Keys {
    id: String,
    global: String,
    slice: String,
}

/// The global budgets of this instance: its region's slices and the way to the global store.
pub struct Global {
    spec: GlobalSpec,
    global: Box<dyn GlobalStore>,
    /// The region's store for calls a request waits on (a spend, the keeper's claim and read):
    /// each answers within [`REGION_TIMEOUT`] or follows `on_error`.
    region: Arc<dyn SliceStore>,
    /// The region's store for calls that carry units into or out of a slice (a grant put in
    /// it, units given back to it, a slice drained to be given back): they wait up to
    /// [`LANDING_TIMEOUT`] for the answer, because one given up on at the near timeout may or
    /// may not have landed, and units that did not are lost (seen under a loaded machine's
    /// stalls: "units granted for the slice are lost ... timed out").
    landing: Arc<dyn SliceStore>,
    budgets: Mutex<HashMap<String, Local>>,
    /// The global store failed: requests needing it follow `on_error` at once until then,
    /// not each after its own timeout.
    down_until: Mutex<Option<Instant>>,
    /// Held by the keeper for each pass, and by [`Global::give_back_all`], which ends the
    /// keeper (`true` inside): a pass in flight at shutdown could refill a slice just given
    /// back.
    passes: tokio::sync::Mutex<bool>,
    /// The global store's clock less this instance's, in µs, as its last answer showed (half
    /// the round trip's uncertainty): which window a windowed budget is in is the global
    /// store's to say, and this estimate makes the first guess right but within that.
    offset_us: AtomicI64,
    metrics: Arc<Metrics>,
}

/// One call to the region's store (near: a round trip is a fraction of a millisecond).
const REGION_TIMEOUT: Duration = Duration::from_millis(250);

/// One call to the region's store that carries units and that no request waits on past
/// [`REGION_TIMEOUT`] (see [`Global`]'s `landing`).
const LANDING_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the global store is left alone after it failed.
const DOWN_FOR: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Global")
            .field("region", &self.spec.region)
            .finish()
    }
}

/// Units a slice is asked for at a budget's first use in a region, before the keeper has seen
/// any demand.
const FIRST_SLICE: u64 = 16;

impl Global {
    /// Connects (lazily: neither store need be up yet) and starts the keeper task on the
    /// current runtime.
    pub fn start(spec: GlobalSpec, metrics: Arc<Metrics>) -> Result<Arc<Global>, LimiterError> {
        let global = Arc::new(Global {
            global: slices::global_store(&spec.url, spec.timeout)?,
            region: slices::slice_store(&spec.region_url, REGION_TIMEOUT)?,
            landing: slices::slice_store(&spec.region_url, LANDING_TIMEOUT)?,
            budgets: Mutex::new(HashMap::new()),
            down_until: Mutex::new(None),
            passes: tokio::sync::Mutex::new(false),
            offset_us: AtomicI64::new(0),
            metrics,
            spec,
        });
        tokio::spawn(keep(Arc::downgrade(&global)));
        tokio::spawn(prepare(Arc::downgrade(&global)));
        Ok(global)
    }

    /// Loads the scripts into both stores (which also opens the connections), so that a
    /// budget's first use pays one round trip to the global store, not a connection's
    /// handshake and a script's upload as well. `Err` while a store does not answer.
    async fn load_scripts(&self) -> Result<(), GlobalError> {
        self.global.prepare().await.map_err(GlobalError::Global)?;
        self.region.prepare().await.map_err(GlobalError::Region)?;
        Ok(())
    }

    /// This instance's region.
    pub fn region(&self) -> &str {
        &self.spec.region
    }

    /// The keys of `ask`'s budget in `window` (a windowed budget's, `None` for a token
    /// bucket): each window is a budget of its own, its start in the keys.
    fn keys(&self, ask: &Ask<'_>, window: Option<(u64, u64)>) -> Keys {
        let mut id = format!("{}:{}:", ask.key.budget, ask.key.kind.as_str());
        crate::limiter::push_hex(&mut id, ask.key.value);
        if let Some((start, _)) = window {
            id.push_str(&format!(":w{start}"));
        }
        let prefix = &self.spec.key_prefix;
        Keys {
            global: format!("{prefix}gb:{{{id}}}"),
            slice: format!("{prefix}gs:{{{id}}}"),
            id,
        }
    }

    /// The global store's clock now, as this instance reckons it (µs since the epoch).
    fn global_now_us(&self) -> u64 {
        let offset = self.offset_us.load(Ordering::Relaxed);
        epoch_us().saturating_add_signed(offset)
    }

    /// The window `limit` counts in now by the global store's clock, as reckoned here (a fixed
    /// window or a quota); `None` for a token bucket.
    fn window_of(&self, limit: &Limit) -> Option<(u64, u64)> {
        limit.algorithm().period_at(self.global_now_us())
    }

    fn budgets(&self) -> std::sync::MutexGuard<'_, HashMap<String, Local>> {
        self.budgets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spends `ask` (a `scope: global` limit) for one request: from the region's slice, or,
    /// when it cannot pay, from the global store. `Err` when a store failed (then `on_error`
    /// decides).
    pub async fn spend(&self, ask: &Ask<'_>) -> Result<Decision, GlobalError> {
        let mut window = self.window_of(ask.limit);
        // A windowed budget's window is the global store's to say: when it says the window
        // reckoned here is not the one its clock is in, the request is decided again in the
        // window its clock gave (once: the window it named is current by its clock).
        for _ in 0..2 {
            match self.spend_in(ask, window).await? {
                Spent::Decided(decision) => return Ok(decision),
                Spent::Outside { now_us } => window = ask.limit.algorithm().period_at(now_us),
            }
        }
        Err(GlobalError::Global(LimiterError::protocol(
            "the global store's clock left the window it named",
        )))
    }

    /// [`Global::spend`] in one window (`None`: a token bucket).
    async fn spend_in(
        &self,
        ask: &Ask<'_>,
        window: Option<(u64, u64)>,
    ) -> Result<Spent, GlobalError> {
        let limit = ask.limit;
        let cost = u64::from(limit.cost());
        let Keys {
            id,
            global: global_key,
            slice: slice_key,
        } = self.keys(ask, window);
        let now = Instant::now();
        let (want, empty_until, global_left) = {
            let mut budgets = self.budgets();
            let local = budgets.entry(id.clone()).or_insert_with(|| Local {
                limit: *limit,
                last_used: now,
                empty_until: None,
                want: FIRST_SLICE * cost,
                held: 0,
                global_left: u64::from(limit.algorithm().units()),
                window,
            });
            local.last_used = now;
            (local.want, local.empty_until, local.global_left)
        };
        let (paid, held) = self.spend_slice(&slice_key, cost).await?;
        let ends_in = window.map(|(_, end)| end.saturating_sub(self.global_now_us()));
        if paid {
            return Ok(Spent::Decided(Decision::allow(
                figures(limit, held + global_left, ends_in),
                0,
            )));
        }
        if let Some(until) = empty_until
            && until > now
        {
            let wait = ends_in.unwrap_or(until.saturating_duration_since(now).as_micros() as u64);
            return Ok(Spent::Decided(Decision::deny(
                figures(limit, held, ends_in),
                wait,
            )));
        }
        // The slice cannot pay: this request asks the global store for its own units and a
        // few for the slice (the keeper sizes slices; requests that each took a slice's worth
        // at once would pile the budget up in one region, and lose it all if the instance
        // died with them in flight).
        let few = (FIRST_SLICE * cost).min(want);
        let (taken, ends) = self
            .take(&global_key, &slice_key, limit, cost, few, held, window)
            .await?;
        let Taken {
            granted,
            left,
            lapsed,
            now_us,
            outside,
        } = taken;
        if outside {
            return Ok(Spent::Outside { now_us });
        }
        self.count_lapsed(lapsed);
        let ends_in = window.map(|(_, end)| end.saturating_sub(now_us));
        if granted < cost {
            // Until one unit may have refilled (a window: until it ends), or a quarter of the
            // ttl (a slice another region gives back).
            let refill = Duration::from_micros(ends_in.unwrap_or_else(|| {
                limit
                    .algorithm()
                    .span_us()
                    .saturating_mul(cost - left.min(cost))
            }));
            // A window's refusals end with it by the global store's clock (`ends`, never later
            // than its end), not by `now` plus what was left when the store decided, which
            // would run past the end by the round trip: the next window's requests would be
            // refused on this one's exhaustion.
            let until = match ends {
                Some(ends) => ends.min(now + self.spec.lease_ttl / 4),
                None => now + refill.min(self.spec.lease_ttl / 4),
            };
            if let Some(local) = self.budgets().get_mut(&id) {
                local.empty_until = Some(until);
                local.global_left = left;
            }
            return Ok(Spent::Decided(Decision::deny(
                figures(limit, held, ends_in),
                u64::try_from(refill.as_micros()).unwrap_or(u64::MAX),
            )));
        }
        self.metrics.global_units("granted", granted);
        let held_now = self
            .keep_extra(&slice_key, cost, granted - cost, held, ends)
            .await;
        if let Some(local) = self.budgets().get_mut(&id) {
            local.empty_until = None;
            local.global_left = left;
            local.held = held_now;
        }
        Ok(Spent::Decided(Decision::allow(
            figures(limit, held_now + left, ends_in),
            0,
        )))
    }

    /// Pays `cost` from the region's slice at `slice_key`: one round trip to the near store.
    /// The call is spawned, and its answer is the slice's until read here: a request dropped
    /// meanwhile (its decision past `storage.timeout`, its client gone) gives back what the
    /// slice paid it. Returns (paid, what the slice holds).
    async fn spend_slice(&self, slice_key: &str, cost: u64) -> Result<(bool, u64), GlobalError> {
        let region = self.region.clone();
        let key = slice_key.to_string();
        let mut pending = SpendPending {
            call: Some(tokio::spawn(async move { region.spend(&key, cost).await })),
            owed: self.owed(slice_key, 0),
            cost,
        };
        let Some(call) = pending.call.as_mut() else {
            return Err(GlobalError::Region(LimiterError::protocol("no call")));
        };
        let answer = call.await;
        pending.call = None;
        match answer {
            Ok(answer) => answer.map_err(GlobalError::Region),
            Err(e) => Err(GlobalError::Region(LimiterError::unavailable(
                crate::limiter::Cause::of("the call ended", e),
            ))),
        }
    }

    /// Puts `extra` units the global store granted a request beyond its `cost` in the slice
    /// (which held `held`), for a slice that ends at `ends` (a window's); returns what it holds
    /// after (as the region's store said, or `held + extra` when it did not say within
    /// [`REGION_TIMEOUT`]). The request's own units are the slice's until it returns with them:
    /// dropped while the extra goes to the slice, it gives them back. The extra's call is
    /// spawned on the landing connection, so it lands once whatever becomes of the request
    /// (given back as well, a call that did land would count it twice) and however long the
    /// region's store takes.
    async fn keep_extra(
        &self,
        slice_key: &str,
        cost: u64,
        extra: u64,
        held: u64,
        ends: Option<Instant>,
    ) -> u64 {
        let mut owed = self.owed(slice_key, cost);
        let ttl_ms = self.slice_ttl_ms(ends);
        let mut held_now = held;
        if extra > 0 && ttl_ms == 0 {
            // The window ends before a slice could spend them.
            self.metrics.global_units("lapsed", extra);
        }
        if extra > 0 && ttl_ms > 0 {
            let grant = Grant {
                units: extra,
                demand: cost,
                ttl_ms,
            };
            let added = self.land(slice_key, grant, "units granted for the slice");
            held_now = match tokio::time::timeout(REGION_TIMEOUT, added).await {
                Ok(Ok(Some(held))) => held,
                // Lost (and said so by the call), or not landed yet: the call goes on.
                Ok(Ok(None)) => held,
                Ok(Err(_)) | Err(_) => held + extra,
            };
        }
        owed.units = 0;
        held_now
    }

    /// Puts `grant` in the slice at `slice_key` on the landing connection, in a task of its own
    /// (it lands whatever becomes of its caller); a failure loses the units, which is counted
    /// (`lapsed`) and logged as `what`. The task answers what the slice holds after, `None` when
    /// the units were lost.
    fn land(
        &self,
        slice_key: &str,
        grant: Grant,
        what: &'static str,
    ) -> tokio::task::JoinHandle<Option<u64>> {
        land(
            self.landing.clone(),
            self.metrics.clone(),
            slice_key.to_string(),
            grant,
            what,
        )
    }

    /// A slice's life from now: `lease_ttl`, and for a windowed budget no later than its
    /// window's end on this instance's clock (`ends`), so that no region spends a window's
    /// unit after the global store's clock left it. 0 when the window has ended.
    fn slice_ttl_ms(&self, ends: Option<Instant>) -> u64 {
        let ttl = match ends {
            Some(ends) => self
                .spec
                .lease_ttl
                .min(ends.saturating_duration_since(Instant::now())),
            None => self.spec.lease_ttl,
        };
        ttl.as_millis() as u64
    }

    /// How to give back what `ask` (a `scope: global` limit) spent of this region's slice just
    /// now, for a request abandoned before it was forwarded ([`Refund::give`]).
    pub fn refund_of(&self, ask: &Ask<'_>) -> Refund {
        let window = self.window_of(ask.limit);
        let Keys { slice, .. } = self.keys(ask, window);
        // The slice may not be there yet (the request's unit came straight from the global
        // store): the refund makes it, for a slice's life.
        let ends = window.map(|(_, end)| {
            let left_us = end.saturating_sub(self.global_now_us());
            Instant::now() + std::time::Duration::from_micros(left_us)
        });
        Refund {
            region: self.landing.clone(),
            metrics: self.metrics.clone(),
            slice_key: slice,
            grant: Grant {
                units: u64::from(ask.limit.cost()),
                demand: 0,
                ttl_ms: self.slice_ttl_ms(ends),
            },
        }
    }

    /// What `ask`'s budget has now, spending nothing (`/budgets`): the region's slice and the
    /// global store's units left, as last seen.
    pub async fn peek(&self, ask: &Ask<'_>) -> Result<(Decision, u64), GlobalError> {
        let window = self.window_of(ask.limit);
        let Keys { id, slice, .. } = self.keys(ask, window);
        let held = self
            .region
            .held(&slice)
            .await
            .map_err(GlobalError::Region)?;
        let left = self
            .budgets()
            .get(&id)
            .map_or(u64::from(ask.limit.algorithm().units()), |l| l.global_left);
        // (As a check that allowed: what is left after one request's cost.)
        let after = (held + left).saturating_sub(u64::from(ask.limit.cost()));
        let ends_in = window.map(|(_, end)| end.saturating_sub(self.global_now_us()));
        Ok((Decision::allow(figures(ask.limit, after, ends_in), 0), held))
    }

    /// One call to the global store: `need` units for a request (0 for the keeper) and up to
    /// `want` more for the slice, in `window` for a windowed budget. Returns what it answered,
    /// and the window's end on this instance's clock (from the global store's: the call's
    /// start plus what the window had left when it decided, so never later than the end).
    ///
    /// A call that outlives `storage.global.timeout` is not abandoned: its request follows
    /// `on_error`, and whatever the global store granted it when the answer does come is put
    /// in the region's slice (`slice_key`), so a slow answer costs no unit of the budget.
    #[allow(clippy::too_many_arguments)]
    async fn take(
        &self,
        key: &str,
        slice_key: &str,
        limit: &Limit,
        need: u64,
        want: u64,
        held: u64,
        window: Option<(u64, u64)>,
    ) -> Result<(Taken, Option<Instant>), GlobalError> {
        if let Some(until) = *self.down_until.lock().unwrap_or_else(|e| e.into_inner())
            && until > Instant::now()
        {
            return Err(GlobalError::Down);
        }
        let call = tokio::spawn(self.global.take(Take {
            key: key.to_string(),
            capacity: limit.algorithm().units(),
            interval_us: limit.algorithm().span_us(),
            need,
            want,
            region: self.spec.region.clone(),
            ttl_ms: self.spec.lease_ttl.as_millis() as u64,
            held,
            window,
        }));
        let (sent, sent_us) = (Instant::now(), epoch_us());
        // Until the answer is read here, the call is the slice's: dropped (a timeout, or the
        // request itself dropped while it waited: its client went away), what it is granted
        // goes to the slice when it comes.
        let mut pending = Pending {
            call: Some(call),
            region: self.landing.clone(),
            slice_key: slice_key.to_string(),
            lease_ttl: self.spec.lease_ttl,
            window_end: window.map(|w| w.1),
            sent,
            metrics: self.metrics.clone(),
        };
        let Some(call) = pending.call.as_mut() else {
            return Err(GlobalError::Global(LimiterError::protocol("no call")));
        };
        let error = match tokio::time::timeout(self.spec.timeout, call).await {
            Ok(Ok(Ok(answer))) => {
                pending.call = None;
                self.metrics.global_call("ok");
                let midway = sent_us + (epoch_us().saturating_sub(sent_us)) / 2;
                let offset = answer.now_us as i128 - midway as i128;
                self.offset_us.store(
                    offset.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                    Ordering::Relaxed,
                );
                let ends = window.map(|(_, end)| {
                    sent + Duration::from_micros(end.saturating_sub(answer.now_us))
                });
                return Ok((answer, ends));
            }
            Ok(Ok(Err(e))) => {
                pending.call = None;
                self.metrics.global_call("error");
                e
            }
            Ok(Err(e)) => {
                pending.call = None;
                self.metrics.global_call("error");
                LimiterError::unavailable(crate::limiter::Cause::of("the call ended", e))
            }
            Err(_) => {
                self.metrics.global_call("timeout");
                LimiterError::Timeout(self.spec.timeout)
            }
        };
        let error = GlobalError::Global(error);
        self.down(&error);
        Err(error)
    }

    /// `units` of the slice at `slice_key` that a request holds ([`Owed`]).
    fn owed(&self, slice_key: &str, units: u64) -> Owed {
        Owed {
            region: self.landing.clone(),
            metrics: self.metrics.clone(),
            slice_key: slice_key.to_string(),
            units,
        }
    }

    /// The global store failed with `error`: left alone for [`DOWN_FOR`] (logged when it
    /// was up before).
    fn down(&self, error: &GlobalError) {
        let now = Instant::now();
        let mut until = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        if until.is_none_or(|u| u <= now) {
            tracing::warn!(region = %self.spec.region, %error, "global store failed: global limits follow storage.on_error for a second");
        }
        *until = Some(now + DOWN_FOR);
    }

    fn count_lapsed(&self, lapsed: u64) {
        if lapsed > 0 {
            self.metrics.global_units("lapsed", lapsed);
        }
    }

    /// One keeper pass over the budgets this instance spent (see the module's docs).
    async fn renew_all(&self) {
        let stopped = self.passes.lock().await;
        if *stopped {
            return;
        }
        let ttl = self.spec.lease_ttl;
        let now = Instant::now();
        let budgets: Vec<(String, Local)> = {
            let mut budgets = self.budgets();
            // A budget idle for two ttls whose slice is empty is forgotten, and so is a window
            // that has ended (its slice ended with it).
            let global_now = self.global_now_us();
            budgets.retain(|_, l| {
                (now.duration_since(l.last_used) < 2 * ttl || l.held > 0)
                    && l.window.is_none_or(|(_, end)| end > global_now)
            });
            budgets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let mut held_total = 0;
        for (id, local) in budgets {
            match self.renew(&id, &local).await {
                Ok(held) => held_total += held,
                Err(e) => tracing::debug!(budget = %id, error = %e, "global slice not renewed"),
            }
        }
        self.metrics.set_global_held(held_total);
    }

    /// Renews one budget's slice in this region, if this instance holds the region's claim on
    /// it for this pass; returns what the slice holds after.
    async fn renew(&self, id: &str, local: &Local) -> Result<u64, GlobalError> {
        let prefix = &self.spec.key_prefix;
        let slice_key = format!("{prefix}gs:{{{id}}}");
        let global_key = format!("{prefix}gb:{{{id}}}");
        let claim_key = format!("{prefix}gk:{{{id}}}");
        let period = self.spec.lease_ttl / 4;
        let claimed = self
            .region
            .claim(&claim_key, &self.spec.region, period.as_millis() as u64)
            .await
            .map_err(GlobalError::Region)?;
        if !claimed {
            return Ok(local.held);
        }
        let SliceRead {
            units: held,
            demand,
            idle,
        } = self
            .region
            .read(&slice_key)
            .await
            .map_err(GlobalError::Region)?;
        let limit = local.limit;
        let (want, target) = match plan(held, demand, idle) {
            Plan::Idle => {
                self.update(id, 0, FIRST_SLICE * u64::from(limit.cost()), None);
                return Ok(0);
            }
            Plan::GiveBack => {
                let units = self
                    .landing
                    .drain(&slice_key)
                    .await
                    .map_err(GlobalError::Region)?;
                if units > 0 {
                    self.give_back(&global_key, &limit, units, local.window)
                        .await?;
                }
                self.update(id, 0, FIRST_SLICE * u64::from(limit.cost()), None);
                return Ok(0);
            }
            Plan::Renew { want, target } => (want, target),
        };
        let (taken, ends) = self
            .take(&global_key, &slice_key, &limit, 0, want, held, local.window)
            .await?;
        if taken.outside {
            // The window has ended by the global store's clock: so has its slice.
            return Ok(0);
        }
        self.count_lapsed(taken.lapsed);
        self.metrics.global_units("granted", taken.granted);
        let (granted, left) = (taken.granted, taken.left);
        let ttl_ms = self.slice_ttl_ms(ends);
        if ttl_ms == 0 {
            self.count_lapsed(granted);
            return Ok(0);
        }
        let grant = Grant {
            units: granted,
            demand: 0,
            ttl_ms,
        };
        let renewed = self.land(&slice_key, grant, "units granted to renew the slice");
        let Ok(Some(held_now)) = renewed.await else {
            return Ok(0); // lost: counted and logged
        };
        self.update(id, held_now, target.max(1), Some(left));
        Ok(held_now)
    }

    fn update(&self, id: &str, held: u64, want: u64, left: Option<u64>) {
        if let Some(local) = self.budgets().get_mut(id) {
            local.held = held;
            local.want = want;
            if let Some(left) = left {
                local.global_left = left;
                if left > 0 {
                    local.empty_until = None;
                }
            }
        }
    }

    async fn give_back(
        &self,
        key: &str,
        limit: &Limit,
        units: u64,
        window: Option<(u64, u64)>,
    ) -> Result<(), GlobalError> {
        let call = self.global.give(Give {
            key: key.to_string(),
            capacity: limit.algorithm().units(),
            interval_us: limit.algorithm().span_us(),
            units,
            region: self.spec.region.clone(),
            window,
        });
        let error = match tokio::time::timeout(self.spec.timeout, call).await {
            Ok(Ok(_)) => {
                self.metrics.global_call("ok");
                self.metrics.global_units("returned", units);
                return Ok(());
            }
            Ok(Err(e)) => {
                self.metrics.global_call("error");
                e
            }
            Err(_) => {
                self.metrics.global_call("timeout");
                LimiterError::Timeout(self.spec.timeout)
            }
        };
        // Out of the slice and not back in the budget: lost, never spent twice (a call that
        // timed out may still land, and then they were returned after all).
        self.metrics.global_units("lapsed", units);
        tracing::warn!(units, error = %error, "units of a slice given back are lost: the global store failed");
        Err(GlobalError::Global(error))
    }

    /// Gives every slice this instance's region holds of the budgets it spent back to the
    /// global store (at shutdown), so that no unit lapses with it.
    pub async fn give_back_all(&self) {
        // No keeper pass after this one, and none in flight.
        let mut stopped = self.passes.lock().await;
        *stopped = true;
        let ids: Vec<(String, Local)> = self
            .budgets()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let prefix = &self.spec.key_prefix;
        for (id, local) in ids {
            let slice_key = format!("{prefix}gs:{{{id}}}");
            let global_key = format!("{prefix}gb:{{{id}}}");
            let Ok(units) = self.landing.drain(&slice_key).await else {
                continue;
            };
            if units > 0 {
                let _ = self
                    .give_back(&global_key, &local.limit, units, local.window)
                    .await;
            }
        }
    }
}

/// What a `take` answers, or why it failed.
type TakeAnswer = Result<Taken, LimiterError>;

/// A call to the global store whose answer nobody has read yet: dropped unread, it is left to
/// finish on its own and what it was granted is put in the region's slice.
/// Units of a region's slice that a request holds and was not admitted with: put back in the
/// slice if the request is dropped holding them (its decision outlived `storage.timeout`, or its
/// client left), so that no unit the stores spent is one nobody was admitted with.
struct Owed {
    /// The landing connection ([`Global`]'s `landing`).
    region: Arc<dyn SliceStore>,
    metrics: Arc<Metrics>,
    slice_key: String,
    units: u64,
}

impl Drop for Owed {
    fn drop(&mut self) {
        if self.units == 0 {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // Back into the slice as it is, its end kept (a window's slice never outlives it).
        let grant = Grant {
            units: self.units,
            demand: 0,
            ttl_ms: 0,
        };
        land(
            self.region.clone(),
            self.metrics.clone(),
            std::mem::take(&mut self.slice_key),
            grant,
            "an abandoned request's units",
        );
    }
}

/// Units a request spent of a `scope: global` budget, which [`Refund::give`] puts in the region's
/// slice (made if need be, living no longer than a slice does: a window's never outlives it);
/// dropped, they stay spent.
pub struct Refund {
    /// The landing connection ([`Global`]'s `landing`).
    region: Arc<dyn SliceStore>,
    metrics: Arc<Metrics>,
    slice_key: String,
    grant: Grant,
}

impl Refund {
    /// Puts the units back in the slice (a spawned call; a store that fails loses them, as an
    /// abandoned request's are: an under-grant, never an over-grant, counted `lapsed`).
    pub fn give(self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let Refund {
            region,
            metrics,
            slice_key,
            grant,
        } = self;
        if grant.ttl_ms == 0 {
            metrics.global_units("lapsed", grant.units);
            return; // the window has ended: so has its slice
        }
        land(
            region,
            metrics,
            slice_key,
            grant,
            "an abandoned request's units",
        );
    }
}

/// A spend from a region's slice under way: if the request is dropped before it reads the
/// answer, what the slice paid goes back to it when the answer comes.
struct SpendPending {
    call: Option<tokio::task::JoinHandle<Result<(bool, u64), LimiterError>>>,
    owed: Owed,
    cost: u64,
}

impl Drop for SpendPending {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let owed = Owed {
            region: self.owed.region.clone(),
            metrics: self.owed.metrics.clone(),
            slice_key: std::mem::take(&mut self.owed.slice_key),
            units: 0,
        };
        let cost = self.cost;
        runtime.spawn(async move {
            // The whole guard moved in (a closure would capture only the field it sets), so
            // that dropping it here gives the units back.
            let mut owed = owed;
            if let Ok(Ok((true, _))) = call.await {
                owed.units = cost;
            }
            drop(owed);
        });
    }
}

struct Pending {
    call: Option<tokio::task::JoinHandle<TakeAnswer>>,
    region: Arc<dyn SliceStore>,
    slice_key: String,
    lease_ttl: Duration,
    /// A windowed budget's window end (the global store's clock), and when the call was sent:
    /// the late units go to a slice that ends with the window.
    window_end: Option<u64>,
    sent: Instant,
    metrics: Arc<Metrics>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let region = self.region.clone();
        let slice_key = std::mem::take(&mut self.slice_key);
        let (lease_ttl, window_end, sent) = (self.lease_ttl, self.window_end, self.sent);
        let metrics = self.metrics.clone();
        runtime.spawn(async move {
            let Ok(Ok(Taken {
                granted, now_us, ..
            })) = call.await
            else {
                return;
            };
            if granted == 0 {
                return;
            }
            metrics.global_units("granted", granted);
            let ttl = match window_end {
                Some(end) => {
                    let ends = sent + Duration::from_micros(end.saturating_sub(now_us));
                    lease_ttl.min(ends.saturating_duration_since(Instant::now()))
                }
                None => lease_ttl,
            };
            let ttl_ms = ttl.as_millis() as u64;
            if ttl_ms == 0 {
                metrics.global_units("lapsed", granted);
                return;
            }
            let grant = Grant {
                units: granted,
                demand: 0,
                ttl_ms,
            };
            let landed = land(region, metrics, slice_key, grant, "a late answer's units");
            if let Ok(Some(_)) = landed.await {
                tracing::debug!(granted, "a late answer's units went to the slice");
            }
        });
    }
}

/// Passes in a row without demand before a region's slice goes back to the global store: a
/// whole `lease_ttl` (a lull of a pass or two keeps it).
const IDLE_PASSES: u64 = 4;

/// What the keeper does with a region's slice of one budget.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// No slice and no demand: nothing.
    Idle,
    /// No demand for [`IDLE_PASSES`]: the slice goes back.
    GiveBack,
    /// Asks the global store for `want` units beyond what the slice `held`, to reach `target`
    /// (1.5 times the demand over one `lease_ttl`); `want` 0 renews the slice's end only.
    Renew { want: u64, target: u64 },
}

/// The keeper's rule for a slice holding `held` units after a pass (a quarter of `lease_ttl`)
/// that saw `demand` units asked, the `idle`-th pass in a row without demand.
fn plan(held: u64, demand: u64, idle: u64) -> Plan {
    if demand == 0 && held == 0 {
        return Plan::Idle;
    }
    if demand == 0 && idle >= IDLE_PASSES {
        return Plan::GiveBack;
    }
    // Demand over one ttl, from the demand over one pass; the simulation's 1.5 times.
    let per_ttl = demand.saturating_mul(4);
    let target = per_ttl.saturating_add(per_ttl / 2);
    Plan::Renew {
        want: target.saturating_sub(held),
        target: target.max(1),
    }
}

/// A global limit's figures for the headers: its capacity, and `remaining` as this region
/// sees it (its slice and the global store's units left at the last call); a windowed
/// budget resets when its window ends (`ends_in_us`), a bucket when it would be full again.
fn figures(limit: &Limit, remaining: u64, ends_in_us: Option<u64>) -> Figures {
    let capacity = u64::from(limit.algorithm().units());
    let remaining = remaining.min(capacity);
    Figures {
        limit: capacity,
        remaining,
        reset_after_us: ends_in_us
            .unwrap_or_else(|| (capacity - remaining).saturating_mul(limit.algorithm().span_us())),
    }
}

/// What [`Global::spend_in`] came to.
enum Spent {
    Decided(Decision),
    /// The global store's clock is not in the window asked for: it is at `now_us`.
    Outside {
        now_us: u64,
    },
}

/// [`Global::land`], for the guards that outlive their request and hold no [`Global`]: puts
/// `grant` in the slice at `slice_key` in a task of its own. Units that do not land (the store
/// failed, or units given back found their slice lapsed) are counted `lapsed`; a failure is
/// logged as `what`. The task answers what the slice holds after, `None` when they were lost.
fn land(
    store: Arc<dyn SliceStore>,
    metrics: Arc<Metrics>,
    slice_key: String,
    grant: Grant,
    what: &'static str,
) -> tokio::task::JoinHandle<Option<u64>> {
    tokio::spawn(async move {
        let units = grant.units;
        match store.add(&slice_key, grant).await {
            // Given back (ttl 0) to a slice that has lapsed: they lapsed with it.
            Ok(0) if grant.ttl_ms == 0 && units > 0 => {
                metrics.global_units("lapsed", units);
                tracing::debug!(units, "{what}: the slice had lapsed, and they with it");
                None
            }
            Ok(held) => Some(held),
            // Only the slice's end was to be renewed: nothing is lost.
            Err(e) if units == 0 => {
                tracing::debug!(error = %e, "{what}: the region's store failed");
                None
            }
            Err(e) => {
                metrics.global_units("lapsed", units);
                tracing::warn!(units, error = %e, "{what} are lost: the region's store failed");
                None
            }
        }
    })
}

/// This instance's clock, in µs since the epoch.
fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Loads the scripts at start, again every second until both stores have answered.
async fn prepare(global: std::sync::Weak<Global>) {
    loop {
        let Some(g) = global.upgrade() else {
            return;
        };
        match g.load_scripts().await {
            Ok(()) => return,
            Err(e) => tracing::debug!(error = %e, "global budgets: stores not ready yet"),
        }
        drop(g);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The keeper: renews slices every quarter of `lease_ttl` until the [`Global`] is dropped.
async fn keep(global: std::sync::Weak<Global>) {
    loop {
        let period = match global.upgrade() {
            Some(g) => g.spec.lease_ttl / 4,
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(g) = global.upgrade() else {
            return;
        };
        g.renew_all().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_sized_to_one_and_a_half_times_a_ttls_demand() {
        // 100 units asked in a pass: 400 over a ttl, a target of 600.
        assert_eq!(
            plan(0, 100, 0),
            Plan::Renew {
                want: 600,
                target: 600
            }
        );
        assert_eq!(
            plan(250, 100, 0),
            Plan::Renew {
                want: 350,
                target: 600
            }
        );
        // A slice above its target asks nothing: it only renews its end.
        assert_eq!(
            plan(900, 100, 0),
            Plan::Renew {
                want: 0,
                target: 600
            }
        );
    }

    #[test]
    fn a_slice_without_demand_goes_back_after_a_whole_ttl() {
        for idle in 1..IDLE_PASSES {
            assert_eq!(
                plan(40, 0, idle),
                Plan::Renew { want: 0, target: 1 },
                "{idle}"
            );
        }
        assert_eq!(plan(40, 0, IDLE_PASSES), Plan::GiveBack);
        assert_eq!(plan(40, 0, IDLE_PASSES + 3), Plan::GiveBack);
        assert_eq!(plan(0, 0, 9), Plan::Idle);
    }

    #[test]
    fn huge_demand_does_not_overflow() {
        assert!(matches!(
            plan(0, u64::MAX, 0),
            Plan::Renew { want: u64::MAX, .. }
        ));
    }

    #[test]
    fn figures_never_say_more_than_the_capacity() {
        let limit = Limit::of(crate::limiter::Algorithm::token_bucket(100, 10.0).unwrap());
        let f = figures(&limit, 250, None);
        assert_eq!((f.limit, f.remaining, f.reset_after_us), (100, 100, 0));
        let f = figures(&limit, 40, None);
        assert_eq!(
            (f.limit, f.remaining, f.reset_after_us),
            (100, 40, 6_000_000)
        );
    }
}
