//! The report's charts, drawn by plotters as SVG text to inline in the HTML or write beside
//! the Markdown: no script, no external asset, and they print as vectors.

use std::error::Error;

use plotters::coord::Shift;
use plotters::prelude::*;
use stallscope_analysis::category::Category;
use stallscope_analysis::experiment::ExperimentReport;
use stallscope_analysis::report::{Comparison, NodeResourceSeries, Report, ResourceRow};

use crate::palette;

/// px, the width of a full-width chart.
pub const WIDTH: u32 = 960;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), Box<dyn Error>>;

/// Draws on a `w`×`h` SVG; a chart that cannot be drawn becomes a note in its place.
fn svg(w: u32, h: u32, draw: impl FnOnce(&Area) -> Drawn) -> String {
    let mut out = String::new();
    let result = {
        let root = SVGBackend::with_string(&mut out, (w, h)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|_| draw(&root).map_err(|e| e.to_string()))
            .and_then(|_| root.present().map_err(|e| e.to_string()))
    };
    match result {
        Ok(()) => out,
        Err(e) => format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"40\"><text x=\"4\" y=\"20\">chart not drawn: {}</text></svg>",
            super::escape(&e)
        ),
    }
}

/// The category's colour for plotters.
pub fn colour(c: Category) -> RGBColor {
    rgb(palette::hex(c))
}

fn rgb(hex: &str) -> RGBColor {
    let byte = |i: usize| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("00"), 16).unwrap_or(0);
    RGBColor(byte(1), byte(3), byte(5))
}

/// Colours of nodes' lines: none of them a category's.
const NODE_COLOURS: [&str; 6] = [
    "#000000", "#6A3D9A", "#8C564B", "#2CA02C", "#7F7F7F", "#17BECF",
];

fn node_colour(i: usize) -> RGBColor {
    rgb(NODE_COLOURS[i % NODE_COLOURS.len()])
}

/// A duration for an axis label: ms under a second.
fn seconds_label(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else if s.abs() < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}

/// s, the iteration time a chart's axis is scaled to: the highest 95th percentile of a rank's
/// counted iterations (warm-up left out), else the median column's 95th percentile. A column
/// holding only the start-up iteration (688 ms among 1 ms ones) has that as its 95th
/// percentile: scaled to it, every ordinary step was a flat line at the bottom.
fn typical_p95(r: &Report) -> f64 {
    let ranks = r
        .breakdown
        .ranks
        .iter()
        .map(|x| x.p95_seconds)
        .filter(|p| p.is_finite() && *p > 0.0)
        .fold(0.0, f64::max);
    if ranks > 0.0 {
        return ranks;
    }
    let mut cols: Vec<f64> = r.timeline.columns.iter().map(|c| c.p95_seconds).collect();
    cols.sort_by(f64::total_cmp);
    cols.get(cols.len() / 2).copied().unwrap_or(0.0)
}

/// An axis's top, s: up to `highest`, but never past 5× the typical 95th percentile (what
/// is above is marked at the top instead), with 10% headroom.
fn clipped_top(r: &Report, highest: f64) -> f64 {
    let typical = typical_p95(r);
    let top = if typical > 0.0 {
        highest.min(5.0 * typical).max(typical)
    } else {
        highest
    };
    if top > 0.0 {
        top * 1.1
    } else {
        1.0
    }
}

