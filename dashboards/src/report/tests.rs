//! The report's renderers on constructed profiles: Markdown and JSON as snapshots, the HTML
//! checked for what a reader needs (Chromium checks it where people see it, in
//! profiler/tests/report.rs).

use stallscope_analysis::report::sample::two_rank_profile;
use stallscope_analysis::report::{compare, Report, ReportBuilder};

use super::*;

fn report(cut: bool) -> Report {
    let mut b = ReportBuilder::new("");
    for f in two_rank_profile(cut) {
        b.ingest(&f);
    }
    let mut r = b.finish();
    r.stallscope_version = "test".into();
    r
}

#[test]
fn markdown_of_a_two_rank_run() {
    let md = markdown(&report(false), "report");
    insta::assert_snapshot!(md.text);
    let names: Vec<&str> = md.files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["report-timeline.svg", "report-iteration-time.svg"]);
    assert!(md.files.iter().all(|(_, svg)| svg.starts_with("<svg")));
}

#[test]
fn json_of_a_cut_run() {
    let r = report(true);
    let json = json(&r);
    let back: Report = serde_json::from_str(&json).expect("the JSON reads back");
    assert_eq!(
        super::json(&back),
        json,
        "the JSON reads back to the same report"
    );
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let summary = serde_json::json!({
        "schema": v["schema"],
        "problems": v["problems"],
        "verdict": v["verdict"],
        "outside": v["outside"]["ranks"],
        "columns": v["timeline"]["columns"].as_array().map(Vec::len),
    });
    insta::assert_snapshot!(serde_json::to_string_pretty(&summary).expect("JSON"));
}

#[test]
fn the_html_holds_the_verdict_every_rank_and_every_chart_and_nothing_external() {
    let r = report(false);
    let page = html(&r);
    assert!(page.contains(&escape(&r.verdict.sentence)));
    for rank in &r.breakdown.ranks {
        assert!(page.contains(&format!("data-rank=\"{}\"", rank.rank)));
    }
    for id in ["chart-timeline", "chart-iteration-time"] {
        assert!(page.contains(&format!("id=\"{id}\"")), "{id}");
    }
    assert!(!page.contains("<script"), "no script");
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
    assert!(page.contains(palette::hex(Category::Compute)));
}

#[test]
fn an_empty_profile_renders_a_page_that_says_so() {
    let r = ReportBuilder::new("").finish();
    let page = html(&r);
    assert!(page.contains("holds no frames"), "{page}");
    assert!(page.contains("nothing to chart"));
    let md = markdown(&r, "x");
    assert!(md.text.contains("holds no frames"));
    assert!(md.files.is_empty());
}

#[test]
fn a_comparison_shows_both_runs() {
    let c = compare(report(false), report(true));
    let page = html_comparison(&c);
    assert!(page.contains("chart-compare"));
    assert!(page.contains("data-rank=\"1\""));
    let md = markdown_comparison(&c, "diff");
    assert!(md.text.contains("| compute |"), "{}", md.text);
}

use crate::palette;
use stallscope_analysis::category::Category;

#[test]
fn the_resources_name_each_nodes_gpus() {
    use stallscope_analysis::frame::Frame;
    use stallscope_analysis::series::{SeriesDecl, SeriesId, SeriesKind};
    let mut frames = two_rank_profile(false);
    let gpus = (0..2).map(|gpu| {
        Frame::Series(SeriesDecl {
            id: SeriesId(900 + gpu),
            name: "gpu.util_pct".into(),
            unit: "%".into(),
            kind: SeriesKind::Gauge,
            labels: vec![
                ("gpu".into(), gpu.to_string()),
                ("uuid".into(), format!("GPU-{gpu}")),
                ("model".into(), "NVIDIA H100 80GB HBM3".into()),
            ],
        })
    });
    frames.splice(1..1, gpus);
    let mut b = ReportBuilder::new("");
    for f in &frames {
        b.ingest(f);
    }
    let r = b.finish();
    assert_eq!(r.resources.len(), 1, "{:?}", r.resources);
    assert_eq!(r.resources[0].gpus.len(), 2);
    assert!(html(&r).contains("<td>2 × NVIDIA H100 80GB HBM3</td>"));
    assert!(
        html(&report(false)).contains("<td>—</td><td>"),
        "no GPU seen: a dash"
    );
}

