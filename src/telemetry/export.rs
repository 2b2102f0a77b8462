//! The way out: one task that takes ended spans off the bounded queue (`Telemetry::emit` puts
//! them there without waiting, and says when a batch's worth is waiting) and exports them in
//! batches: OTLP/HTTP protobuf (`otlp::encode`) POSTed through `opentelemetry-http`'s hyper
//! client with rustls.

use std::sync::Arc;

use bytes::Bytes;
use opentelemetry_http::HttpClient;
use opentelemetry_sdk::trace::SpanData;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc::Receiver;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{Notify, oneshot};

use super::otlp;

use super::{BATCH, BATCH_WAIT, EXPORT_TIMEOUT};

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

/// The exporting task: every [`BATCH_WAIT`], or as soon as `full` says a batch's worth is
/// waiting, it takes what is queued and sends it to `url` in batches of at most [`BATCH`],
/// one export at a time. In between it does not wait on the queue, so queueing a span wakes
/// nothing. A failed export's spans are counted as dropped (the collector may be down: they
/// are not retried, so memory stays bounded). A flush (`flushes`) exports everything queued at
/// once and then says so. It ends once the queue is closed and empty.
pub(super) async fn export_spans(
    mut spans: Receiver<SpanData>,
    full: Arc<Notify>,
    mut flushes: Receiver<oneshot::Sender<()>>,
    client: Client,
    url: String,
    resource: otlp::Resource,
    dropped: Counter,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let flush = tokio::select! {
            _ = tokio::time::sleep(BATCH_WAIT) => None,
            _ = full.notified() => None,
            Some(done) = flushes.recv() => Some(done),
        };
        // Batches until the queue is empty (a batch short of `BATCH` took the last span).
        loop {
            let closed = take(&mut spans, &mut batch);
            let more = batch.len() == BATCH;
            if !batch.is_empty() {
                export(&client, &url, &resource, &batch, &dropped).await;
                batch.clear();
            }
            if closed {
                return;
            }
            if !more {
                break;
            }
        }
        if let Some(done) = flush {
            let _ = done.send(());
        }
    }
}

/// Moves up to [`BATCH`] queued spans into `batch` without waiting; true when the queue is
/// closed and empty.
fn take(spans: &mut Receiver<SpanData>, batch: &mut Vec<SpanData>) -> bool {
    while batch.len() < BATCH {
        match spans.try_recv() {
            Ok(span) => batch.push(span),
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => return true,
        }
    }
    false
}

/// One export: `batch` as one OTLP request, within [`EXPORT_TIMEOUT`].
async fn export(
    client: &Client,
    url: &str,
    resource: &otlp::Resource,
    batch: &[SpanData],
    dropped: &Counter,
) {
    let n = batch.len() as u64;
    let body = Bytes::from(otlp::encode(resource, batch));
    let Ok(request) = http::Request::post(url)
        .header("content-type", "application/x-protobuf")
        .body(body)
    else {
        dropped.inc_by(n);
        return;
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
