//! The frame around every screen: the header (job, size, live or replay), the tabs, the hang
//! banner while a hang lasts, the training's output pane under `run --tui`, and the footer
//! with the keys or the filter.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Tabs};
use ratatui::Frame;
use stallscope_analysis::view::JobView;

use super::format::count;
use super::{detail, hang, help, job, nodes, ranks, timeline, App, Mode, Screen};

/// Rows of training output the pane shows (plus its border): more on a tall terminal.
fn output_rows(height: u16) -> u16 {
    match height {
        34.. => 5,
        24.. => 2,
        _ => 0,
    }
}

/// Draws the whole dashboard: `app`'s screen of `live` (or of the paused copy).
pub fn draw(frame: &mut Frame, app: &App, live: &JobView) {
    let view = app.shown(live);
    let area = frame.area();
    let output_rows = match &app.output {
        Some(_) if output_rows(area.height) > 0 => output_rows(area.height) + 1,
        _ => 0,
    };
    let [head, tabs, body, output, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(output_rows),
        Constraint::Length(1),
    ])
    .areas(area);
    let [banner, body] = Layout::vertical([
        Constraint::Length(hang::rows(view, body.width, body.height)),
        Constraint::Min(1),
    ])
    .areas(body);
    hang::draw(frame, banner, view);
    frame.render_widget(Paragraph::new(header(app, view)), head);
    frame.render_widget(
        Tabs::new(
            Screen::ALL
                .iter()
                .enumerate()
                .map(|(i, s)| format!("{} {}", i + 1, s.title())),
        )
        .select(app.screen.index())
        .highlight_style(Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD))
        .divider("│"),
        tabs,
    );
    match (app.screen, app.detail) {
        (Screen::Ranks, Some(rank)) => detail::draw(frame, body, app, view, rank),
        (Screen::Job, _) => job::draw(frame, body, view),
        (Screen::Timeline, _) => timeline::draw(frame, body, app, view),
        (Screen::Ranks, None) => ranks::draw(frame, body, app, view),
        (Screen::Nodes, _) => nodes::draw(frame, body, app, view),
    }
    if let (Some(out), true) = (&app.output, output_rows > 0) {
        draw_output(frame, output, out);
    }
    frame.render_widget(Paragraph::new(footer(app)), foot);
    if app.help {
        let r = centred(area, 62, 20);
        frame.render_widget(Clear, r);
        help::draw(frame, r, app);
    }
}

fn header(app: &App, view: &JobView) -> Line<'static> {
    let nodes = match view.nodes.len() {
        0 => String::new(),
        1 => " on 1 node".into(),
        n => format!(" on {n} nodes"),
    };
    let name = if view.name.is_empty() {
        "job".to_string()
    } else {
        view.name.clone()
    };
    let mut spans = vec![
        Span::from(" stallscope ").bold().reversed(),
        Span::raw(format!(
            " {name} · {} it × {} rank{}{nodes} ",
            count(view.iterations()),
            view.ranks.len(),
            if view.ranks.len() == 1 { "" } else { "s" },
        )),
    ];
    let state = match &app.mode {
        _ if app.paused.is_some() => Span::from("PAUSED").bold().reversed(),
        Mode::Live(at) => Span::from(format!("live · {}", short_source(at))).bold(),
        Mode::Ended(at) => Span::from(format!("ended · {}", short_source(at))).bold(),
        Mode::Lost(why) => Span::from(format!("feed lost: {why}")).bold().reversed(),
        Mode::Replay(c) => Span::from(format!(
            "replay {} {} {:.1}/{:.1} s",
            c.profile,
            if c.playing { "▶" } else { "⏸" },
            c.seconds,
            c.total_seconds,
        ))
        .bold(),
    };
    spans.push(state);
    Line::from(spans)
}

/// A feed socket's file name, or an address as it is.
fn short_source(at: &str) -> &str {
    at.rsplit('/').next().unwrap_or(at)
}

fn footer(app: &App) -> Line<'static> {
    if app.editing_filter {
        return Line::from(vec![
            Span::from(" / filter: ").bold(),
            Span::raw(format!("{}▏", app.filter)),
            Span::raw("  Enter done · Esc clear").dim(),
        ]);
    }
    let mut keys: Vec<(&str, String)> = vec![("q", "quit".into()), ("?", "help".into())];
    keys.push(("Tab", "screen".into()));
    match app.screen {
        Screen::Ranks if app.detail.is_some() => keys.push(("Esc", "back".into())),
        Screen::Ranks => {
            keys.push(("↑↓", "select".into()));
            keys.push(("⏎", "detail".into()));
            keys.push(("s", format!("sort:{}", app.rank_sort.name())));
        }
        Screen::Nodes => keys.push(("↑↓", "select".into())),
        _ => {}
    }
    if matches!(app.mode, Mode::Replay(_)) {
        keys.push(("←→", "step".into()));
        keys.push(("␣", "play".into()));
    } else {
        if app.screen == Screen::Timeline {
            keys.push(("←→", "scroll".into()));
        }
        keys.push((
            "p",
            if app.paused.is_some() {
                "resume"
            } else {
                "pause"
            }
            .into(),
        ));
    }
    keys.push(("/", "filter".into()));
    let mut spans = Vec::new();
    for (k, what) in keys {
        spans.push(Span::from(format!(" {k}")).bold());
        spans.push(Span::raw(format!(" {what}")));
    }
    if !app.filter.is_empty() {
        spans.push(Span::from(format!("  [{}]", app.filter)).bold());
    }
    Line::from(spans)
}

fn draw_output(frame: &mut Frame, area: Rect, out: &super::OutputPane) {
    let block = Block::new()
        .borders(Borders::TOP)
        .title(format!(" training output (all of it: {}) ", out.log))
        .dim();
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let skip = out.lines.len().saturating_sub(inner.height as usize);
    let lines: Vec<Line> = out.lines[skip..]
        .iter()
        .map(|l| Line::raw(l.clone()))
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// A rectangle of at most `w`×`h` centred in `area`.
fn centred(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}
