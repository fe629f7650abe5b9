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
//! Labels are bounded: `job`, `node`, `rank`, `category`, `direction`, `resource`, `source`
//! and the GPU's identity (`gpu`, `UUID`, `modelName`, as dcgm-exporter names them), never an
//! iteration, a pid or a path. A figure no source gave is left out, never written as 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use stallscope_analysis::category::Category;
use stallscope_analysis::collectives::Collective;
use stallscope_analysis::view::{NodeView, RankView};

use crate::{MetricsState, NodeTotals, BUCKETS};

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
/// its `_total` there, and there is no `# EOF`. Everything else is the same text.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + 4096);
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            let counter = lines
                .peek()
                .is_some_and(|next| *next == format!("# TYPE {name} counter"));
            if counter {
                out.push_str(&format!("# HELP {name}_total{}\n", &rest[name.len()..]));
                lines.next();
                out.push_str(&format!("# TYPE {name}_total counter\n"));
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
    let job = state.view.name.as_str();
    if let Some(cpu) = own_cpu_seconds {
        out.family(
            "stallscope_process_cpu_seconds_total",
            "counter",
            "CPU time the profiler itself used, s.",
        );
        out.sample_owned(
            "stallscope_process_cpu_seconds_total",
            &[("job", job.to_string())],
            cpu,
        );
    }
    out.family(
        "stallscope_feed_resyncs_total",
        "counter",
        "Times this server fell behind the live model and started again from a snapshot.",
    );
    out.sample_owned(
        "stallscope_feed_resyncs_total",
        &[("job", job.to_string())],
        state.resyncs as f64,
    );
    ranks(&mut out, state);
    collectives(&mut out, state);
    gpus(&mut out, state);
    stragglers(&mut out, state);
    hang(&mut out, state);
    slowdowns(&mut out, state);
    nodes(&mut out, state);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(out));
    let mut text = String::new();
    // Writing to a String cannot fail; the families are well-formed by construction.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

fn ranks(out: &mut Out, state: &MetricsState) {
    let job = state.view.name.as_str();
    let ranks: Vec<&RankView> = state.view.ranks.values().collect();
    let labels = |r: &RankView| -> Vec<(&'static str, String)> {
        vec![
            ("job", job.into()),
            ("node", r.node.clone()),
            ("rank", r.rank.to_string()),
        ]
    };
    let name = "stallscope_iterations_total";
    out.family(name, "counter", "Iterations counted (warm-up left out).");
    for r in &ranks {
        out.sample_owned(name, &labels(r), r.figures.iterations as f64);
    }
    let name = "stallscope_iteration_wall_seconds_total";
    out.family(name, "counter", "Wall time of the counted iterations, s.");
    for r in &ranks {
        out.sample_owned(name, &labels(r), r.figures.wall_seconds);
    }
    let name = "stallscope_stall_seconds_total";
    out.family(
        name,
        "counter",
        "Counted iterations' wall time by category, s (sums to the wall time).",
    );
    for r in &ranks {
        for c in Category::ALL {
            let mut l = labels(r);
            l.push(("category", c.name().into()));
            out.sample_owned(name, &l, r.figures.categories.get(c).seconds);
        }
    }
    let name = "stallscope_iteration_p95_seconds";
    out.family(
        name,
        "gauge",
        "95th percentile of the recent iterations' time, s.",
    );
    for r in ranks.iter().filter(|r| !r.recent.is_empty()) {
        out.sample_owned(name, &labels(r), r.p95_iteration_seconds);
    }
    let name = "stallscope_iteration_duration_seconds";
    out.family(
        name,
        "histogram",
        "Iteration time of the counted iterations (warm-up left out), s.",
    );
    for r in &ranks {
        let Some(h) = state.histograms.get(&r.rank) else {
            continue;
        };
        let mut buckets: Vec<(f64, u64)> = BUCKETS.iter().copied().zip(h.counts).collect();
        buckets.push((f64::INFINITY, h.over));
        out.push(
            &labels(r),
            Value::Histogram {
                sum: h.sum_seconds,
                count: h.count(),
                buckets,
            },
        );
    }
}

/// A collective's figure: family name, help, and its value per iteration.
type CollectiveFigure = (&'static str, &'static str, fn(&Collective) -> f64);

