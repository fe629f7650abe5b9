//! A rank's detail (Enter on the Ranks screen): its figures per category, its GPU, its loader
//! workers, its most exposed communication operations and its own timeline.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Stylize;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use stallscope_analysis::view::{JobView, RankView};

use super::format::{bytes, count, duration, or_dash, pct};
use super::{timeline, App};

/// Draws rank `rank`'s detail in `area`.
pub fn draw(frame: &mut Frame, area: Rect, app: &App, view: &JobView, rank: u32) {
    let Some(r) = view.ranks.get(&rank) else {
        frame.render_widget(
            Paragraph::new(format!("rank {rank} is not in the model (any more)")),
            area,
        );
        return;
    };
    let mut lines = vec![Line::from(vec![
        Span::raw(format!(" rank {} on {}", r.rank, r.node)).bold(),
        Span::raw(format!(" · pid {}", r.pid)).dim(),
        Span::raw(format!(
            " · {} it · median {} · p95 {}",
            count(r.figures.iterations),
            duration(r.figures.median_iteration_seconds),
            duration(r.p95_iteration_seconds)
        )),
    ])];
    let model = r
        .gpu
        .as_ref()
        .and_then(|g| view.nodes.get(&r.node)?.gpu_model(&g.gpu));
    lines.extend(gpu_and_loader_lines(r, model));
    lines.extend(collective_lines(view, rank));
    let [facts, chart] =
        Layout::vertical([Constraint::Length(lines.len() as u16), Constraint::Min(4)]).areas(area);
    frame.render_widget(Paragraph::new(lines), facts);
    timeline::draw_chart(frame, chart, app, view, Some(rank), &r.figures.categories);
}

/// The rank's GPU (index, product name when NVML gave it, UUID) and its figures, then its
/// DataLoader workers.
fn gpu_and_loader_lines(r: &RankView, model: Option<&str>) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    match &r.gpu {
        Some(g) => {
            lines.push(Line::from(vec![
                Span::raw(format!(" GPU {}", g.gpu)).bold(),
                Span::raw(model.map(|m| format!(" {m}")).unwrap_or_default()),
                Span::raw(format!(" {}", g.uuid.clone().unwrap_or_default())).dim(),
            ]));
            lines.push(Line::raw(format!(
                " busy {} · {} · {} per iteration",
                or_dash(g.busy_fraction, pct),
                or_dash(g.power_watts, |w| format!("{w:.0} W")),
                or_dash(g.energy_joules_per_iteration, |j| format!("{j:.1} J")),
            )));
            lines.push(Line::raw(format!(
                " PCIe in {} out {} · NVLink {} per iteration",
                or_dash(g.pcie_rx_bytes_per_iteration, bytes),
                or_dash(g.pcie_tx_bytes_per_iteration, bytes),
                or_dash(g.nvlink_bytes_per_iteration, bytes),
            )));
            lines.push(Line::raw(format!(
                " iterations timed with CUDA events {} · with NVML readings {}",
                pct(g.cuda_timed_fraction),
                pct(g.read_fraction)
            )));
        }
        None => lines.push(Line::raw(" no GPU seen for this rank").dim()),
    }
    let workers = match (r.loader_workers, r.loader_pids.is_empty()) {
        (None, true) => " loader workers: not reported (none, or a rank of another node)".into(),
        (w, _) => format!(
            " loader workers: {} configured, {} seen{}",
            or_dash(w, |n| n.to_string()),
            r.loader_pids.len(),
            if r.loader_pids.is_empty() {
                String::new()
            } else {
                format!(
                    " (pids {})",
                    r.loader_pids
                        .iter()
                        .take(6)
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
        ),
    };
    lines.push(Line::raw(workers));
    lines
}

/// Operations a rank's detail shows, the most exposed first (the summary JSON lists all).
const SHOWN_OPERATIONS: usize = 3;

/// The rank's most exposed collective and point-to-point operations per iteration, as the
/// summary lists them: operation, role, count, bytes, time held and of it waiting.
fn collective_lines(view: &JobView, rank: u32) -> Vec<Line<'static>> {
    let Some(r) = view.summary.ranks.iter().find(|r| r.rank == rank) else {
        return Vec::new();
    };
    r.collectives
        .iter()
        .take(SHOWN_OPERATIONS)
        .map(|c| {
            let role = c
                .role
                .map_or(String::new(), |x| format!(" ({})", x.short()));
            Line::raw(format!(
                " {}{role} {:.1} × {} per it · {} ({} waiting)",
                c.op,
                c.count_per_iteration,
                bytes(c.bytes_per_iteration),
                duration(c.seconds_per_iteration),
                duration(c.waited_seconds_per_iteration),
            ))
        })
        .collect()
}
