//! The Nodes screen: one row per node (CPU busy, run-queue delay, GPU busy, NIC, RDMA and disk
//! rates, PSI, clock offset ± uncertainty, records and markers lost), and for the selected
//! node its last two minutes as sparklines and the sources that are down. The RDMA column and
//! sparkline appear only where a node has RDMA ports: on 80 columns the column pushes `lost`
//! off the edge, which a node with InfiniBand or EFA pays for its most telling rate.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline};
use ratatui::Frame;
use stallscope_analysis::view::{JobView, NodeResources, NodeView};

use super::format::{or_dash, pct, rate};
use super::ranks::clip;
use super::App;

/// One sparkline of the selected node: its label and how to read it from a reading.
struct Series {
    label: &'static str,
    read: fn(&NodeResources) -> Option<f64>,
    show: fn(f64) -> String,
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

/// The sparkline only a node with RDMA ports shows.
const RDMA_LABEL: &str = "RDMA in+out";

const SERIES: [Series; 8] = [
    Series {
        label: "CPU cores",
        read: |r| r.cpu_busy_cores,
        show: |v| format!("{v:.2}"),
    },
    Series {
        label: "GPU busy",
        read: |r| r.gpu_busy,
        show: pct,
    },
    Series {
        label: "NIC in+out",
        read: |r| sum(r.nic_rx_bytes_per_s, r.nic_tx_bytes_per_s),
        show: rate,
    },
    Series {
        label: RDMA_LABEL,
        read: |r| sum(r.rdma_rx_bytes_per_s, r.rdma_tx_bytes_per_s),
        show: rate,
    },
    Series {
        label: "disk read",
        read: |r| r.disk_read_bytes_per_s,
        show: rate,
    },
    Series {
        label: "PCIe in+out",
        read: |r| sum(r.pcie_rx_bytes_per_s, r.pcie_tx_bytes_per_s),
        show: rate,
    },
    Series {
        label: "NVLink",
        read: |r| sum(r.nvlink_rx_bytes_per_s, r.nvlink_tx_bytes_per_s),
        show: rate,
    },
    Series {
        label: "PSI io",
        read: |r| r.psi_io,
        show: pct,
    },
];

/// Whether node `n` has RDMA ports (a reading with their bytes).
fn has_rdma(n: &NodeView) -> bool {
    n.resources
        .iter()
        .chain(n.history.iter())
        .any(|r| r.rdma_rx_bytes_per_s.is_some() || r.rdma_tx_bytes_per_s.is_some())
}

/// The sparklines of node `n`: RDMA only where it has RDMA ports.
fn series_of(n: &NodeView) -> Vec<&'static Series> {
    let rdma = has_rdma(n);
    SERIES
        .iter()
        .filter(|s| rdma || s.label != RDMA_LABEL)
        .collect()
}

/// Draws the Nodes screen in `area`.
pub fn draw(frame: &mut Frame, area: Rect, app: &App, view: &JobView) {
    let nodes = app.nodes(view);
    let selected = app.node_row.min(nodes.len().saturating_sub(1));
    let shown = nodes
        .get(selected)
        .map_or(SERIES.len() - 1, |n| series_of(n).len());
    let panel_rows = shown as u16 + 2;
    let [head, rows_area, panel] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(panel_rows),
    ])
    .areas(area);
    let rdma = nodes.iter().any(|n| has_rdma(n));
    let rdma_head = if rdma {
        format!(" {:>11}", "RDMA in/out")
    } else {
        String::new()
    };
    frame.render_widget(
        Paragraph::new(Line::from(
            format!(
                "  {:<9} {:>3} {:>5} {:>5} {:>4} {:>11}{rdma_head} {:>6} {:>8} {:>12} {:>5}",
                "node",
                "rk",
                "CPU",
                "runq",
                "GPU",
                "NIC in/out",
                "disk",
                "PSI c/io",
                "clock ±",
                "lost"
            )
            .bold(),
        )),
        head,
    );
    let height = rows_area.height as usize;
    let first = selected.saturating_sub(height.saturating_sub(1));
    let lines: Vec<Line> = nodes
        .iter()
        .enumerate()
        .skip(first)
        .take(height)
        .map(|(i, n)| row(n, i == selected, rdma))
        .collect();
    frame.render_widget(Paragraph::new(lines), rows_area);
    if let Some(n) = nodes.get(selected) {
        draw_panel(frame, panel, n);
    }
}

