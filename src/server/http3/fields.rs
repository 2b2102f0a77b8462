//! The pseudo-header rules of an HTTP/3 request (RFC 9114 §4.1.2, §4.3), checked on the QPACK
//! field section as it comes (RFC 9204 §4.5), since h3 0.0.8 folds the field lines into a
//! request without them: a duplicated pseudo-header (two `:method`s, the last one winning), a
//! pseudo-header after a regular field, one a request may not have (`:status`, an unknown
//! `:name`), or any pseudo-header in trailers is a malformed request.
//!
//! Only the names are read: a static table entry's (RFC 9204 Appendix A), or a literal name
//! (Huffman-decoded when it is encoded). Field lines that refer to the dynamic table are left to
//! h3, which has none and refuses them.

use loona_hpack::huffman::HuffmanDecoder;

/// The pseudo-headers a request may carry, each at most once.
const REQUEST_PSEUDO: [&[u8]; 5] = [
    b":method",
    b":scheme",
    b":authority",
    b":path",
    b":protocol",
];

/// The name of static table entry `index` when it is a pseudo-header, `Some(b"")` for a
/// regular field, `None` past the table.
fn static_name(index: u64) -> Option<&'static [u8]> {
    Some(match index {
        0 => b":authority",
        1 => b":path",
        15..=21 => b":method",
        22 | 23 => b":scheme",
        24..=28 | 63..=71 => b":status",
        2..=98 => b"",
        _ => return None,
    })
}

