//! The Ranks screen: one row per rank (node, iterations, median, p95, a bar of its recent
//! parts, its largest stall, its GPU), sortable and filterable; the straggler of the last
//! window marked ▲, a rank that turned slow and has not recovered ▼ (it comes first in the
//! note). Only the rows on screen are built, so 1,024 ranks cost what 20 do.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use stallscope_analysis::view::{JobView, RankView};

use super::chart::share_bar;
use super::format::{count, duration, pct};
use super::{largest_stall_share, App};

/// Width of the parts bar.
const BAR: usize = 16;

/// Draws the Ranks screen in `area`.
pub fn draw(frame: &mut Frame, area: Rect, app: &App, view: &JobView) {
    let [head, rows_area, note] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(
        Paragraph::new(Line::from(
            format!(
                "  {:>4} {:<8} {:>6} {:>8} {:>8}  {:<BAR$} {:<16} {:>4}",
                "rank", "node", "iters", "median", "p95", "last 32 it", "largest stall", "GPU"
            )
            .bold(),
        )),
        head,
    );
    let rows = app.ranks(view);
    let straggler = view.stragglers.back();
    let height = rows_area.height as usize;
    let selected = app.rank_row.min(rows.len().saturating_sub(1));
    let first = selected.saturating_sub(height.saturating_sub(1));
    let lines: Vec<Line> = rows
        .iter()
        .enumerate()
        .skip(first)
        .take(height)
        .map(|(i, r)| {
            let is_straggler = straggler.is_some_and(|w| w.rank == r.rank && w.node == r.node);
            let mark = if slow_now(view, r) {
                "▼ "
            } else if is_straggler {
                "▲ "
            } else {
                "  "
            };
            row(r, i == selected, mark)
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), rows_area);
    let slow = view.summary.slowdowns.iter().rev().find(|s| s.ongoing());
    let note_text = match (slow, straggler) {
        (Some(s), _) => format!(
            "  ▼ rank {} on {} slow since iteration {}: {} {} → {} ({:.2}×)",
            s.rank,
            s.node,
            count(s.since_iteration),
            s.category,
            duration(s.before_seconds),
            duration(s.after_seconds),
            s.factor
        ),
        (None, Some(w)) => format!(
            "  ▲ straggler, iterations {}–{}: rank {} on {} held the others {} ({} of their time waiting)",
            count(w.first_iter),
            count(w.last_iter),
            w.rank,
            w.node,
            duration(w.held_seconds),
            pct(w.others_wait_fraction)
        ),
        (None, None) => format!(
            "  {} of {} ranks shown · sorted by {}",
            rows.len(),
            view.ranks.len(),
            app.rank_sort.name()
        ),
    };
    frame.render_widget(Paragraph::new(Line::raw(note_text).dim()), note);
}

/// Whether rank `r` turned slow and has not recovered.
fn slow_now(view: &JobView, r: &RankView) -> bool {
    view.summary
        .slowdowns
        .iter()
        .any(|s| s.ongoing() && s.rank == r.rank && s.node == r.node)
}

/// One rank's row; `mark`: `▼ ` slow now, `▲ ` the straggler, else blank.
fn row(r: &RankView, selected: bool, mark: &'static str) -> Line<'static> {
    let window = r.window();
    let stall = match window.largest_stall() {
        Some(c) => format!("{} {}", c.name(), pct(largest_stall_share(&window))),
        None => "–".into(),
    };
    let gpu = r
        .gpu
        .as_ref()
        .and_then(|g| g.busy_fraction)
        .map_or("–".to_string(), pct);
    let mut style = Style::new();
    if mark != "  " {
        style = style.add_modifier(Modifier::BOLD);
    }
    if selected {
        style = style.add_modifier(Modifier::REVERSED);
    }
    let mut spans = vec![
        Span::styled(mark, style),
        Span::styled(
            format!(
                "{:>4} {:<8} {:>6} {:>8} {:>8}  ",
                r.rank,
                clip(&r.node, 8),
                count(r.figures.iterations),
                duration(r.figures.median_iteration_seconds),
                duration(r.p95_iteration_seconds),
            ),
            style,
        ),
    ];
    spans.extend(share_bar(&window, BAR));
    spans.push(Span::styled(format!(" {stall:<16} {gpu:>4}"), style));
    Line::from(spans)
}

/// `s` cut to `n` characters, with `…` when cut.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(n - 1).collect();
        out.push('…');
        out
    }
}
