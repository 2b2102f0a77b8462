//! The demo API itself: a fixed worker pool in front of a fake "matching service".
//!
//! Every request except `GET /__stats` must take one of `workers` permits (a FIFO tokio
//! [`Semaphore`], so waiting requests form a queue), holds it for `service_time`, and is answered
//! 200. A request that cannot get a permit within `queue_timeout` is answered 503: this is how the
//! service fails under overload, like a saturated thread pool. Capacity is therefore
//! `workers / service_time` requests per second; anything above that queues, then fails.
//!
//! It can get sick and heal at run time: `POST /__capacity?service_time=150ms&workers=4`
//! changes the service time and the worker pool for the requests that start from then on (a
//! smaller pool takes effect as workers free up), so tests and the load test can degrade the
//! upstream mid-run and see floodgate's adaptive concurrency follow.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Body;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Semaphore;

use crate::body::{DemoBody, json_response};

/// Path of the statistics endpoint, which bypasses the worker pool.
pub const STATS_PATH: &str = "/__stats";
/// Path of the capacity knob (`service_time=`, `workers=`), which bypasses the worker pool.
pub const CAPACITY_PATH: &str = "/__capacity";

/// How the demo API behaves at start-up (`/__capacity` changes the first two).
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    /// Size of the worker pool.
    pub workers: usize,
    /// How long one request holds a worker.
    pub service_time: Duration,
    /// How long a request may wait for a worker before it is answered 503.
    pub queue_timeout: Duration,
}

/// Shared state: the worker pool and the counters reported by `/__stats`.
#[derive(Debug)]
pub struct DemoApi {
    capacity: Capacity,
    workers: Semaphore,
    /// The service time now, in µs, and the pool's size now (the knob's).
    service_us: AtomicU64,
    pool: std::sync::Mutex<usize>,
    served: AtomicU64,
    rejected: AtomicU64,
    in_flight: AtomicU64,
}

