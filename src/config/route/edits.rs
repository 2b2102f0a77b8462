//! A route's `request_headers:` and `response_headers:`: headers set (a value, possibly with
//! the request's variables) and removed.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The variables a `set` value may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    Route,
    IdentityKind,
    Consumer,
    Tier,
    JwtSubject,
    ClientIp,
}

impl Var {
    fn named(name: &str) -> Option<Var> {
        Some(match name {
            "route" => Var::Route,
            "identity_kind" => Var::IdentityKind,
            "consumer" => Var::Consumer,
            "tier" => Var::Tier,
            "jwt_subject" => Var::JwtSubject,
            "client_ip" => Var::ClientIp,
            _ => return None,
        })
    }
}

/// What the variables are for one request (each empty when unknown). Never the raw API key.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    pub route: std::sync::Arc<str>,
    pub identity_kind: &'static str,
    pub consumer: Option<String>,
    pub tier: Option<String>,
    pub jwt_subject: Option<String>,
    pub client_ip: Option<std::net::IpAddr>,
}

/// One `set` value: fixed (made once, at load), or text and variables rendered per request.
#[derive(Debug, Clone)]
pub enum Value {
    Fixed(HeaderValue),
    Template(Vec<Piece>),
}

#[derive(Debug, Clone)]
pub enum Piece {
    Text(String),
    Var(Var),
}

impl Value {
    /// `text`, read: `{name}` is a variable, `{{` and `}}` a brace.
    pub fn parse(text: &str) -> Result<Value, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    let var = Var::named(&name).ok_or_else(|| {
                        format!(
                            "{{{name}}} is not a variable: route, identity_kind, consumer, tier, jwt_subject, client_ip"
                        )
                    })?;
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Var(var));
                }
                '}' => return Err("a lone } (write }} for one)".into()),
                c => literal.push(c),
            }
        }
        if pieces.is_empty() {
            return HeaderValue::from_str(&literal)
                .map(Value::Fixed)
                .map_err(|_| format!("{text:?} cannot be a header value"));
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        // Checked now with empty variables: the text itself must fit in a header value.
        let text: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Text(t) => Some(t.as_str()),
                Piece::Var(_) => None,
            })
            .collect();
        HeaderValue::from_str(&text).map_err(|_| format!("{text:?} cannot be a header value"))?;
        Ok(Value::Template(pieces))
    }

    /// The value for a request with `vars`; `None` when a variable's value cannot be in a
    /// header (a subject with a line break: the header is then not set).
    pub fn render(&self, vars: &Vars) -> Option<HeaderValue> {
        let pieces = match self {
            Value::Fixed(value) => return Some(value.clone()),
            Value::Template(pieces) => pieces,
        };
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Var(Var::Route) => out.push_str(&vars.route),
                Piece::Var(Var::IdentityKind) => out.push_str(vars.identity_kind),
                Piece::Var(Var::Consumer) => out.push_str(vars.consumer.as_deref().unwrap_or("")),
                Piece::Var(Var::Tier) => out.push_str(vars.tier.as_deref().unwrap_or("")),
                Piece::Var(Var::JwtSubject) => {
                    out.push_str(vars.jwt_subject.as_deref().unwrap_or(""))
                }
                Piece::Var(Var::ClientIp) => {
                    if let Some(ip) = vars.client_ip {
                        out.push_str(&ip.to_string());
                    }
                }
            }
        }
        HeaderValue::from_str(&out).ok()
    }

    fn uses_vars(&self) -> bool {
        matches!(self, Value::Template(_))
    }
}

/// Headers set and removed on one side of a route's exchange.
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    pub set: Vec<(HeaderName, Value)>,
    pub remove: Vec<HeaderName>,
}

impl HeaderEdits {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }

    /// True when a value holds a variable (the request's must then be worked out).
    pub fn uses_vars(&self) -> bool {
        self.set.iter().any(|(_, v)| v.uses_vars())
    }

    /// Removes, then sets (replacing whatever was sent under each name set).
    pub fn apply(&self, headers: &mut HeaderMap, vars: &Vars) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            match value.render(vars) {
                Some(value) => {
                    headers.insert(name.clone(), value);
                }
                None => {
                    headers.remove(name);
                }
            }
        }
    }
}

/// Headers a route may not set or remove: how the message is framed and passed hop by hop,
/// which floodgate itself manages.
pub fn managed(name: &HeaderName) -> bool {
    use http::header::*;
    [
        CONNECTION,
        TRANSFER_ENCODING,
        CONTENT_LENGTH,
        TE,
        TRAILER,
        UPGRADE,
        HOST,
        PROXY_AUTHENTICATE,
        PROXY_AUTHORIZATION,
    ]
    .contains(name)
        || name == "keep-alive"
        || name == "proxy-connection"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        Vars {
            route: "billing".into(),
            identity_kind: "consumer",
            consumer: Some("acme".into()),
            tier: Some("gold".into()),
            jwt_subject: None,
            client_ip: Some("10.0.0.9".parse().unwrap()),
        }
    }

    #[test]
    fn a_value_is_fixed_or_rendered_with_the_requests_variables() {
        let fixed = Value::parse("floodgate").unwrap();
        assert!(matches!(fixed, Value::Fixed(_)));
        assert_eq!(fixed.render(&vars()).unwrap(), "floodgate");
        let template = Value::parse("{consumer}/{tier}@{client_ip} {{x}} {jwt_subject}").unwrap();
        assert_eq!(template.render(&vars()).unwrap(), "acme/gold@10.0.0.9 {x} ");
        assert_eq!(
            Value::parse("{route}").unwrap().render(&vars()).unwrap(),
            "billing"
        );
        assert!(
            Value::parse("{api_key}")
                .unwrap_err()
                .contains("not a variable")
        );
        assert!(Value::parse("a}b").is_err());
        assert!(Value::parse("line\nbreak").is_err());
        // A subject that cannot be a header value leaves the header unset.
        let subject = Vars {
            jwt_subject: Some("a\nb".into()),
            ..vars()
        };
        assert!(
            Value::parse("{jwt_subject}")
                .unwrap()
                .render(&subject)
                .is_none()
        );
    }

    #[test]
    fn edits_remove_then_set_over_what_the_client_sent() {
        let edits = HeaderEdits {
            set: vec![(
                HeaderName::from_static("x-consumer"),
                Value::parse("{consumer}").unwrap(),
            )],
            remove: vec![HeaderName::from_static("x-debug")],
        };
        let mut headers = HeaderMap::new();
        headers.append("x-consumer", HeaderValue::from_static("forged"));
        headers.append("x-consumer", HeaderValue::from_static("forged-too"));
        headers.insert("x-debug", HeaderValue::from_static("1"));
        edits.apply(&mut headers, &vars());
        assert_eq!(headers.get_all("x-consumer").iter().count(), 1);
        assert_eq!(headers["x-consumer"], "acme");
        assert!(!headers.contains_key("x-debug"));
        assert!(managed(&HeaderName::from_static("transfer-encoding")));
        assert!(managed(&HeaderName::from_static("keep-alive")));
        assert!(!managed(&HeaderName::from_static("x-consumer")));
    }
}
