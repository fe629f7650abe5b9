//! Per rank, what each kind of communication operation cost per iteration: how many ran, the
//! bytes they moved, the exposed time they held the loop and how much of it was waiting for a
//! peer rather than moving data.
//!
//! The category totals say that a rank waited in communication; they do not say in which
//! operation. An FSDP job's all-gathers and reduce-scatters, a pipeline's sends and DDP's
//! all-reduce each have their own cure, so the summary lists them apart, keyed by the identity
//! the hook sent (`op=`, `g=`), with the role the operation plays in the job. The totals are
//! folded per (op, group) as iterations are counted: a handful of entries per rank, bounded by
//! [`MAX_OPS_PER_RANK`], however long the job runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::secs;

/// Distinct (op, group) pairs kept per rank; operations of further pairs are counted in
/// [`CommTotals::untracked`] only (a program that made a process group per call would
/// otherwise grow the totals without bound).
pub const MAX_OPS_PER_RANK: usize = 64;

/// One `comm` span's share of one attributed iteration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpTime {
    /// The operation the hook named (`all_gather_into_tensor`, `send`, …); `None` for an
    /// unnamed `comm` span (DDP's exposed all-reduce, `stallscope.phase("comm")`).
    pub op: Option<String>,
    /// Its process group's small id, when named.
    pub group: Option<u32>,
    /// Whether the span ended in this iteration: a span straddling the step is counted (its
    /// number and bytes) once, in the iteration where it ended, and its time on both sides.
    pub ended_here: bool,
    /// bytes of its tensors on this rank, as the hook sent them (`b=`).
    pub bytes: u64,
    /// ns of the iteration the attribution gave the span (its exposed time).
    pub exposed_ns: u64,
    /// ns of those spent waiting for the last peer to begin the same operation.
    pub waited_ns: u64,
}

/// Running sums for one (op, group).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct OpTotals {
    count: u64,
    bytes: u64,
    exposed_ns: u64,
    waited_ns: u64,
}

/// One rank's running sums per (op, group) over its counted iterations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommTotals {
    ops: BTreeMap<(Option<String>, Option<u32>), OpTotals>,
    /// Operations of (op, group) pairs beyond [`MAX_OPS_PER_RANK`], not listed.
    pub untracked: u64,
}

impl CommTotals {
    /// Counts one span of a counted iteration.
    pub fn add(&mut self, t: &OpTime) {
        let key = (t.op.clone(), t.group);
        if !self.ops.contains_key(&key) && self.ops.len() >= MAX_OPS_PER_RANK {
            self.untracked += u64::from(t.ended_here);
            return;
        }
        let e = self.ops.entry(key).or_default();
        if t.ended_here {
            e.count += 1;
            e.bytes += t.bytes;
        }
        e.exposed_ns += t.exposed_ns;
        e.waited_ns += t.waited_ns;
    }
}

/// The part an operation plays in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Point to point between pipeline stages (`send`, `recv`, `isend`, `irecv`,
    /// `batch_isend_irecv`).
    Pipeline,
    /// FSDP's parameter all-gather or gradient reduce-scatter, in a job without DDP.
    Fsdp,
    /// DDP's gradient all-reduce.
    DataParallel,
    /// A tensor-parallel group's operation.
    TensorParallel,
}

/// One (op, group) of one rank, per counted iteration: an entry of the summary's
/// `ranks[].collectives`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    /// The operation (`all_gather_into_tensor`, `send`, …); `all_reduce` for DDP's exposed
    /// gradient all-reduce, `comm` for a `stallscope.phase("comm")` of the program's own.
    pub op: String,
    /// Its process group's id as the hook numbered it (`"0"` the default group), `"ddp"` for
    /// DDP's all-reduce; `null` for an unnamed span.
    pub group: Option<String>,
    /// The part it plays, when known.
    pub role: Option<Role>,
    /// Operations per iteration.
    pub count_per_iteration: f64,
    /// bytes per iteration on this rank: an all-gather's gathered output, a reduce-scatter's
    /// whole input, a send's or receive's tensor; for DDP's all-reduce the gradient buckets'
    /// bytes the hook reported (`comm_bytes`) per iteration.
    pub bytes_per_iteration: f64,
    /// s per iteration the loop was held in it (exposed time).
    pub seconds_per_iteration: f64,
    /// s per iteration of those spent waiting for a peer to begin the same operation; the
    /// rest moved data.
    pub waited_seconds_per_iteration: f64,
}

