//! Every screen drawn on ratatui's TestBackend from models built here: a 3-node job with a
//! straggler, a GPU job with figures as the scripted GPU gives them, and a job with a source
//! down; keys driven through [`App::on_key`].

use std::collections::VecDeque;

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::crossnode::StragglerWindow;
use stallscope_analysis::figures::{Categories, CoverageShare, Figures, RankSummary};
use stallscope_analysis::finding::{find, FindingInput};
use stallscope_analysis::gpu_usage::RankGpu;
use stallscope_analysis::slowdown::Slowdown;
use stallscope_analysis::summary::{SourceDown, Summary};
use stallscope_analysis::view::{
    IterationParts, JobView, NodeResources, NodeView, RankView, RESOURCE_HISTORY,
};

use super::*;
use crate::palette;

const MS: u64 = 1_000_000;

/// One rank of a test model: ms per iteration in each category.
struct Spec {
    rank: u32,
    node: &'static str,
    ms: [(Category, u64); 3],
}

fn split_of(ms: &[(Category, u64)], jitter_ms: u64) -> Split {
    let mut s = Split::default();
    for (c, v) in ms {
        s.add(*c, v * MS);
    }
    s.add(Category::Compute, jitter_ms * MS);
    s
}

fn figures(parts: &[IterationParts]) -> Figures {
    let mut total = Split::default();
    let mut walls: Vec<u64> = parts.iter().map(|p| p.wall_ns()).collect();
    for p in parts {
        total.add_split(&p.split);
    }
    walls.sort_unstable();
    Figures {
        iterations: parts.len() as u64,
        median_iteration_seconds: walls.get(walls.len() / 2).copied().unwrap_or(0) as f64 / 1e9,
        wall_seconds: total.total() as f64 / 1e9,
        categories: Categories::from_split(&total),
        coverage: CoverageShare {
            marked: 0.97,
            sampled: 1.0,
        },
    }
}

/// A job of `specs` after `iters` iterations per rank (5 of them warm-up).
fn model(name: &str, specs: &[Spec], iters: u64) -> JobView {
    let mut v = JobView::new(name);
    let mut job_parts = Vec::new();
    let mut rank_summaries = Vec::new();
    for s in specs {
        let mut end = 0;
        let recent: VecDeque<IterationParts> = (0..iters)
            .map(|i| {
                let split = split_of(&s.ms, (i * 7 + u64::from(s.rank)) % 5);
                end += split.total();
                IterationParts {
                    iter: i,
                    end_ns: end,
                    split,
                    gpu_busy_ppm: None,
                }
            })
            .collect();
        let counted: Vec<IterationParts> = recent.iter().skip(5).copied().collect();
        let fig = figures(&counted);
        job_parts.extend(counted.iter().copied());
        rank_summaries.push(RankSummary {
            rank: s.rank,
            pid: 4000 + s.rank,
            node: Some(s.node.into()),
            figures: fig.clone(),
            gpu: None,
            collectives: Vec::new(),
        });
        v.ranks.insert(
            s.rank,
            RankView {
                rank: s.rank,
                node: s.node.into(),
                pid: 4000 + s.rank,
                p95_iteration_seconds: fig.median_iteration_seconds * 1.08,
                figures: fig,
                recent,
                ..RankView::default()
            },
        );
        let n = v.nodes.entry(s.node.into()).or_insert_with(|| NodeView {
            node: s.node.into(),
            ..NodeView::default()
        });
        n.ranks.push(s.rank);
    }
    let job = figures(&job_parts);
    v.summary = Summary {
        schema: "stallscope.summary/1".into(),
        command: vec!["python3".into(), format!("{name}.py")],
        warmup_iterations: 5,
        wall_seconds: 42.5,
        finding: find(&FindingInput {
            job: &job,
            ranks: &rank_summaries,
            loader_workers: Some(2),
            cpus: 16,
            parallelism: &Default::default(),
        }),
        job,
        ranks: rank_summaries,
        ..Summary::default()
    };
    v.attributed = iters * specs.len() as u64;
    v.batch_size = Some(64);
    v.samples_per_second = Some(4_321.0);
    for (i, n) in v.nodes.values_mut().enumerate() {
        for t in 0..RESOURCE_HISTORY as u64 {
            let wave = ((t + i as u64 * 13) % 20) as f64 / 20.0;
            push_reading(n, t, wave);
        }
        n.clock_offset_ns = Some(i as i64 * 1_250_000 - 400_000);
        n.clock_uncertainty_ns = Some(80_000);
    }
    v
}

