//! Numbers out of procfs text, without allocating.
//!
//! The sources read the same files up to a hundred times a second. A general parser
//! (procfs-core's) builds a `String` per line or per field and, measured with callgrind over a
//! 100 Hz run, spent more instructions than the rest of the sampler; these helpers walk the
//! bytes once and stop at the last field wanted.

/// A decimal number with nothing else around it; `None` for anything else or on overflow.
pub(crate) fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// The lines of `text`, without their `\n`.
pub(crate) fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|b| *b == b'\n')
}

/// The fields of `line`: what lies between runs of ASCII whitespace, none empty.
pub(crate) fn fields(line: &[u8]) -> Fields<'_> {
    Fields { rest: line }
}

/// Iterator of [`fields`].
pub(crate) struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Fields<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|b| !b.is_ascii_whitespace())?;
        let field = &self.rest[start..];
        let end = field
            .iter()
            .position(u8::is_ascii_whitespace)
            .unwrap_or(field.len());
        self.rest = &field[end..];
        Some(&field[..end])
    }
}

/// The fields of a `stat` line after the parenthesised `comm` (which may itself hold `)` and
/// spaces, hence the last `)`), starting at field 3 (the state), and the `comm`.
pub(crate) fn stat_fields(line: &[u8]) -> Option<(&[u8], Fields<'_>)> {
    let open = line.iter().position(|b| *b == b'(')?;
    let close = line.iter().rposition(|b| *b == b')')?;
    let comm = line.get(open + 1..close)?;
    Some((comm, fields(&line[close + 1..])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_fields_and_lines() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"1 "), None);
        let f: Vec<&[u8]> = fields(b"  lo: 12\t 3  \n").collect();
        assert_eq!(f, [&b"lo:"[..], b"12", b"3"]);
        assert_eq!(fields(b"   ").next(), None);
        let l: Vec<&[u8]> = lines(b"a\nb\n").collect();
        assert_eq!(l, [&b"a"[..], b"b", b""]);
    }

    #[test]
    fn stat_fields_start_after_the_last_parenthesis() {
        let (comm, mut f) = stat_fields(b"42 (a) b) S 1 2").unwrap();
        assert_eq!(comm, b"a) b");
        assert_eq!(f.next(), Some(&b"S"[..]));
        assert_eq!(f.next(), Some(&b"1"[..]));
        assert!(stat_fields(b"42 (python3").is_none());
    }
}
