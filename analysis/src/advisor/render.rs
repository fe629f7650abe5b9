//! The advice as text: one table of candidates (fastest first), then the communication and
//! data advice. Every number a user might act on stands next to what it rests on.

use std::fmt::Write;

use super::{label, Advice, AdviceReport};

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "—".into())
}

/// `0.412 s`, or `2.1 ms` below 0.1 s.
fn seconds(s: f64) -> String {
    if s < 0.1 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

fn advice_lines(out: &mut String, title: &str, list: &[Advice]) {
    if list.is_empty() {
        return;
    }
    let _ = writeln!(out, "{title}:");
    for a in list {
        let _ = writeln!(
            out,
            "  - {} — saves about {} per iteration ({:.0}%); not when {}",
            a.change,
            seconds(a.gain_seconds),
            a.gain_fraction * 100.0,
            a.unless
        );
    }
}

/// Renders the report as text.
pub fn render_text(r: &AdviceReport) -> String {
    let mut out = String::new();
    let m = &r.measured;
    let b = &m.breakdown;
    let _ = writeln!(
        out,
        "measured on {} ({} rank{}, {} node{}): mean iteration {:.3} s (median {:.3} s) = compute {:.3} · fetch {:.3} · prep {:.3} · interconnect {:.3} · network {:.3} · peer wait {:.3} · other {:.3}",
        r.current,
        m.ranks,
        if m.ranks == 1 { "" } else { "s" },
        m.nodes,
        if m.nodes == 1 { "" } else { "s" },
        m.iteration_seconds,
        m.median_iteration_seconds,
        b.compute, b.data_fetch, b.data_prep, b.interconnect, b.network, b.peer_wait, b.other
    );
    if !m.nodes_from.is_empty() {
        let _ = writeln!(out, "  nodes from {}", m.nodes_from);
    }
    for note in &m.node_count_notes {
        let _ = writeln!(out, "  note: {note}");
    }
    instance_table(&mut out, r);
    // Grouped by reason, each type once (not once per node count): a CPU job leaves most of
    // a cloud catalog out for one reason.
    let mut skipped: Vec<(&str, Vec<&str>)> = Vec::new();
    for p in &r.instances {
        let Some(why) = p.not_applicable.as_deref() else {
            continue;
        };
        let name = p.instance_type.as_str();
        match skipped.iter_mut().find(|(w, _)| *w == why) {
            Some((_, names)) if names.contains(&name) => {}
            Some((_, names)) => names.push(name),
            None => skipped.push((why, vec![name])),
        }
    }
    for (why, names) in &skipped {
        let _ = writeln!(out, "not predicted, {why}: {}", names.join(", "));
    }
    let _ = writeln!(
        out,
        "* outside what was measured (see --json for each reason)"
    );
    if let Some(first) = r
        .instances
        .iter()
        .find(|p| p.predicted_iteration_seconds.is_some())
    {
        let _ = writeln!(out, "assumptions ({}):", label(first));
        for a in &first.assumptions {
            let _ = writeln!(out, "  - {a}");
        }
        for e in &first.extrapolations {
            let _ = writeln!(out, "  - outside the measurement: {e}");
        }
    }
    let _ = writeln!(
        out,
        "\ncommunication is {}-bound{}",
        match r.communication_bound {
            super::CommBound::Latency => "latency",
            super::CommBound::Bandwidth => "bandwidth",
            super::CommBound::Unknown => "(not measured)",
        },
        match (m.comm_bytes_per_iteration, m.collectives_per_iteration) {
            (Some(b), Some(c)) => format!(
                ": {c:.0} collective(s) per iteration, {:.0} bytes each",
                b / c.max(1.0)
            ),
            _ => String::new(),
        }
    );
    advice_lines(&mut out, "communication", &r.communication);
    if !r.not_advised.is_empty() {
        let _ = writeln!(out, "considered, not advised:");
        for a in &r.not_advised {
            let _ = writeln!(out, "  - {} — no gain here: {}", a.change, a.unless);
        }
    }
    advice_lines(&mut out, "data", &r.data);
    out
}

/// One row per candidate instance and node count: predicted times, hours, cost and marks.
fn instance_table(out: &mut String, r: &AdviceReport) {
    let _ = writeln!(
        out,
        "\n{:<28} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10}  ",
        "instance", "ranks", "iter s", "compute", "data", "comm", "hours", "cost $", "$/node-h"
    );
    for p in &r.instances {
        let name = label(p);
        let Some(t) = p.predicted_iteration_seconds else {
            continue;
        };
        let bd = p.breakdown.unwrap_or_default();
        let marks = format!(
            "{}{}{}{}",
            if p.pareto { " pareto" } else { "" },
            if p.current { " (measured)" } else { "" },
            if r.cheapest_within_budget.as_deref() == Some(name.as_str()) {
                " cheapest"
            } else {
                ""
            },
            if p.extrapolations.is_empty() {
                ""
            } else {
                " *"
            }
        );
        let _ = writeln!(
            out,
            "{:<28} {:>5} {:>9.3} {:>8.3} {:>8.3} {:>8.3} {:>8} {:>9} {:>10.3} {}",
            name,
            p.ranks,
            t,
            bd.compute,
            bd.data_fetch + bd.data_prep,
            bd.interconnect + bd.network,
            opt(p.predicted_hours, |h| format!("{h:.2}")),
            opt(p.predicted_cost, |c| format!("{c:.2}")),
            p.price_per_node_hour,
            marks.trim_start()
        );
    }
}
