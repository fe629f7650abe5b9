//! Numbers as the dashboard prints them: short, unit-bearing, fixed width where columns need
//! it.

/// A duration given in s: `850 µs`, `12.3 ms`, `1.23 s`, `2 m 05 s`.
pub fn duration(s: f64) -> String {
    if !s.is_finite() || s <= 0.0 {
        "–".into()
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 0.1 {
        format!("{:.1} ms", s * 1e3)
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else if s < 100.0 {
        format!("{s:.2} s")
    } else {
        let whole = s.round() as u64;
        format!("{} m {:02} s", whole / 60, whole % 60)
    }
}

/// A rate given in bytes/s: `0 B/s`, `12 kB/s`, `1.2 MB/s`, `3.4 GB/s` (decimal units).
pub fn rate(bytes_per_s: f64) -> String {
    format!("{}/s", bytes(bytes_per_s))
}

/// A size given in bytes, decimal units.
pub fn bytes(b: f64) -> String {
    let b = b.max(0.0);
    if b < 1e3 {
        format!("{b:.0} B")
    } else if b < 1e6 {
        format!("{:.0} kB", b / 1e3)
    } else if b < 1e9 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.1} GB", b / 1e9)
    }
}

/// A share 0–1 as a whole percentage.
pub fn pct(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

/// A count with thousands separators: `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// An optional figure, or `–`.
pub fn or_dash<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "–".into(), f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_a_person_writes_them() {
        assert_eq!(duration(0.000_85), "850 µs");
        assert_eq!(duration(0.0123), "12.3 ms");
        assert_eq!(duration(0.25), "250 ms");
        assert_eq!(duration(1.234), "1.23 s");
        assert_eq!(duration(125.0), "2 m 05 s");
        assert_eq!(duration(0.0), "–");
        assert_eq!(rate(1_234_567.0), "1.2 MB/s");
        assert_eq!(bytes(999.0), "999 B");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(pct(0.426), "43%");
    }
}
