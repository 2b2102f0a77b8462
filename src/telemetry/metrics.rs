//! floodgate's metrics over OTLP: every `metrics_interval`, what `/metrics` says now, as OTLP
//! metrics (cumulative sums for counters, gauges, explicit-bucket histograms), under the names
//! `/metrics` has. One source of truth: the Prometheus registry is rendered and read back, so
//! the two can never disagree and no instrument is declared twice.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry_http::HttpClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

/// Exports `render()` to `url` every `interval`, forever. A failed export is logged at debug
/// level and not retried: the next one carries the cumulative figures anyway.
pub(super) async fn export(
    client: super::Client,
    url: String,
    resource: opentelemetry_sdk::Resource,
    interval: Duration,
    render: impl Fn() -> String + Send + Sync + 'static,
) {
    let started = unix_nanos();
    let resource = Resource {
        attributes: resource
            .iter()
            .map(|(k, v)| string_kv(k.as_str(), &v.to_string()))
            .collect(),
        ..Default::default()
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let metrics = read(&render(), started, unix_nanos());
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "floodgate".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let body = Bytes::from(request.encode_to_vec());
        let Ok(http) = http::Request::post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body)
        else {
            return;
        };
        match client.send_bytes(http).await {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => tracing::debug!(status = %response.status(), "metrics export refused"),
            Err(e) => tracing::debug!(error = %e, "metrics export failed"),
        }
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

/// A sample's labels, in the order written.
type Labels<'t> = Vec<(&'t str, String)>;

/// One sample line: its name, labels and value.
struct Sample<'t> {
    name: &'t str,
    labels: Vec<(&'t str, String)>,
    value: f64,
}

/// Reads OpenMetrics text (as `prometheus-client` writes it) into OTLP metrics.
pub(super) fn read(text: &str, start: u64, now: u64) -> Vec<Metric> {
    let mut kinds: BTreeMap<&str, &str> = BTreeMap::new();
    let mut help: BTreeMap<&str, &str> = BTreeMap::new();
    let mut samples: Vec<Sample<'_>> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                kinds.insert(name, kind);
            }
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = rest.split_once(' ') {
                help.insert(name, text);
            }
        } else if !line.starts_with('#')
            && let Some(sample) = sample(line)
        {
            samples.push(sample);
        }
    }
    let mut out = Vec::new();
    for (&family, &kind) in &kinds {
        let description = help.get(family).copied().unwrap_or("").to_string();
        match kind {
            "counter" => {
                let name = format!("{family}_total");
                let points = samples
                    .iter()
                    .filter(|s| s.name == name)
                    .map(|s| number(s, start, now))
                    .collect();
                out.push(Metric {
                    name,
                    description,
                    data: Some(metric::Data::Sum(Sum {
                        data_points: points,
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                        is_monotonic: true,
                    })),
                    ..Default::default()
                });
            }
            "gauge" => {
                let points = samples
                    .iter()
                    .filter(|s| s.name == family)
                    .map(|s| number(s, start, now))
                    .collect();
                out.push(Metric {
                    name: family.to_string(),
                    description,
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: points,
                    })),
                    ..Default::default()
                });
            }
            "histogram" => {
                out.push(Metric {
                    name: family.to_string(),
                    description,
                    data: Some(metric::Data::Histogram(Histogram {
                        data_points: histogram(family, &samples, start, now),
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    })),
                    ..Default::default()
                });
            }
            _ => {}
        }
    }
    out
}

fn number(s: &Sample<'_>, start: u64, now: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes: s.labels.iter().map(|(k, v)| string_kv(k, v)).collect(),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(s.value)),
        ..Default::default()
    }
}

