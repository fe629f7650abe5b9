//! The Ranks screen: one row per rank (node, iterations, median, p95, a bar of its recent
//! parts, its largest stall, its GPU), sortable and filterable; the straggler of the last
//! window marked. Only the rows on screen are built, so 1,024 ranks cost what 20 do.

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
            row(r, i == selected, is_straggler)
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), rows_area);
    let note_text = match straggler {
        Some(w) => format!(
            "  ▲ straggler, iterations {}–{}: rank {} on {} held the others {} ({} of their time waiting)",
            count(w.first_iter),
            count(w.last_iter),
            w.rank,
            w.node,
            duration(w.held_seconds),
            pct(w.others_wait_fraction)
        ),
        None => format!(
            "  {} of {} ranks shown · sorted by {}",
            rows.len(),
            view.ranks.len(),
            app.rank_sort.name()
        ),
    };
    frame.render_widget(Paragraph::new(Line::raw(note_text).dim()), note);
}

fn row(r: &RankView, selected: bool, straggler: bool) -> Line<'static> {
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
    if straggler {
        style = style.add_modifier(Modifier::BOLD);
    }
    if selected {
        style = style.add_modifier(Modifier::REVERSED);
    }
    let mut spans = vec![
        Span::styled(if straggler { "▲ " } else { "  " }, style),
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
