//! The category colours every view uses: the terminal dashboard, the Grafana dashboard and
//! the report. Okabe & Ito's palette, chosen to stay distinct for colour-blind readers and
//! readable on dark and light backgrounds; one colour per category, never reused.

use ratatui::style::Color;
use stallscope_analysis::category::Category;

/// The category's colour as `#RRGGBB`.
pub fn hex(c: Category) -> &'static str {
    match c {
        Category::Compute => "#0072B2",
        Category::DataFetch => "#E69F00",
        Category::DataPrep => "#D55E00",
        Category::Interconnect => "#CC79A7",
        Category::Network => "#56B4E9",
        Category::PeerWait => "#F0E442",
        Category::Other => "#999999",
    }
}

/// The category's colour for the terminal (24-bit).
pub fn color(c: Category) -> Color {
    let h = hex(c);
    let byte = |i: usize| u8::from_str_radix(&h[i..i + 2], 16).unwrap_or(0);
    Color::Rgb(byte(1), byte(3), byte(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grafana_dashboard_uses_the_same_colour_for_each_category() {
        let json: serde_json::Value =
            serde_json::from_str(include_str!("../grafana/stallscope.json")).expect("JSON");
        let mut found = 0;
        let mut check = |v: &serde_json::Value| {
            let (Some(name), Some(colour)) = (
                v.pointer("/matcher/options").and_then(|o| o.as_str()),
                v.pointer("/properties/0/value/fixedColor")
                    .and_then(|c| c.as_str()),
            ) else {
                return;
            };
            if let Some(c) = Category::ALL.iter().find(|c| c.name() == name) {
                assert_eq!(colour, hex(*c), "{name}");
                found += 1;
            }
        };
        walk(&json, &mut check);
        assert!(found >= 7, "the dashboard colours {found} categories");
    }

    fn walk(v: &serde_json::Value, f: &mut impl FnMut(&serde_json::Value)) {
        f(v);
        match v {
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
            serde_json::Value::Object(o) => o.values().for_each(|x| walk(x, f)),
            _ => {}
        }
    }

    #[test]
    fn colours_are_the_hex_values() {
        assert_eq!(color(Category::Compute), Color::Rgb(0x00, 0x72, 0xB2));
        assert_eq!(color(Category::PeerWait), Color::Rgb(0xF0, 0xE4, 0x42));
    }
}
