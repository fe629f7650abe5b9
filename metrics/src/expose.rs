//! The exposition of a [`MetricsState`] in OpenMetrics text, written by the Prometheus
//! organisation's `prometheus-client` crate: a pure function, so its output is tested on a
//! state built in the test.
//!
//! The figures are the model's at the time of the scrape, so they are collected into
//! families here and handed to the crate through its `Collector` interface (const counters,
//! gauges and histograms), which writes the names, types, escaping and `# EOF`. Counters are
//! named here with their `_total`, as users query them; the crate's counter family is that
//! name without it.
//!
//! A scrape of 10,000 ranks is some 300,000 series (issue 31: under 100 ms), so no string is
//! made per series: each of the model's strings that labels series (the job, a node, an
//! operation) is copied once a scrape and shared ([`Names`]; the crate's collectors must be
//! `'static`, so they cannot borrow the state), a rank's labels are made once for its 11
//! samples, a rank label is its number (written by the crate), each family keeps its
//! samples' labels in one flat list, and the text is written into a buffer of the previous
//! scrape's size. What is left is the crate's encoder (85% of a scrape's instructions, half
//! of it the histograms: each of a rank's 17 lines writes its labels again).
//!
//! Labels are bounded: `job`, `node`, `rank`, `category`, `direction`, `resource`, `source`
//! and the GPU's identity (`gpu`, `UUID`, `modelName`, as dcgm-exporter names them), never an
//! iteration, a pid or a path. A figure no source gave is left out, never written as 0.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use stallscope_analysis::category::Category;
use stallscope_analysis::collectives::Collective;
use stallscope_analysis::view::{NodeView, RankView};

use crate::{Histogram, MetricsState, NodeTotals, BUCKETS};