/// The all-gathers and reduce-scatters FSDP (1 and 2) issues.
pub const FSDP_OPS: [&str; 6] = [
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
];

/// Point-to-point operations: a pipeline's.
const P2P_OPS: [&str; 5] = ["send", "recv", "isend", "irecv", "batch_isend_irecv"];

/// What the summary knows of the job when it lists a rank's operations.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobComm<'a> {
    /// The job used DDP (a loop sent its gradient buckets).
    pub ddp: bool,
    /// bytes DDP all-reduced per iteration on this rank, when its hook said (`comm_bytes`).
    pub ddp_bytes_per_iteration: Option<f64>,
    /// Groups of a DeviceMesh dimension named `tp` (the hook's `group_dim.<g>=tp`).
    pub tensor_parallel_groups: &'a [u32],
}

/// The DeviceMesh dimension name that marks a tensor-parallel group.
pub const TENSOR_PARALLEL_DIM: &str = "tp";

/// The meta key prefix naming a group's DeviceMesh dimension: `group_dim.<g>=<name>`.
pub const GROUP_DIM_PREFIX: &str = "group_dim.";

/// The meta key prefix the hook gives a group DTensor's functional collectives ran on when no
/// DeviceMesh dimension names it: `group_role.<g>=tp`.
pub const GROUP_ROLE_PREFIX: &str = "group_role.";

/// The groups `meta` (one process's latest metadata) says are tensor parallel: a `tp` mesh
/// dimension's, or one DTensor's collectives ran on (`group_role.<g>=tp`).
pub fn tensor_parallel_groups(meta: &BTreeMap<String, String>) -> Vec<u32> {
    meta.iter()
        .filter_map(|(k, v)| {
            let g = k
                .strip_prefix(GROUP_DIM_PREFIX)
                .or_else(|| k.strip_prefix(GROUP_ROLE_PREFIX))?;
            (v == TENSOR_PARALLEL_DIM).then(|| g.parse().ok()).flatten()
        })
        .collect()
}

/// The role of `op` on group `group`; `None` when nothing says.
fn role(op: &str, group: Option<u32>, job: JobComm) -> Option<Role> {
    if group.is_some_and(|g| job.tensor_parallel_groups.contains(&g)) {
        Some(Role::TensorParallel)
    } else if P2P_OPS.contains(&op) {
        Some(Role::Pipeline)
    } else if FSDP_OPS.contains(&op) && !job.ddp {
        Some(Role::Fsdp)
    } else {
        None
    }
}