fn push_reading(n: &mut NodeView, t: u64, wave: f64) {
    let r = NodeResources {
        t_ns: t * 1_000 * MS,
        dur_ns: 1_000 * MS,
        cpu_busy_cores: Some(3.0 + 2.0 * wave),
        runq_delay: Some(0.05 * wave),
        nic_rx_bytes_per_s: Some(110e6 * wave),
        nic_tx_bytes_per_s: Some(95e6 * wave),
        disk_read_bytes_per_s: Some(40e6 * (1.0 - wave)),
        disk_write_bytes_per_s: Some(0.0),
        psi_cpu: Some(0.12 * wave),
        psi_io: Some(0.03),
        psi_memory: Some(0.0),
        gpu_busy: None,
        pcie_rx_bytes_per_s: None,
        pcie_tx_bytes_per_s: None,
        nvlink_rx_bytes_per_s: None,
        nvlink_tx_bytes_per_s: None,
        rdma_rx_bytes_per_s: None,
        rdma_tx_bytes_per_s: None,
    };
    n.resources = Some(r.clone());
    n.history.push_back(r);
}

/// Six ranks on three nodes; rank 4 on node-c prepares its data slowly, the others wait.
fn straggler_job() -> JobView {
    use Category::*;
    let fast = |rank, node| Spec {
        rank,
        node,
        ms: [(Compute, 80), (PeerWait, 45), (Network, 12)],
    };
    let mut v = model(
        "resnet",
        &[
            fast(0, "node-a"),
            fast(1, "node-a"),
            fast(2, "node-b"),
            fast(3, "node-b"),
            Spec {
                rank: 4,
                node: "node-c",
                ms: [(Compute, 80), (DataPrep, 48), (Network, 12)],
            },
            fast(5, "node-c"),
        ],
        300,
    );
    v.stragglers.push_back(StragglerWindow {
        first_iter: 256,
        last_iter: 287,
        rank: 4,
        node: "node-c".into(),
        held_seconds: 1.41,
        others_wait_fraction: 0.33,
    });
    v.nodes.get_mut("node-b").expect("node").records_dropped = 17;
    v
}

/// One rank on an A100 as the scripted GPU reports it: busy 93%, 312 W, a 38.5 MB batch.
fn gpu_job() -> JobView {
    use Category::*;
    let mut v = model(
        "train",
        &[Spec {
            rank: 0,
            node: "gpu-1",
            ms: [(Compute, 41), (Interconnect, 6), (DataFetch, 2)],
        }],
        120,
    );
    let gpu = RankGpu {
        gpu: "0".into(),
        uuid: Some("GPU-5b8d2b1e-4c1f-0d2e-9a4b-1f2e3d4c5b6a".into()),
        busy_fraction: Some(0.93),
        power_watts: Some(312.0),
        pcie_rx_bytes_per_iteration: Some(38.6e6),
        pcie_tx_bytes_per_iteration: Some(0.4e6),
        nvlink_bytes_per_iteration: None,
        energy_joules_per_iteration: Some(15.3),
        batch_bytes: Some(38_535_168),
        cuda_timed_fraction: 1.0,
        read_fraction: 1.0,
    };
    let r = v.ranks.get_mut(&0).expect("rank 0");
    r.gpu = Some(gpu);
    r.loader_workers = Some(4);
    r.loader_pids = vec![5101, 5102, 5103, 5104];
    for p in r.recent.iter_mut() {
        p.gpu_busy_ppm = Some(930_000);
    }
    for n in v.nodes.values_mut() {
        n.gpus = vec![stallscope_analysis::frame::GpuIdentity {
            gpu: "0".into(),
            uuid: Some("GPU-5b8d2b1e-4c1f-0d2e-9a4b-1f2e3d4c5b6a".into()),
            model: Some("NVIDIA H100 80GB HBM3".into()),
        }];
        for h in n.history.iter_mut().chain(n.resources.iter_mut()) {
            h.gpu_busy = Some(0.93);
            h.pcie_rx_bytes_per_s = Some(780e6);
            h.pcie_tx_bytes_per_s = Some(8e6);
        }
    }
    v
}