/// The `Content-Type` of a scrape in OpenMetrics (what Prometheus asks for).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of a scrape in the Prometheus text format 0.0.4 (for clients that do
/// not accept OpenMetrics: curl, `promtool check metrics`, older scrapers).
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` header takes OpenMetrics.
pub fn accepts_openmetrics(accept: &str) -> bool {
    accept.contains("application/openmetrics-text")
}

/// The same exposition in the Prometheus text format 0.0.4: a counter family is named with
/// its `_total` there, and there is no `# EOF`. Everything else is the same text, copied in
/// runs between the comment lines.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + 4096);
    let mut rest = openmetrics;
    while !rest.is_empty() {
        // The samples up to the next comment line go over as they are.
        let comment = if rest.starts_with('#') {
            0
        } else {
            rest.find("\n#").map_or(rest.len(), |i| i + 1)
        };
        out.push_str(&rest[..comment]);
        if comment == rest.len() && !rest.ends_with('\n') {
            out.push('\n');
        }
        rest = &rest[comment..];
        let Some(end) = rest
            .find('\n')
            .map(|i| i + 1)
            .or((!rest.is_empty()).then_some(rest.len()))
        else {
            break;
        };
        let line = rest[..end].trim_end_matches('\n');
        rest = &rest[end..];
        if line == "# EOF" {
            continue;
        }
        if let Some(help) = line.strip_prefix("# HELP ") {
            let name = help.split(' ').next().unwrap_or("");
            let next = rest.split('\n').next().unwrap_or("");
            if next
                .strip_prefix("# TYPE ")
                .and_then(|t| t.strip_prefix(name))
                == Some(" counter")
            {
                out.push_str(&format!("# HELP {name}_total{}\n", &help[name.len()..]));
                out.push_str(&format!("# TYPE {name}_total counter\n"));
                rest = rest.get(next.len() + 1..).unwrap_or("");
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The text of one scrape, with the process's own CPU time read now.
pub fn render(state: &MetricsState) -> String {
    render_with(state, own_cpu_seconds())
}

/// The text of one scrape; `own_cpu_seconds` is the profiler's CPU time, s, when known.
pub fn render_with(state: &MetricsState, own_cpu_seconds: Option<f64>) -> String {
    let mut out = Out::default();
    let names = Names::default();
    let job = state.view.name.as_str();
    if let Some(cpu) = own_cpu_seconds {
        out.family(
            "stallscope_process_cpu_seconds_total",
            "counter",
            "CPU time the profiler itself used, s.",
        );
        out.sample(
            "stallscope_process_cpu_seconds_total",
            [("job", names.get(job))],
            cpu,
        );
    }
    out.family(
        "stallscope_feed_resyncs_total",
        "counter",
        "Times this server fell behind the live model and started again from a snapshot.",
    );
    out.sample(
        "stallscope_feed_resyncs_total",
        [("job", names.get(job))],
        state.resyncs as f64,
    );
    ranks(&mut out, &names, state);
    collectives(&mut out, &names, state);
    gpus(&mut out, &names, state);
    stragglers(&mut out, &names, state);
    hang(&mut out, &names, state);
    slowdowns(&mut out, &names, state);
    nodes(&mut out, &names, state);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(out.families)));
    let mut text = String::with_capacity(LAST_SCRAPE_BYTES.load(Ordering::Relaxed) + 4096);
    // Writing to a String cannot fail; the families are well-formed by construction.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    LAST_SCRAPE_BYTES.store(text.len(), Ordering::Relaxed);
    text
}

/// bytes, the latest scrape's length: the next one's buffer is made that large at once
/// instead of growing (and copying) through some 25 doublings at 10,000 ranks.
static LAST_SCRAPE_BYTES: AtomicUsize = AtomicUsize::new(0);

fn ranks<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let job = state.view.name.as_str();
    // Each rank's labels, made once and shared by its 11 samples.
    let ranks: Vec<(&RankView, [Label; 3])> = state
        .view
        .ranks
        .values()
        .map(|r| {
            let l = [
                ("job", names.get(job)),
                ("node", names.get(&r.node)),
                ("rank", r.rank.into()),
            ];
            (r, l)
        })
        .collect();
    let name = "stallscope_iterations_total";
    out.family(name, "counter", "Iterations counted (warm-up left out).");
    for (r, l) in &ranks {
        out.sample(name, l.clone(), r.figures.iterations as f64);
    }
    let name = "stallscope_iteration_wall_seconds_total";
    out.family(name, "counter", "Wall time of the counted iterations, s.");
    for (r, l) in &ranks {
        out.sample(name, l.clone(), r.figures.wall_seconds);
    }
    let name = "stallscope_stall_seconds_total";
    out.family(
        name,
        "counter",
        "Counted iterations' wall time by category, s (sums to the wall time).",
    );
    for (r, l) in &ranks {
        for c in Category::ALL {
            let l = l.clone().into_iter().chain([("category", c.name().into())]);
            out.sample(name, l, r.figures.categories.get(c).seconds);
        }
    }
    let name = "stallscope_iteration_p95_seconds";
    out.family(
        name,
        "gauge",
        "95th percentile of the recent iterations' time, s.",
    );
    for (r, l) in ranks.iter().filter(|(r, _)| !r.recent.is_empty()) {
        out.sample(name, l.clone(), r.p95_iteration_seconds);
    }
    let name = "stallscope_iteration_duration_seconds";
    out.family(
        name,
        "histogram",
        "Iteration time of the counted iterations (warm-up left out), s.",
    );
    for (r, l) in &ranks {
        let Some(h) = state.histograms.get(&r.rank) else {
            continue;
        };
        out.push(l.clone(), Value::Histogram(Box::new(h.clone())));
    }
}

/// A collective's figure: family name, help, and its value per iteration.
type CollectiveFigure = (&'static str, &'static str, fn(&Collective) -> f64);

