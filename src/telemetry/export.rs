//! The way out: ended spans onto a bounded queue without waiting (a full queue drops the span
//! and counts it), and one task that exports them in batches: OTLP/HTTP protobuf
//! (`otlp::encode`) POSTed through `opentelemetry-http`'s hyper client with rustls.

use std::time::Duration;

use bytes::Bytes;
use opentelemetry::Context;
use opentelemetry_http::HttpClient;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};
use prometheus_client::metrics::counter::Counter;

use super::otlp;

use super::{BATCH, BATCH_WAIT, EXPORT_TIMEOUT};

/// Ended spans on their way to the exporting task.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    pub(super) queue: tokio::sync::mpsc::Sender<SpanData>,
    pub(super) dropped: Counter,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The HTTP client both exporters send with: hyper on floodgate's runtime, TLS by rustls for
/// an `https://` collector.
pub(super) type Client = opentelemetry_http::hyper::HyperClient<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
>;

pub(super) fn http_client(_endpoint: &http::Uri) -> anyhow::Result<Client> {
    let connector = crate::tls::https_or_http("the OTLP collector", None);
    Ok(opentelemetry_http::hyper::HyperClient::new(
        connector,
        EXPORT_TIMEOUT,
        None,
    ))
}

/// The exporting task: batches of at most [`BATCH`] spans, sent to `url` one export at a time;
/// a failed export's spans are counted as dropped (the collector may be down: they are not
/// retried, so memory stays bounded).
pub(super) async fn export_spans(
    mut spans: tokio::sync::mpsc::Receiver<SpanData>,
    client: Client,
    url: String,
    resource: otlp::Resource,
    dropped: Counter,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        // Whatever is queued is taken at once (`recv_many`), not a span at a time.
        if spans.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(deadline, spans.recv_many(&mut batch, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = batch.len() as u64;
        let body = Bytes::from(otlp::encode(&resource, &batch));
        batch.clear();
        let Ok(request) = http::Request::post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body)
        else {
            dropped.inc_by(n);
            continue;
        };
        match tokio::time::timeout(EXPORT_TIMEOUT, client.send_bytes(request)).await {
            Ok(Ok(response)) if response.status().is_success() => {}
            Ok(Ok(response)) => {
                dropped.inc_by(n);
                tracing::debug!(status = %response.status(), spans = n, "span export refused");
            }
            Ok(Err(e)) => {
                dropped.inc_by(n);
                tracing::debug!(error = %e, spans = n, "span export failed");
            }
            Err(_) => {
                dropped.inc_by(n);
                tracing::debug!(spans = n, "span export timed out");
            }
        }
    }
}
