//! `alerts:`: webhooks told when an identity's budget is spent past a share of it
//! (`src/alerts.rs`).

use serde::Deserialize;

use super::Validator;

/// One `alerts:` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertFile {
    pub url: String,
    pub at: Vec<f64>,
}

/// One webhook: where it is POSTed, and at which shares of a budget spent (ascending, each in
/// (0, 1]).
#[derive(Debug, Clone, PartialEq)]
pub struct AlertSink {
    pub url: http::Uri,
    pub at: Vec<f64>,
}

impl Validator {
    /// `alerts:`: each URL `http://` or `https://` with a host, each `at` a share above 0 and at
    /// most 1.
    pub(super) fn alerts(&mut self, file: Option<Vec<AlertFile>>) -> Vec<AlertSink> {
        let mut sinks = Vec::new();
        for (n, alert) in file.unwrap_or_default().into_iter().enumerate() {
            let path = format!("alerts[{n}]");
            let url = match alert.url.parse::<http::Uri>() {
                Ok(url)
                    if matches!(url.scheme_str(), Some("http" | "https"))
                        && url.authority().is_some() =>
                {
                    Some(url)
                }
                _ => {
                    self.problem(
                        format!("{path}.url"),
                        format!("{:?} is not an http:// or https:// URL", alert.url),
                    );
                    None
                }
            };
            if alert.at.is_empty() {
                self.problem(
                    format!("{path}.at"),
                    "name at least one share, like [0.8, 1.0]",
                );
            }
            let mut at = Vec::new();
            for (t, share) in alert.at.iter().enumerate() {
                if share.is_finite() && *share > 0.0 && *share <= 1.0 {
                    at.push(*share);
                } else {
                    self.problem(
                        format!("{path}.at[{t}]"),
                        format!("{share} is not a share of a budget above 0 and at most 1"),
                    );
                }
            }
            at.sort_by(f64::total_cmp);
            at.dedup();
            if let Some(url) = url {
                sinks.push(AlertSink { url, at });
            }
        }
        sinks
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const ROUTES: &str = "listen: 127.0.0.1:8080\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: http://127.0.0.1:9\n";

    #[test]
    fn alerts_are_checked_field_by_field() {
        let ok = Config::from_yaml(&format!(
            "alerts:\n  - url: https://hooks.example/q\n    at: [1.0, 0.8, 0.8]\n{ROUTES}"
        ))
        .unwrap();
        assert_eq!(ok.alerts[0].at, [0.8, 1.0]);
        let problems: Vec<String> = Config::from_yaml(&format!(
            "alerts:\n  - url: ftp://x/y\n    at: [0, 1.5, 0.5]\n  - url: http://ok/\n    at: []\n{ROUTES}"
        ))
        .unwrap_err()
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(problems.len(), 4, "{problems:?}");
        for field in [
            "alerts[0].url",
            "alerts[0].at[0]",
            "alerts[0].at[1]",
            "alerts[1].at",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(field)),
                "{field}: {problems:?}"
            );
        }
    }
}
