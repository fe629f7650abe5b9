//! The help overlay (`?`): the keys, and what the colours mean.

use ratatui::layout::Rect;
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;
use stallscope_analysis::category::Category;

use super::{App, Mode};
use crate::palette;

/// The keys, as the help lists them.
pub const KEYS: [(&str, &str); 12] = [
    ("q", "quit the dashboard (the training goes on)"),
    ("Ctrl-C", "quit and interrupt the training"),
    ("Tab 1-4", "screens: Job, Timeline, Ranks, Nodes"),
    ("↑↓ PgUp PgDn", "select a rank or a node"),
    ("Enter / Esc", "a rank's detail / back"),
    ("s", "sort ranks: rank, median, stall, node"),
    ("/", "filter ranks and nodes by number or name"),
    ("p", "pause the live view (the feed goes on)"),
    ("← →", "scroll the timeline (replay: step)"),
    ("Home End", "oldest / latest (replay: start / end)"),
    ("space", "replay: play / pause"),
    ("?", "this help; any key closes it"),
];

/// Draws the help in `area`.
pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::raw(format!(" {k:<13}")).bold(),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::raw(""));
    for row in Category::ALL.chunks(4) {
        let mut legend = vec![Span::raw(" ")];
        for c in row {
            legend.push(Span::styled("■ ", Style::new().fg(palette::color(*c))));
            legend.push(Span::raw(format!("{:<13}", c.name())));
        }
        lines.push(Line::from(legend));
    }
    if let Mode::Replay(c) = &app.mode {
        lines.push(Line::raw(format!(" replaying {}", c.profile)).dim());
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" stallscope top: keys ")),
        area,
    );
}