/// A histogram family's points: one per label set (`le` aside), its cumulative `_bucket`
/// counts turned into per-bucket counts.
fn histogram(
    family: &str,
    samples: &[Sample<'_>],
    start: u64,
    now: u64,
) -> Vec<HistogramDataPoint> {
    let bucket = format!("{family}_bucket");
    let (sum, count) = (format!("{family}_sum"), format!("{family}_count"));
    let mut points: BTreeMap<Labels<'_>, HistogramDataPoint> = BTreeMap::new();
    let mut cumulative: BTreeMap<Labels<'_>, Vec<(f64, f64)>> = BTreeMap::new();
    for s in samples {
        let labels: Labels<'_> = s
            .labels
            .iter()
            .filter(|(k, _)| *k != "le")
            .cloned()
            .collect();
        let point = points
            .entry(labels.clone())
            .or_insert_with(|| HistogramDataPoint {
                attributes: labels.iter().map(|(k, v)| string_kv(k, v)).collect(),
                start_time_unix_nano: start,
                time_unix_nano: now,
                ..Default::default()
            });
        if s.name == bucket {
            let le = s
                .labels
                .iter()
                .find(|(k, _)| *k == "le")
                .and_then(|(_, v)| {
                    if v == "+Inf" {
                        Some(f64::INFINITY)
                    } else {
                        v.parse().ok()
                    }
                });
            if let Some(le) = le {
                cumulative.entry(labels).or_default().push((le, s.value));
            }
        } else if s.name == sum {
            point.sum = Some(s.value);
        } else if s.name == count {
            point.count = s.value as u64;
        }
    }
    for (labels, mut buckets) in cumulative {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let Some(point) = points.get_mut(&labels) {
            let mut before = 0.0;
            for (le, total) in buckets {
                if le.is_finite() {
                    point.explicit_bounds.push(le);
                }
                point.bucket_counts.push((total - before).max(0.0) as u64);
                before = total;
            }
        }
    }
    points.into_values().collect()
}

/// `name{a="x",b="y"} value` (or `name value`); a timestamp or exemplar after it is ignored.
fn sample(line: &str) -> Option<Sample<'_>> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(at) => line.split_at(at),
        None => return None,
    };
    let mut labels = Vec::new();
    let rest = if let Some(inner) = rest.strip_prefix('{') {
        let end = inner.find('}')?;
        let mut text = &inner[..end];
        while !text.is_empty() {
            let (key, after) = text.split_once("=\"")?;
            // A value ends at the first quote not escaped.
            let mut value = String::new();
            let mut chars = after.char_indices();
            let mut close = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, next)) = chars.next() {
                            value.push(match next {
                                'n' => '\n',
                                other => other,
                            });
                        }
                    }
                    '"' => {
                        close = Some(i);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let close = close?;
            labels.push((key.trim_start_matches(','), value));
            text = after[close + 1..].trim_start_matches(',');
        }
        &inner[end + 1..]
    } else {
        rest
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_read_back_under_their_names() {
        let text = "# HELP floodgate_requests Requests.\n# TYPE floodgate_requests counter\n\
floodgate_requests_total{route=\"api\",decision=\"allowed\"} 7\n\
floodgate_requests_total{route=\"a,b\\\"c\",decision=\"denied\"} 2\n\
# TYPE floodgate_open_connections gauge\nfloodgate_open_connections 3\n\
# TYPE floodgate_limiter_duration_seconds histogram\n\
floodgate_limiter_duration_seconds_bucket{le=\"0.001\"} 4\n\
floodgate_limiter_duration_seconds_bucket{le=\"0.01\"} 9\n\
floodgate_limiter_duration_seconds_bucket{le=\"+Inf\"} 10\n\
floodgate_limiter_duration_seconds_sum 0.05\nfloodgate_limiter_duration_seconds_count 10\n# EOF\n";
        let metrics = read(text, 1, 2);
        let by = |name: &str| metrics.iter().find(|m| m.name == name).unwrap();
        let Some(metric::Data::Sum(sum)) = &by("floodgate_requests_total").data else {
            panic!("not a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.data_points.len(), 2);
        let odd = &sum.data_points[1].attributes[0];
        assert_eq!(
            odd.value.as_ref().unwrap().value,
            Some(any_value::Value::StringValue("a,b\"c".into()))
        );
        let Some(metric::Data::Gauge(gauge)) = &by("floodgate_open_connections").data else {
            panic!("not a gauge")
        };
        assert_eq!(
            gauge.data_points[0].value,
            Some(number_data_point::Value::AsDouble(3.0))
        );
        let Some(metric::Data::Histogram(h)) = &by("floodgate_limiter_duration_seconds").data
        else {
            panic!("not a histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![0.001, 0.01]);
        assert_eq!(p.bucket_counts, vec![4, 5, 1]);
        assert_eq!((p.count, p.sum), (10, Some(0.05)));
    }
}