/// Issue 30, item 8: a script named like an HTML tag stays text, and a backtick in an
/// argument stays inside the command's code span.
#[test]
fn markdown_keeps_names_and_arguments_from_outside_as_text() {
    let mut r = report(false);
    r.name = "<img src=x onerror=alert(1)>.py".into();
    r.summary.command = vec![
        "python3".into(),
        "<img src=x onerror=alert(1)>.py".into(),
        "--tag=`rm -rf`".into(),
    ];
    r.problems = vec!["node <b>a</b> & b".into()];
    let md = markdown(&r, "x").text;
    // One code span around the whole command, fenced by two backticks (the argument has a
    // run of one) and padded (it ends with one); inside a code span nothing is HTML.
    let command = "`` python3 <img src=x onerror=alert(1)>.py --tag=`rm -rf` ``";
    let line = md.lines().find(|l| l.contains("rank(s)")).unwrap();
    assert!(line.starts_with(command), "{line}");
    let outside_code = md.replace(command, "");
    assert!(!outside_code.contains("<img"), "{md}");
    assert!(!outside_code.contains("<b>"), "{md}");
    assert!(md.contains("# stallscope report: &lt;img src=x onerror=alert(1)&gt;.py"));
    assert!(md.contains("node &lt;b&gt;a&lt;/b&gt; &amp; b"), "{md}");
}

/// Issue 29: a node with RDMA ports gets an RDMA chart beside the NIC's (1 GB/s received
/// throughout); a run without has none.
#[test]
fn an_rdma_node_gets_an_rdma_chart_beside_the_nic() {
    use stallscope_analysis::frame::Frame;
    use stallscope_analysis::series::{names, SeriesDecl, SeriesId, SeriesKind};
    let build = |frames: &[Frame]| {
        let mut b = ReportBuilder::new("");
        for f in frames {
            b.ingest(f);
        }
        b.finish()
    };
    let titles = |r: &stallscope_analysis::report::Report| -> Vec<&str> {
        crate::report::charts::resources(r)
            .iter()
            .map(|(p, _)| p.title)
            .collect()
    };
    let plain = two_rank_profile(false);
    assert!(!titles(&build(&plain)).contains(&"RDMA"));
    let rdma = SeriesId(950);
    let mut frames = plain.clone();
    frames.insert(
        1,
        Frame::Series(SeriesDecl {
            id: rdma,
            name: names::RDMA_RX_BYTES.into(),
            unit: "bytes".into(),
            kind: SeriesKind::Counter,
            labels: vec![
                ("device".into(), "mlx5_0".into()),
                ("port".into(), "1".into()),
            ],
        }),
    );
    for f in &mut frames {
        if let Frame::Samples(batch) = f {
            batch.values.push((rdma, batch.t_ns));
        }
    }
    let r = build(&frames);
    let columns = &r.resources[0].columns;
    let mid = &columns[columns.len() / 2];
    let mb = mid.rdma_mb_per_s.expect("RDMA read");
    assert!((mb - 1000.0).abs() < 1.0, "{mb}");
    // The constructed profile reads the CPU only: the RDMA chart is its one resource chart.
    assert_eq!(titles(&r), ["RDMA"]);
    let order: Vec<&str> = crate::report::charts::PANELS
        .iter()
        .map(|p| p.title)
        .collect();
    let nic = order.iter().position(|t| *t == "NIC").unwrap();
    assert_eq!(order[nic + 1], "RDMA", "beside the NIC: {order:?}");
}

/// Issue 29: retransmissions over time. A flow that retransmits 5 segments between each of the
/// node's flow frames draws a TCP retransmissions line on the node's own axis, at 5 segments
/// per interval; a run without flows has no such chart.
#[test]
fn retransmissions_over_time_come_from_the_flow_frames() {
    use stallscope_analysis::flows::{FlowClass, FlowSample, NodeFlows};
    use stallscope_analysis::frame::Frame;
    let build = |frames: &[Frame]| {
        let mut b = ReportBuilder::new("");
        for f in frames {
            b.ingest(f);
        }
        b.finish()
    };
    let titles = |r: &stallscope_analysis::report::Report| -> Vec<&str> {
        crate::report::charts::resources(r)
            .iter()
            .map(|(p, _)| p.title)
            .collect()
    };
    let plain = two_rank_profile(false);
    let panel = "TCP retransmissions";
    assert!(!titles(&build(&plain)).contains(&panel));
    let mut frames = Vec::new();
    let mut since = None;
    let mut retransmits = 0;
    for f in &plain {
        frames.push(f.clone());
        if let Frame::Samples(batch) = f {
            let since_ns = since.unwrap_or(batch.t_ns);
            frames.push(Frame::NodeFlows(NodeFlows {
                node: String::new(),
                t_ns: batch.t_ns,
                since_ns,
                flows: vec![FlowSample {
                    class: Some(FlowClass::Collective),
                    local: "10.0.0.1:40000".into(),
                    remote: "10.0.0.2:29500".into(),
                    bytes_in: retransmits * 1000,
                    retransmits,
                    ..FlowSample::default()
                }],
            }));
            if let Some(prev) = since {
                assert_eq!(batch.t_ns - prev, plain_interval(&plain));
            }
            since = Some(batch.t_ns);
            retransmits += 5;
        }
    }
    let r = build(&frames);
    assert!(titles(&r).contains(&panel), "{:?}", titles(&r));
    assert_eq!(
        r.resources.len(),
        1,
        "the flows are the node's own: {:?}",
        r.resources
    );
    let columns = &r.resources[0].columns;
    let mid = &columns[columns.len() / 2];
    let per_s = mid.tcp_retransmits_per_s.expect("retransmissions read");
    let expected = 5.0 / (plain_interval(&plain) as f64 / 1e9);
    assert!(
        (per_s - expected).abs() < 0.01 * expected,
        "{per_s} against {expected}"
    );
}