/// Each rank's collective and point-to-point operations over its counted iterations, as the
/// summary lists them (`ranks[].collectives`), labelled by operation, process group and role;
/// no family at all for a job that had none. An operation without bytes (DDP's all-reduce
/// while its hook has not said them, a `comm` span of the program's own) has no bytes
/// series: 0 would read as measured.
fn collectives<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let job = state.view.name.as_str();
    let rows: Vec<_> = state
        .view
        .summary
        .ranks
        .iter()
        .flat_map(|r| r.collectives.iter().map(move |c| (r, c)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let families: [CollectiveFigure; 4] = [
        (
            "stallscope_collective_seconds_total",
            "Time the loop was held in the operation over the counted iterations, s.",
            |c| c.seconds_per_iteration,
        ),
        (
            "stallscope_collective_waited_seconds_total",
            "Of that time, s waiting for the last peer to arrive (the rest moved data).",
            |c| c.waited_seconds_per_iteration,
        ),
        (
            "stallscope_collective_bytes_total",
            "Bytes of the operation's tensors on this rank over the counted iterations.",
            |c| c.bytes_per_iteration,
        ),
        (
            "stallscope_collective_operations_total",
            "Operations over the counted iterations.",
            |c| c.count_per_iteration,
        ),
    ];
    let labels: Vec<[Label; 6]> = rows
        .iter()
        .map(|(r, c)| {
            [
                ("job", names.get(job)),
                ("node", names.get(r.node.as_deref().unwrap_or_default())),
                ("rank", r.rank.into()),
                ("op", names.get(&c.op)),
                ("group", names.get(c.group.as_deref().unwrap_or_default())),
                ("role", c.role.map_or("", |x| x.short()).into()),
            ]
        })
        .collect();
    for (name, help, per_iteration) in families {
        out.family(name, "counter", help);
        for ((r, c), l) in rows.iter().zip(&labels) {
            if name == "stallscope_collective_bytes_total" && c.bytes_per_iteration <= 0.0 {
                continue;
            }
            let total = per_iteration(c) * r.figures.iterations as f64;
            out.sample(name, l.clone(), total);
        }
    }
}

/// A GPU figure: name, type, help, and its value from a rank.
type GpuFigure = (
    &'static str,
    &'static str,
    &'static str,
    fn(&RankView) -> Option<f64>,
);

fn counted(r: &RankView, per_iteration: Option<f64>) -> Option<f64> {
    let g = r.gpu.as_ref()?;
    Some(per_iteration? * r.figures.iterations as f64 * g.read_fraction)
}

const GPU_FIGURES: [GpuFigure; 6] = [
    (
        "stallscope_gpu_busy_ratio",
        "gauge",
        "Share of the time a kernel ran (NVML), 0-1.",
        |r| r.gpu.as_ref()?.busy_fraction,
    ),
    (
        "stallscope_gpu_power_watts",
        "gauge",
        "Mean board power, W.",
        |r| r.gpu.as_ref()?.power_watts,
    ),
    (
        "stallscope_gpu_energy_joules_total",
        "counter",
        "Energy over the counted iterations, J.",
        |r| counted(r, r.gpu.as_ref()?.energy_joules_per_iteration),
    ),
    (
        "stallscope_gpu_pcie_received_bytes_total",
        "counter",
        "Bytes received over PCIe in the counted iterations.",
        |r| counted(r, r.gpu.as_ref()?.pcie_rx_bytes_per_iteration),
    ),
    (
        "stallscope_gpu_pcie_sent_bytes_total",
        "counter",
        "Bytes sent over PCIe in the counted iterations.",
        |r| counted(r, r.gpu.as_ref()?.pcie_tx_bytes_per_iteration),
    ),
    (
        "stallscope_gpu_nvlink_bytes_total",
        "counter",
        "Bytes over NVLink in the counted iterations, both directions.",
        |r| counted(r, r.gpu.as_ref()?.nvlink_bytes_per_iteration),
    ),
];

fn gpus<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let job = state.view.name.as_str();
    for (name, kind, help, value) in GPU_FIGURES {
        let rows: Vec<(&RankView, f64)> = state
            .view
            .ranks
            .values()
            .filter_map(|r| Some((r, value(r)?)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        out.family(name, kind, help);
        for (r, v) in rows {
            let g = r.gpu.as_ref().expect("a value implies a GPU");
            let mut l: Vec<Label> = vec![
                ("job", names.get(job)),
                ("node", names.get(&r.node)),
                ("rank", r.rank.into()),
                ("gpu", names.get(&g.gpu)),
            ];
            if let Some(uuid) = &g.uuid {
                l.push(("UUID", names.get(uuid)));
            }
            let model = state
                .view
                .nodes
                .get(&r.node)
                .and_then(|n| n.gpu_model(&g.gpu));
            if let Some(model) = model {
                l.push(("modelName", names.get(model)));
            }
            out.sample(name, l, v);
        }
    }
}

fn stragglers<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let name = "stallscope_straggler_held_seconds_total";
    out.family(
        name,
        "counter",
        "How long the rank held the others up in straggler windows, s.",
    );
    let mut held: BTreeMap<(u32, &str), f64> = state
        .held
        .iter()
        .map(|((rank, node), s)| ((*rank, node.as_str()), *s))
        .collect();
    for r in state.view.ranks.values() {
        held.entry((r.rank, r.node.as_str())).or_insert(0.0);
    }
    for ((rank, node), s) in held {
        let l = [
            ("job", names.get(&state.view.name)),
            ("node", names.get(node)),
            ("rank", rank.into()),
        ];
        out.sample(name, l, s);
    }
}

/// `stallscope_hang`: 1 while the latest hang `stallscope run` or the collector declared
/// lasts, 0 once it resumed; absent before any hang (an agent declares none). The
/// collector's also names the missing ranks' nodes (`missing_at`).
fn hang<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let Some(latest) = state.view.summary.hangs.last() else {
        return;
    };
    let name = "stallscope_hang";
    out.family(
        name,
        "gauge",
        "1 while no rank finishes an iteration (a hang declared), 0 once one did; missing_ranks: the ranks that never arrived at the collective the others wait in, comma-separated; missing_at (across nodes): the same as RANK@NODE.",
    );
    let missing: Vec<String> = latest.missing_ranks.iter().map(u32::to_string).collect();
    let hung = latest.resumed_after_seconds.is_none();
    let mut l: Vec<Label> = vec![
        ("job", names.get(&state.view.name)),
        ("missing_ranks", missing.join(",").into()),
    ];
    if !latest.missing_at.is_empty() {
        l.push(("missing_at", latest.missing_at.join(",").into()));
    }
    out.sample(name, l, if hung { 1.0 } else { 0.0 });
}