/// Every iteration's mean parts per column, stacked, over the run; the slowest iteration of
/// each column where it stands out (3× the column's median) marked with a triangle. The axis
/// stops at 5× the typical 95th percentile, as the iteration-time chart's does: a column
/// above it (the start-up iteration) is cut there and marked with a triangle.
pub fn timeline(r: &Report) -> Option<String> {
    let cols = &r.timeline.columns;
    if cols.is_empty() {
        return None;
    }
    let width = r.timeline.column_seconds;
    let x_max = r
        .run_seconds
        .max(cols.last().map_or(0.0, |c| c.start_seconds + width));
    let highest = cols
        .iter()
        .map(|c| c.mean.get(Category::Compute).seconds.max(0.0) + stall_sum(c))
        .fold(0.0, f64::max);
    let y_max = clipped_top(r, highest);
    Some(svg(WIDTH, 300, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("s since the run's start")
            .y_desc("mean iteration")
            .y_label_formatter(&|v| seconds_label(*v))
            .draw()?;
        // A column's iterations ended in it and began up to their slowest's length before:
        // its bar reaches back to the previous bar (or that far), so the chart has no gaps
        // where no iteration ended and a long iteration shows as long as it was.
        let mut prev_end: Option<f64> = None;
        for c in cols {
            let end = c.start_seconds + width;
            let longest = c.slowest.as_ref().map_or(width, |s| s.seconds.max(width));
            let left = prev_end.unwrap_or(0.0).max(end - longest);
            prev_end = Some(end);
            let mut base = 0.0;
            for cat in Category::ALL {
                let h = c.mean.get(cat).seconds;
                if h <= 0.0 {
                    continue;
                }
                if base < y_max {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(left, base), (end, (base + h).min(y_max))],
                        colour(cat).filled(),
                    )))?;
                }
                base += h;
            }
        }
        let spikes = cols.iter().filter_map(|c| {
            let s = c.slowest.as_ref()?;
            let cut = c.mean.get(Category::Compute).seconds + stall_sum(c) > y_max;
            (cut || (s.seconds >= 3.0 * c.p50_seconds && c.p50_seconds > 0.0))
                .then_some((c.start_seconds + width / 2.0, s.seconds))
        });
        chart.draw_series(
            spikes.map(|(x, s)| TriangleMarker::new((x, s.min(y_max * 0.97)), 5, BLACK.filled())),
        )?;
        Ok(())
    }))
}

fn stall_sum(c: &stallscope_analysis::report::TimelineColumn) -> f64 {
    Category::ALL
        .iter()
        .filter(|c| **c != Category::Compute)
        .map(|cat| c.mean.get(*cat).seconds)
        .sum()
}

/// Iteration time over the run: median, 95th percentile and slowest per column. The axis
/// reaches 5× the highest 95th percentile of a rank's counted iterations ([`typical_p95`]); a
/// slowest iteration above it (a checkpoint, the start-up) is a triangle at the top, so
/// ordinary steps keep their resolution.
pub fn iteration_time(r: &Report) -> Option<String> {
    let cols = &r.timeline.columns;
    if cols.is_empty() {
        return None;
    }
    let width = r.timeline.column_seconds;
    let x_max = r
        .run_seconds
        .max(cols.last().map_or(0.0, |c| c.start_seconds + width));
    let hi = cols
        .iter()
        .map(|c| c.slowest.as_ref().map_or(c.p95_seconds, |s| s.seconds))
        .fold(0.0, f64::max);
    if hi <= 0.0 {
        return None;
    }
    let y_max = clipped_top(r, hi);
    Some(svg(WIDTH, 240, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("s since the run's start")
            .y_desc("iteration time")
            .y_label_formatter(&|v| seconds_label(*v))
            .draw()?;
        let mid = |c: &stallscope_analysis::report::TimelineColumn| c.start_seconds + width / 2.0;
        let slowest = || {
            cols.iter()
                .filter_map(|c| c.slowest.as_ref().map(|s| (mid(c), s.seconds)))
        };
        chart.draw_series(
            slowest()
                .filter(|(_, s)| *s <= y_max)
                .map(|p| Circle::new(p, 2, rgb("#7F7F7F").filled())),
        )?;
        chart.draw_series(
            slowest()
                .filter(|(_, s)| *s > y_max)
                .map(|(x, _)| TriangleMarker::new((x, y_max * 0.97), 5, rgb("#7F7F7F").filled())),
        )?;
        chart.draw_series(LineSeries::new(
            cols.iter().map(|c| (mid(c), c.p95_seconds.min(y_max))),
            rgb("#D55E00").stroke_width(2),
        ))?;
        chart.draw_series(LineSeries::new(
            cols.iter().map(|c| (mid(c), c.p50_seconds.min(y_max))),
            BLACK.stroke_width(2),
        ))?;
        Ok(())
    }))
}