/// ns between the sample batches of a constructed profile.
fn plain_interval(frames: &[stallscope_analysis::frame::Frame]) -> u64 {
    let t: Vec<u64> = frames
        .iter()
        .filter_map(|f| match f {
            stallscope_analysis::frame::Frame::Samples(b) => Some(b.t_ns),
            _ => None,
        })
        .collect();
    t[1] - t[0]
}

/// Issue 29: the report lists each node's flows by class, and the transfer that shared the
/// link while the collectives waited.
#[test]
fn the_report_lists_flows_and_the_transfer_that_shared_the_link() {
    use stallscope_analysis::flows::{FlowClass, FlowSummary, SharedLink};
    let mut r = report(false);
    assert!(!html(&r).contains("id=\"flows\""), "no flows, no section");
    let flow = |class, remote: &str, bytes_out, pids: Vec<u32>| FlowSummary {
        class: Some(class),
        local: Some("10.0.0.1:40000".into()),
        remote: Some(remote.into()),
        pids,
        bytes_out,
        retransmits: 7,
        rtt_ms: Some(2.5),
        flows: 1,
        ..Default::default()
    };
    r.summary.nodes = vec![stallscope_analysis::summary::NodeSummary {
        node: "node-a".into(),
        flows: vec![
            flow(FlowClass::Other, "10.0.0.2:5201", 25_000_000, vec![]),
            flow(
                FlowClass::Collective,
                "10.0.0.2:39000",
                9_000_000,
                vec![4242],
            ),
        ],
        ..Default::default()
    }];
    r.summary.shared_links = vec![SharedLink {
        node: "node-a".into(),
        local: "10.0.0.1:40000".into(),
        remote: "10.0.0.2:5201".into(),
        bytes: 25_000_000,
        retransmits: 7,
        iterations: (12, 30),
    }];
    let page = html(&r);
    let section = &page[page.find("id=\"flows\"").expect("a flows section")..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("transfer of 25 MB"), "{section}");
    assert!(section.contains("iterations 12–30"), "{section}");
    assert!(section.contains("<td>other</td><td>10.0.0.1:40000</td><td>10.0.0.2:5201</td><td>—</td><td>0 B</td><td>25 MB</td><td>7</td><td>2.5 ms</td>"), "{section}");
    assert!(
        section.contains("<td>collective</td>") && section.contains("<td>4242</td>"),
        "{section}"
    );
}

#[test]
fn a_rank_that_turned_slow_has_its_section_in_html_and_markdown() {
    let mut r = report(false);
    assert!(
        !html(&r).contains("Ranks that turned slow"),
        "none: no section"
    );
    r.summary.slowdowns = vec![stallscope_analysis::slowdown::Slowdown {
        rank: 1,
        node: "vm".into(),
        category: "data_prep".into(),
        since_iteration: 30,
        detected_iteration: 33,
        until_iteration: None,
        factor: 1.54,
        before_seconds: 0.0066,
        after_seconds: 0.294,
        pid: 7,
    }];
    let page = html(&r);
    assert!(page.contains("<h2>Ranks that turned slow</h2>"), "{page}");
    assert!(
        page.contains("<tr data-slowdown=\"1\"><td>1</td><td>vm</td><td>data_prep</td><td>30</td><td>33</td><td>still slow at the end</td><td>6.6 ms</td><td>294.0 ms</td><td>1.54×</td></tr>"),
        "{page}"
    );
    let md = markdown(&r, "report").text;
    assert!(md.contains("## Ranks that turned slow"), "{md}");
    assert!(
        md.contains(
            "| 1 | vm | data_prep | 30 | 33 | still slow at the end | 6.6 ms | 294.0 ms | 1.54× |"
        ),
        "{md}"
    );
}

