//! The Stall timeline: the last iterations as stacked columns (mean over the ranks that
//! finished each), scrolling back with ←, and each category's share in the columns shown and
//! in the whole run.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::figures::Categories;
use stallscope_analysis::view::JobView;

use super::chart::{columns_kept, StackedColumns};
use super::format::{count, duration, pct};
use super::App;
use crate::palette;

/// Draws the Timeline screen in `area`.
pub fn draw(frame: &mut Frame, area: Rect, app: &App, view: &JobView) {
    draw_chart(frame, area, app, view, None, &view.summary.job.categories);
}

/// The chart of `rank` (all ranks: `None`) scrolled `app.timeline_back` iterations, with its
/// legend comparing the columns shown with `run`'s shares.
pub fn draw_chart(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    view: &JobView,
    rank: Option<u32>,
    run: &Categories,
) {
    let [chart_area, legend_area] =
        Layout::vertical([Constraint::Min(3), Constraint::Length(3)]).areas(area);
    let block = Block::bordered();
    let inner = block.inner(chart_area);
    let cols = columns_kept(
        &mut app.column_sums.borrow_mut(),
        view,
        rank,
        inner.width as usize,
        app.timeline_back,
    );
    let title = match cols.iters {
        Some((first, last)) => format!(
            " iterations {}–{}{} · tallest {} ",
            count(first),
            count(last),
            match rank {
                Some(r) => format!(" of rank {r}"),
                None => " (mean over ranks)".into(),
            },
            duration(cols.max_ns as f64 / 1e9)
        ),
        None => " no iteration yet ".into(),
    };
    frame.render_widget(block.title(title), chart_area);
    frame.render_widget(
        StackedColumns {
            columns: &cols.splits,
        },
        inner,
    );
    let mut shown = Split::default();
    for s in &cols.splits {
        shown.add_split(s);
    }
    frame.render_widget(Paragraph::new(legend(&shown, run)), legend_area);
}

/// Three lines of `■ name shown% (run%)`.
fn legend(shown: &Split, run: &Categories) -> Vec<Line<'static>> {
    let total = shown.total().max(1) as f64;
    let item = |c: Category| {
        vec![
            Span::styled(" ■ ", Style::new().fg(palette::color(c))),
            Span::raw(format!("{:<12}", c.name())),
            Span::raw(format!("{:>4}", pct(shown.get(c) as f64 / total))),
            Span::raw(format!(" ({:>3})", pct(run.get(c).fraction))).dim(),
        ]
    };
    let mut lines: Vec<Line> = Category::ALL
        .chunks(3)
        .map(|row| Line::from(row.iter().flat_map(|c| item(*c)).collect::<Vec<_>>()))
        .collect();
    if let Some(last) = lines.last_mut() {
        last.push_span(Span::raw("   share of the columns (of the whole run)").dim());
    }
    lines
}