/// Each rank's collective and point-to-point operations over its counted iterations, as the
/// summary lists them (`ranks[].collectives`), labelled by operation, process group and role;
/// no family at all for a job that had none.
fn collectives(out: &mut Out, state: &MetricsState) {
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
    for (name, help, per_iteration) in families {
        out.family(name, "counter", help);
        for (r, c) in &rows {
            let labels = vec![
                ("job", job.to_string()),
                ("node", r.node.clone().unwrap_or_default()),
                ("rank", r.rank.to_string()),
                ("op", c.op.clone()),
                ("group", c.group.clone().unwrap_or_default()),
                ("role", c.role.map_or("", |x| x.short()).to_string()),
            ];
            let total = per_iteration(c) * r.figures.iterations as f64;
            out.sample_owned(name, &labels, total);
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

fn gpus(out: &mut Out, state: &MetricsState) {
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
            let mut l = vec![
                ("job", job.to_string()),
                ("node", r.node.clone()),
                ("rank", r.rank.to_string()),
                ("gpu", g.gpu.clone()),
            ];
            if let Some(uuid) = &g.uuid {
                l.push(("UUID", uuid.clone()));
            }
            let model = state
                .view
                .nodes
                .get(&r.node)
                .and_then(|n| n.gpu_model(&g.gpu));
            if let Some(model) = model {
                l.push(("modelName", model.to_string()));
            }
            out.sample_owned(name, &l, v);
        }
    }
}

fn stragglers(out: &mut Out, state: &MetricsState) {
    let name = "stallscope_straggler_held_seconds_total";
    out.family(
        name,
        "counter",
        "How long the rank held the others up in straggler windows, s.",
    );
    let mut held = state.held.clone();
    for r in state.view.ranks.values() {
        held.entry((r.rank, r.node.clone())).or_insert(0.0);
    }
    for ((rank, node), s) in &held {
        let l = [
            ("job", state.view.name.clone()),
            ("node", node.clone()),
            ("rank", rank.to_string()),
        ];
        out.sample_owned(name, &l, *s);
    }
}

/// `stallscope_hang`: 1 while the latest hang `stallscope run` or the collector declared
/// lasts, 0 once it resumed; absent before any hang (an agent declares none). The
/// collector's also names the missing ranks' nodes (`missing_at`).
fn hang(out: &mut Out, state: &MetricsState) {
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
    let mut l = vec![
        ("job", state.view.name.clone()),
        ("missing_ranks", missing.join(",")),
    ];
    if !latest.missing_at.is_empty() {
        l.push(("missing_at", latest.missing_at.join(",")));
    }
    out.sample_owned(name, &l, if hung { 1.0 } else { 0.0 });
}

/// `stallscope_slowdown`: per (rank, node, category) that turned slow, how many times slower
/// its iterations are while it lasts, 0 once it recovered; absent before any.
fn slowdowns(out: &mut Out, state: &MetricsState) {
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
    let mut latest: std::collections::BTreeMap<(u32, &str, &str), f64> = Default::default();
    for s in found {
        let value = if s.ongoing() { s.factor } else { 0.0 };
        latest.insert((s.rank, s.node.as_str(), s.category.as_str()), value);
    }
    for ((rank, node, category), value) in latest {
        let l = [
            ("job", state.view.name.clone()),
            ("rank", rank.to_string()),
            ("node", node.to_string()),
            ("category", category.to_string()),
        ];
        out.sample_owned(name, &l, value);
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

fn nodes(out: &mut Out, state: &MetricsState) {
    let job = state.view.name.as_str();
    let nodes: Vec<&NodeView> = state.view.nodes.values().collect();
    network(out, state);
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
            let mut l = vec![("job", job.to_string()), ("node", node.clone())];
            if let Some((k, val)) = extra {
                l.push((k, val.to_string()));
            }
            out.sample_owned(name, &l, v);
        }
    }
    rdma_counters(out, job, &nodes);
    flows(out, job, &nodes);
    node_gauges(out, job, &nodes);
    node_health(out, job, &nodes);
}

/// `stallscope_node_rdma_counter_total`: each RDMA port's wait, congestion and retransmission
/// counters, as the node's meter counted them since its agent or run started. One family for
/// counters of three units, each named by its sysfs file: `port_xmit_wait` counts ticks, a
/// `*_bytes` file bytes, the others events.
fn rdma_counters(out: &mut Out, job: &str, nodes: &[&NodeView]) {
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
                ("job", job.to_string()),
                ("node", n.node.clone()),
                ("device", c.device.clone()),
                ("port", c.port.clone()),
                ("counter", c.counter.clone()),
            ];
            out.sample_owned(name, &l, c.value as f64);
        }
    }
}

