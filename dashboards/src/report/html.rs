//! The report as one self-contained HTML page.

use std::fmt::Write;

use stallscope_analysis::advisor::CommBound;
use stallscope_analysis::category::Category;
use stallscope_analysis::figures::Categories;
use stallscope_analysis::report::{Activity, AdviceSection, Comparison, Report, SlowIteration};

use super::{category_label, charts, duration, escape, opt, percent, shares};
use crate::palette;
use stallscope_analysis::collectives::bytes_text;

const STYLE: &str = include_str!("report.css");

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<meta name=\"generator\" content=\"stallscope {}\">\n<title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        env!("CARGO_PKG_VERSION"),
        escape(title)
    )
}

/// A stacked bar of the parts, each segment titled with its share.
fn bar(c: &Categories) -> String {
    let mut s = String::from("<div class=\"bar\">");
    for k in Category::ALL {
        let f = c.get(k).fraction;
        if f <= 0.0 {
            continue;
        }
        let _ = write!(
            s,
            "<span style=\"width:{:.2}%;background:{}\" title=\"{} {}\"></span>",
            f * 100.0,
            palette::hex(k),
            category_label(k),
            percent(f)
        );
    }
    s.push_str("</div>");
    s
}

fn legend() -> String {
    let mut s = String::from("<p class=\"legend\">");
    for k in Category::ALL {
        let _ = write!(
            s,
            "<span><i style=\"background:{}\"></i>{}</span> ",
            palette::hex(k),
            category_label(k)
        );
    }
    s.push_str("</p>");
    s
}

fn figure(id: &str, caption: &str, svg: &str) -> String {
    format!(
        "<figure class=\"chart\" id=\"{id}\">\n{svg}\n<figcaption>{}</figcaption>\n</figure>\n",
        escape(caption)
    )
}

fn activity(a: &Option<Activity>) -> String {
    let Some(a) = a else {
        return "no readings cover it".into();
    };
    let mut parts = Vec::new();
    if let Some(c) = a.cpu_busy_cores {
        parts.push(format!("CPU {c:.2} cores"));
    }
    if let Some(g) = a.gpu_busy {
        parts.push(format!("GPU {}", percent(g)));
    }
    if let (Some(r), Some(w)) = (a.disk_read_mb_per_s, a.disk_write_mb_per_s) {
        parts.push(format!("disk read {r:.1} MB/s, write {w:.1} MB/s"));
    }
    if let (Some(r), Some(t)) = (a.nic_rx_mb_per_s, a.nic_tx_mb_per_s) {
        parts.push(format!("NIC in {r:.1} MB/s, out {t:.1} MB/s"));
    }
    if parts.is_empty() {
        "no readings cover it".into()
    } else {
        escape(&parts.join("; "))
    }
}

