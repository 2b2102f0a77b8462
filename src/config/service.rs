//! `service:`: floodgate's limiter as a rate-limit service for other proxies (`src/service.rs`).
//! The rules themselves are envoyproxy/ratelimit's files (`service.config`), read by the
//! service; this section says where it listens and how `/check` builds its descriptors.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use http::HeaderName;
use serde::Deserialize;

use super::Validator;

/// `service:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceFile {
    pub listen: String,
    #[serde(default)]
    pub tls: Option<ServiceTlsFile>,
    /// envoyproxy/ratelimit's YAML: files, or directories of `*.yaml`.
    #[serde(default)]
    pub config: Vec<String>,
    #[serde(default)]
    pub forward_auth: Option<ForwardAuthFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceTlsFile {
    pub cert: String,
    pub key: String,
    /// Clients must present a certificate signed by one of these CAs.
    #[serde(default)]
    pub client_ca: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardAuthFile {
    pub domain: String,
    pub descriptors: Vec<Vec<EntryFile>>,
    #[serde(default)]
    pub deny_status: Option<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryFile {
    pub key: String,
    pub value: String,
}

/// `service:`, validated.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub listen: SocketAddr,
    pub tls: Option<ServiceTls>,
    pub config: Vec<PathBuf>,
    pub forward_auth: Option<ForwardAuthConfig>,
}

/// The service port's TLS: the server's certificate, and the CAs a client's must chain to.
#[derive(Clone)]
pub struct ServiceTls {
    server_config: Arc<rustls::ServerConfig>,
    pub client_ca: Option<PathBuf>,
}

impl std::fmt::Debug for ServiceTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceTls")
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

impl ServiceTls {
    /// The acceptor for the service's connections.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server_config.clone())
    }
}

/// `service.forward_auth`, validated.
#[derive(Debug, Clone)]
pub struct ForwardAuthConfig {
    pub domain: String,
    /// Each descriptor: its entries' keys and where their values come from.
    pub descriptors: Vec<Vec<(String, EntrySource)>>,
    /// What a request over the limit is answered: 429, or 403 for nginx's `auth_request`.
    pub deny_status: u16,
}

/// Where a forward-auth descriptor entry's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntrySource {
    /// The client address, as the proxy finds it (`X-Forwarded-For` past trusted proxies).
    ClientIp,
    /// `header:NAME`.
    Header(HeaderName),
    /// `query:NAME`: a parameter of the query `/check` was called with.
    Query(String),
    /// `literal:TEXT`: always this value.
    Literal(String),
}

impl Validator {
    /// `service:`; relative paths in it are read from `base` (the config file's folder).
    pub(super) fn service(
        &mut self,
        s: ServiceFile,
        base: Option<&std::path::Path>,
    ) -> Option<ServiceConfig> {
        let resolve = |p: String| match base {
            Some(base) if std::path::Path::new(&p).is_relative() => base.join(p),
            _ => PathBuf::from(p),
        };
        let listen = self.socket_addr("service.listen", &s.listen);
        if s.config.is_empty() {
            self.problem(
                "service.config",
                "name at least one envoyproxy/ratelimit file or directory",
            );
        }
        let tls = s.tls.and_then(|t| self.service_tls(t));
        let forward_auth = s.forward_auth.and_then(|f| self.forward_auth(f));
        Some(ServiceConfig {
            listen: listen?,
            tls,
            config: s.config.into_iter().map(resolve).collect(),
            forward_auth,
        })
    }

    fn service_tls(&mut self, t: ServiceTlsFile) -> Option<ServiceTls> {
        let client_ca = t.client_ca.map(PathBuf::from);
        match crate::tls::service_config(
            std::path::Path::new(&t.cert),
            std::path::Path::new(&t.key),
            client_ca.as_deref(),
        ) {
            Ok(server_config) => Some(ServiceTls {
                server_config,
                client_ca,
            }),
            Err(problems) => {
                for p in problems {
                    self.problem(format!("service.tls.{}", p.field), p.message);
                }
                None
            }
        }
    }

    fn forward_auth(&mut self, f: ForwardAuthFile) -> Option<ForwardAuthConfig> {
        let before = self.problems.len();
        if f.domain.is_empty() {
            self.problem("service.forward_auth.domain", "must not be empty");
        }
        if f.descriptors.is_empty() {
            self.problem(
                "service.forward_auth.descriptors",
                "name at least one descriptor",
            );
        }
        let deny_status = f.deny_status.unwrap_or(429);
        if deny_status != 429 && deny_status != 403 {
            self.problem(
                "service.forward_auth.deny_status",
                format!("{deny_status} is not 429 (Caddy, Traefik) or 403 (nginx auth_request)"),
            );
        }
        let mut descriptors = Vec::with_capacity(f.descriptors.len());
        for (i, d) in f.descriptors.into_iter().enumerate() {
            if d.is_empty() {
                self.problem(
                    format!("service.forward_auth.descriptors[{i}]"),
                    "a descriptor needs at least one entry",
                );
            }
            let mut entries = Vec::with_capacity(d.len());
            for (j, e) in d.into_iter().enumerate() {
                let path = format!("service.forward_auth.descriptors[{i}][{j}]");
                if e.key.is_empty() {
                    self.problem(format!("{path}.key"), "must not be empty");
                }
                let source = match e.value.split_once(':') {
                    _ if e.value == "client_ip" => Some(EntrySource::ClientIp),
                    Some(("header", name)) => match HeaderName::from_bytes(name.as_bytes()) {
                        Ok(name) => Some(EntrySource::Header(name)),
                        Err(_) => {
                            self.problem(
                                format!("{path}.value"),
                                format!("{name:?} is not a header name"),
                            );
                            None
                        }
                    },
                    Some(("query", name)) if !name.is_empty() => {
                        Some(EntrySource::Query(name.to_string()))
                    }
                    Some(("literal", text)) => Some(EntrySource::Literal(text.to_string())),
                    _ => {
                        self.problem(
                            format!("{path}.value"),
                            format!(
                                "{:?} is not client_ip, header:NAME, query:NAME or literal:TEXT",
                                e.value
                            ),
                        );
                        None
                    }
                };
                if let Some(source) = source {
                    entries.push((e.key, source));
                }
            }
            descriptors.push(entries);
        }
        (self.problems.len() == before).then_some(ForwardAuthConfig {
            domain: f.domain,
            descriptors,
            deny_status,
        })
    }
}