/// `stallscope_slowdown`: per (rank, node, category) that turned slow, how many times slower
/// its iterations are while it lasts, 0 once it recovered; absent before any.
fn slowdowns<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let found = &state.view.summary.slowdowns;
    if found.is_empty() {
        return;
    }
    let name = "stallscope_slowdown";
    out.family(
        name,
        "gauge",
        "A rank that turned slow: how many times slower its iterations are since the category grew (its median iteration over its baseline's), 0 once it recovered.",
    );
    // The latest slowdown of each (rank, node, category) decides its value.
    let mut latest: BTreeMap<(u32, &str, &str), f64> = Default::default();
    for s in found {
        let value = if s.ongoing() { s.factor } else { 0.0 };
        latest.insert((s.rank, s.node.as_str(), s.category.as_str()), value);
    }
    for ((rank, node, category), value) in latest {
        let l = [
            ("job", names.get(&state.view.name)),
            ("rank", rank.into()),
            ("node", names.get(node)),
            ("category", names.get(category)),
        ];
        out.sample(name, l, value);
    }
}

/// A node counter: name, help, and its value from the totals.
type NodeFigure = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
    fn(&NodeTotals) -> Option<f64>,
);

const NODE_COUNTERS: [NodeFigure; 10] = [
    (
        "stallscope_node_disk_read_bytes_total",
        "Bytes read from whole disks.",
        None,
        |t| t.disk_read_bytes,
    ),
    (
        "stallscope_node_disk_written_bytes_total",
        "Bytes written to whole disks.",
        None,
        |t| t.disk_write_bytes,
    ),
    (
        "stallscope_node_runqueue_delay_seconds_total",
        "Time the training loops' threads waited for a CPU, s.",
        None,
        |t| t.runq_delay_seconds,
    ),
    (
        "stallscope_node_job_cpu_seconds_total",
        "CPU time the job's processes used, s.",
        None,
        |t| t.cpu_seconds,
    ),
    (
        "stallscope_node_pcie_bytes_total",
        "Bytes the node's GPUs moved over PCIe.",
        Some(("direction", "rx")),
        |t| t.pcie_rx_bytes,
    ),
    (
        "stallscope_node_pcie_bytes_total",
        "",
        Some(("direction", "tx")),
        |t| t.pcie_tx_bytes,
    ),
    (
        "stallscope_node_nvlink_bytes_total",
        "Bytes the node's GPUs moved over NVLink.",
        Some(("direction", "rx")),
        |t| t.nvlink_rx_bytes,
    ),
    (
        "stallscope_node_nvlink_bytes_total",
        "",
        Some(("direction", "tx")),
        |t| t.nvlink_tx_bytes,
    ),
    (
        "stallscope_node_rdma_bytes_total",
        "Bytes on the node's RDMA ports (InfiniBand, RoCE, EFA), which the NICs' counters miss.",
        Some(("direction", "rx")),
        |t| t.rdma_rx_bytes,
    ),
    (
        "stallscope_node_rdma_bytes_total",
        "",
        Some(("direction", "tx")),
        |t| t.rdma_tx_bytes,
    ),
];