/// A rank's operations over its `iterations` counted iterations, the most exposed first.
pub fn collectives(t: &CommTotals, iterations: u64, job: JobComm) -> Vec<Collective> {
    if iterations == 0 {
        return Vec::new();
    }
    let n = iterations as f64;
    let mut out: Vec<Collective> = t
        .ops
        .iter()
        .map(|((op, group), s)| {
            let (op, group, role, bytes) = match (op, group) {
                (Some(op), g) => (
                    op.clone(),
                    g.map(|g| g.to_string()),
                    role(op, *g, job),
                    s.bytes as f64,
                ),
                (None, _) if job.ddp => (
                    "all_reduce".to_string(),
                    Some("ddp".to_string()),
                    Some(Role::DataParallel),
                    job.ddp_bytes_per_iteration.map_or(0.0, |b| b * n),
                ),
                (None, _) => ("comm".to_string(), None, None, 0.0),
            };
            Collective {
                op,
                group,
                role,
                count_per_iteration: s.count as f64 / n,
                bytes_per_iteration: bytes / n,
                seconds_per_iteration: secs(s.exposed_ns) / n,
                waited_seconds_per_iteration: secs(s.waited_ns) / n,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.seconds_per_iteration
            .total_cmp(&a.seconds_per_iteration)
            .then_with(|| a.op.cmp(&b.op))
    });
    out
}

/// Operations a rank's summary line names; the JSON lists them all.
pub const SHOWN_PER_RANK: usize = 3;

/// One line of the text summary: rank `rank`'s most exposed operations, per iteration, e.g.
/// `rank 0 comm per iteration: all_gather_into_tensor (fsdp) 8 × 2.1 MB 12.3 ms (3.1 ms
/// waiting)`; `None` when it had none.
pub fn render_line(rank: u32, ops: &[Collective]) -> Option<String> {
    if ops.is_empty() {
        return None;
    }
    let parts: Vec<String> = ops
        .iter()
        .take(SHOWN_PER_RANK)
        .map(|c| {
            let role = c
                .role
                .map_or(String::new(), |r| format!(" ({})", r.short()));
            format!(
                "{}{role} {:.1} × {} {:.1} ms ({:.1} ms waiting)",
                c.op,
                c.count_per_iteration,
                bytes_text(c.bytes_per_iteration),
                c.seconds_per_iteration * 1e3,
                c.waited_seconds_per_iteration * 1e3,
            )
        })
        .collect();
    let more = ops.len().saturating_sub(SHOWN_PER_RANK);
    let more = if more > 0 {
        format!("; {more} more in --json")
    } else {
        String::new()
    };
    Some(format!(
        "rank {rank} comm per iteration: {}{more}",
        parts.join(", ")
    ))
}

impl Role {
    /// Its short name in text: `pipeline`, `fsdp`, `ddp`, `tp`.
    pub fn short(self) -> &'static str {
        match self {
            Role::Pipeline => "pipeline",
            Role::Fsdp => "fsdp",
            Role::DataParallel => "ddp",
            Role::TensorParallel => "tp",
        }
    }
}

