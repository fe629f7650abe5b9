//! The post-hoc report, rendered: one self-contained HTML page (inline SVG charts, no script,
//! no external asset, prints to PDF), Markdown for tickets and pull requests (tables, with
//! the charts as SVG files beside it), and JSON (`stallscope.report/1`) for other tools.
//! Each is a pure function of a [`Report`] or a [`Comparison`].

pub mod charts;
mod hangs;
mod html;
mod markdown;

pub use html::{html, html_comparison};
pub use markdown::{markdown, markdown_comparison, Rendered};

use stallscope_analysis::category::Category;
use stallscope_analysis::figures::Categories;
use stallscope_analysis::report::{Comparison, Report};

/// The report as JSON (`stallscope.report/1`).
pub fn json(r: &Report) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")) + "\n"
}

/// The comparison as JSON.
pub fn json_comparison(c: &Comparison) -> String {
    serde_json::to_string_pretty(c).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")) + "\n"
}

/// Escapes text for HTML (and SVG) bodies and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A category's name for people: `data fetch`.
pub fn category_label(c: Category) -> String {
    c.name().replace('_', " ")
}

/// s as people read them: `12.3 ms`, `1.25 s`, `2 h 03 min`.
pub fn duration(s: f64) -> String {
    if !s.is_finite() {
        return "—".into();
    }
    if s == 0.0 {
        "0 s".into()
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if s < 120.0 {
        format!("{s:.2} s")
    } else if s < 7200.0 {
        let whole = s.round() as u64;
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        let minutes = (s / 60.0).round() as u64;
        format!("{} h {:02} min", minutes / 60, minutes % 60)
    }
}

/// A share as a percentage: `42%`, `0.4%`.
pub fn percent(f: f64) -> String {
    if f > 0.0 && f < 0.01 {
        format!("{:.1}%", f * 100.0)
    } else {
        format!("{:.0}%", f * 100.0)
    }
}

/// An optional figure with its unit, `—` when absent.
pub fn opt(v: Option<f64>, unit: &str, digits: usize) -> String {
    match v {
        Some(v) => format!("{v:.digits$}{unit}"),
        None => "—".into(),
    }
}

/// The categories with time, largest first: `compute 61%, data prep 30%`.
pub fn shares(c: &Categories) -> String {
    let mut v: Vec<(Category, f64)> = Category::ALL
        .iter()
        .map(|&k| (k, c.get(k).fraction))
        .filter(|(_, f)| *f >= 0.005)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    if v.is_empty() {
        return "—".into();
    }
    v.iter()
        .map(|(k, f)| format!("{} {}", category_label(*k), percent(*f)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