fn nodes<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let job = state.view.name.as_str();
    let nodes: Vec<&NodeView> = state.view.nodes.values().collect();
    network(out, names, state);
    for (name, help, extra, value) in NODE_COUNTERS {
        let rows: Vec<(&String, f64)> = state
            .nodes
            .iter()
            .filter_map(|(n, t)| Some((n, value(t)?)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        if !help.is_empty() || !out.has(name) {
            out.family(name, "counter", help);
        }
        for (node, v) in rows {
            let l = [("job", names.get(job)), ("node", names.get(node))];
            let extra = extra.map(|(k, val)| (k, val.into()));
            out.sample(name, l.into_iter().chain(extra), v);
        }
    }
    rdma_counters(out, names, job, &nodes);
    flows(out, names, job, &nodes);
    node_gauges(out, names, job, &nodes);
    node_health(out, names, job, &nodes);
}

/// `stallscope_node_rdma_counter_total`: each RDMA port's wait, congestion and retransmission
/// counters, as the node's meter counted them since its agent or run started. One family for
/// counters of three units, each named by its sysfs file: `port_xmit_wait` counts ticks, a
/// `*_bytes` file bytes, the others events.
fn rdma_counters<'a>(out: &mut Out, names: &Names<'a>, job: &'a str, nodes: &[&'a NodeView]) {
    let name = "stallscope_node_rdma_counter_total";
    let mut first = true;
    for n in nodes {
        for c in &n.rdma_counters {
            if std::mem::take(&mut first) {
                out.family(
                    name,
                    "counter",
                    "RDMA port counters since counting began, by sysfs file (counter): port_xmit_wait in ticks, *_bytes in bytes, the others in events.",
                );
            }
            let l = [
                ("job", names.get(job)),
                ("node", names.get(&n.node)),
                ("device", names.get(&c.device)),
                ("port", names.get(&c.port)),
                ("counter", names.get(&c.counter)),
            ];
            out.sample(name, l, c.value as f64);
        }
    }
}

/// `stallscope_flow_bytes_total` and `stallscope_tcp_retransmits_total`: each node's TCP
/// flows over its NICs per class (`collective`, `data`, `control`, `other`), as its flow
/// source (sock_diag) counted them since its agent or run started.
fn flows<'a>(out: &mut Out, names: &Names<'a>, job: &'a str, nodes: &[&'a NodeView]) {
    let bytes = "stallscope_flow_bytes_total";
    let retrans = "stallscope_tcp_retransmits_total";
    if nodes.iter().all(|n| n.flow_classes.is_empty()) {
        return;
    }
    out.family(
        bytes,
        "counter",
        "Bytes of the node's TCP flows over its NICs, by class (collective, data, control: the job's; other: not the job's) and direction.",
    );
    for n in nodes {
        for t in &n.flow_classes {
            let class = t.class.map_or("other", |c| c.as_str());
            for (direction, v) in [("rx", t.bytes_in), ("tx", t.bytes_out)] {
                let l = [
                    ("job", names.get(job)),
                    ("node", names.get(&n.node)),
                    ("class", class.into()),
                    ("direction", direction.into()),
                ];
                out.sample(bytes, l, v as f64);
            }
        }
    }
    out.family(
        retrans,
        "counter",
        "TCP segments retransmitted on the node's flows over its NICs, by class: evidence of congestion.",
    );
    for n in nodes {
        for t in &n.flow_classes {
            let l = [
                ("job", names.get(job)),
                ("node", names.get(&n.node)),
                ("class", t.class.map_or("other", |c| c.as_str()).into()),
            ];
            out.sample(retrans, l, t.retransmits as f64);
        }
    }
}

