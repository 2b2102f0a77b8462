//! One path, one route: request paths are normalised before a route is chosen, and the
//! normalised path is what the upstream receives, so a different spelling of a limited path
//! (`//api/rides`, `/api/./rides`, `/api/x/../rides`, `/api/%72ides`) cannot walk around its
//! limit to a catch-all route. As nginx does before `location` matching and Envoy with
//! `normalize_path` and `merge_slashes`:
//!
//! 1. percent-encoded unreserved characters (RFC 3986 §2.3: letters, digits, `-._~`) are decoded,
//!    and the other escapes have their hex digits upper-cased (§6.2.2.1); a `%` not followed by
//!    two hex digits is an error (400);
//! 2. encoded slashes (`%2F`), encoded backslashes (`%5C`) and backslashes follow
//!    [`EscapedSlashes`];
//! 3. repeated slashes are merged (unless `merge_slashes: false`);
//! 4. dot segments are resolved (§5.2.4); `..` above the root stays at the root.
//!
//! A path that needs none of this (the common case) is returned borrowed: no allocation.

use std::borrow::Cow;

/// What to do with `%2F`, `%5C` and `\` in a path: they can make a framework see a different
/// path than the one that was limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// Leave them as they are (routes see `%2F` as data, not a separator).
    Keep,
    /// Refuse the request with 400 (the default: no spelling is ambiguous).
    #[default]
    Reject,
    /// Decode them to `/` before routing and forwarding.
    Decode,
}

/// How paths are normalised (`path_normalization`, `merge_slashes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRules {
    pub escaped_slashes: EscapedSlashes,
    pub merge_slashes: bool,
}

impl Default for PathRules {
    fn default() -> Self {
        PathRules {
            escaped_slashes: EscapedSlashes::Reject,
            merge_slashes: true,
        }
    }
}

/// Why a path cannot be routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path has a % not followed by two hex digits")]
    InvalidEscape,
    #[error("the path has an encoded slash or a backslash (path_normalization: reject)")]
    EscapedSlash,
    #[error("the path must start with /")]
    NotAbsolute,
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