fn verdict(r: &Report, out: &mut String) {
    let v = &r.verdict;
    let c = &v.confidence;
    let _ = writeln!(
        out,
        "<section id=\"verdict\" class=\"verdict\">\n<h2>Verdict</h2>\n<p class=\"finding\">{}</p>\n<p class=\"change\"><b>Change:</b> {}</p>",
        escape(&v.sentence),
        escape(&v.suggestion)
    );
    if v.max_gain_seconds > 0.0 {
        let _ = writeln!(
            out,
            "<p class=\"gain\"><b>Gain, at most:</b> {} per iteration ({:.2}× faster, from a median of {}). <span class=\"why\">{}</span></p>",
            duration(v.max_gain_seconds),
            v.max_speedup,
            duration(v.median_iteration_seconds),
            escape(&v.bound_explained)
        );
    } else {
        let _ = writeln!(out, "<p class=\"gain\">{}</p>", escape(&v.bound_explained));
    }
    let _ = writeln!(
        out,
        "<p class=\"confidence {level}\"><b>Confidence: {level}.</b> Coverage: {} of the counted time in marked phases, {} covered by samples; clocks {}; markers lost {}, malformed {}; records dropped {}; sources down {}; profile {}.</p>",
        percent(c.coverage_marked),
        percent(c.coverage_sampled),
        c.clock_uncertainty_ms.map_or("on one node".into(), |u| format!("within ± {u:.2} ms")),
        c.markers_dropped,
        c.markers_rejected,
        c.records_dropped,
        c.sources_down.len(),
        if c.complete { "complete" } else { "cut short" },
        level = escape(&c.level),
    );
    if !c.reasons.is_empty() {
        out.push_str("<ul class=\"reasons\">\n");
        for why in &c.reasons {
            let _ = writeln!(out, "<li>{}</li>", escape(why));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n");
}

fn breakdown(r: &Report, out: &mut String) {
    let b = &r.breakdown;
    let s = &r.summary.job;
    let _ = writeln!(
        out,
        "<section id=\"breakdown\">\n<h2>Where the iterations' time went</h2>\n{}\n<table class=\"parts\">\n<tr><th>Scope</th><th>Iterations</th><th>Parts</th><th>Shares</th></tr>\n<tr><td>Job (all ranks)</td><td>{}</td><td>{}</td><td>{}</td></tr>\n<tr><td>Critical path (per iteration, the rank that held it up)</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        legend(),
        s.iterations,
        bar(&b.job),
        escape(&shares(&b.job)),
        b.critical_path_iterations,
        bar(&b.critical_path),
        escape(&shares(&b.critical_path)),
    );
    for n in &b.nodes {
        let _ = writeln!(
            out,
            "<tr data-node=\"{n}\"><td>Node {n} (ranks {})</td><td></td><td>{}</td><td>{}</td></tr>",
            n.ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            bar(&n.parts),
            escape(&shares(&n.parts)),
            n = escape(&n.node),
        );
    }
    out.push_str("</table>\n<h3>Ranks</h3>\n<table class=\"ranks\">\n<tr><th>Rank</th><th>Node</th><th>Iterations</th><th>Median</th><th>p95</th><th>GPU busy</th><th>Parts</th><th>Largest stall</th></tr>\n");
    for rr in &b.ranks {
        let _ = writeln!(
            out,
            "<tr data-rank=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            rr.rank,
            rr.rank,
            escape(&rr.node),
            rr.iterations,
            duration(rr.median_seconds),
            duration(rr.p95_seconds),
            opt(rr.gpu_busy.map(|g| g * 100.0), "%", 0),
            bar(&rr.parts),
            rr.largest_stall.map_or("—".into(), |c| format!(
                "{} {}",
                category_label(c),
                percent(rr.parts.get(c).fraction)
            )),
        );
    }
    out.push_str("</table>\n</section>\n");
}

fn timeline(r: &Report, out: &mut String) {
    out.push_str("<section id=\"timeline\">\n<h2>Every iteration over the run</h2>\n");
    match (charts::timeline(r), charts::iteration_time(r)) {
        (Some(stack), Some(times)) => {
            let _ = write!(
                out,
                "{}{}{}",
                legend(),
                figure(
                    "chart-timeline",
                    &format!(
                        "The mean iteration's parts, all ranks, per {} column ({} iterations); ▲ marks a column whose slowest iteration took 3× its median or more.",
                        duration(r.timeline.column_seconds),
                        r.timeline.columns.iter().map(|c| c.iterations).sum::<u64>()
                    ),
                    &stack
                ),
                figure(
                    "chart-iteration-time",
                    "Iteration time per column: median (black), 95th percentile (vermilion), slowest (grey dots; a triangle at the top: above the axis, which stops at 5× the highest p95).",
                    &times
                )
            );
        }
        _ => out.push_str(
            "<p class=\"empty\">No iteration was attributed: there is nothing to chart.</p>\n",
        ),
    }
    out.push_str("</section>\n");
}

fn slow_rows(list: &[SlowIteration], out: &mut String) {
    out.push_str("<table class=\"long\">\n<tr><th>Rank</th><th>Node</th><th>Iteration</th><th>Ended at</th><th>Took</th><th>Rank's median</th><th>Largest part</th><th>Its node meanwhile</th></tr>\n");
    for s in list {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2} s</td><td>{}</td><td>{}</td><td>{} {}</td><td>{}</td></tr>",
            s.rank,
            escape(&s.node),
            s.iter,
            s.at_seconds,
            duration(s.seconds),
            duration(s.rank_median_seconds),
            category_label(s.largest),
            percent(s.parts.get(s.largest).fraction),
            activity(&s.activity)
        );
    }
    out.push_str("</table>\n");
}