/// `stallscope_node_network_bytes_total`: per interface (`device`, as node_exporter names
/// it) and direction where the node's meter counted its NICs; the node's sum, without
/// `device`, where only its readings are known (no per-NIC counts, e.g. a profile written
/// before them).
fn network<'a>(out: &mut Out, names: &Names<'a>, state: &'a MetricsState) {
    let name = "stallscope_node_network_bytes_total";
    let job = state.view.name.as_str();
    let mut rows: Vec<(Vec<Label>, f64)> = Vec::new();
    let mut node_names: Vec<&String> = state.view.nodes.keys().chain(state.nodes.keys()).collect();
    node_names.sort();
    node_names.dedup();
    for node in node_names {
        let labels = |extra: &[(&'static str, &'a str)]| {
            let mut l: Vec<Label> = vec![("job", names.get(job)), ("node", names.get(node))];
            l.extend(extra.iter().map(|(k, v)| (*k, names.get(v))));
            l
        };
        match state.view.nodes.get(node).filter(|n| !n.nics.is_empty()) {
            Some(n) => {
                for nic in &n.nics {
                    for (direction, bytes) in [("rx", nic.rx_bytes), ("tx", nic.tx_bytes)] {
                        let l = labels(&[("device", &nic.iface), ("direction", direction)]);
                        rows.push((l, bytes as f64));
                    }
                }
            }
            None => {
                let Some(t) = state.nodes.get(node) else {
                    continue;
                };
                for (direction, bytes) in [("rx", t.nic_rx_bytes), ("tx", t.nic_tx_bytes)] {
                    if let Some(bytes) = bytes {
                        rows.push((labels(&[("direction", direction)]), bytes));
                    }
                }
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    out.family(
        name,
        "counter",
        "Bytes on the NICs (loopback left out), per interface (device) and direction.",
    );
    for (l, v) in rows {
        out.sample(name, l, v);
    }
}

fn node_gauges<'a>(out: &mut Out, names: &Names<'a>, job: &'a str, nodes: &[&'a NodeView]) {
    let name = "stallscope_node_pressure_ratio";
    let mut first = true;
    for n in nodes {
        let Some(r) = &n.resources else { continue };
        for (resource, v) in [
            ("cpu", r.psi_cpu),
            ("io", r.psi_io),
            ("memory", r.psi_memory),
        ] {
            let Some(v) = v else { continue };
            if std::mem::take(&mut first) {
                out.family(
                    name,
                    "gauge",
                    "Share of the last second some task stalled (PSI some), 0-1.",
                );
            }
            let l = [
                ("job", names.get(job)),
                ("node", names.get(&n.node)),
                ("resource", resource.into()),
            ];
            out.sample(name, l, v);
        }
    }
    let name = "stallscope_node_gpu_busy_ratio";
    let rows: Vec<_> = nodes
        .iter()
        .filter_map(|n| Some((n, n.resources.as_ref()?.gpu_busy?)))
        .collect();
    if !rows.is_empty() {
        out.family(
            name,
            "gauge",
            "Mean utilisation of the node's GPUs over the last second, 0-1.",
        );
        for (n, v) in rows {
            let l = [("job", names.get(job)), ("node", names.get(&n.node))];
            out.sample(name, l, v);
        }
    }
}

/// A node's health figure: name, help, and its value.
type NodeHealth = (&'static str, &'static str, fn(&NodeView) -> Option<f64>);