impl PathRules {
    /// The normalised form of `path` (the path only, without the query).
    pub fn normalize<'a>(&self, path: &'a str) -> Result<Cow<'a, str>, PathError> {
        let bytes = path.as_bytes();
        if bytes.first() != Some(&b'/') {
            // `*` (OPTIONS) and absolute-form targets have no path to normalise.
            return if path == "*" {
                Ok(Cow::Borrowed(path))
            } else {
                Err(PathError::NotAbsolute)
            };
        }
        if !self.needs_work(bytes) {
            return Ok(Cow::Borrowed(path));
        }
        // 1 and 2: escapes and backslashes, into `decoded`.
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' => {
                    let (Some(hi), Some(lo)) = (
                        bytes.get(i + 1).copied().and_then(hex_value),
                        bytes.get(i + 2).copied().and_then(hex_value),
                    ) else {
                        return Err(PathError::InvalidEscape);
                    };
                    let byte = hi << 4 | lo;
                    if byte == b'/' || byte == b'\\' {
                        match self.escaped_slashes {
                            EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                            EscapedSlashes::Decode => decoded.push(b'/'),
                            EscapedSlashes::Keep => decoded.extend_from_slice(if byte == b'/' {
                                b"%2F"
                            } else {
                                b"%5C"
                            }),
                        }
                    } else if is_unreserved(byte) {
                        decoded.push(byte);
                    } else {
                        decoded.push(b'%');
                        decoded.extend_from_slice(format!("{byte:02X}").as_bytes());
                    }
                    i += 3;
                }
                b'\\' => {
                    match self.escaped_slashes {
                        EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                        EscapedSlashes::Decode => decoded.push(b'/'),
                        EscapedSlashes::Keep => decoded.push(b'\\'),
                    }
                    i += 1;
                }
                b => {
                    decoded.push(b);
                    i += 1;
                }
            }
        }
        // 3 and 4: segments. Empty segments are dropped when merging; `.` and `..` resolved.
        let trailing = decoded.ends_with(b"/")
            || decoded.ends_with(b"/.")
            || decoded.ends_with(b"/..")
            || decoded == b".";
        let mut segments: Vec<&[u8]> = Vec::new();
        let body = &decoded[1..];
        for segment in body.split(|&b| b == b'/') {
            match segment {
                b"." => {}
                b".." => {
                    // Drop the last real segment (and any empty ones a merge would have dropped).
                    while segments.last() == Some(&&b""[..]) && self.merge_slashes {
                        segments.pop();
                    }
                    segments.pop();
                }
                b"" if self.merge_slashes => {}
                other => segments.push(other),
            }
        }
        let mut out = Vec::with_capacity(decoded.len());
        for segment in &segments {
            out.push(b'/');
            out.extend_from_slice(segment);
        }
        if out.is_empty() || (trailing && !out.ends_with(b"/")) {
            out.push(b'/');
        }
        // Only ASCII bytes were replaced and whole UTF-8 sequences kept, so this is UTF-8; a
        // failure would be a bug, answered as an invalid path rather than a panic.
        String::from_utf8(out)
            .map(Cow::Owned)
            .map_err(|_| PathError::InvalidEscape)
    }

    /// True when the path has something to normalise: an escape, a backslash, an empty segment
    /// (when merging) or a dot segment.
    fn needs_work(&self, bytes: &[u8]) -> bool {
        let mut previous = b'/';
        let mut dots = 0u8; // dots since the last slash, when the segment is only dots
        let mut only_dots = true;
        for &b in bytes.iter().skip(1) {
            match b {
                b'%' | b'\\' => return true,
                b'/' => {
                    if (previous == b'/' && self.merge_slashes)
                        || (only_dots && dots > 0 && dots <= 2)
                    {
                        return true;
                    }
                    dots = 0;
                    only_dots = true;
                }
                b'.' => dots = dots.saturating_add(1),
                _ => only_dots = false,
            }
            previous = b;
        }
        only_dots && (1..=2).contains(&dots)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn norm(path: &str) -> Result<String, PathError> {
        PathRules::default().normalize(path).map(Cow::into_owned)
    }

    #[test]
    fn the_spellings_an_attacker_tries_all_become_one_path() {
        for spelling in [
            "/api/rides/request",
            "//api/rides/request",
            "/api//rides/request",
            "/api/./rides/request",
            "/api/x/../rides/request",
            "/api/rides/%72equest",
            "/%61pi/rides/request",
            "/api/rides/request/.",
            "/./api/rides/request",
            "/../api/rides/request",
            "/api/rides/%2e/request",
            "/api/rides/x/%2E%2E/request",
        ] {
            let expected = if spelling.ends_with("/.") {
                "/api/rides/request/"
            } else {
                "/api/rides/request"
            };
            assert_eq!(norm(spelling).as_deref(), Ok(expected), "{spelling}");
        }
    }

    #[test]
    fn an_ordinary_path_is_borrowed() {
        for path in [
            "/",
            "/api/rides/request",
            "/a/b.json",
            "/v1/x..y/z",
            "/.well-known/x",
        ] {
            assert!(
                matches!(PathRules::default().normalize(path), Ok(Cow::Borrowed(_))),
                "{path}"
            );
        }
    }

    #[test]
    fn escapes_are_checked_and_reserved_ones_kept_upper_case() {
        assert_eq!(norm("/a%zz"), Err(PathError::InvalidEscape));
        assert_eq!(norm("/a%4"), Err(PathError::InvalidEscape));
        assert_eq!(norm("/a%"), Err(PathError::InvalidEscape));
        assert_eq!(norm("/a%3fb").as_deref(), Ok("/a%3Fb"));
        assert_eq!(norm("/caf%C3%A9").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(norm("relative"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn escaped_slashes_follow_the_configured_choice() {
        let rules = |escaped_slashes| PathRules {
            escaped_slashes,
            merge_slashes: true,
        };
        for path in ["/api%2Frides", "/api%5crides", "/api\\rides"] {
            assert_eq!(
                rules(EscapedSlashes::Reject).normalize(path),
                Err(PathError::EscapedSlash)
            );
            assert_eq!(
                rules(EscapedSlashes::Decode).normalize(path).as_deref(),
                Ok("/api/rides")
            );
        }
        assert_eq!(
            rules(EscapedSlashes::Keep)
                .normalize("/api%2frides")
                .as_deref(),
            Ok("/api%2Frides")
        );
    }

    #[test]
    fn merging_slashes_can_be_turned_off() {
        let rules = PathRules {
            escaped_slashes: EscapedSlashes::Reject,
            merge_slashes: false,
        };
        assert_eq!(rules.normalize("/a//b").as_deref(), Ok("/a//b"));
        assert_eq!(rules.normalize("/a/./b").as_deref(), Ok("/a/b"));
    }

    fn segment() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_~-]{1,6}".prop_filter("not a dot segment", |s| s != "." && s != "..")
    }

    /// The same path spelled another way: slashes doubled, `.` and `x/..` inserted, unreserved
    /// characters percent-encoded.
    fn respell(segments: &[String], noise: &[u8]) -> String {
        let mut out = String::new();
        for (i, seg) in segments.iter().enumerate() {
            let n = noise.get(i).copied().unwrap_or(0);
            out.push('/');
            if n & 1 != 0 {
                out.push('/');
            }
            if n & 2 != 0 {
                out.push_str("./");
            }
            if n & 4 != 0 {
                out.push_str("junk/../");
            }
            for (j, c) in seg.chars().enumerate() {
                if n & 8 != 0 && j == 0 {
                    out.push_str(&format!("%{:02x}", c as u32));
                } else {
                    out.push(c);
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn any_two_spellings_of_one_path_normalise_alike_and_route_alike(
            segments in prop::collection::vec(segment(), 1..6),
            noise in prop::collection::vec(0u8..16, 6),
        ) {
            let plain = format!("/{}", segments.join("/"));
            let respelled = respell(&segments, &noise);
            let a = norm(&plain).unwrap();
            let b = norm(&respelled).unwrap();
            prop_assert_eq!(&a, &b, "{} vs {}", plain, respelled);
            // Normalising is idempotent: a normalised path is its own normal form.
            prop_assert_eq!(norm(&a).unwrap(), a.clone());
            // So a prefix route matches both or neither.
            let prefix = format!("/{}", segments[0]);
            prop_assert_eq!(a.starts_with(&prefix), b.starts_with(&prefix));
        }
    }
}