/// Two ranks on one node whose NVML source went down mid-run, markers lost.
fn source_down_job() -> JobView {
    use Category::*;
    let spec = |rank| Spec {
        rank,
        node: "local",
        ms: [(Compute, 20), (DataFetch, 30), (Other, 2)],
    };
    let mut v = model("train", &[spec(0), spec(1)], 60);
    let why = "NVML_ERROR_GPU_IS_LOST (the GPU fell off the bus)";
    v.summary.sources_down.push(SourceDown {
        source: "nvml".into(),
        message: why.into(),
    });
    v.summary.markers.dropped = 3;
    let n = v.nodes.get_mut("local").expect("node");
    n.sources_down.push(format!("nvml: {why}"));
    n.markers_dropped = 3;
    v
}

fn screen(app: &App, view: &JobView, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| draw(f, app, view)).expect("draw");
    t
}

fn on(screen_: Screen) -> App {
    let mut app = App::new(Mode::Live("/run/stallscope/run-4242.feed".into()));
    app.screen = screen_;
    app
}

fn key(app: &mut App, view: &JobView, code: KeyCode) -> Outcome {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE), view)
}

#[test]
fn job_screen_of_a_straggler_job() {
    let v = straggler_job();
    insta::assert_snapshot!(screen(&on(Screen::Job), &v, 80, 24).backend());
}

/// The straggler job whose rank 4 turned slow at iteration 230 (data_prep), still slow, and
/// whose rank 1 was slow in compute from 100 to 140.
fn slowdown_job() -> JobView {
    let mut v = straggler_job();
    let slow = |rank: u32, node: &str, category: &str, since, until| Slowdown {
        rank,
        node: node.into(),
        category: category.into(),
        since_iteration: since,
        detected_iteration: since + 3,
        until_iteration: until,
        factor: 1.6,
        before_seconds: 0.002,
        after_seconds: 0.048,
        pid: 0,
    };
    v.summary.slowdowns = vec![
        slow(1, "node-a", "compute", 100, Some(140)),
        slow(4, "node-c", "data_prep", 230, None),
    ];
    v
}

#[test]
fn a_rank_that_turned_slow_is_marked_and_said_on_the_ranks_and_job_screens() {
    let v = slowdown_job();
    let t = screen(&on(Screen::Ranks), &v, 100, 24);
    let text = format!("{}", t.backend());
    assert!(
        text.contains(
            "▼ rank 4 on node-c slow since iteration 230: data_prep 2.0 ms → 48.0 ms (1.60×)"
        ),
        "{text}"
    );
    let buf = t.backend().buffer();
    let marked: Vec<String> = (0..24)
        .filter(|y| buf[(0, *y)].symbol() == "▼")
        .map(|y| (0..30).map(|x| buf[(x, y)].symbol()).collect())
        .collect();
    assert_eq!(marked.len(), 1, "the row of rank 4 alone: {text}");
    assert!(marked[0].contains("4 node-c"), "{text}");
    let t = screen(&on(Screen::Job), &v, 120, 30);
    let text = format!("{}", t.backend());
    assert!(
        text.contains("▼ rank 4 on node-c slow since iteration 230: data_prep"),
        "{text}"
    );
    assert!(
        text.contains("▽ rank 1 on node-a slow since iteration 100: compute"),
        "{text}"
    );
    assert!(text.contains("back at 140"), "{text}");
}

