//! JSON scanning without building values: where a string, a nested value or
//! a scalar ends. Strings are skipped by substring search for their closing
//! quote (and escapes), so a prompt costs about one pass of `memchr`.

use memchr::memchr2;

/// Nesting the request scanner follows (serde_json's own limit).
pub const MAX_DEPTH: u32 = 128;

/// Why a body is not scanned through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    Malformed,
    TooDeep,
}

pub fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\r' | b'\n')) {
        i += 1;
    }
    i
}

/// The end (one past the closing quote) of the string opening at `at`.
pub fn string_end(b: &[u8], at: usize) -> Result<usize, Bad> {
    let mut i = at + 1;
    loop {
        let rest = b.get(i..).ok_or(Bad::Malformed)?;
        let k = i + memchr2(b'"', b'\\', rest).ok_or(Bad::Malformed)?;
        match b.get(k) {
            Some(b'"') => return Ok(k + 1),
            // An escape: the next byte is never the string's end.
            _ => i = k + 2,
        }
    }
}

/// The end of the value starting at `at` (a string, object, array or scalar).
pub fn value_end(b: &[u8], at: usize) -> Result<usize, Bad> {
    match b.get(at) {
        Some(b'"') => string_end(b, at),
        Some(b'{' | b'[') => container_end(b, at),
        Some(b't') => literal(b, at, b"true"),
        Some(b'f') => literal(b, at, b"false"),
        Some(b'n') => literal(b, at, b"null"),
        Some(_) => number_end(b, at),
        None => Err(Bad::Malformed),
    }
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Result<usize, Bad> {
    let end = at + word.len();
    if b.get(at..end) == Some(word) {
        Ok(end)
    } else {
        Err(Bad::Malformed)
    }
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
fn number_end(b: &[u8], at: usize) -> Result<usize, Bad> {
    let digits = |mut i: usize| {
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        (i > start).then_some(i)
    };
    let mut i = at + usize::from(b.get(at) == Some(&b'-'));
    i = match b.get(i) {
        Some(b'0') => i + 1,
        Some(b'1'..=b'9') => digits(i).ok_or(Bad::Malformed)?,
        _ => return Err(Bad::Malformed),
    };
    if b.get(i) == Some(&b'.') {
        i = digits(i + 1).ok_or(Bad::Malformed)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(i).ok_or(Bad::Malformed)?;
    }
    Ok(i)
}

/// The end of the object or array opening at `at`; brackets must match.
fn container_end(b: &[u8], at: usize) -> Result<usize, Bad> {
    // Bit i of `arrays`: level i+1 is an array.
    let (mut depth, mut arrays) = (0u32, 0u128);
    let mut i = at;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => {
                i = string_end(b, i)?;
                continue;
            }
            b'{' | b'[' => {
                if depth == MAX_DEPTH {
                    return Err(Bad::TooDeep);
                }
                arrays = (arrays << 1) | u128::from(c == b'[');
                depth += 1;
            }
            b'}' | b']' => {
                if depth == 0 || (arrays & 1 == 1) != (c == b']') {
                    return Err(Bad::Malformed);
                }
                arrays >>= 1;
                depth -= 1;
                if depth == 0 {
                    return Ok(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err(Bad::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends() {
        let b = br#""a\"b" {"x":[1,{"y":"}"}]} 12.5e3,"#;
        assert_eq!(string_end(b, 0), Ok(6));
        assert_eq!(value_end(b, 7), Ok(26));
        assert_eq!(value_end(b, 27), Ok(33));
        for (v, end) in [
            ("-0.5E+2 ", Ok(7)),
            ("true,", Ok(4)),
            ("nul", Err(Bad::Malformed)),
            ("01", Ok(1)),
            ("1.", Err(Bad::Malformed)),
            ("-", Err(Bad::Malformed)),
            ("x", Err(Bad::Malformed)),
        ] {
            assert_eq!(value_end(v.as_bytes(), 0), end, "{v}");
        }
        assert_eq!(value_end(b"{]", 0), Err(Bad::Malformed));
        assert_eq!(value_end(b"[1,2", 0), Err(Bad::Malformed));
        assert_eq!(value_end(b"\"abc\\", 0), Err(Bad::Malformed));
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(value_end(deep.as_bytes(), 0), Err(Bad::TooDeep));
        let ok = "[".repeat(128) + &"]".repeat(128);
        assert_eq!(value_end(ok.as_bytes(), 0), Ok(256));
    }
}