/// `bytes` in B, kB, MB or GB (powers of 1000).
pub fn bytes_text(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(
        op: Option<&str>,
        ended_here: bool,
        bytes: u64,
        exposed_ms: u64,
        waited_ms: u64,
    ) -> OpTime {
        OpTime {
            op: op.map(String::from),
            group: op.map(|_| 0),
            ended_here,
            bytes,
            exposed_ns: exposed_ms * 1_000_000,
            waited_ns: waited_ms * 1_000_000,
        }
    }

    #[test]
    fn operations_are_summed_per_op_and_group_over_the_counted_iterations() {
        let mut t = CommTotals::default();
        for _ in 0..4 {
            // Per iteration: two all-gathers of 1 kB, one reduce-scatter of 2 kB.
            t.add(&span(Some("all_gather_into_tensor"), true, 1024, 3, 1));
            t.add(&span(Some("all_gather_into_tensor"), true, 1024, 3, 1));
            t.add(&span(Some("reduce_scatter_tensor"), true, 2048, 2, 0));
        }
        // A reduce-scatter straddling the last step: its time counts, its number and bytes
        // in the iteration where it ends.
        t.add(&span(Some("reduce_scatter_tensor"), false, 2048, 4, 0));
        let c = collectives(&t, 4, JobComm::default());
        assert_eq!(c.len(), 2, "{c:?}");
        let gather = &c[0];
        assert_eq!(
            (gather.op.as_str(), gather.group.as_deref(), gather.role),
            ("all_gather_into_tensor", Some("0"), Some(Role::Fsdp))
        );
        assert_eq!(gather.count_per_iteration, 2.0);
        assert_eq!(gather.bytes_per_iteration, 2048.0);
        assert!((gather.seconds_per_iteration - 0.006).abs() < 1e-12);
        assert!((gather.waited_seconds_per_iteration - 0.002).abs() < 1e-12);
        let scatter = &c[1];
        assert_eq!(scatter.count_per_iteration, 1.0);
        assert_eq!(scatter.bytes_per_iteration, 2048.0);
        assert!((scatter.seconds_per_iteration - 0.003).abs() < 1e-12);
    }

    #[test]
    fn roles_follow_the_job() {
        let mut t = CommTotals::default();
        t.add(&span(Some("send"), true, 64, 1, 1));
        t.add(&span(Some("all_gather"), true, 64, 1, 0));
        t.add(&span(None, true, 0, 5, 1));
        let ddp = JobComm {
            ddp: true,
            ddp_bytes_per_iteration: Some(4096.0),
            ..JobComm::default()
        };
        let c = collectives(&t, 1, ddp);
        let find = |op: &str| c.iter().find(|c| c.op == op).unwrap();
        assert_eq!(find("send").role, Some(Role::Pipeline));
        // With DDP an all-gather is not FSDP's.
        assert_eq!(find("all_gather").role, None);
        let all_reduce = find("all_reduce");
        assert_eq!(all_reduce.group.as_deref(), Some("ddp"));
        assert_eq!(all_reduce.role, Some(Role::DataParallel));
        assert_eq!(all_reduce.bytes_per_iteration, 4096.0);
        let c = collectives(&t, 1, JobComm::default());
        assert_eq!(
            c.iter().find(|c| c.op == "all_gather").unwrap().role,
            Some(Role::Fsdp)
        );
        let own = c.iter().find(|c| c.op == "comm").unwrap();
        assert_eq!((own.group.as_deref(), own.role), (None, None));
    }

    #[test]
    fn a_tp_mesh_dimensions_group_is_tensor_parallel() {
        let meta: BTreeMap<String, String> = [
            ("group.2", "2/0:1"),
            ("group_dim.1", "dp"),
            ("group_dim.2", "tp"),
            ("group_role.3", "tp"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        // The mesh's `tp` dimension, and the group DTensor's collectives ran on unnamed.
        let tp = tensor_parallel_groups(&meta);
        assert_eq!(tp, [2, 3]);
        let mut t = CommTotals::default();
        for g in [1, 2] {
            t.add(&OpTime {
                group: Some(g),
                ..span(Some("all_gather_into_tensor"), true, 64, 1, 0)
            });
        }
        let job = JobComm {
            tensor_parallel_groups: &tp,
            ..JobComm::default()
        };
        let c = collectives(&t, 1, job);
        let role = |g: &str| {
            c.iter()
                .find(|c| c.group.as_deref() == Some(g))
                .unwrap()
                .role
        };
        assert_eq!(
            (role("1"), role("2")),
            (Some(Role::Fsdp), Some(Role::TensorParallel))
        );
    }

    #[test]
    fn the_text_line_names_the_most_exposed_operations() {
        let mut t = CommTotals::default();
        for _ in 0..2 {
            t.add(&span(Some("all_gather_into_tensor"), true, 1_052_672, 6, 1));
        }
        t.add(&span(Some("reduce_scatter_tensor"), true, 1_052_672, 2, 0));
        let line = render_line(0, &collectives(&t, 1, JobComm::default())).unwrap();
        assert_eq!(
            line,
            "rank 0 comm per iteration: all_gather_into_tensor (fsdp) 2.0 × 2.1 MB 12.0 ms (2.0 ms waiting), reduce_scatter_tensor (fsdp) 1.0 × 1.1 MB 2.0 ms (0.0 ms waiting)"
        );
        assert_eq!(render_line(0, &[]), None);
    }

    #[test]
    fn the_pairs_kept_are_bounded() {
        let mut t = CommTotals::default();
        for g in 0..(MAX_OPS_PER_RANK as u32 + 10) {
            t.add(&OpTime {
                group: Some(g),
                ..span(Some("broadcast"), true, 8, 1, 0)
            });
        }
        assert_eq!(
            collectives(&t, 1, JobComm::default()).len(),
            MAX_OPS_PER_RANK
        );
        assert_eq!(t.untracked, 10);
    }
}
