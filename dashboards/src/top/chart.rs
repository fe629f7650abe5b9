//! The stacked-column chart of iterations (one column per iteration, one colour per
//! category, compute at the bottom) and the one-line share bar, shared by the Timeline screen,
//! the rank detail and the Ranks rows.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Style, Stylize};
use ratatui::text::Span;
use ratatui::widgets::Widget;
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::view::JobView;

use super::column_sums::ColumnSums;
use crate::palette;

/// Iterations as stacked columns, the latest at the right edge.
pub struct StackedColumns<'a> {
    /// One split per column, oldest first.
    pub columns: &'a [Split],
}

impl Widget for StackedColumns<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let max = self.columns.iter().map(Split::total).max().unwrap_or(0);
        if max == 0 || area.height == 0 {
            return;
        }
        let shown = self.columns.len().min(area.width as usize);
        let first_x = area.x + area.width - shown as u16;
        let h = f64::from(area.height);
        for (i, split) in self.columns[self.columns.len() - shown..]
            .iter()
            .enumerate()
        {
            let x = first_x + i as u16;
            for row in 0..area.height {
                let centre = (f64::from(row) + 0.5) / h * max as f64;
                let Some(c) = category_at(split, centre) else {
                    break;
                };
                let y = area.y + area.height - 1 - row;
                buf[(x, y)].set_symbol("█").set_fg(palette::color(c));
            }
        }
    }
}

/// The category whose stacked band holds `ns`, counting from compute at the bottom.
fn category_at(split: &Split, ns: f64) -> Option<Category> {
    let mut top = 0.0;
    for c in Category::ALL {
        top += split.get(c) as f64;
        if ns < top {
            return Some(c);
        }
    }
    None
}

/// The columns of the Timeline: per iteration number, the mean over the ranks that finished
/// it (or one rank's), for the `width` iterations ending `back` before the latest.
pub struct Columns {
    /// Oldest first.
    pub splits: Vec<Split>,
    /// The first and last iteration shown, when any is.
    pub iters: Option<(u64, u64)>,
    /// ns, the longest column.
    pub max_ns: u64,
}

/// The columns of `view`'s ranks (only `rank`, when given), summed afresh.
#[cfg(test)]
pub fn columns(view: &JobView, rank: Option<u32>, width: usize, back: u64) -> Columns {
    columns_kept(&mut ColumnSums::default(), view, rank, width, back)
}

/// Builds the columns from `view`'s ranks (only `rank`, when given), adding to the sums
/// `kept` from the frame before only what arrived since.
pub fn columns_kept(
    kept: &mut ColumnSums,
    view: &JobView,
    rank: Option<u32>,
    width: usize,
    back: u64,
) -> Columns {
    let ranks = view
        .ranks
        .values()
        .filter(|r| rank.is_none_or(|want| r.rank == want));
    let latest = ranks
        .clone()
        .filter_map(|r| r.recent.back().map(|p| p.iter))
        .max();
    let Some(latest) = latest else {
        return Columns {
            splits: vec![],
            iters: None,
            max_ns: 0,
        };
    };
    let oldest_kept = ranks
        .clone()
        .filter_map(|r| r.recent.front().map(|p| p.iter))
        .min()
        .unwrap_or(0);
    let width = width.max(1) as u64;
    let last = latest
        .saturating_sub(back)
        .max(oldest_kept + width - 1)
        .min(latest);
    let first = last.saturating_sub(width - 1);
    let sums = kept.update(view, rank, first, last);
    // Iterations no rank holds any more (or yet) get no column.
    let first_held = sums
        .iter()
        .position(|(_, n)| *n > 0)
        .map(|i| first + i as u64);
    let splits: Vec<Split> = sums
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(ns, n)| Split {
            ns: ns.map(|v| v / n),
        })
        .collect();
    Columns {
        max_ns: splits.iter().map(Split::total).max().unwrap_or(0),
        iters: Some((first_held.unwrap_or(first), last)),
        splits,
    }
}

/// A bar `width` cells wide, split by category in proportion to `split`.
pub fn share_bar(split: &Split, width: usize) -> Vec<Span<'static>> {
    let total = split.total();
    if total == 0 || width == 0 {
        return vec![Span::raw(" ".repeat(width))];
    }
    let mut spans = Vec::new();
    let mut drawn = 0usize;
    let mut cumulative = 0u64;
    for c in Category::ALL {
        cumulative += split.get(c);
        let end = ((cumulative as f64 / total as f64) * width as f64).round() as usize;
        if end > drawn {
            spans.push(Span::styled(
                "█".repeat(end - drawn),
                Style::new().fg(palette::color(c)),
            ));
            drawn = end;
        }
    }
    if drawn < width {
        spans.push(" ".repeat(width - drawn).dim());
    }
    spans
}
