//! The experiment as text, for the terminal and `stallscope summary`.

use std::fmt::Write;

use super::{Bound, Config, ExperimentReport, Stall, WhatIf};
use crate::category::Category;

fn formula(c: Category, report: &ExperimentReport) -> &'static str {
    let ran = |c: Config| report.runs.iter().any(|r| r.config == c);
    match c {
        Category::Compute => "T(R0)",
        Category::Interconnect => "T(R1) - T(R0)",
        Category::Network => "T(R1n) - T(R1)",
        Category::DataPrep if ran(Config::Nodes) => "T(R3) - T(R1n)",
        Category::DataPrep if ran(Config::Local) || !ran(Config::Single) => "T(R3) - T(R1)",
        Category::DataPrep => "T(R3) - T(R0)",
        Category::DataFetch => "T(R2) - T(R3)",
        Category::PeerWait | Category::Other => "",
    }
}

fn stall_line(out: &mut String, c: Category, f: &str, stall: Option<Stall>) {
    match stall {
        Some(s) => {
            let _ = writeln!(
                out,
                "  {:<13} {:<15} {:>8.4} s ± {:.4}  {:>5.1}%{}",
                c.name(),
                f,
                s.seconds,
                s.uncertainty_s,
                s.fraction * 100.0,
                if s.within_noise() {
                    "  (within noise)"
                } else {
                    ""
                }
            );
        }
        None => {
            let _ = writeln!(out, "  {:<13} {:<15} not measured", c.name(), f);
        }
    }
}

fn what_if_table(out: &mut String, w: &WhatIf) {
    let unit = if w.inputs.samples_per_iteration > 1.0 {
        "samples/s"
    } else {
        "iterations/s"
    };
    let mut cores: Vec<f64> = w.table.iter().map(|p| p.cores).collect();
    cores.sort_by(f64::total_cmp);
    cores.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    let _ = writeln!(
        out,
        "\nWhat if (DS-Analyzer): predicted {unit} by the share of the dataset cached (rows) and the cores preparing data (columns); C compute-, P prep-, F fetch-bound"
    );
    let mut head = format!("  {:<10}", "cached");
    for c in &cores {
        let now = (c - w.inputs.prep_cores_now).abs() < 1e-9;
        let label = format!("{}{}", trim(*c), if now { "*" } else { "" });
        let _ = write!(head, " {label:>10}");
    }
    let _ = writeln!(out, "{head}");
    for x in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let mut line = format!("  {:<10}", format!("{:.0}%", x * 100.0));
        for c in &cores {
            if let Some(p) = w
                .table
                .iter()
                .find(|p| (p.cached_fraction - x).abs() < 1e-9 && (p.cores - c).abs() < 1e-9)
            {
                let tag = match p.bound {
                    Bound::Compute => 'C',
                    Bound::Prep => 'P',
                    Bound::Fetch => 'F',
                };
                let _ = write!(line, " {:>9.1}{tag}", p.samples_per_s);
            }
        }
        let _ = writeln!(out, "{line}");
    }
    let i = &w.inputs;
    let _ = writeln!(
        out,
        "  (* cores used now; compute {:.1} {unit}; prep {}; storage {}; {} per sample)",
        i.compute_samples_per_s,
        i.prep_core_seconds_per_sample
            .map_or("not measured".into(), |s| format!(
                "{:.4} core-s per sample",
                s
            )),
        i.storage_bytes_per_s
            .map_or("not measured".into(), |b| format!("{:.1} MB/s", b / 1e6)),
        i.bytes_per_sample
            .map_or("bytes not measured".into(), |b| format!("{:.0} bytes", b)),
    );
}

fn trim(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round() as i64)
    } else {
        format!("{x:.1}")
    }
}

/// Renders the experiment: the runs, the stalls by difference, the online breakdown against
/// them, and the what-if table.
pub fn render_text(report: &ExperimentReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stallscope experiment: {} ({} iterations per process after {} warm-up)",
        report.command.join(" "),
        report.iterations,
        report.warmup_iterations
    );
    runs_table(&mut out, report);
    let d = &report.differential;
    let Some(basis) = d.basis else {
        let _ = writeln!(out, "\nNo configuration completed an iteration.");
        return out;
    };
    let _ = writeln!(
        out,
        "\nStalls by difference, s per iteration and share of {} ({:.4} s):",
        basis.label(),
        d.basis_seconds
    );
    for c in [
        Category::Compute,
        Category::Interconnect,
        Category::Network,
        Category::DataPrep,
        Category::DataFetch,
    ] {
        stall_line(&mut out, c, formula(c, report), d.get(c));
    }
    if !report.agreement.is_empty() {
        agreement_table(&mut out, report, basis.label());
    }
    if let Some(w) = &report.what_if {
        what_if_table(&mut out, w);
    }
    out
}

/// One line per configuration run: its processes, nodes, time per iteration, exit code.
fn runs_table(out: &mut String, report: &ExperimentReport) {
    let _ = writeln!(
        out,
        "\n  {:<4} {:<42} {:>5} {:>5} {:>10} {:>8} {:>5}",
        "run", "configuration", "procs", "nodes", "s/iter", "±", "exit"
    );
    for r in &report.runs {
        let _ = writeln!(
            out,
            "  {:<4} {:<42} {:>5} {:>5} {:>10.4} {:>8.4} {:>5}",
            r.config.label(),
            r.config.describe(),
            r.processes,
            r.nodes,
            r.timing.mean_s,
            r.timing.stderr_s,
            r.exit_code
        );
    }
}

/// The online breakdown of the basis run next to the differential, per category.
fn agreement_table(out: &mut String, report: &ExperimentReport, basis: &str) {
    let _ = writeln!(
        out,
        "\nOnline breakdown of {basis} against the differential:"
    );
    let _ = writeln!(
        out,
        "  {:<13} {:>7} {:>13} {:>17}",
        "category", "online", "differential", "difference (pts)"
    );
    for a in &report.agreement {
        let diff = a
            .differential
            .map_or("-".to_string(), |d| format!("{:.1}%", d * 100.0));
        let err = a
            .error_points()
            .map_or("-".to_string(), |e| format!("{e:.1}"));
        let _ = writeln!(
            out,
            "  {:<13} {:>6.1}% {:>13} {:>17}",
            a.category.name(),
            a.online * 100.0,
            diff,
            err
        );
    }
}