fn node_health<'a>(out: &mut Out, names: &Names<'a>, job: &'a str, nodes: &[&'a NodeView]) {
    let node_labels =
        |n: &'a NodeView| -> [Label; 2] { [("job", names.get(job)), ("node", names.get(&n.node))] };
    let families: [NodeHealth; 4] = [
        (
            "stallscope_markers_dropped_total",
            "Marker datagrams lost.",
            |n| Some(n.markers_dropped as f64),
        ),
        (
            "stallscope_records_dropped_total",
            "Records the agent dropped while the collector was away.",
            |n| Some(n.records_dropped as f64),
        ),
        (
            "stallscope_clock_offset_seconds",
            "The node's clock minus the collector's, s.",
            |n| Some(n.clock_offset_ns? as f64 / 1e9),
        ),
        (
            "stallscope_clock_uncertainty_seconds",
            "The clock offset is right within this, s.",
            |n| Some(n.clock_uncertainty_ns? as f64 / 1e9),
        ),
    ];
    for (name, help, value) in families {
        let rows: Vec<_> = nodes.iter().filter_map(|n| Some((n, value(n)?))).collect();
        if rows.is_empty() {
            continue;
        }
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        out.family(name, kind, help);
        for (n, v) in rows {
            out.sample(name, node_labels(n), v);
        }
    }
    let name = "stallscope_source_up";
    out.family(
        name,
        "gauge",
        "Whether a source delivers readings (1) or is down (0).",
    );
    for n in nodes {
        for (source, up) in sources(n) {
            let l = [
                ("job", names.get(job)),
                ("node", names.get(&n.node)),
                ("source", source.into()),
            ];
            out.sample(name, l, if up { 1.0 } else { 0.0 });
        }
    }
}

/// Each source the node's readings or its down list name, and whether it is up.
fn sources(n: &NodeView) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    let down: Vec<String> = n
        .sources_down
        .iter()
        .map(|s| s.split(':').next().unwrap_or(s).trim().to_string())
        .collect();
    if let Some(r) = &n.resources {
        let seen = [
            ("cpu", r.cpu_busy_cores.is_some()),
            ("runq", r.runq_delay.is_some()),
            ("net", r.nic_rx_bytes_per_s.is_some()),
            ("rdma", r.rdma_rx_bytes_per_s.is_some()),
            ("disk", r.disk_read_bytes_per_s.is_some()),
            ("psi", r.psi_cpu.is_some()),
            ("nvml", r.gpu_busy.is_some()),
        ];
        for (s, yes) in seen {
            if yes && !down.iter().any(|d| d == s) {
                out.push((s.into(), true));
            }
        }
    }
    for d in down {
        if !out.iter().any(|(s, _)| *s == d) {
            out.push((d, false));
        }
    }
    out
}

/// A label's value: a constant, a string of the model shared by every series it labels
/// (made once a scrape by [`Names`]), a number (written by the crate), or one made for this
/// scrape (a hang's list of ranks, a source's name).
#[derive(Clone, Debug)]
enum LabelValue {
    Static(&'static str),
    Shared(Arc<str>),
    Number(u32),
    Owned(String),
}

impl From<&'static str> for LabelValue {
    fn from(s: &'static str) -> Self {
        LabelValue::Static(s)
    }
}

impl From<u32> for LabelValue {
    fn from(n: u32) -> Self {
        LabelValue::Number(n)
    }
}

impl From<String> for LabelValue {
    fn from(s: String) -> Self {
        LabelValue::Owned(s)
    }
}

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            LabelValue::Static(s) => EncodeLabelValue::encode(s, encoder),
            LabelValue::Shared(s) => EncodeLabelValue::encode(&s.as_ref(), encoder),
            LabelValue::Number(n) => EncodeLabelValue::encode(n, encoder),
            LabelValue::Owned(s) => EncodeLabelValue::encode(&s.as_str(), encoder),
        }
    }
}

