//! What the admin endpoints share: their query's parameters, and their one error type.

/// Why an admin endpoint cannot answer: a status and a problem detail.
#[derive(Debug)]
pub struct AdminError {
    pub status: u16,
    pub error: &'static str,
    pub detail: String,
}

/// An [`AdminError`].
pub(super) fn bad(status: u16, error: &'static str, detail: impl Into<String>) -> AdminError {
    AdminError {
        status,
        error,
        detail: detail.into(),
    }
}

/// An admin query's parameters, decoded (`application/x-www-form-urlencoded`: `%XX` escapes,
/// `+` for a space).
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(query: &str) -> Query {
        Query(
            form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// Every parameter, in order.
    pub(super) fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The first value of `name`, if given.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_decoded() {
        let q = Query::parse("route=r&api_key=a%2Bb+c&ip=%3A%3A1&x");
        assert_eq!(q.get("route"), Some("r"));
        assert_eq!(q.get("api_key"), Some("a+b c"));
        assert_eq!(q.get("ip"), Some("::1"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(Query::parse("k=%zz%4").get("k"), Some("%zz%4"));
    }
}
