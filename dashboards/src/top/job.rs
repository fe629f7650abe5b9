//! The Job screen: the verdict first (the finding with the bound on its gain, and the change
//! it suggests), then the figures (iterations, median and p95, throughput), each category's share in
//! the whole run and in the recent window, and how much to trust them (coverage, drops,
//! sources down).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::view::{JobView, WINDOW_ITERATIONS};

use super::format::{count, duration, pct};
use crate::palette;

/// Draws the Job screen in `area`.
pub fn draw(frame: &mut Frame, area: Rect, view: &JobView) {
    let verdict_text = verdict_lines(view);
    let inner_width = area.width.saturating_sub(2).max(1) as usize;
    let wrapped: usize = verdict_text
        .iter()
        .map(|l| (l.width() + l.width() / 10).div_ceil(inner_width).max(1))
        .sum();
    let [verdict, figures, shares, health] = Layout::vertical([
        Constraint::Length(wrapped.clamp(1, 7) as u16 + 2),
        Constraint::Length(3),
        Constraint::Length(8),
        Constraint::Min(0),
    ])
    .areas(area);
    frame.render_widget(
        Paragraph::new(verdict_text)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(" Verdict ")),
        verdict,
    );
    let recent = recent(view);
    frame.render_widget(
        Paragraph::new(figure_lines(view, recent.p95_seconds)),
        figures,
    );
    frame.render_widget(
        Paragraph::new(share_lines(view, &recent.window, shares.width)),
        shares,
    );
    frame.render_widget(
        Paragraph::new(health_lines(view)).wrap(Wrap { trim: false }),
        health,
    );
}

fn verdict_lines(view: &JobView) -> Vec<Line<'static>> {
    let f = &view.summary.finding;
    if view.summary.job.iterations == 0 {
        return vec![Line::raw(
            "No counted iteration yet: the verdict comes after the warm-up.",
        )];
    }
    let colour = f
        .category
        .map_or(Style::new(), |c| Style::new().fg(palette::color(c)).bold());
    vec![
        Line::from(vec![
            Span::styled("■ ", colour),
            Span::raw(f.sentence.clone()).bold(),
        ]),
        Line::from(vec![
            Span::raw("→ ").bold(),
            Span::raw(f.suggestion.clone()),
        ]),
    ]
}

/// The job's recent window, read in one pass a frame (32 iterations × 1,024 ranks): every
/// rank's last [`WINDOW_ITERATIONS`] parts summed by category, and the 95th percentile of
/// their wall times (what "p95 now" means here).
struct Recent {
    /// ns per category.
    window: Split,
    /// s; 0 when there is no iteration.
    p95_seconds: f64,
}

fn recent(view: &JobView) -> Recent {
    let mut window = Split::default();
    let mut walls: Vec<u64> = Vec::with_capacity(view.ranks.len() * WINDOW_ITERATIONS);
    for r in view.ranks.values() {
        for p in r.recent.iter().rev().take(WINDOW_ITERATIONS) {
            window.add_split(&p.split);
            walls.push(p.wall_ns());
        }
    }
    let p95_seconds = if walls.is_empty() {
        0.0
    } else {
        let k = ((0.95 * walls.len() as f64).ceil() as usize).clamp(1, walls.len()) - 1;
        // The k-th smallest without sorting them all.
        *walls.select_nth_unstable(k).1 as f64 / 1e9
    };
    Recent {
        window,
        p95_seconds,
    }
}