fn outside(r: &Report, out: &mut String) {
    let o = &r.outside;
    let _ = writeln!(
        out,
        "<section id=\"outside\">\n<h2>Time outside iterations</h2>\n<p>{}</p>",
        escape(&o.sentence)
    );
    if !o.ranks.is_empty() {
        out.push_str("<table class=\"outside\">\n<tr><th>Rank</th><th>Run</th><th>Before the loop</th><th>First iteration</th><th>Warm-up</th><th>Steady iterations</th><th>Long iterations</th><th>After the last step</th></tr>\n");
        let run = o.run_seconds.max(1e-9);
        for x in &o.ranks {
            let segs = [
                (x.before_loop_seconds, "#BBBBBB", "before the loop"),
                (x.first_iteration_seconds, "#888888", "first iteration"),
                (x.warmup_seconds, "#666666", "warm-up"),
                (
                    x.steady_seconds,
                    palette::hex(Category::Compute),
                    "steady iterations",
                ),
                (x.long_seconds, "#000000", "long iterations"),
                (x.teardown_seconds, "#DDDDDD", "after the last step"),
            ];
            let mut b = String::from("<div class=\"bar\">");
            for (s, colour, what) in segs {
                if s > 0.0 {
                    let _ = write!(
                        b,
                        "<span style=\"width:{:.2}%;background:{colour}\" title=\"{what} {}\"></span>",
                        s / run * 100.0,
                        duration(s)
                    );
                }
            }
            b.push_str("</div>");
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{b}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td></tr>",
                x.rank,
                duration(x.before_loop_seconds),
                duration(x.first_iteration_seconds),
                duration(x.warmup_seconds),
                duration(x.steady_seconds),
                duration(x.long_seconds),
                x.long_iterations,
                duration(x.teardown_seconds)
            );
        }
        out.push_str("</table>\n<p class=\"legend\"><span><i style=\"background:#BBBBBB\"></i>before the loop</span> <span><i style=\"background:#888888\"></i>first iteration</span> <span><i style=\"background:#666666\"></i>warm-up</span> <span><i style=\"background:#0072B2\"></i>steady</span> <span><i style=\"background:#000000\"></i>long</span> <span><i style=\"background:#DDDDDD\"></i>after the last step</span></p>\n");
        let _ = writeln!(
            out,
            "<p><b>Before the first step</b> the node did: {}. <b>After the last step</b>: {}.</p>",
            activity(&o.startup_activity),
            activity(&o.teardown_activity)
        );
    }
    if !o.long_iterations.is_empty() {
        out.push_str("<h3>Long iterations (3× their rank's median or more): epoch ends, evaluation, checkpoints</h3>\n");
        slow_rows(&o.long_iterations, out);
    }
    out.push_str("</section>\n");
}

fn stragglers(r: &Report, out: &mut String) {
    let s = &r.stragglers;
    out.push_str("<section id=\"stragglers\">\n<h2>Stragglers</h2>\n");
    if s.total_windows == 0 {
        out.push_str("<p>No rank held the others up (a single rank, or none was slower by more than the noise).</p>\n</section>\n");
        return;
    }
    let _ = writeln!(out, "<p>{}</p>", escape(&s.sentence().unwrap_or_default()));
    out.push_str(
        "<table>\n<tr><th>Rank</th><th>Node</th><th>Windows</th><th>Held the others</th></tr>\n",
    );
    for x in &s.by_rank {
        let _ = writeln!(
            out,
            "<tr data-straggler=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            x.rank,
            x.rank,
            escape(&x.node),
            x.windows,
            duration(x.held_seconds)
        );
    }
    let heading = if s.persistent().is_some() {
        "Windows, most held first"
    } else {
        "The windows that held the others longest"
    };
    let _ = writeln!(out, "</table>\n<h3>{heading}</h3>\n<table>\n<tr><th>Iterations</th><th>At</th><th>Straggler</th><th>Node</th><th>Held</th><th>Others waiting</th><th>What it was doing</th></tr>");
    for w in s.shown_windows() {
        let _ = writeln!(
            out,
            "<tr data-straggler=\"{}\"><td>{}–{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            w.rank,
            w.first_iter,
            w.last_iter,
            opt(w.at_seconds, " s", 1),
            w.rank,
            escape(&w.node),
            duration(w.held_seconds),
            percent(w.others_wait_fraction),
            w.doing.as_ref().map_or("—".into(), |d| format!("{} {}", bar(d), escape(&shares(d))))
        );
    }
    out.push_str("</table>\n</section>\n");
}