/// Issue 28: a hang gets a section in both renderings: who never arrived where, who waited,
/// where each rank stood, and each rank's stacks (escaped, as the program's text).
#[test]
fn a_hang_has_a_section_with_the_missing_rank_and_its_stacks() {
    use stallscope_analysis::hang::{Collective, HangReport, RankAtHang};
    let mut r = report(false);
    assert!(
        !super::html::html(&r).contains("id=\"hangs\""),
        "no hang, no section"
    );
    let all_reduce = Collective {
        op: "all_reduce".into(),
        group: 0,
        seq: 12,
    };
    let rank = |rank: u32, state: &str, collective: Option<Collective>| RankAtHang {
        rank,
        pid: 10 + rank,
        last_iteration: Some(11),
        state: state.into(),
        collective,
        has_hook: true,
        node: Some(format!("node-{rank}")),
    };
    r.summary.hangs.push(HangReport {
        at_seconds: 70.0,
        stalled_seconds: 61.0,
        last_iteration: Some(11),
        collective: Some(all_reduce.clone()),
        waiting_ranks: vec![0],
        missing_ranks: vec![1],
        ranks: vec![
            rank(0, "collective", Some(all_reduce)),
            rank(1, "data_loading", None),
        ],
        stacks: [(
            "1".to_string(),
            "  File \"train.py\", line 9 in __getitem__ <lambda>\n".to_string(),
        )]
        .into(),
        resumed_after_seconds: Some(4.0),
        ..HangReport::default()
    });
    let html = super::html::html(&r);
    let section = &html[html.find("<section id=\"hangs\">").expect("a hang section")..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("data-missing=\"1\""), "{section}");
    assert!(
        section.contains(
            "1@node-1 never arrived at all_reduce #12 of group 0 while 0@node-0 waited in it"
        ),
        "{section}"
    );
    assert!(
        section.contains("data-rank=\"1\" data-state=\"data_loading\""),
        "{section}"
    );
    assert!(
        section.contains("in __getitem__ &lt;lambda&gt;"),
        "{section}"
    );
    assert!(section.contains("Iterations resumed"), "{section}");
    let md = super::markdown::markdown(&r, "r").text;
    let md = &md[md.find("## Hangs").expect("a hang section")..];
    assert!(
        md.contains("| 1 | node-1 | in data loading (waiting for a batch) | 11 |"),
        "{md}"
    );
    assert!(
        md.contains("```text\n  File \"train.py\", line 9 in __getitem__ <lambda>\n```"),
        "{md}"
    );
}

#[test]
fn each_ranks_collectives_are_a_table_in_html_and_markdown() {
    use stallscope_analysis::collectives::{Collective, Role};
    let mut r = report(false);
    for x in &mut r.summary.ranks {
        x.collectives.clear();
    }
    assert!(!html(&r).contains("id=\"collectives\""), "none: no section");
    r.summary.ranks[1].collectives = vec![Collective {
        op: "batch_isend_irecv".into(),
        group: Some("0".into()),
        role: Some(Role::Pipeline),
        count_per_iteration: 8.0,
        bytes_per_iteration: 131_072.0,
        seconds_per_iteration: 0.5933,
        waited_seconds_per_iteration: 0.5919,
    }];
    let rank = r.summary.ranks[1].rank;
    let page = html(&r);
    let row = format!("<tr data-rank=\"{rank}\"><td>{rank}</td><td>batch_isend_irecv</td><td>0</td><td>pipeline</td><td>8.0</td><td>131.1 kB</td><td>593.3 ms</td><td>591.9 ms</td></tr>");
    assert!(page.contains("id=\"collectives\""), "{page}");
    assert!(page.contains(&row), "{row}");
    let md = markdown(&r, "report").text;
    let row = format!(
        "| {rank} | batch_isend_irecv | 0 | pipeline | 8.0 | 131.1 kB | 593.3 ms | 591.9 ms |"
    );
    assert!(md.contains(&row), "{row} in\n{md}");
    // Bytes never said are unknown, not 0 B.
    r.summary.ranks[1].collectives[0].bytes_per_iteration = 0.0;
    assert!(html(&r).contains("<td>8.0</td><td>—</td>"));
    assert!(markdown(&r, "report").text.contains("| 8.0 | — |"));
}