/// The model's strings that label series (the job, nodes, operations, devices), each copied
/// once a scrape and shared by every series it labels. (`prometheus-client` takes only
/// `'static` collectors, so the scrape's families cannot borrow the state.)
#[derive(Debug, Default)]
struct Names<'a>(RefCell<HashMap<&'a str, Arc<str>>>);

impl<'a> Names<'a> {
    /// `s` as a label value.
    fn get(&self, s: &'a str) -> LabelValue {
        let mut names = self.0.borrow_mut();
        LabelValue::Shared(names.entry(s).or_insert_with(|| Arc::from(s)).clone())
    }
}

/// One label: name and value.
type Label = (&'static str, LabelValue);

/// One sample's value.
#[derive(Debug)]
enum Value {
    Number(f64),
    /// A rank's cumulative iteration times, in [`BUCKETS`].
    Histogram(Box<Histogram>),
}

/// One metric family and its samples.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: String,
    kind: MetricType,
    /// Every sample's labels, one after the other.
    labels: Vec<Label>,
    /// Each sample: the end of its labels in `labels` (they start where the previous
    /// sample's end), and its value.
    samples: Vec<(usize, Value)>,
}

impl Family {
    fn add(&mut self, labels: impl IntoIterator<Item = Label>, v: Value) {
        self.labels.extend(labels);
        self.samples.push((self.labels.len(), v));
    }
}

/// The families of one scrape, in order.
#[derive(Debug, Default)]
struct Out {
    families: Vec<Family>,
}

impl Out {
    fn has(&self, name: &str) -> bool {
        self.families.iter().any(|f| f.name == name)
    }

    /// Starts family `name` of `kind` (`counter`, `gauge` or `histogram`).
    fn family(&mut self, name: &'static str, kind: &str, help: &str) {
        let kind = match kind {
            "counter" => MetricType::Counter,
            "histogram" => MetricType::Histogram,
            _ => MetricType::Gauge,
        };
        self.families.push(Family {
            name,
            help: help.to_string(),
            kind,
            labels: Vec::new(),
            samples: Vec::new(),
        });
    }

    /// Adds a sample to family `name` (the latest family of that name).
    fn sample(&mut self, name: &str, labels: impl IntoIterator<Item = Label>, v: f64) {
        if let Some(f) = self.families.iter_mut().rev().find(|f| f.name == name) {
            f.add(labels, Value::Number(v));
        }
    }

    /// Adds a sample to the latest family.
    fn push(&mut self, labels: impl IntoIterator<Item = Label>, v: Value) {
        if let Some(f) = self.families.last_mut() {
            f.add(labels, v);
        }
    }
}

/// The families of one scrape, given to `prometheus-client` as a collector.
#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A gauge of 1, as exporters name their build info: promtool's parser (and the
        // Prometheus text format) has no `info` type.
        let mut build = encoder.encode_descriptor(
            "stallscope_build_info",
            "stallscope's version.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64)
            .encode(build.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)?;
        for f in &self.0 {
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
                _ => f.name,
            };
            let mut family = encoder.encode_descriptor(name, &f.help, None, f.kind)?;
            let mut start = 0;
            for (end, v) in &f.samples {
                let labels = &f.labels[start..*end];
                start = *end;
                let sample = family.encode_family(&labels)?;
                match (v, f.kind) {
                    (Value::Number(x), MetricType::Counter) => {
                        ConstCounter::new(x.max(0.0)).encode(sample)?
                    }
                    (Value::Number(x), _) => ConstGauge::new(*x).encode(sample)?,
                    (Value::Histogram(h), _) => {
                        let mut buckets = [(f64::INFINITY, h.over); BUCKETS.len() + 1];
                        for (b, (le, n)) in buckets.iter_mut().zip(BUCKETS.iter().zip(h.counts)) {
                            *b = (*le, n);
                        }
                        let mut sample = sample;
                        sample.encode_histogram::<NoLabelSet>(
                            h.sum_seconds,
                            h.count(),
                            &buckets,
                            None,
                        )?
                    }
                }
            }
        }
        Ok(())
    }
}

/// s, this process's CPU time (user + system), from `/proc/self/stat`.
fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| (utime + stime) / hz as f64)
}