/// One resource panel: a title, a unit, and how to read its value from a row.
pub struct Panel {
    /// Title.
    pub title: &'static str,
    /// Unit of the y axis.
    pub unit: &'static str,
    read: fn(&ResourceRow) -> Option<f64>,
}

impl Panel {
    /// The panel's name in ids and file names: `pressure-psi-some`.
    pub fn slug(&self) -> String {
        self.title
            .to_lowercase()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("-")
    }
}

/// The resource panels, in the report's order.
pub const PANELS: [Panel; 10] = [
    Panel {
        title: "CPU busy",
        unit: "cores",
        read: |r| r.cpu_busy_cores,
    },
    Panel {
        title: "Run-queue delay",
        unit: "s per s",
        read: |r| r.runq_delay,
    },
    Panel {
        title: "GPU busy",
        unit: "%",
        read: |r| r.gpu_busy.map(|g| g * 100.0),
    },
    Panel {
        title: "NIC",
        unit: "MB/s, in + out",
        read: |r| sum2(r.nic_rx_mb_per_s, r.nic_tx_mb_per_s),
    },
    // Only where a node has RDMA ports: a panel without readings is left out.
    Panel {
        title: "RDMA",
        unit: "MB/s, in + out",
        read: |r| r.rdma_mb_per_s,
    },
    // Only where the flow source read the node's TCP flows.
    Panel {
        title: "TCP retransmissions",
        unit: "segments/s",
        read: |r| r.tcp_retransmits_per_s,
    },
    Panel {
        title: "Disk",
        unit: "MB/s, read + write",
        read: |r| sum2(r.disk_read_mb_per_s, r.disk_write_mb_per_s),
    },
    Panel {
        title: "PCIe",
        unit: "MB/s",
        read: |r| r.pcie_mb_per_s,
    },
    Panel {
        title: "NVLink",
        unit: "MB/s",
        read: |r| r.nvlink_mb_per_s,
    },
    Panel {
        title: "Pressure (PSI some)",
        unit: "% CPU",
        read: |r| r.psi_cpu.map(|p| p * 100.0),
    },
];

fn sum2(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

/// The panels that have readings, each a line per node over the run's time axis.
pub fn resources(r: &Report) -> Vec<(&'static Panel, String)> {
    let x_max = r.run_seconds.max(1e-3);
    let width = r.timeline.column_seconds;
    PANELS
        .iter()
        .filter_map(|p| {
            let lines: Vec<(usize, Vec<(f64, f64)>)> = r
                .resources
                .iter()
                .enumerate()
                .map(|(i, n)| (i, points(n, p, width)))
                .filter(|(_, pts)| !pts.is_empty())
                .collect();
            if lines.is_empty() {
                return None;
            }
            let y_max = lines
                .iter()
                .flat_map(|(_, pts)| pts.iter().map(|(_, y)| *y))
                .fold(0.0, f64::max);
            let y_max = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
            let chart = svg(WIDTH, 150, |root| {
                let mut chart = ChartBuilder::on(root)
                    .margin(6)
                    .x_label_area_size(24)
                    .y_label_area_size(64)
                    .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
                chart.configure_mesh().y_desc(p.unit).y_labels(4).draw()?;
                for (i, pts) in &lines {
                    chart.draw_series(LineSeries::new(
                        pts.iter().copied(),
                        node_colour(*i).stroke_width(2),
                    ))?;
                }
                Ok(())
            });
            Some((p, chart))
        })
        .collect()
}

fn points(n: &NodeResourceSeries, p: &Panel, width: f64) -> Vec<(f64, f64)> {
    n.columns
        .iter()
        .filter_map(|row| (p.read)(row).map(|v| (row.start_seconds + width / 2.0, v)))
        .collect()
}

/// The colour of node `i`'s lines, as `#RRGGBB`, for the legend.
pub fn node_hex(i: usize) -> &'static str {
    NODE_COLOURS[i % NODE_COLOURS.len()]
}