/// A rate in few characters: `12`, `340k`, `1.2M`, `3.4G` (bytes/s).
fn short(v: Option<f64>) -> String {
    let Some(v) = v else { return "–".into() };
    if v < 1e3 {
        format!("{v:.0}")
    } else if v < 1e6 {
        format!("{:.0}k", v / 1e3)
    } else if v < 1e7 {
        format!("{:.1}M", v / 1e6)
    } else if v < 1e9 {
        format!("{:.0}M", v / 1e6)
    } else if v < 1e10 {
        format!("{:.1}G", v / 1e9)
    } else {
        format!("{:.0}G", v / 1e9)
    }
}

/// Node `n`'s row; with an RDMA column when `rdma`.
fn row(n: &NodeView, selected: bool, rdma: bool) -> Line<'static> {
    let r = n.resources.clone().unwrap_or_default();
    let rdma = if rdma {
        let rates = (r.rdma_rx_bytes_per_s, r.rdma_tx_bytes_per_s);
        let cell = match rates {
            (None, None) => "–".to_string(),
            (rx, tx) => format!("{}/{}", short(rx), short(tx)),
        };
        format!(" {cell:>11}")
    } else {
        String::new()
    };
    let psi = match (r.psi_cpu, r.psi_io) {
        (None, None) => "–".to_string(),
        (c, i) => format!(
            "{}/{}",
            or_dash(c, |v| format!("{:.0}", v * 100.0)),
            or_dash(i, |v| format!("{:.0}%", v * 100.0))
        ),
    };
    let clock = match (n.clock_offset_ns, n.clock_uncertainty_ns) {
        (Some(o), Some(u)) => format!("{:+.2}±{:.2}ms", o as f64 / 1e6, u as f64 / 1e6),
        (Some(o), None) => format!("{:+.2}ms", o as f64 / 1e6),
        _ => "–".into(),
    };
    let lost = n.records_dropped + n.markers_dropped;
    let mut style = Style::new();
    if selected {
        style = style.add_modifier(Modifier::REVERSED);
    }
    let flag = if n.sources_down.is_empty() {
        "  "
    } else {
        "! "
    };
    Line::from(vec![
        Span::styled(flag, style.add_modifier(Modifier::BOLD)),
        Span::styled(
            format!(
                "{:<9} {:>3} {:>5} {:>5} {:>4} {:>11}{rdma} {:>6} {:>8} {:>12} {:>5}",
                clip(&n.node, 9),
                n.ranks.len(),
                or_dash(r.cpu_busy_cores, |v| format!("{v:.1}")),
                or_dash(r.runq_delay, |v| format!("{v:.2}")),
                or_dash(r.gpu_busy, pct),
                format!(
                    "{}/{}",
                    short(r.nic_rx_bytes_per_s),
                    short(r.nic_tx_bytes_per_s)
                ),
                short(r.disk_read_bytes_per_s),
                psi,
                clock,
                lost,
            ),
            style,
        ),
    ])
}

fn draw_panel(frame: &mut Frame, area: Rect, n: &NodeView) {
    let down = if n.sources_down.is_empty() {
        "all sources up".to_string()
    } else {
        format!("down: {}", n.sources_down.join("; "))
    };
    // The job's share of the node's NIC, from its TCP flows (absent without the flow source).
    let share = stallscope_analysis::flows::job_share(&n.flow_classes)
        .map(|s| format!("job {} of NIC flow bytes · ", pct(s)))
        .unwrap_or_default();
    let block = Block::new().borders(Borders::TOP).title(format!(
        " {} · last {} s · {share}{down} ",
        n.node,
        n.history.len()
    ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if n.history.is_empty() {
        frame.render_widget(Paragraph::new("no resource readings yet").dim(), inner);
        return;
    }
    let series = series_of(n);
    let rows = Layout::vertical(series.iter().map(|_| Constraint::Length(1))).split(inner);
    for (s, row) in series.iter().zip(rows.iter()) {
        let values: Vec<Option<f64>> = n.history.iter().map(s.read).collect();
        let [label, spark, now] = Layout::horizontal([
            Constraint::Length(12),
            Constraint::Min(10),
            Constraint::Length(11),
        ])
        .areas(*row);
        frame.render_widget(Paragraph::new(format!(" {}", s.label)).dim(), label);
        let max = values.iter().flatten().fold(0.0f64, |m, v| m.max(*v));
        let width = spark.width as usize;
        let skip = values.len().saturating_sub(width);
        let data: Vec<u64> = values[skip..]
            .iter()
            .map(|v| match (v, max > 0.0) {
                (Some(v), true) => (v / max * 100.0).round() as u64,
                _ => 0,
            })
            .collect();
        frame.render_widget(Sparkline::default().data(&data).max(100), spark);
        let latest = values.last().copied().flatten();
        frame.render_widget(Paragraph::new(format!(" {}", or_dash(latest, s.show))), now);
    }
}