/// Decrements `in_flight` when a request ends, including when its client goes away mid-wait
/// and hyper drops the handler future.
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl DemoApi {
    /// Builds the API with an idle worker pool and zeroed counters.
    pub fn new(capacity: Capacity) -> Arc<Self> {
        Arc::new(DemoApi {
            capacity,
            workers: Semaphore::new(capacity.workers),
            service_us: AtomicU64::new(capacity.service_time.as_micros() as u64),
            pool: std::sync::Mutex::new(capacity.workers),
            served: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        })
    }

    /// Answers one request. Never fails: every outcome is an HTTP response.
    ///
    /// Generic over the body so unit tests can call it without a socket; the server passes
    /// hyper's `Incoming`.
    pub async fn handle<B: Body>(
        self: Arc<Self>,
        req: Request<B>,
    ) -> Result<Response<DemoBody>, Infallible> {
        if req.method() == Method::GET && req.uri().path() == STATS_PATH {
            return Ok(self.stats());
        }
        if req.uri().path() == CAPACITY_PATH {
            return Ok(self.set_capacity(req.uri().query().unwrap_or("")));
        }
        let _in_flight = InFlight::enter(&self.in_flight);
        let method = req.method().to_string();
        let path = req.uri().path().to_owned();

        // Read the body, as a real API would before doing its work. A client that breaks off
        // mid-body gets no answer worth sending; 400 is the honest one.
        let chat = req.method() == Method::POST && path == crate::chat::PATH;
        let (parts, body) = req.into_parts();
        let Ok(body) = body.collect().await else {
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "bad_request_body"}),
            ));
        };

        let permit =
            match tokio::time::timeout(self.capacity.queue_timeout, self.workers.acquire()).await {
                Ok(Ok(permit)) => permit,
                // Timed out in the queue, or (never, since it is not closed) the pool was closed.
                Ok(Err(_)) | Err(_) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    return Ok(json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        serde_json::json!({
                            "error": "overloaded",
                            "detail": format!(
                                "no worker free within {} ms",
                                self.capacity.queue_timeout.as_millis()
                            ),
                        }),
                    ));
                }
            };
        tokio::time::sleep(Duration::from_micros(
            self.service_us.load(Ordering::Relaxed),
        ))
        .await;
        drop(permit);
        let served = self.served.fetch_add(1, Ordering::Relaxed);
        if chat {
            return Ok(crate::chat::answer(
                &parts.headers,
                &body.to_bytes(),
                served,
            ));
        }
        Ok(json_response(
            StatusCode::OK,
            serde_json::json!({"ok": true, "path": path, "method": method}),
        ))
    }

    /// The knob: `service_time=DURATION` and `workers=N` (either or both), for the requests that
    /// start from now on. 400 for anything else; the new capacity as `/__stats` says it.
    fn set_capacity(self: &Arc<Self>, query: &str) -> Response<DemoBody> {
        let bad = |detail: String| {
            json_response(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "bad_capacity", "detail": detail}),
            )
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "service_time" => match crate::duration::parse_duration(value) {
                    Ok(d) => self
                        .service_us
                        .store(d.as_micros() as u64, Ordering::Relaxed),
                    Err(e) => return bad(format!("service_time: {e}")),
                },
                "workers" => match value.parse::<usize>() {
                    Ok(n) if n >= 1 => self.resize(n),
                    _ => return bad(format!("workers: {value:?} is not a count of at least 1")),
                },
                other => return bad(format!("unknown parameter {other:?}")),
            }
        }
        self.stats()
    }

    /// Grows the pool at once, or shrinks it as workers free up (the removed permits are
    /// taken, then forgotten).
    fn resize(self: &Arc<Self>, workers: usize) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if workers > *pool {
            self.workers.add_permits(workers - *pool);
        } else if workers < *pool {
            let remove = (*pool - workers) as u32;
            let api = self.clone();
            tokio::spawn(async move {
                if let Ok(permits) = api.workers.acquire_many(remove).await {
                    permits.forget();
                }
            });
        }
        *pool = workers;
    }

    /// The `/__stats` answer: `{"served": N, "rejected": N, "in_flight": N}`.
    ///
    /// `served` counts 200s from a worker, `rejected` counts 503s from the queue timeout, and
    /// `in_flight` counts requests that are queued for or holding a worker right now.
    fn stats(&self) -> Response<DemoBody> {
        json_response(
            StatusCode::OK,
            serde_json::json!({
                "served": self.served.load(Ordering::Relaxed),
                "rejected": self.rejected.load(Ordering::Relaxed),
                "in_flight": self.in_flight.load(Ordering::Relaxed),
                "workers": *self.pool.lock().unwrap_or_else(|p| p.into_inner()),
                "service_time_ms": self.service_us.load(Ordering::Relaxed) as f64 / 1000.0,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Empty;
    use http_body_util::Full;

    fn api(workers: usize) -> Arc<DemoApi> {
        DemoApi::new(Capacity {
            workers,
            service_time: Duration::from_millis(20),
            queue_timeout: Duration::from_secs(2),
        })
    }

    fn request(method: Method, path: &str) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(Bytes::from_static(b"{\"rider_id\":\"r1\"}")));
        *req.method_mut() = method;
        *req.uri_mut() = path.parse().expect("test uri");
        req
    }

    async fn body_json(response: Response<DemoBody>) -> serde_json::Value {
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("full body")
            .to_bytes();
        serde_json::from_slice(&bytes).expect("json body")
    }

    /// (served, rejected, in_flight) from `/__stats`.
    async fn counters(api: &Arc<DemoApi>) -> (u64, u64, u64) {
        let s = stats(api).await;
        let n = |k: &str| s[k].as_u64().unwrap();
        (n("served"), n("rejected"), n("in_flight"))
    }

    async fn stats(api: &Arc<DemoApi>) -> serde_json::Value {
        let mut req = Request::new(Empty::<Bytes>::new());
        *req.uri_mut() = STATS_PATH.parse().expect("test uri");
        let response = api.clone().handle(req).await.expect("infallible");
        body_json(response).await
    }

    #[tokio::test(start_paused = true)]
    async fn answers_any_path_after_holding_a_worker() {
        let api = api(1);
        let started = tokio::time::Instant::now();
        let response = api
            .clone()
            .handle(request(Method::POST, "/api/rides/request"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!(
            body_json(response).await,
            serde_json::json!({"ok": true, "path": "/api/rides/request", "method": "POST"})
        );
        assert_eq!(counters(&api).await, (1, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn sheds_load_with_503_when_no_worker_frees_up_in_time() {
        let api = DemoApi::new(Capacity {
            workers: 1,
            service_time: Duration::from_secs(10),
            queue_timeout: Duration::from_secs(1),
        });
        let busy = tokio::spawn(api.clone().handle(request(Method::POST, "/a")));
        tokio::task::yield_now().await;
        let response = api
            .clone()
            .handle(request(Method::POST, "/b"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body_json(response).await["error"], "overloaded");
        assert_eq!(counters(&api).await, (0, 1, 1));
        let first = busy.await.expect("task").expect("infallible");
        assert_eq!(first.status(), StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn the_capacity_knob_changes_service_time_and_workers_at_run_time() {
        let api = api(2);
        let knob = |query: &str| request(Method::POST, &format!("{CAPACITY_PATH}?{query}"));
        let r = api
            .clone()
            .handle(knob("service_time=150ms&workers=1"))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let s = body_json(r).await;
        assert_eq!(
            (s["workers"].as_u64(), s["service_time_ms"].as_f64()),
            (Some(1), Some(150.0))
        );
        // One worker, 150 ms each: two requests take 300 ms together. (The pool shrinks as a
        // worker frees up: here at once, once the task taking it has run.)
        tokio::task::yield_now().await;
        let started = tokio::time::Instant::now();
        let (a, b) = tokio::join!(
            api.clone().handle(request(Method::POST, "/x")),
            api.clone().handle(request(Method::POST, "/y"))
        );
        assert_eq!(
            (a.unwrap().status(), b.unwrap().status()),
            (StatusCode::OK, StatusCode::OK)
        );
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        // Healed: two workers, 20 ms.
        api.clone()
            .handle(knob("service_time=20ms&workers=2"))
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let _ = tokio::join!(
            api.clone().handle(request(Method::POST, "/x")),
            api.clone().handle(request(Method::POST, "/y"))
        );
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        let bad = api.clone().handle(knob("workers=0")).await.unwrap();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    }
}
