//! The report's hang section (issue 28), the same facts in HTML and Markdown: for every hang
//! declared, when and for how long no rank finished an iteration, the collective entered last,
//! the ranks that never arrived and those waiting in it (as `RANK@NODE` across nodes), where
//! each rank stood (inside a collective, in its data loading, or elsewhere) and every rank's
//! Python stacks. Absent when the run had no hang.

use std::fmt::Write;

use stallscope_analysis::hang::{HangReport, RankAtHang};
use stallscope_analysis::report::Report;

use super::{duration, escape};

/// `RANK@NODE`, or the rank alone.
fn named(h: &HangReport, rank: u32) -> String {
    match h
        .ranks
        .iter()
        .find(|r| r.rank == rank)
        .and_then(|r| r.node.as_ref())
    {
        Some(node) => format!("{rank}@{node}"),
        None => rank.to_string(),
    }
}

fn list(h: &HangReport, ranks: &[u32]) -> String {
    if ranks.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = ranks.iter().map(|r| named(h, *r)).collect();
    names.join(", ")
}

/// Where a rank stood, in words.
fn place(r: &RankAtHang) -> String {
    match (&r.collective, r.state.as_str()) {
        (Some(c), _) => format!("inside {}", c.describe()),
        (None, "data_loading") => "in data loading (waiting for a batch)".into(),
        (None, "no_answer") => "unknown (its node's agent did not answer)".into(),
        (None, "finishing") => "finishing (it destroyed its process group, or exits)".into(),
        _ => "in compute or code the hook does not mark".into(),
    }
}

/// One hang in one sentence.
fn sentence(h: &HangReport) -> String {
    let mut s = format!(
        "At {}, no rank had finished an iteration for {}",
        duration(h.at_seconds),
        duration(h.stalled_seconds)
    );
    if let Some(i) = h.last_iteration {
        s += &format!(" (the last: iteration {i})");
    }
    match &h.collective {
        Some(c) if !h.missing_ranks.is_empty() => {
            s += &format!(
                "; {} never arrived at {} while {} waited in it",
                list(h, &h.missing_ranks),
                c.describe(),
                list(h, &h.waiting_ranks)
            )
        }
        Some(c) => s += &format!("; every rank waited in {}", c.describe()),
        None => s += "; no rank was inside a collective",
    }
    s += &match h.resumed_after_seconds {
        Some(after) => format!(". Iterations resumed {} later.", duration(after)),
        None => ". It lasted to the end of the profile.".into(),
    };
    s
}

/// The section in HTML (nothing without a hang).
pub fn html(r: &Report, out: &mut String) {
    let hangs = &r.summary.hangs;
    if hangs.is_empty() {
        return;
    }
    out.push_str("<section id=\"hangs\">\n<h2>Hangs</h2>\n");
    for h in hangs {
        let missing: Vec<String> = h.missing_ranks.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "<article class=\"hang\" data-missing=\"{}\">\n<p>{}</p>",
            missing.join(","),
            escape(&sentence(h))
        );
        out.push_str("<table>\n<tr><th>Rank</th><th>Node</th><th>Where it was</th><th>Last iteration</th><th>Stacks</th></tr>\n");
        for rank in &h.ranks {
            let stacks = if h.stacks.contains_key(&rank.rank.to_string()) {
                "below"
            } else if rank.has_hook {
                "did not come"
            } else {
                "no stallscope hook"
            };
            let _ = writeln!(
                out,
                "<tr data-rank=\"{}\" data-state=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                rank.rank,
                escape(&rank.state),
                rank.rank,
                escape(rank.node.as_deref().unwrap_or("—")),
                escape(&place(rank)),
                rank.last_iteration.map_or("—".into(), |i| i.to_string()),
                stacks
            );
        }
        out.push_str("</table>\n");
        for node in &h.unanswered_nodes {
            let _ = writeln!(
                out,
                "<p>Node {}'s agent did not answer: its ranks' places and stacks are unknown.</p>",
                escape(node)
            );
        }
        for (rank, text) in &h.stacks {
            let who = rank.parse().map_or_else(|_| rank.clone(), |r| named(h, r));
            let _ = writeln!(
                out,
                "<details open data-stacks=\"{}\"><summary>Rank {}'s Python stacks</summary>\n<pre>{}</pre>\n</details>",
                escape(rank),
                escape(&who),
                escape(text)
            );
        }
        out.push_str("</article>\n");
    }
    out.push_str("</section>\n");
}

/// The section in Markdown (nothing without a hang). Names and stacks are the program's:
/// prose is escaped by `text`, stacks go in fenced blocks.
pub fn markdown(r: &Report, out: &mut String, text: fn(&str) -> String) {
    let hangs = &r.summary.hangs;
    if hangs.is_empty() {
        return;
    }
    out.push_str("## Hangs\n\n");
    for h in hangs {
        let _ = writeln!(out, "{}\n", text(&sentence(h)));
        out.push_str("| rank | node | where it was | last iteration |\n|---|---|---|---|\n");
        for rank in &h.ranks {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                rank.rank,
                text(rank.node.as_deref().unwrap_or("—")).replace('|', "\\|"),
                text(&place(rank)).replace('|', "\\|"),
                rank.last_iteration.map_or("—".into(), |i| i.to_string())
            );
        }
        out.push('\n');
        for node in &h.unanswered_nodes {
            let _ = writeln!(
                out,
                "Node {}'s agent did not answer: its ranks' places and stacks are unknown.\n",
                text(node)
            );
        }
        for (rank, stack) in &h.stacks {
            let who = rank.parse().map_or_else(|_| rank.clone(), |r| named(h, r));
            let longest = stack.split(|c| c != '`').map(str::len).max().unwrap_or(0);
            let fence = "`".repeat(longest.max(2) + 1);
            let _ = writeln!(
                out,
                "Rank {}'s Python stacks:\n\n{fence}text\n{}\n{fence}\n",
                text(&who),
                stack.trim_end()
            );
        }
    }
}
