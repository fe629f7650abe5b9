//! The hang banner: while a declared hang lasts (no rank finishes an iteration; see
//! `analysis::hang`), every screen opens with it — who never arrived where, where each rank
//! stands (inside which collective, or in its data loading) and their Python stacks — so the
//! culprit is on screen without switching tabs. It goes once iterations resume.

use ratatui::layout::Rect;
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;
use stallscope_analysis::hang::{describe, HangReport};
use stallscope_analysis::view::JobView;

/// The hang declared and still lasting, if any.
pub fn lasting(view: &JobView) -> Option<&HangReport> {
    view.summary
        .hangs
        .last()
        .filter(|h| h.resumed_after_seconds.is_none())
}

/// Rows the banner takes in a body of `height` rows: its text and border, at most two
/// thirds of the body; 0 without a lasting hang.
pub fn rows(view: &JobView, width: u16, height: u16) -> u16 {
    let Some(h) = lasting(view) else {
        return 0;
    };
    let inner = usize::from(width.saturating_sub(2)).max(1);
    let text: usize = lines(h)
        .iter()
        .map(|l| l.width().div_ceil(inner).max(1))
        .sum();
    let most = height.saturating_mul(2) / 3;
    u16::try_from(text + 2).unwrap_or(u16::MAX).min(most)
}

/// The hang in words, as the run's and the collector's stderr say it (without the prefix),
/// the stacks of the ranks that never arrived first: a short banner still shows theirs.
fn lines(h: &HangReport) -> Vec<Line<'static>> {
    let mut words = h.clone();
    let stacks = std::mem::take(&mut words.stacks);
    let mut out: Vec<Line<'static>> = describe(&words)
        .lines()
        .map(|l| Line::from(l.strip_prefix("stallscope: ").unwrap_or(l).to_string()))
        .collect();
    let missing = |rank: &String| {
        let rank = rank.parse::<u32>().ok();
        !rank.is_some_and(|r| h.missing_ranks.contains(&r))
    };
    let mut ordered: Vec<(&String, &String)> = stacks.iter().collect();
    ordered.sort_by_key(|(rank, _)| missing(rank));
    for (rank, text) in ordered {
        let named = h
            .ranks
            .iter()
            .find(|r| r.rank.to_string() == *rank)
            .and_then(|r| r.node.as_ref())
            .map_or_else(|| rank.clone(), |node| format!("{rank}@{node}"));
        out.push(Line::from(format!("rank {named}'s Python stacks:")).bold());
        out.extend(text.lines().map(|l| Line::from(format!("  {l}"))));
    }
    out
}

/// Draws the banner of `view`'s lasting hang in `area`.
pub fn draw(frame: &mut Frame, area: Rect, view: &JobView) {
    let Some(h) = lasting(view) else {
        return;
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::Red))
        .title(
            " HANG: no rank finishes an iteration "
                .bold()
                .reversed()
                .red(),
        );
    frame.render_widget(
        Paragraph::new(lines(h))
            .wrap(Wrap { trim: false })
            .block(block),
        area,
    );
}