/// A QPACK prefixed integer (RFC 9204 §4.1.1, HPACK's): its value and the bytes it took.
fn integer(bytes: &[u8], prefix_bits: u8) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    let max = (1u64 << prefix_bits) - 1;
    let mut value = u64::from(first) & max;
    if value < max {
        return Some((value, 1));
    }
    let mut shift = 0u32;
    for (i, &b) in bytes.iter().enumerate().skip(1) {
        if shift > 56 {
            return None;
        }
        value = value.checked_add(u64::from(b & 0x7f) << shift)?;
        shift += 7;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// A string literal: its bytes (Huffman-decoded if `huffman`) and the bytes it took. The length
/// is a prefixed integer of `prefix_bits`, the H flag the bit above it.
fn string(bytes: &[u8], prefix_bits: u8, decode: bool) -> Result<(Option<Vec<u8>>, usize), ()> {
    let first = *bytes.first().ok_or(())?;
    let huffman = first & (1 << prefix_bits) != 0;
    let (len, used) = integer(bytes, prefix_bits).ok_or(())?;
    let end = used
        .checked_add(usize::try_from(len).map_err(|_| ())?)
        .ok_or(())?;
    let raw = bytes.get(used..end).ok_or(())?;
    if !decode {
        return Ok((None, end));
    }
    let text = match huffman {
        false => raw.to_vec(),
        true => HUFFMAN
            .with(|d| d.borrow_mut().decode(raw))
            .map_err(|_| ())?,
    };
    Ok((Some(text), end))
}

thread_local! {
    /// Built once per thread: its tables are a few hundred entries.
    static HUFFMAN: std::cell::RefCell<HuffmanDecoder> = std::cell::RefCell::new(HuffmanDecoder::new());
}

/// Checks the field section `block` (a HEADERS frame's payload) of a request's head
/// (`trailers: false`) or its trailers: why it is malformed, if it is. A block h3 cannot decode
/// either (cut short, a dynamic reference) is left to h3.
pub(super) fn malformed(block: &[u8], trailers: bool) -> Option<&'static str> {
    // The prefix: Required Insert Count, then Delta Base (both 0 without a dynamic table).
    let (_, used) = integer(block, 8)?;
    let rest = block.get(used..)?;
    let (_, used2) = integer(rest, 7)?;
    let mut at = used + used2;
    let mut seen: [bool; 5] = [false; 5];
    let mut regular = false;
    while at < block.len() {
        let line = &block[at..];
        let b = line[0];
        // The name of this field line (`b""`: a regular field; `None`: not ours to read).
        let (name, used): (Option<Vec<u8>>, usize) = if b & 0x80 != 0 {
            // Indexed field line; T (0x40) static.
            let (index, used) = integer(line, 6)?;
            match b & 0x40 != 0 {
                true => (Some(static_name(index)?.to_vec()), used),
                false => return None,
            }
        } else if b & 0x40 != 0 {
            // Literal with name reference; T (0x10) static; then the value.
            let (index, used) = integer(line, 4)?;
            if b & 0x10 == 0 {
                return None;
            }
            let (_, value) = string(&line[used..], 7, false).ok()?;
            (Some(static_name(index)?.to_vec()), used + value)
        } else if b & 0x20 != 0 {
            // Literal with literal name (3-bit length prefix, H at 0x08); then the value.
            let (name, used) = string(line, 3, true).ok()?;
            let (_, value) = string(&line[used..], 7, false).ok()?;
            (name, used + value)
        } else {
            // Post-base references: the dynamic table, which h3 refuses.
            return None;
        };
        at += used;
        let Some(name) = name else { continue };
        if !name.starts_with(b":") {
            regular = true;
            continue;
        }
        if trailers {
            return Some("a pseudo-header in trailers");
        }
        if regular {
            return Some("a pseudo-header after a regular field");
        }
        let Some(slot) = REQUEST_PSEUDO.iter().position(|p| *p == name.as_slice()) else {
            return Some("a pseudo-header a request may not have");
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Some("a duplicated pseudo-header");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field section: the zero prefix, then `lines`.
    fn section(lines: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![0, 0];
        for line in lines {
            out.extend_from_slice(line);
        }
        out
    }

    /// Indexed static entry `i` (< 64).
    fn indexed(i: u8) -> Vec<u8> {
        vec![0xc0 | i]
    }

    /// A literal name and value, neither Huffman-encoded (lengths < 8 and < 128).
    fn literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x20 | name.len() as u8];
        out.extend_from_slice(name);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
        out
    }

    /// Static name `i` (< 16) with a literal value.
    fn named(i: u8, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x50 | i];
        out.push(value.len() as u8);
        out.extend_from_slice(value);
        out
    }

    #[test]
    fn a_well_formed_head_and_trailers_pass() {
        // GET (17), https (23), :path "/" (1), :authority literal, then user-agent literally.
        let head = section(&[
            &indexed(17),
            &indexed(23),
            &indexed(1),
            &named(0, b"a.example"),
            &literal(b"x-a", b"1"),
        ]);
        assert_eq!(malformed(&head, false), None);
        assert_eq!(malformed(&section(&[&literal(b"x-sum", b"1")]), true), None);
    }

    #[test]
    fn the_pseudo_header_rules_h3_does_not_check_are_checked() {
        let get = indexed(17);
        let post = indexed(20);
        let cases: [(Vec<u8>, bool, &str); 6] = [
            (section(&[&get, &post]), false, "a duplicated pseudo-header"),
            (
                section(&[&literal(b"x-a", b"1"), &get]),
                false,
                "a pseudo-header after a regular field",
            ),
            (
                section(&[&get, &indexed(25)]),
                false,
                "a pseudo-header a request may not have",
            ),
            (
                section(&[&literal(b":foo", b"1")]),
                false,
                "a pseudo-header a request may not have",
            ),
            (section(&[&get]), true, "a pseudo-header in trailers"),
            (
                section(&[&literal(b":path", b"/x")]),
                true,
                "a pseudo-header in trailers",
            ),
        ];
        for (block, trailers, why) in cases {
            assert_eq!(malformed(&block, trailers), Some(why), "{block:x?}");
        }
    }

    #[test]
    fn a_huffman_encoded_literal_name_is_decoded() {
        // ":path" Huffman-encoded (HPACK's code): b9 58 d3 3f, 4 bytes; H set (0x08).
        let mut line = vec![0x20 | 0x08 | 4, 0xb9, 0x58, 0xd3, 0x3f];
        line.extend_from_slice(&[1, b'/']);
        let block = section(&[&indexed(17), &line, &indexed(1)]);
        assert_eq!(malformed(&block, false), Some("a duplicated pseudo-header"));
    }
}