/// Issue 28: while a hang lasts, every screen opens with it: rank 1@node-b missing, rank
/// 0@node-a waiting in the all-reduce, and rank 1's stack; it goes once iterations resume.
#[test]
fn a_lasting_hang_opens_every_screen_with_the_missing_rank_and_its_stack() {
    use stallscope_analysis::hang::{Collective, HangReport, RankAtHang};
    let mut v = straggler_job();
    let at = |rank: u32, node: &str, collective: Option<Collective>| RankAtHang {
        rank,
        pid: 4000 + rank,
        last_iteration: Some(11),
        state: if collective.is_some() {
            "collective"
        } else {
            "compute_or_unknown"
        }
        .into(),
        collective,
        has_hook: true,
        node: Some(node.into()),
    };
    let all_reduce = Collective {
        op: "all_reduce".into(),
        group: 0,
        seq: 12,
    };
    v.summary.hangs.push(HangReport {
        at_seconds: 80.0,
        stalled_seconds: 61.0,
        last_iteration: Some(11),
        collective: Some(all_reduce.clone()),
        waiting_ranks: vec![0],
        missing_ranks: vec![1],
        ranks: vec![at(0, "node-a", Some(all_reduce)), at(1, "node-b", None)],
        stacks: [(
            "1".to_string(),
            "Thread 0x7f01 (most recent call first):\n  File \"train.py\", line 7 in stuck_in_here\n  File \"train.py\", line 15 in <module>\n".to_string(),
        )]
        .into(),
        missing_at: vec!["1@node-b".into()],
        waiting_at: vec!["0@node-a".into()],
        ..HangReport::default()
    });
    let t = screen(&on(Screen::Job), &v, 100, 30);
    insta::assert_snapshot!(t.backend());
    for s in [Screen::Ranks, Screen::Nodes, Screen::Timeline] {
        let text = format!("{}", screen(&on(s), &v, 100, 30).backend());
        assert!(text.contains("HANG"), "{text}");
        assert!(text.contains("rank 1@node-b's Python stacks"), "{text}");
        assert!(text.contains("line 7 in stuck_in_here"), "{text}");
    }
    v.summary.hangs[0].resumed_after_seconds = Some(3.0);
    let text = format!("{}", screen(&on(Screen::Job), &v, 100, 30).backend());
    assert!(!text.contains("HANG"), "{text}");
}

#[test]
fn timeline_screen_of_a_straggler_job() {
    let v = straggler_job();
    insta::assert_snapshot!(screen(&on(Screen::Timeline), &v, 80, 24).backend());
}

#[test]
fn ranks_screen_marks_the_straggler() {
    let v = straggler_job();
    let t = screen(&on(Screen::Ranks), &v, 80, 24);
    insta::assert_snapshot!(t.backend());
    // The straggler's bar shows its data_prep in data_prep's colour.
    let buf = t.backend().buffer();
    let row = (0..24)
        .find(|y| buf[(0, *y)].symbol() == "▲")
        .expect("a marked row");
    assert!((0..80).any(|x| buf[(x, row)].fg == palette::color(Category::DataPrep)));
}

#[test]
fn nodes_screen_of_a_straggler_job() {
    let v = straggler_job();
    insta::assert_snapshot!(screen(&on(Screen::Nodes), &v, 80, 24).backend());
}

#[test]
fn rank_detail_of_a_gpu_job() {
    let v = gpu_job();
    let mut app = on(Screen::Ranks);
    assert_eq!(key(&mut app, &v, KeyCode::Enter), Outcome::Continue);
    assert_eq!(app.detail, Some(0));
    insta::assert_snapshot!(screen(&app, &v, 80, 24).backend());
}

#[test]
fn nodes_screen_of_a_gpu_job() {
    let v = gpu_job();
    insta::assert_snapshot!(screen(&on(Screen::Nodes), &v, 80, 24).backend());
}

/// Issue 29: the GPU job's node collecting over InfiniBand (12 GB/s in, 11 GB/s out on its
/// RDMA ports, next to a trickle on the NIC): an RDMA column beside the NIC's and its sparkline.
#[test]
fn nodes_screen_of_an_rdma_job() {
    let mut v = gpu_job();
    for n in v.nodes.values_mut() {
        for (i, h) in n
            .history
            .iter_mut()
            .chain(n.resources.iter_mut())
            .enumerate()
        {
            let wave = 0.5 + 0.5 * ((i as f64) / 3.0).sin();
            h.rdma_rx_bytes_per_s = Some(12e9 * wave);
            h.rdma_tx_bytes_per_s = Some(11e9 * wave);
        }
    }
    insta::assert_snapshot!(screen(&on(Screen::Nodes), &v, 100, 24).backend());
}