/// The ranks that turned slow (a part of their iterations grew and stayed grown), when any
/// did: from when, seen when, until when, what grew and how much slower.
fn slowdowns(r: &Report, out: &mut String) {
    let found = &r.summary.slowdowns;
    if found.is_empty() {
        return;
    }
    out.push_str("<section id=\"slowdowns\">\n<h2>Ranks that turned slow</h2>\n");
    out.push_str("<p>A part of these ranks' iterations grew, against their own earlier iterations, and stayed grown (change points, found while the run went on).</p>\n");
    out.push_str("<table>\n<tr><th>Rank</th><th>Node</th><th>What grew</th><th>Slow since iteration</th><th>Seen at</th><th>Until</th><th>Before</th><th>After</th><th>Slower</th></tr>\n");
    for d in found {
        let _ = writeln!(
            out,
            "<tr data-slowdown=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}×</td></tr>",
            d.rank,
            d.rank,
            escape(&d.node),
            escape(&d.category),
            d.since_iteration,
            d.detected_iteration,
            d.until_iteration.map_or("still slow at the end".into(), |u| u.to_string()),
            duration(d.before_seconds),
            duration(d.after_seconds),
            d.factor
        );
    }
    out.push_str("</table>\n</section>\n");
}

/// An operation's bytes per iteration; `—` when none were said (DDP's all-reduce whose hook
/// never reported its buckets, a `comm` span of the program's own): 0 B would read as measured.
pub(super) fn collective_bytes(bytes: f64) -> String {
    if bytes > 0.0 {
        bytes_text(bytes)
    } else {
        "—".into()
    }
}

/// Each rank's collective and point-to-point operations, per counted iteration.
fn collectives(r: &Report, out: &mut String) {
    let ranks: Vec<_> = r
        .summary
        .ranks
        .iter()
        .filter(|x| !x.collectives.is_empty())
        .collect();
    if ranks.is_empty() {
        return;
    }
    out.push_str("<section id=\"collectives\">\n<h2>Communication operations per iteration</h2>\n<p>Each rank's collectives and point-to-point operations, most exposed first: the time the loop was held in them, and how much of it was waiting for the last peer to arrive (the rest moved data).</p>\n<table>\n<tr><th>Rank</th><th>Operation</th><th>Group</th><th>Role</th><th>Count</th><th>Bytes</th><th>Time</th><th>Waited</th></tr>\n");
    for x in ranks {
        for c in &x.collectives {
            let _ = writeln!(
                out,
                "<tr data-rank=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.1} ms</td><td>{:.1} ms</td></tr>",
                x.rank,
                x.rank,
                escape(&c.op),
                escape(c.group.as_deref().unwrap_or("—")),
                c.role.map_or("—", |r| r.short()),
                c.count_per_iteration,
                collective_bytes(c.bytes_per_iteration),
                c.seconds_per_iteration * 1e3,
                c.waited_seconds_per_iteration * 1e3,
            );
        }
    }
    out.push_str("</table>\n</section>\n");
}

