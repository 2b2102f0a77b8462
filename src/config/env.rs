//! `${NAME}` and `${NAME:-default}` in a config file, replaced by the environment's values before
//! the YAML is read, so that one file (the Docker image's baked-in one, say) serves wherever it is
//! run: `upstream: ${FLOODGATE_UPSTREAM}`, `capacity: ${FLOODGATE_BURST:-20}`.
//!
//! As in a shell, `:-` also applies when the variable is set but empty. `$${` stands for a literal
//! `${`. Comments (a `#` at the start of a line or after a space, outside quotes) are left as they
//! are, so they may mention variables freely. A variable that is unset, with no default, is an
//! error naming it and its line; the text substituted is not interpreted again.

use std::borrow::Cow;
use std::collections::HashMap;

/// `text` with every `${...}` replaced, or the problems found (each a line and a message).
pub fn expand<'t>(
    text: &'t str,
    env: &HashMap<String, String>,
) -> Result<Cow<'t, str>, Vec<String>> {
    if !text.contains("${") {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let (code, comment) = line.split_at(comment_start(line));
        expand_line(code, env, &mut out, |message| {
            problems.push(format!("line {}: {message}", n + 1));
        });
        out.push_str(comment);
    }
    if problems.is_empty() {
        Ok(Cow::Owned(out))
    } else {
        Err(problems)
    }
}

fn expand_line(
    mut rest: &str,
    env: &HashMap<String, String>,
    out: &mut String,
    mut problem: impl FnMut(String),
) {
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
            continue;
        }
        let Some(after) = rest.strip_prefix("${") else {
            out.push('$');
            rest = &rest[1..];
            continue;
        };
        let Some(end) = after.find('}') else {
            problem("`${` has no closing `}`".to_string());
            out.push_str(rest);
            return;
        };
        let inner = &after[..end];
        rest = &after[end + 1..];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        if !is_variable_name(name) {
            problem(format!(
                "`${{{inner}}}`: {name:?} is not a variable name (letters, digits and _)"
            ));
            continue;
        }
        match (env.get(name).filter(|v| !v.is_empty()), default) {
            (Some(value), _) => out.push_str(value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => problem(format!(
                "${{{name}}} is not set (set it, or give a default: ${{{name}:-value}})"
            )),
        }
    }
    out.push_str(rest);
}

/// Where a line's comment starts (its length if it has none): a `#` at the start or after
/// white space, outside single and double quotes.
fn comment_start(line: &str) -> usize {
    let mut quote: Option<u8> = None;
    let mut previous = b' ';
    for (i, &b) in line.as_bytes().iter().enumerate() {
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'#' && previous.is_ascii_whitespace() => return i,
            None => {}
        }
        previous = b;
    }
    line.len()
}

fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> HashMap<String, String> {
        [("UP", "http://api:9000"), ("EMPTY", ""), ("N", "20")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn variables_and_defaults_are_replaced() {
        let text = "upstream: ${UP}\ncapacity: ${N:-5}\nrate: ${MISSING:-10}\nx: ${EMPTY:-d}\n";
        assert_eq!(
            expand(text, &env()).unwrap(),
            "upstream: http://api:9000\ncapacity: 20\nrate: 10\nx: d\n"
        );
    }

    #[test]
    fn text_without_variables_is_borrowed_untouched() {
        assert!(matches!(
            expand("a: $1 and $x\n", &env()),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(expand("a: $1 ${N}$\n", &env()).unwrap(), "a: $1 20$\n");
    }

    #[test]
    fn comments_and_escapes_are_left_alone() {
        let text = "# run with ${NOT_SET}\nkey: \"a # ${N}\" # ${ALSO_NOT_SET}\nlit: $${N}\n";
        assert_eq!(
            expand(text, &env()).unwrap(),
            "# run with ${NOT_SET}\nkey: \"a # 20\" # ${ALSO_NOT_SET}\nlit: ${N}\n"
        );
    }

    #[test]
    fn an_unset_variable_or_a_broken_reference_names_its_line() {
        let problems = expand("a: 1\nb: ${NOPE}\nc: ${bad-name}\nd: ${OPEN\n", &env()).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("line 2: ${NOPE} is not set"),
            "{problems:?}"
        );
        assert!(problems[1].starts_with("line 3:"), "{problems:?}");
        assert!(problems[2].starts_with("line 4:"), "{problems:?}");
    }
}