#[test]
fn job_screen_says_a_source_is_down() {
    let v = source_down_job();
    insta::assert_snapshot!(screen(&on(Screen::Job), &v, 80, 24).backend());
}

#[test]
fn help_and_an_empty_model_on_a_wide_terminal() {
    let v = JobView::new("train");
    let mut app = on(Screen::Job);
    key(&mut app, &v, KeyCode::Char('?'));
    insta::assert_snapshot!(screen(&app, &v, 100, 30).backend());
    key(&mut app, &v, KeyCode::Char('x'));
    assert!(!app.help, "any key closes the help");
}

#[test]
fn replay_and_the_training_output_pane() {
    let v = gpu_job();
    let mut app = App::new(Mode::Replay(ReplayCursor {
        profile: "run.stallscope".into(),
        position: 12,
        len: 40,
        seconds: 12.0,
        total_seconds: 39.5,
        playing: false,
    }));
    app.screen = Screen::Timeline;
    app.output = Some(OutputPane {
        log: "stallscope-train-4242.log".into(),
        lines: (0..10)
            .map(|i| format!("epoch 0 step {i} loss 2.{i}"))
            .collect(),
    });
    insta::assert_snapshot!(screen(&app, &v, 80, 24).backend());
}

#[test]
fn keys_switch_screens_sort_filter_and_select() {
    let v = straggler_job();
    let mut app = on(Screen::Job);
    key(&mut app, &v, KeyCode::Tab);
    assert_eq!(app.screen, Screen::Timeline);
    key(&mut app, &v, KeyCode::BackTab);
    key(&mut app, &v, KeyCode::BackTab);
    assert_eq!(app.screen, Screen::Nodes);
    key(&mut app, &v, KeyCode::Char('3'));
    assert_eq!(app.screen, Screen::Ranks);

    // Sorted by median, the straggler comes first.
    key(&mut app, &v, KeyCode::Char('s'));
    assert_eq!(app.rank_sort, RankSort::Median);
    assert_eq!(app.ranks(&v)[0].rank, 4);
    key(&mut app, &v, KeyCode::Char('s'));
    assert_eq!(
        app.ranks(&v)[0].rank,
        4,
        "its data_prep is the largest stall"
    );

    // ↓ past the end stays on the last row; Enter opens that rank; Esc comes back.
    for _ in 0..10 {
        key(&mut app, &v, KeyCode::Down);
    }
    assert_eq!(app.rank_row, 5);
    key(&mut app, &v, KeyCode::Enter);
    assert!(app.detail.is_some());
    key(&mut app, &v, KeyCode::Esc);
    assert_eq!(app.detail, None);

    // `/node-b` leaves two ranks; Esc while editing clears it.
    key(&mut app, &v, KeyCode::Char('/'));
    for c in "node-b".chars() {
        key(&mut app, &v, KeyCode::Char(c));
    }
    assert_eq!(
        key(&mut app, &v, KeyCode::Char('q')),
        Outcome::Continue,
        "q is text while editing"
    );
    key(&mut app, &v, KeyCode::Backspace);
    key(&mut app, &v, KeyCode::Enter);
    let shown: Vec<u32> = app.ranks(&v).iter().map(|r| r.rank).collect();
    assert_eq!(
        shown,
        [2, 3],
        "equal stalls in rank order, filtered to node-b"
    );
    key(&mut app, &v, KeyCode::Char('4'));
    assert_eq!(app.nodes(&v).len(), 1);

    assert_eq!(key(&mut app, &v, KeyCode::Char('q')), Outcome::Quit);
    assert_eq!(
        app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL), &v),
        Outcome::Interrupt
    );
}

#[test]
fn pause_freezes_the_view_until_resumed() {
    let mut v = straggler_job();
    let mut app = on(Screen::Job);
    key(&mut app, &v, KeyCode::Char('p'));
    v.attributed += 1_000;
    assert_eq!(app.shown(&v).attributed + 1_000, v.attributed);
    key(&mut app, &v, KeyCode::Char('p'));
    assert_eq!(app.shown(&v).attributed, v.attributed);
}