fn resources(r: &Report, out: &mut String) {
    out.push_str("<section id=\"resources\">\n<h2>Resources beside the stalls</h2>\n");
    let _ = write!(out, "<table>\n<tr><th>Node</th><th>Ranks</th><th>GPUs</th><th>Clock offset</th><th>Records dropped</th><th>Markers lost</th><th>Sources down</th></tr>\n");
    for (i, n) in r.resources.iter().enumerate() {
        let _ = writeln!(
            out,
            "<tr><td><i class=\"line\" style=\"background:{}\"></i>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            charts::node_hex(i),
            escape(&n.node),
            n.ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            gpu_models(&n.gpus),
            match (n.clock_offset_ms, n.clock_uncertainty_ms) {
                (Some(o), Some(u)) => format!("{o:+.2} ± {u:.2} ms"),
                _ => "—".into(),
            },
            n.records_dropped,
            n.markers_dropped,
            if n.sources_down.is_empty() { "none".into() } else { escape(&n.sources_down.join("; ")) }
        );
    }
    out.push_str("</table>\n");
    let panels = charts::resources(r);
    if panels.is_empty() {
        out.push_str("<p class=\"empty\">No resource readings in the profile.</p>\n");
    }
    for (p, svg) in panels {
        let id = format!("chart-resource-{}", p.slug());
        out.push_str(&figure(
            &id,
            &format!("{} ({}), per node, on the timeline's axis", p.title, p.unit),
            &svg,
        ));
    }
    out.push_str("</section>\n");
}

/// Each node's TCP flows (the flow source's), largest first, and the transfers that shared a
/// link while the collectives waited; nothing without flows.
fn flows(r: &Report, out: &mut String) {
    let nodes: Vec<_> = r
        .summary
        .nodes
        .iter()
        .filter(|n| !n.flows.is_empty())
        .collect();
    if nodes.is_empty() {
        return;
    }
    out.push_str("<section id=\"flows\">\n<h2>Network flows</h2>\n");
    for s in &r.summary.shared_links {
        let _ = writeln!(
            out,
            "<p class=\"finding\">{}</p>",
            escape(&stallscope_analysis::flows::shared_link_sentence(s))
        );
    }
    out.push_str("<table>\n<tr><th>Node</th><th>Class</th><th>Local</th><th>Remote</th><th>Processes</th><th>Bytes in</th><th>Bytes out</th><th>Retransmits</th><th>RTT</th></tr>\n");
    for n in nodes {
        for f in &n.flows {
            let dash = || "—".to_string();
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&n.node),
                f.class.map_or("other", |c| c.as_str()),
                f.local.as_deref().map_or_else(|| format!("{} more", f.flows), escape),
                f.remote.as_deref().map_or_else(dash, escape),
                if f.pids.is_empty() { dash() } else { f.pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ") },
                stallscope_analysis::flows::bytes_in_words(f.bytes_in),
                stallscope_analysis::flows::bytes_in_words(f.bytes_out),
                f.retransmits,
                f.rtt_ms.map_or_else(dash, |ms| format!("{ms:.1} ms")),
            );
        }
    }
    out.push_str("</table>\n</section>\n");
}