fn figure_lines(view: &JobView, p95_now_seconds: f64) -> Vec<Line<'static>> {
    let s = &view.summary;
    let median = s.job.median_iteration_seconds;
    let throughput = match view.samples_per_second {
        Some(x) => format!("{x:.0} samples/s"),
        None if median > 0.0 => format!("{:.1} it/s per rank", 1.0 / median),
        None => "–".into(),
    };
    vec![
        Line::from(vec![
            Span::raw(" iterations ").dim(),
            Span::raw(format!(
                "{} counted ({} seen, {} warm-up per rank)",
                count(s.job.iterations),
                count(view.attributed),
                s.warmup_iterations
            )),
        ]),
        Line::from(vec![
            Span::raw(" median ").dim(),
            Span::raw(duration(median)),
            Span::raw("   p95 now ").dim(),
            Span::raw(duration(p95_now_seconds)),
            Span::raw("   throughput ").dim(),
            Span::raw(throughput),
            Span::raw("   wall ").dim(),
            Span::raw(duration(s.wall_seconds)),
        ]),
        Line::from(vec![
            Span::raw(" seen ").dim(),
            Span::raw(format!(
                "{} of the time inside marked phases, {} covered by samples",
                pct(s.job.coverage.marked),
                pct(s.job.coverage.sampled)
            )),
        ]),
    ]
}

/// How far to trust the figures: what was lost, what is down, who turned slow, who held the
/// others up.
fn health_lines(view: &JobView) -> Vec<Line<'static>> {
    let s = &view.summary;
    let lost = s.markers.dropped + s.markers.rejected;
    let trouble = lost > 0 || view.records_dropped > 0 || !s.sources_down.is_empty();
    let mut lines = vec![Line::from(vec![
        Span::raw(" lost ").dim(),
        Span::styled(
            format!(
                "{lost} marker{} · {} record{} · sources down: {}",
                if lost == 1 { "" } else { "s" },
                view.records_dropped,
                if view.records_dropped == 1 { "" } else { "s" },
                if s.sources_down.is_empty() {
                    "none".to_string()
                } else {
                    s.sources_down.len().to_string()
                }
            ),
            if trouble {
                Style::new().bold()
            } else {
                Style::new()
            },
        ),
    ])];
    for d in &s.sources_down {
        lines.push(Line::from(vec![
            Span::raw(" ! ").bold(),
            Span::raw(format!("{}: {}", d.source, d.message)),
        ]));
    }
    // The latest few ranks that turned slow, the ongoing ones bold.
    for d in s.slowdowns.iter().rev().take(3) {
        let (mark, end) = match d.until_iteration {
            None => (Span::raw(" ▼ ").bold(), String::new()),
            Some(until) => (Span::raw(" ▽ "), format!(", back at {}", count(until))),
        };
        lines.push(Line::from(vec![
            mark,
            Span::raw(format!(
                "rank {} on {} slow since iteration {}: {} {} → {} ({:.2}× slower{end})",
                d.rank,
                d.node,
                count(d.since_iteration),
                d.category,
                duration(d.before_seconds),
                duration(d.after_seconds),
                d.factor
            )),
        ]));
    }
    if let Some(w) = view.stragglers.back() {
        lines.push(Line::from(vec![
            Span::raw(" ▲ ").bold(),
            Span::raw(format!(
                "iterations {}–{}: rank {} on {} held the others up {}",
                count(w.first_iter),
                count(w.last_iter),
                w.rank,
                w.node,
                duration(w.held_seconds)
            )),
        ]));
    }
    lines
}

fn share_lines(view: &JobView, window: &Split, width: u16) -> Vec<Line<'static>> {
    let run = &view.summary.job.categories;
    let wtotal = window.total().max(1) as f64;
    let bar_width = (width as usize).saturating_sub(32).min(60);
    let mut lines = vec![Line::from(vec![
        Span::raw(format!(" {:<14}{:>6}{:>8}  ", "category", "run", "window")).dim(),
        Span::raw("share of the run").dim(),
    ])];
    for c in Category::ALL {
        let run_share = run.get(c).fraction;
        let window_share = window.get(c) as f64 / wtotal;
        let cells = (run_share * bar_width as f64).round() as usize;
        lines.push(Line::from(vec![
            Span::styled(" ■ ", Style::new().fg(palette::color(c))),
            Span::raw(format!(
                "{:<12}{:>6}{:>8}  ",
                c.name(),
                pct(run_share),
                pct(window_share)
            )),
            Span::styled("█".repeat(cells), Style::new().fg(palette::color(c))),
        ]));
    }
    lines
}