/// DS-Analyzer's what-if: predicted samples/s against cores preparing data, a line per
/// cached share of the dataset.
pub fn what_if(e: &ExperimentReport) -> Option<String> {
    let w = e.what_if.as_ref()?;
    if w.table.is_empty() {
        return None;
    }
    let x_max = w.table.iter().map(|p| p.cores).fold(0.0, f64::max).max(1.0);
    let y_max = w
        .table
        .iter()
        .map(|p| p.samples_per_s)
        .filter(|s| s.is_finite())
        .fold(0.0, f64::max)
        * 1.15;
    if y_max <= 0.0 {
        return None;
    }
    let mut fractions: Vec<f64> = w.table.iter().map(|p| p.cached_fraction).collect();
    fractions.sort_by(f64::total_cmp);
    fractions.dedup();
    Some(svg(WIDTH, 280, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("cores preparing data")
            .y_desc("samples/s")
            .draw()?;
        for (i, f) in fractions.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = w
                .table
                .iter()
                .filter(|p| p.cached_fraction == *f && p.samples_per_s.is_finite())
                .map(|p| (p.cores, p.samples_per_s))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let colour = node_colour(i);
            chart
                .draw_series(LineSeries::new(pts, colour.stroke_width(2)))?
                .label(format!("{:.0}% cached", f * 100.0))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
        Ok(())
    }))
}

/// Two runs' mean iteration per category, side by side.
pub fn comparison(c: &Comparison) -> String {
    let y_max = c
        .categories
        .iter()
        .map(|x| x.before_seconds.max(x.after_seconds))
        .fold(0.0, f64::max)
        * 1.15;
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let n = c.categories.len() as f64;
    svg(WIDTH, 260, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..n, 0f64..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(c.categories.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 0.26 {
                    Category::ALL
                        .get(i)
                        .map_or(String::new(), |c| c.name().to_string())
                } else {
                    String::new()
                }
            })
            .y_desc("s per mean iteration")
            .y_label_formatter(&|v| seconds_label(*v))
            .draw()?;
        for (i, x) in c.categories.iter().enumerate() {
            let i = i as f64;
            let col = colour(x.category);
            chart.draw_series([
                Rectangle::new(
                    [(i + 0.1, 0.0), (i + 0.48, x.before_seconds)],
                    col.mix(0.45).filled(),
                ),
                Rectangle::new([(i + 0.52, 0.0), (i + 0.9, x.after_seconds)], col.filled()),
            ])?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stallscope_analysis::report::{RankRow, TimelineColumn};

    /// Issue 30: the start-up iteration (688 ms) among 1 ms ones set both charts' axes to
    /// 700 ms. They now stop at 5× the ranks' 95th percentile of counted iterations.
    #[test]
    fn the_start_up_iteration_does_not_set_the_axis() {
        let mut r = Report::default();
        r.breakdown.ranks.push(RankRow {
            p95_seconds: 0.0012,
            ..RankRow::default()
        });
        r.timeline.column_seconds = 1.0;
        for (k, p95) in [0.688, 0.0012, 0.0011, 0.0012].into_iter().enumerate() {
            r.timeline.columns.push(TimelineColumn {
                start_seconds: k as f64,
                p50_seconds: p95,
                p95_seconds: p95,
                ..TimelineColumn::default()
            });
        }
        let top = clipped_top(&r, 0.688);
        assert!((top - 5.0 * 0.0012 * 1.1).abs() < 1e-9, "{top}");
        // Without ranks' figures the median column decides, not the start-up column.
        r.breakdown.ranks.clear();
        assert!(clipped_top(&r, 0.688) < 0.01);
        // A run that is all slow keeps its axis.
        assert!((clipped_top(&r, 0.0012) - 0.0012 * 1.1).abs() < 1e-9);
    }
}
