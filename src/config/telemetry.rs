//! `telemetry:`: OpenTelemetry traces and metrics over OTLP/HTTP (`src/telemetry.rs`). The
//! standard `OTEL_*` variables apply when the file is silent.

use std::time::Duration;

use serde::Deserialize;

use super::{Validator, parse_duration};

/// `telemetry:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryFile {
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    #[serde(default)]
    pub service_name: Option<String>,
    #[serde(default)]
    pub sample_ratio: Option<f64>,
    #[serde(default)]
    pub metrics_interval: Option<String>,
}

/// `telemetry:`, validated: on when an endpoint is known (from the file or
/// `OTEL_EXPORTER_OTLP_ENDPOINT`).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL: spans go to `{endpoint}/v1/traces`, metrics to `/v1/metrics`.
    pub endpoint: http::Uri,
    pub service_name: String,
    /// The share of traces started here that are sampled (an incoming `traceparent`'s flag
    /// decides for the traces it continues).
    pub sample_ratio: f64,
    /// How often metrics are exported (`None`: no OTLP metrics).
    pub metrics_interval: Option<Duration>,
}

impl Validator {
    /// `telemetry:` (absent: the `OTEL_*` variables in `env` alone). `None`: telemetry is off.
    pub(super) fn telemetry(
        &mut self,
        t: Option<TelemetryFile>,
        env: &std::collections::HashMap<String, String>,
    ) -> Option<TelemetryConfig> {
        let t = t.unwrap_or_default();
        let var = |name: &str| env.get(name).filter(|v| !v.is_empty()).cloned();
        let (endpoint, path) = match (t.otlp_endpoint, var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(e), _) => (e, "telemetry.otlp_endpoint"),
            (None, Some(e)) => (e, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            (None, None) => return None,
        };
        let endpoint = match endpoint.trim_end_matches('/').parse::<http::Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") || uri.scheme_str() == Some("https") => uri,
            _ => {
                self.problem(
                    path,
                    format!("{endpoint:?} is not an http:// or https:// URL"),
                );
                return None;
            }
        };
        let service_name = t
            .service_name
            .or_else(|| var("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "floodgate".into());
        let from_env = match (
            var("OTEL_TRACES_SAMPLER").as_deref(),
            var("OTEL_TRACES_SAMPLER_ARG"),
        ) {
            (Some("parentbased_traceidratio" | "traceidratio"), Some(arg)) => match arg.parse() {
                Ok(ratio) => Some(ratio),
                Err(_) => {
                    self.problem(
                        "OTEL_TRACES_SAMPLER_ARG",
                        format!("{arg:?} is not a number"),
                    );
                    None
                }
            },
            (Some("parentbased_always_off" | "always_off"), _) => Some(0.0),
            _ => None,
        };
        let sample_ratio = t.sample_ratio.or(from_env).unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sample_ratio) {
            self.problem("telemetry.sample_ratio", "must be between 0 and 1");
        }
        let metrics_interval = match t.metrics_interval {
            None => Some(Duration::from_secs(10)),
            Some(text) => match parse_duration(&text) {
                Ok(d) if d.is_zero() => None,
                Ok(d) if d < Duration::from_millis(100) => {
                    self.problem(
                        "telemetry.metrics_interval",
                        "must be 0 (off) or at least 100ms",
                    );
                    None
                }
                Ok(d) => Some(d),
                Err(e) => {
                    self.problem("telemetry.metrics_interval", e);
                    None
                }
            },
        };
        Some(TelemetryConfig {
            endpoint,
            service_name,
            sample_ratio,
            metrics_interval,
        })
    }
}