/// `stallscope_flow_bytes_total` and `stallscope_tcp_retransmits_total`: each node's TCP
/// flows over its NICs per class (`collective`, `data`, `control`, `other`), as its flow
/// source (sock_diag) counted them since its agent or run started.
fn flows(out: &mut Out, job: &str, nodes: &[&NodeView]) {
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
                    ("job", job.to_string()),
                    ("node", n.node.clone()),
                    ("class", class.to_string()),
                    ("direction", direction.to_string()),
                ];
                out.sample_owned(bytes, &l, v as f64);
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
                ("job", job.to_string()),
                ("node", n.node.clone()),
                ("class", t.class.map_or("other", |c| c.as_str()).to_string()),
            ];
            out.sample_owned(retrans, &l, t.retransmits as f64);
        }
    }
}

/// `stallscope_node_network_bytes_total`: per interface (`device`, as node_exporter names
/// it) and direction where the node's meter counted its NICs; the node's sum, without
/// `device`, where only its readings are known (no per-NIC counts, e.g. a profile written
/// before them).
fn network(out: &mut Out, state: &MetricsState) {
    let name = "stallscope_node_network_bytes_total";
    let job = state.view.name.as_str();
    let mut rows: Vec<(Vec<(&str, String)>, f64)> = Vec::new();
    let mut names: Vec<&String> = state.view.nodes.keys().chain(state.nodes.keys()).collect();
    names.sort();
    names.dedup();
    for node in names {
        let labels = |extra: &[(&'static str, &str)]| {
            let mut l = vec![("job", job.to_string()), ("node", node.clone())];
            l.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
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
        out.sample_owned(name, &l, v);
    }
}

fn node_gauges(out: &mut Out, job: &str, nodes: &[&NodeView]) {
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
                ("job", job.into()),
                ("node", n.node.clone()),
                ("resource", resource.into()),
            ];
            out.sample_owned(name, &l, v);
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
            out.sample_owned(name, &[("job", job.into()), ("node", n.node.clone())], v);
        }
    }
}

/// A node's health figure: name, help, and its value.
type NodeHealth = (&'static str, &'static str, fn(&NodeView) -> Option<f64>);

fn node_health(out: &mut Out, job: &str, nodes: &[&NodeView]) {
    let node_labels = |n: &NodeView| [("job", job.to_string()), ("node", n.node.clone())];
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
            out.sample_owned(name, &node_labels(n), v);
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
                ("job", job.into()),
                ("node", n.node.clone()),
                ("source", source),
            ];
            out.sample_owned(name, &l, if up { 1.0 } else { 0.0 });
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

/// One sample's value.
#[derive(Debug)]
enum Value {
    Number(f64),
    Histogram {
        sum: f64,
        count: u64,
        /// (upper bound, count in that bucket alone), ending with +Inf.
        buckets: Vec<(f64, u64)>,
    },
}

/// One metric family and its samples.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: String,
    kind: MetricType,
    samples: Vec<(Vec<(&'static str, String)>, Value)>,
}

/// The families of one scrape, in order; given to `prometheus-client` as a collector.
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
            samples: Vec::new(),
        });
    }

    /// Adds a sample to family `name` (the latest family of that name).
    fn sample_owned(&mut self, name: &str, labels: &[(&'static str, String)], v: f64) {
        if let Some(f) = self.families.iter_mut().rev().find(|f| f.name == name) {
            f.samples.push((labels.to_vec(), Value::Number(v)));
        }
    }

    /// Adds a sample to the latest family.
    fn push(&mut self, labels: &[(&'static str, String)], v: Value) {
        if let Some(f) = self.families.last_mut() {
            f.samples.push((labels.to_vec(), v));
        }
    }
}

impl Collector for Out {
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
        for f in &self.families {
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
                _ => f.name,
            };
            let mut family = encoder.encode_descriptor(name, &f.help, None, f.kind)?;
            for (labels, v) in &f.samples {
                let sample = family.encode_family(labels)?;
                match (v, f.kind) {
                    (Value::Number(x), MetricType::Counter) => {
                        ConstCounter::new(x.max(0.0)).encode(sample)?
                    }
                    (Value::Number(x), _) => ConstGauge::new(*x).encode(sample)?,
                    (
                        Value::Histogram {
                            sum,
                            count,
                            buckets,
                        },
                        _,
                    ) => {
                        let mut sample = sample;
                        sample.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?
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
