//! The report as Markdown for tickets and pull requests: tables, and the charts as SVG files
//! written beside it (linked by name).

use std::fmt::Write;

use stallscope_analysis::category::Category;
use stallscope_analysis::report::{AdviceSection, Comparison, Report};

use super::{category_label, charts, duration, opt, percent, shares};

/// A rendered document (Markdown, HTML or JSON) and the files it links to (name, content), to write beside it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    /// The document.
    pub text: String,
    /// The SVG files it links to, by name.
    pub files: Vec<(String, String)>,
}

impl Rendered {
    /// A document with nothing beside it (the HTML page, the JSON).
    pub fn page(text: String) -> Rendered {
        Rendered {
            text,
            files: Vec::new(),
        }
    }
}

/// Text from outside the report's own words (a script's or node's name, a path, a message)
/// as Markdown prose: `&`, `<` and `>` as entities, so a name like `<img onerror=…>` reads as
/// itself instead of becoming live HTML where the Markdown is rendered.
fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

/// `s` as one code span: fenced by one more backtick than its longest run of backticks, and
/// padded when it begins or ends with one (CommonMark), so a backtick in an argument cannot
/// end the span early. Nothing inside a code span is read as HTML.
fn code(s: &str) -> String {
    let s = s.replace('\n', " ");
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') || s.is_empty() {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// A table cell: prose ([`text`]) with no pipes or line breaks.
fn cell(s: &str) -> String {
    text(s).replace('|', "\\|").replace('\n', " ")
}

fn table(out: &mut String, head: &[&str], rows: impl IntoIterator<Item = Vec<String>>) {
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    for r in rows {
        let cells: Vec<String> = r.iter().map(|c| cell(c)).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out.push('\n');
}

/// The report as Markdown; charts are named `{stem}-….svg`.
pub fn markdown(r: &Report, stem: &str) -> Rendered {
    let mut out = String::new();
    let mut files = Vec::new();
    header_and_verdict(r, &mut out);
    super::hangs::markdown(r, &mut out, text);
    breakdown(r, &mut out);
    every_iteration(r, &mut out, stem, &mut files);
    outside(r, &mut out);
    stragglers(r, &mut out);
    slowdowns(r, &mut out);
    collectives(r, &mut out);
    resources(r, &mut out, stem, &mut files);
    experiment(r, &mut out, stem, &mut files);
    advice(r, &mut out);
    profiles(r, &mut out);
    Rendered { text: out, files }
}

/// The title, the command, what to read first, the verdict and how sure it is.
fn header_and_verdict(r: &Report, out: &mut String) {
    let v = &r.verdict;
    let c = &v.confidence;
    let _ = writeln!(out, "# stallscope report: {}\n", text(&r.name));
    let _ = writeln!(
        out,
        "{} · {} rank(s) · run {}{}\n",
        code(&r.summary.command.join(" ")),
        r.breakdown.ranks.len(),
        duration(r.run_seconds),
        r.summary
            .exit_code
            .map_or(String::new(), |c| format!(" · exit code {c}"))
    );
    if !r.problems.is_empty() {
        out.push_str("> **Read this first:**\n");
        for p in &r.problems {
            let _ = writeln!(out, "> - {}", text(p));
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "## Verdict\n\n**{}**\n\n**Change:** {}\n",
        text(&v.sentence),
        text(&v.suggestion)
    );
    if v.max_gain_seconds > 0.0 {
        let _ = writeln!(
            out,
            "**Gain, at most:** {} per iteration ({:.2}× faster, from a median of {}). {}\n",
            duration(v.max_gain_seconds),
            v.max_speedup,
            duration(v.median_iteration_seconds),
            text(&v.bound_explained)
        );
    }
    let _ = writeln!(
        out,
        "**Confidence: {}.** Coverage {} marked, {} sampled; clocks {}; markers lost {}; records dropped {}; sources down {}; profile {}.\n",
        c.level,
        percent(c.coverage_marked),
        percent(c.coverage_sampled),
        c.clock_uncertainty_ms.map_or("on one node".into(), |u| format!("± {u:.2} ms")),
        c.markers_dropped,
        c.records_dropped,
        c.sources_down.len(),
        if c.complete { "complete" } else { "cut short" }
    );
    for why in &c.reasons {
        let _ = writeln!(out, "- {}", text(why));
    }
    if !c.reasons.is_empty() {
        out.push('\n');
    }
}

/// Where the iterations' time went: the job, its critical path, nodes and ranks.
fn breakdown(r: &Report, out: &mut String) {
    out.push_str("## Where the iterations' time went\n\n");
    let b = &r.breakdown;
    let mut rows = vec![
        vec![
            "job".into(),
            r.summary.job.iterations.to_string(),
            shares(&b.job),
        ],
        vec![
            "critical path".into(),
            b.critical_path_iterations.to_string(),
            shares(&b.critical_path),
        ],
    ];
    rows.extend(
        b.nodes
            .iter()
            .map(|n| vec![format!("node {}", n.node), String::new(), shares(&n.parts)]),
    );
    table(out, &["scope", "iterations", "shares"], rows);
    table(
        out,
        &[
            "rank",
            "node",
            "iterations",
            "median",
            "p95",
            "GPU busy",
            "largest stall",
            "shares",
        ],
        b.ranks.iter().map(|x| {
            vec![
                x.rank.to_string(),
                x.node.clone(),
                x.iterations.to_string(),
                duration(x.median_seconds),
                duration(x.p95_seconds),
                opt(x.gpu_busy.map(|g| g * 100.0), "%", 0),
                x.largest_stall.map_or("—".into(), category_label),
                shares(&x.parts),
            ]
        }),
    );
}

/// Every iteration over the run, as charts written beside the document.
fn every_iteration(r: &Report, out: &mut String, stem: &str, files: &mut Vec<(String, String)>) {
    out.push_str("## Every iteration over the run\n\n");
    if let Some(svg) = charts::timeline(r) {
        let name = format!("{stem}-timeline.svg");
        let _ = writeln!(
            out,
            "![The mean iteration's parts per column]({name})\n\nColours: {}.\n",
            Category::ALL
                .iter()
                .map(|c| format!("{} {}", category_label(*c), crate::palette::hex(*c)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        files.push((name, svg));
    } else {
        out.push_str("No iteration was attributed.\n\n");
    }
    if let Some(svg) = charts::iteration_time(r) {
        let name = format!("{stem}-iteration-time.svg");
        let _ = writeln!(out, "![Iteration time: median, p95, slowest]({name})\n");
        files.push((name, svg));
    }
}

/// Time outside the counted iterations: start-up, warm-up, long iterations, teardown.
fn outside(r: &Report, out: &mut String) {
    let o = &r.outside;
    let _ = writeln!(out, "## Time outside iterations\n\n{}\n", text(&o.sentence));
    table(
        out,
        &[
            "rank",
            "before the loop",
            "first iteration",
            "warm-up",
            "steady",
            "long",
            "after the last step",
        ],
        o.ranks.iter().map(|x| {
            vec![
                x.rank.to_string(),
                duration(x.before_loop_seconds),
                duration(x.first_iteration_seconds),
                duration(x.warmup_seconds),
                duration(x.steady_seconds),
                format!("{} ({})", duration(x.long_seconds), x.long_iterations),
                duration(x.teardown_seconds),
            ]
        }),
    );
    if !o.long_iterations.is_empty() {
        table(
            out,
            &[
                "rank",
                "iteration",
                "ended at",
                "took",
                "rank's median",
                "largest part",
            ],
            o.long_iterations.iter().map(|s| {
                vec![
                    s.rank.to_string(),
                    s.iter.to_string(),
                    format!("{:.2} s", s.at_seconds),
                    duration(s.seconds),
                    duration(s.rank_median_seconds),
                    category_label(s.largest),
                ]
            }),
        );
    }
}

/// Each rank's collective and point-to-point operations, per counted iteration.
fn collectives(r: &Report, out: &mut String) {
    let rows: Vec<Vec<String>> = r
        .summary
        .ranks
        .iter()
        .flat_map(|x| {
            x.collectives.iter().map(move |c| {
                vec![
                    x.rank.to_string(),
                    c.op.clone(),
                    c.group.clone().unwrap_or_else(|| "—".into()),
                    c.role.map_or("—", |r| r.short()).to_string(),
                    format!("{:.1}", c.count_per_iteration),
                    super::html::collective_bytes(c.bytes_per_iteration),
                    format!("{:.1} ms", c.seconds_per_iteration * 1e3),
                    format!("{:.1} ms", c.waited_seconds_per_iteration * 1e3),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    out.push_str("## Communication operations per iteration\n\n");
    table(
        out,
        &[
            "rank",
            "operation",
            "group",
            "role",
            "count",
            "bytes",
            "time",
            "waited",
        ],
        rows,
    );
}

/// The straggler windows: the verdict, the ranks, a few windows or all of them.
fn stragglers(r: &Report, out: &mut String) {
    out.push_str("## Stragglers\n\n");
    if r.stragglers.total_windows == 0 {
        out.push_str("No rank held the others up.\n\n");
    } else {
        let _ = writeln!(
            out,
            "{}\n",
            text(&r.stragglers.sentence().unwrap_or_default())
        );
        table(
            out,
            &["rank", "node", "windows", "held the others"],
            r.stragglers.by_rank.iter().map(|x| {
                vec![
                    x.rank.to_string(),
                    x.node.clone(),
                    x.windows.to_string(),
                    duration(x.held_seconds),
                ]
            }),
        );
        out.push_str("The windows that held the others longest:\n\n");
        table(
            out,
            &[
                "iterations",
                "straggler",
                "node",
                "held",
                "others waiting",
                "what it was doing",
            ],
            r.stragglers.shown_windows().iter().take(10).map(|w| {
                vec![
                    format!("{}–{}", w.first_iter, w.last_iter),
                    w.rank.to_string(),
                    w.node.clone(),
                    duration(w.held_seconds),
                    percent(w.others_wait_fraction),
                    w.doing.as_ref().map_or("—".into(), shares),
                ]
            }),
        );
    }
}

/// The ranks that turned slow, when any did.
fn slowdowns(r: &Report, out: &mut String) {
    let found = &r.summary.slowdowns;
    if found.is_empty() {
        return;
    }
    out.push_str("## Ranks that turned slow\n\n");
    out.push_str("A part of these ranks' iterations grew, against their own earlier iterations, and stayed grown.\n\n");
    table(
        out,
        &[
            "rank",
            "node",
            "what grew",
            "slow since",
            "seen at",
            "until",
            "before",
            "after",
            "slower",
        ],
        found.iter().map(|d| {
            vec![
                d.rank.to_string(),
                d.node.clone(),
                d.category.clone(),
                d.since_iteration.to_string(),
                d.detected_iteration.to_string(),
                d.until_iteration
                    .map_or("still slow at the end".into(), |u| u.to_string()),
                duration(d.before_seconds),
                duration(d.after_seconds),
                format!("{:.2}×", d.factor),
            ]
        }),
    );
}

/// The node resources, as charts written beside the document.
fn resources(r: &Report, out: &mut String, stem: &str, files: &mut Vec<(String, String)>) {
    out.push_str("## Resources\n\n");
    for (p, svg) in charts::resources(r) {
        let name = format!("{stem}-{}.svg", p.slug());
        let _ = writeln!(out, "![{} ({})]({name})\n", p.title, p.unit);
        files.push((name, svg));
    }
    if r.resources.iter().all(|n| n.columns.is_empty()) {
        out.push_str("No resource readings in the profile.\n\n");
    }
}

/// Stalls by difference, for an experiment's report.
fn experiment(r: &Report, out: &mut String, stem: &str, files: &mut Vec<(String, String)>) {
    if let Some(e) = &r.experiment {
        out.push_str("## Stalls by difference\n\n");
        table(
            out,
            &["category", "online", "by difference"],
            e.agreement.iter().map(|a| {
                vec![
                    category_label(a.category),
                    percent(a.online),
                    a.differential.map_or("not measured".into(), percent),
                ]
            }),
        );
        if let Some(svg) = charts::what_if(e) {
            let name = format!("{stem}-what-if.svg");
            let _ = writeln!(out, "![DS-Analyzer what-if]({name})\n");
            files.push((name, svg));
        }
    }
}

/// The advisor's instances and communication advice.
fn advice(r: &Report, out: &mut String) {
    out.push_str("## Instance choice and communication\n\n");
    match &r.advice {
        None => out.push_str("The advisor was not run for this report.\n\n"),
        Some(AdviceSection::Unavailable(why)) => {
            let _ = writeln!(out, "No advice: {}\n", text(why));
        }
        Some(AdviceSection::Advice(a)) => {
            table(
                out,
                &["instance", "nodes", "iteration", "$/node-h", "pareto"],
                a.instances.iter().take(12).map(|p| {
                    vec![
                        p.instance_type.clone(),
                        p.nodes.to_string(),
                        p.predicted_iteration_seconds.map_or("—".into(), duration),
                        format!("{:.2}", p.price_per_node_hour),
                        if p.pareto {
                            "yes".into()
                        } else {
                            String::new()
                        },
                    ]
                }),
            );
            for x in a.communication.iter().chain(&a.data) {
                let _ = writeln!(
                    out,
                    "- {} (up to {} per iteration)",
                    text(&x.change),
                    duration(x.gain_seconds)
                );
            }
            for x in &a.not_advised {
                let _ = writeln!(
                    out,
                    "- considered, not advised: {} ({})",
                    text(&x.change),
                    text(&x.unless)
                );
            }
            out.push('\n');
        }
    }
}

/// The profiles read.
fn profiles(r: &Report, out: &mut String) {
    out.push_str("## Profiles\n\n");
    table(
        out,
        &["path", "kind", "size", "frames", "complete"],
        r.sources.iter().map(|s| {
            vec![
                s.path.clone(),
                s.kind.clone(),
                format!("{:.1} MB", s.bytes as f64 / 1e6),
                s.frames.to_string(),
                if s.complete {
                    "yes".into()
                } else {
                    "no".into()
                },
            ]
        }),
    );
}

/// Two runs side by side as Markdown.
pub fn markdown_comparison(c: &Comparison, stem: &str) -> Rendered {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# stallscope: {} before and after\n\n**{}**\n",
        text(&c.after.name),
        text(&c.sentence)
    );
    let name = format!("{stem}-compare.svg");
    let _ = writeln!(out, "![Per category, before and after]({name})\n");
    table(
        &mut out,
        &["category", "before", "after", "change"],
        c.categories.iter().map(|x| {
            vec![
                category_label(x.category),
                format!(
                    "{} ({})",
                    duration(x.before_seconds),
                    percent(x.before_fraction)
                ),
                format!(
                    "{} ({})",
                    duration(x.after_seconds),
                    percent(x.after_fraction)
                ),
                format!("{:+.1} ms", (x.after_seconds - x.before_seconds) * 1e3),
            ]
        }),
    );
    table(
        &mut out,
        &["rank", "median before", "median after"],
        c.ranks.iter().map(|r| {
            vec![
                r.rank.to_string(),
                r.before_median_seconds.map_or("—".into(), duration),
                r.after_median_seconds.map_or("—".into(), duration),
            ]
        }),
    );
    Rendered {
        text: out,
        files: vec![(name, charts::comparison(c))],
    }
}