/// A node's GPUs in a table cell: each product name with how many of it (`2 × NVIDIA H100
/// 80GB HBM3`), or a dash.
fn gpu_models(gpus: &[stallscope_analysis::frame::GpuIdentity]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for g in gpus {
        let model = g.model.as_deref().unwrap_or("unnamed GPU");
        match counts.iter_mut().find(|(m, _)| *m == model) {
            Some((_, n)) => *n += 1,
            None => counts.push((model, 1)),
        }
    }
    if counts.is_empty() {
        return "—".into();
    }
    counts
        .iter()
        .map(|(m, n)| escape(&format!("{n} × {m}")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn experiment(r: &Report, out: &mut String) {
    let Some(e) = &r.experiment else {
        return;
    };
    out.push_str("<section id=\"experiment\">\n<h2>Stalls by difference (stallscope experiment)</h2>\n<table>\n<tr><th>Category</th><th>Online (this profile's model)</th><th>By difference</th></tr>\n");
    for a in &e.agreement {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            category_label(a.category),
            percent(a.online),
            a.differential.map_or("not measured".into(), percent)
        );
    }
    out.push_str("</table>\n<table>\n<tr><th>Configuration</th><th>Processes</th><th>Mean iteration</th><th>± (s.e.)</th><th>Iterations</th></tr>\n");
    for run in &e.runs {
        let _ = writeln!(
            out,
            "<tr><td>{:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            run.config,
            run.processes,
            duration(run.timing.mean_s),
            duration(run.timing.stderr_s),
            run.timing.iterations
        );
    }
    out.push_str("</table>\n");
    if let Some(svg) = charts::what_if(e) {
        out.push_str(&figure(
            "chart-what-if",
            "DS-Analyzer's what-if: predicted samples/s against cores preparing data, a line per share of the dataset in the page cache.",
            &svg,
        ));
    }
    out.push_str("</section>\n");
}

fn advice(r: &Report, out: &mut String) {
    out.push_str("<section id=\"advice\">\n<h2>Instance choice and communication</h2>\n");
    match &r.advice {
        None => out.push_str("<p class=\"empty\">The advisor was not run for this report.</p>\n"),
        Some(AdviceSection::Unavailable(why)) => {
            let _ = writeln!(out, "<p class=\"empty\">No advice: {}</p>", escape(why));
        }
        Some(AdviceSection::Advice(a)) => {
            let _ = writeln!(
                out,
                "<p>Measured on <b>{}</b>; cheapest within the budget: <b>{}</b>. {}</p>",
                escape(&a.current),
                escape(a.cheapest_within_budget.as_deref().unwrap_or("—")),
                match a.communication_bound {
                    CommBound::Latency => "Communication is latency-bound.",
                    CommBound::Bandwidth => "Communication is bandwidth-bound.",
                    CommBound::Unknown => "How communication is bound was not measured.",
                }
            );
            out.push_str("<table>\n<tr><th>Instance</th><th>Nodes</th><th>Iteration</th><th>Samples/s</th><th>$/node-h</th><th>Pareto</th><th>Note</th></tr>\n");
            for p in a.instances.iter().take(12) {
                let _ = writeln!(
                    out,
                    "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td></tr>",
                    if p.current { " class=\"current\"" } else { "" },
                    escape(&p.instance_type),
                    p.nodes,
                    p.predicted_iteration_seconds.map_or("—".into(), duration),
                    opt(p.samples_per_second, "", 0),
                    p.price_per_node_hour,
                    if p.pareto { "yes" } else { "" },
                    escape(p.not_applicable.as_deref().unwrap_or(&p.extrapolations.join("; ")))
                );
            }
            out.push_str("</table>\n");
            for (title, list) in [("Communication", &a.communication), ("Data", &a.data)] {
                if list.is_empty() {
                    continue;
                }
                let _ = writeln!(out, "<h3>{title}</h3>\n<ul>");
                for x in list {
                    let _ = writeln!(
                        out,
                        "<li>{} — saves up to {} per iteration ({}){}</li>",
                        escape(&x.change),
                        duration(x.gain_seconds),
                        percent(x.gain_fraction),
                        if x.unless.is_empty() {
                            String::new()
                        } else {
                            format!("; not if {}", escape(&x.unless))
                        }
                    );
                }
                out.push_str("</ul>\n");
            }
            if !a.not_advised.is_empty() {
                out.push_str("<h3>Considered, not advised</h3>\n<ul>");
                for x in &a.not_advised {
                    let _ = writeln!(
                        out,
                        "<li>{} — no gain here: {}</li>",
                        escape(&x.change),
                        escape(&x.unless)
                    );
                }
                out.push_str("</ul>\n");
            }
        }
    }
    out.push_str("</section>\n");
}

fn sources(r: &Report, out: &mut String) {
    out.push_str("<section id=\"sources\">\n<h2>Profiles</h2>\n");
    if !r.problems.is_empty() {
        out.push_str("<ul class=\"problems\">\n");
        for p in &r.problems {
            let _ = writeln!(out, "<li>{}</li>", escape(p));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("<table>\n<tr><th>Path</th><th>Kind</th><th>Host</th><th>Size</th><th>Frames</th><th>Complete</th></tr>\n");
    for s in &r.sources {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1} MB</td><td>{}</td><td>{}</td></tr>",
            escape(&s.path),
            escape(&s.kind),
            escape(&s.host),
            s.bytes as f64 / 1e6,
            s.frames,
            if s.complete { "yes" } else { "no" }
        );
    }
    let _ = writeln!(
        out,
        "</table>\n<p class=\"meta\">stallscope {} · report schema stallscope.report/1 · the same figures as JSON: <code>stallscope report … -o report.json</code></p>\n</section>",
        escape(&r.stallscope_version)
    );
}

/// The report as one HTML page.
pub fn html(r: &Report) -> String {
    let mut body = String::new();
    let command = r.summary.command.join(" ");
    let _ = writeln!(
        body,
        "<header>\n<h1>stallscope report: {}</h1>\n<p class=\"meta\">{} · {} rank(s) on {} node(s) · run {}{}</p>\n</header>",
        escape(&r.name),
        escape(if command.is_empty() { "(no command recorded)" } else { &command }),
        r.breakdown.ranks.len(),
        r.resources.len().max(usize::from(!r.breakdown.ranks.is_empty())),
        duration(r.run_seconds),
        r.summary.exit_code.map_or(String::new(), |c| format!(" · exit code {c}")),
    );
    if !r.problems.is_empty() {
        body.push_str("<aside id=\"problems\" class=\"problems\"><b>Read this first:</b><ul>\n");
        for p in &r.problems {
            let _ = writeln!(body, "<li>{}</li>", escape(p));
        }
        body.push_str("</ul></aside>\n");
    }
    verdict(r, &mut body);
    super::hangs::html(r, &mut body);
    breakdown(r, &mut body);
    timeline(r, &mut body);
    outside(r, &mut body);
    stragglers(r, &mut body);
    slowdowns(r, &mut body);
    collectives(r, &mut body);
    resources(r, &mut body);
    flows(r, &mut body);
    experiment(r, &mut body);
    advice(r, &mut body);
    sources(r, &mut body);
    page(&format!("stallscope report: {}", r.name), &body)
}

/// Two runs side by side as one HTML page.
pub fn html_comparison(c: &Comparison) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<header>\n<h1>stallscope: {} before and after</h1>\n<p class=\"meta\">before: {} · after: {}</p>\n</header>\n<section id=\"verdict\" class=\"verdict\">\n<h2>What changed</h2>\n<p class=\"finding\">{}</p>\n<p>Before: {}<br>After: {}</p>\n</section>",
        escape(&c.after.name),
        escape(&c.before.sources.iter().map(|s| s.path.clone()).collect::<Vec<_>>().join(", ")),
        escape(&c.after.sources.iter().map(|s| s.path.clone()).collect::<Vec<_>>().join(", ")),
        escape(&c.sentence),
        escape(&c.before.verdict.sentence),
        escape(&c.after.verdict.sentence),
    );
    body.push_str("<section id=\"categories\">\n<h2>Per category</h2>\n");
    body.push_str(&legend());
    body.push_str(&figure(
        "chart-compare",
        "Seconds per mean counted iteration, before (pale) and after (full colour).",
        &charts::comparison(c),
    ));
    body.push_str(
        "<table>\n<tr><th>Category</th><th>Before</th><th>After</th><th>Change</th></tr>\n",
    );
    for x in &c.categories {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{} ({})</td><td>{} ({})</td><td>{:+.1} ms</td></tr>",
            category_label(x.category),
            duration(x.before_seconds),
            percent(x.before_fraction),
            duration(x.after_seconds),
            percent(x.after_fraction),
            (x.after_seconds - x.before_seconds) * 1e3
        );
    }
    body.push_str("</table>\n</section>\n<section id=\"ranks\">\n<h2>Per rank</h2>\n<table>\n<tr><th>Rank</th><th>Median before</th><th>Median after</th><th>Largest stall before</th><th>After</th></tr>\n");
    for r in &c.ranks {
        let _ = writeln!(
            body,
            "<tr data-rank=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.rank,
            r.rank,
            r.before_median_seconds.map_or("—".into(), duration),
            r.after_median_seconds.map_or("—".into(), duration),
            r.before_largest_stall.map_or("—".into(), category_label),
            r.after_largest_stall.map_or("—".into(), category_label),
        );
    }
    body.push_str(
        "</table>\n</section>\n<section id=\"timelines\">\n<h2>Iterations over each run</h2>\n",
    );
    for (label, r) in [("Before", &c.before), ("After", &c.after)] {
        if let Some(svg) = charts::timeline(r) {
            body.push_str(&figure(
                &format!("chart-timeline-{}", label.to_lowercase()),
                &format!("{label}: the mean iteration's parts over the run"),
                &svg,
            ));
        }
    }
    body.push_str("</section>\n");
    page(
        &format!("stallscope: {} before and after", c.after.name),
        &body,
    )
}