#[test]
fn replay_keys_move_the_cursor() {
    let v = JobView::new("x");
    let mut app = App::new(Mode::Replay(ReplayCursor {
        len: 10,
        position: 4,
        ..ReplayCursor::default()
    }));
    assert_eq!(key(&mut app, &v, KeyCode::Right), Outcome::Seek(5));
    assert_eq!(key(&mut app, &v, KeyCode::Left), Outcome::Seek(3));
    assert_eq!(key(&mut app, &v, KeyCode::Home), Outcome::Seek(0));
    assert_eq!(key(&mut app, &v, KeyCode::End), Outcome::Seek(9));
    assert_eq!(key(&mut app, &v, KeyCode::Char(' ')), Outcome::Continue);
    assert!(matches!(&app.mode, Mode::Replay(c) if c.playing));
    key(&mut app, &v, KeyCode::Char('p'));
    assert!(app.paused.is_none(), "a replay is paused with space, not p");
}

#[test]
fn the_timeline_scrolls_back_and_stops_at_the_oldest_kept_iteration() {
    let v = straggler_job();
    let mut app = on(Screen::Timeline);
    let latest = chart::columns(&v, None, 60, app.timeline_back).iters;
    assert_eq!(latest, Some((240, 299)));
    key(&mut app, &v, KeyCode::Left);
    assert_eq!(
        chart::columns(&v, None, 60, app.timeline_back).iters,
        Some((230, 289))
    );
    key(&mut app, &v, KeyCode::Home);
    assert_eq!(
        chart::columns(&v, None, 60, app.timeline_back).iters,
        Some((0, 59))
    );
}

#[test]
fn every_screen_fits_from_80x24_to_a_large_terminal_and_a_tiny_one() {
    let v = straggler_job();
    for s in Screen::ALL {
        for (w, h) in [(80, 24), (200, 60), (20, 5), (1, 1)] {
            screen(&on(s), &v, w, h);
        }
    }
}

/// Issue 29: the selected node's panel says what share of its NIC's TCP bytes were the job's
/// (its flows' classes other than `other`).
#[test]
fn nodes_screen_shows_the_jobs_share_of_its_nic() {
    use stallscope_analysis::flows::{FlowClass, FlowClassTotals};
    let mut v = gpu_job();
    for n in v.nodes.values_mut() {
        n.flow_classes = vec![
            FlowClassTotals {
                class: Some(FlowClass::Collective),
                bytes_in: 20_000_000,
                bytes_out: 20_000_000,
                retransmits: 3,
            },
            FlowClassTotals {
                class: Some(FlowClass::Other),
                bytes_in: 0,
                bytes_out: 60_000_000,
                retransmits: 0,
            },
        ];
    }
    let text = screen(&on(Screen::Nodes), &v, 100, 24)
        .backend()
        .to_string();
    assert!(text.contains("job 40% of NIC flow bytes"), "{text}");
}

#[test]
fn rank_detail_names_its_most_exposed_operations() {
    use stallscope_analysis::collectives::{Collective, Role};
    use stallscope_analysis::summary::RankSummary;
    let mut v = gpu_job();
    v.summary.ranks = vec![RankSummary {
        rank: 0,
        collectives: vec![Collective {
            op: "all_gather_into_tensor".into(),
            group: Some("0".into()),
            role: Some(Role::Fsdp),
            count_per_iteration: 8.0,
            bytes_per_iteration: 2_105_344.0,
            seconds_per_iteration: 0.0123,
            waited_seconds_per_iteration: 0.0031,
        }],
        ..RankSummary::default()
    }];
    let mut app = on(Screen::Ranks);
    assert_eq!(key(&mut app, &v, KeyCode::Enter), Outcome::Continue);
    let t = screen(&app, &v, 100, 30);
    let buf = t.backend().buffer();
    let text: String = (0..30)
        .map(|y| (0..100).map(|x| buf[(x, y)].symbol()).collect::<String>() + "\n")
        .collect();
    assert!(
        text.contains(
            " all_gather_into_tensor (fsdp) 8.0 × 2.1 MB per it · 12.3 ms (3.1 ms waiting)"
        ),
        "{text}"
    );
}
