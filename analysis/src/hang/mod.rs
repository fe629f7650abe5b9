//! Hang detection: when no rank of the job finishes an iteration for a while, say where each
//! rank stands.
//!
//! A distributed job whose ranks wait for one that never arrives makes no progress and no
//! error: each rank sits in a collective, or one in its data loading, until a timeout of tens
//! of minutes. The hook marks a blocking collective as it is entered, so a rank stuck in one
//! has that `comm` span open with its identity (group, op, seq); a rank waiting for a batch
//! has its `data` span open. [`HangWatch::check`], called every attribution round with the
//! job's monotonic clock, declares one hang per stall once no loop has stepped for the
//! threshold ([`HangWatch::threshold_ns`]) and reports its recovery when steps resume. No hang
//! is declared before the first iteration of any rank: start-up (imports, data sets, rendezvous)
//! may take any time. The stacks are the recorder's to fetch (it signals the processes); this
//! stays pure.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::loops::MarkerLog;
use crate::marker::phase;
use crate::Nanos;

/// ns without an iteration before a hang, at the least (and before the median is known).
pub const MIN_HANG_NS: Nanos = 60_000_000_000;
/// A hang is this many median iterations without one, when that is longer than
/// [`MIN_HANG_NS`].
pub const MEDIANS_PER_HANG: u64 = 20;
/// Iteration durations kept for the median (the latest).
const DURATIONS_KEPT: usize = 999;

/// A collective (or point-to-point operation) by its identity, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Collective {
    /// The operation: `all_reduce`, `broadcast`, `send`, …
    pub op: String,
    /// Small id of its process group (0: the default group).
    pub group: u32,
    /// Its number, from 0, per (group, op).
    pub seq: u64,
}

/// Where one rank stood when the hang was declared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankAtHang {
    /// Global rank.
    pub rank: u32,
    /// Process id.
    pub pid: u32,
    /// Its last finished iteration.
    pub last_iteration: Option<u64>,
    /// `collective` (inside `collective`), `data_loading` (waiting for a batch),
    /// `finishing` (it destroyed its default process group, or exits), `compute_or_unknown`
    /// (none of these: computing, or in code the hook does not mark) or, across nodes,
    /// `no_answer` (its agent did not answer).
    pub state: String,
    /// The collective it is inside, when `state` is `collective`.
    pub collective: Option<Collective>,
    /// Whether its process has the hook's stack dump (`stacks=` meta).
    pub has_hook: bool,
    /// Its node, when the collector declared the hang (`None` in `stallscope run`).
    #[serde(default)]
    pub node: Option<String>,
}

/// One declared hang.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangReport {
    /// s from the run's start to the declaration.
    pub at_seconds: f64,
    /// s without any finished iteration when declared.
    pub stalled_seconds: f64,
    /// The last iteration any rank finished.
    pub last_iteration: Option<u64>,
    /// The collective entered last: the highest (group, seq) any rank is inside.
    pub collective: Option<Collective>,
    /// Ranks inside `collective`.
    pub waiting_ranks: Vec<u32>,
    /// Ranks of `collective`'s group that are not inside it.
    pub missing_ranks: Vec<u32>,
    /// Every rank, by rank.
    pub ranks: Vec<RankAtHang>,
    /// Every thread's Python stack, by rank (as text), for the ranks whose hook answered.
    pub stacks: BTreeMap<String, String>,
    /// s from the declaration until a rank finished an iteration again; `None` while hung.
    pub resumed_after_seconds: Option<f64>,
    /// `missing_ranks` as `RANK@NODE`, when the collector declared the hang (empty in
    /// `stallscope run`; a rank of no known node is its number alone).
    #[serde(default)]
    pub missing_at: Vec<String>,
    /// `waiting_ranks` as `RANK@NODE`, as `missing_at`.
    #[serde(default)]
    pub waiting_at: Vec<String>,
    /// Nodes whose agent did not answer the collector's request for where its ranks stand
    /// (their ranks' state is `no_answer`, without stacks).
    #[serde(default)]
    pub unanswered_nodes: Vec<String>,
}

/// One node's answer to the collector's request when the job stalls
/// ([`Frame::NodeHang`](crate::frame::Frame::NodeHang)): where its live ranks stand, the
/// process groups their hooks described, and their stacks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeHang {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// The request it answers.
    pub id: u64,
    /// Its live ranks (none: no training loop runs there).
    pub ranks: Vec<RankAtHang>,
    /// Global ranks of each process group its loops described (`group.<id>` meta).
    pub groups: BTreeMap<u32, Vec<u32>>,
    /// The job's world size, as its loops said.
    pub world_size: Option<u32>,
    /// Its ranks' Python stacks, by rank (as text).
    pub stacks: BTreeMap<String, String>,
}

/// What one check found.
#[derive(Clone, Debug, PartialEq)]
pub enum HangEvent {
    /// A new hang (its stacks still to fetch).
    Declared(Box<HangReport>),
    /// Iterations resumed after the hang declared at `at_seconds`.
    Resumed {
        /// The hang's `at_seconds`.
        at_seconds: f64,
        /// s from its declaration to the first iteration after it.
        after_seconds: f64,
    },
}

/// Watches the loops' steps for a stall; see the module docs.
#[derive(Debug, Default)]
pub struct HangWatch {
    /// ns without an iteration that make a hang (`--hang-after`); `None`: the default.
    fixed_ns: Option<Nanos>,
    /// The latest iteration durations, ns.
    durations: VecDeque<Nanos>,
    /// Latest iteration seen per loop pid.
    seen: BTreeMap<u32, u64>,
    /// ns of the latest step of any loop.
    last_step_ns: Option<Nanos>,
    /// The hang declared and not resumed: its `at_seconds`, ns of its declaration and of the
    /// last step before it.
    hung: Option<(f64, Nanos, Nanos)>,
}

impl HangWatch {
    /// A watch declaring a hang after `after_ns` without an iteration; `None`: after
    /// max([`MIN_HANG_NS`], [`MEDIANS_PER_HANG`] × the median iteration).
    pub fn new(after_ns: Option<Nanos>) -> HangWatch {
        HangWatch {
            fixed_ns: after_ns,
            ..HangWatch::default()
        }
    }

    /// ns without an iteration that make a hang now.
    pub fn threshold_ns(&self) -> Nanos {
        if let Some(ns) = self.fixed_ns {
            return ns;
        }
        let mut sorted: Vec<Nanos> = self.durations.iter().copied().collect();
        sorted.sort_unstable();
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
        MIN_HANG_NS.max(median.saturating_mul(MEDIANS_PER_HANG))
    }

    /// Takes the steps in `markers` and, at `now` (ns, the job's monotonic clock; the run
    /// started at `started_ns`), says whether a hang begins or ends. `exited`: pids gone.
    pub fn check(
        &mut self,
        markers: &MarkerLog,
        exited: &BTreeMap<u32, Nanos>,
        now: Nanos,
        started_ns: Nanos,
    ) -> Option<HangEvent> {
        self.take_steps(markers);
        if let Some(resumed) = self.resumed() {
            return Some(resumed);
        }
        let live_loops = markers
            .procs
            .values()
            .any(|p| p.is_loop() && !exited.contains_key(&p.pid) && !winding_down(p));
        let stalled = self.stalled_ns(now).filter(|_| live_loops)?;
        let mut report = where_ranks_stand(markers, exited);
        report.at_seconds = secs(now.saturating_sub(started_ns));
        report.stalled_seconds = secs(stalled);
        self.declare(report.at_seconds, now);
        Some(HangEvent::Declared(Box::new(report)))
    }

    /// Takes one finished iteration: `duration_ns` long (when known), its end seen at
    /// `end_ns` (the watch's clock).
    pub fn observe(&mut self, duration_ns: Option<Nanos>, end_ns: Nanos) {
        if let Some(d) = duration_ns {
            if self.durations.len() == DURATIONS_KEPT {
                self.durations.pop_front();
            }
            self.durations.push_back(d);
        }
        self.last_step_ns = Some(self.last_step_ns.map_or(end_ns, |l| l.max(end_ns)));
    }

    /// ns without an iteration at `now`, when that makes a hang not yet declared; `None`
    /// before the first iteration, below the threshold, or while a declared one lasts.
    pub fn stalled_ns(&self, now: Nanos) -> Option<Nanos> {
        let stalled = now.saturating_sub(self.last_step_ns?);
        (self.hung.is_none() && stalled >= self.threshold_ns()).then_some(stalled)
    }

    /// Marks the hang of `at_seconds` declared at `now`: no other is declared until
    /// iterations resume.
    pub fn declare(&mut self, at_seconds: f64, now: Nanos) {
        if let Some(last) = self.last_step_ns {
            self.hung = Some((at_seconds, now, last));
        }
    }

    /// The end of the declared hang, once an iteration came after it (observed since).
    pub fn resumed(&mut self) -> Option<HangEvent> {
        let (at_seconds, declared_ns, step_before) = self.hung?;
        let last = self.last_step_ns?;
        if last <= step_before {
            return None;
        }
        self.hung = None;
        Some(HangEvent::Resumed {
            at_seconds,
            after_seconds: secs(last.saturating_sub(declared_ns)),
        })
    }

    fn take_steps(&mut self, markers: &MarkerLog) {
        for p in markers.procs.values().filter(|p| p.is_loop()) {
            let Some((&latest, &at)) = p.steps.iter().next_back() else {
                continue;
            };
            let from = self.seen.get(&p.pid).map_or(0, |s| s + 1);
            // Only the steps the loop sent, never every number in between: a step numbered
            // 10^14 (`--iter-regex` on a token counter) took this walk for days (issue 30).
            let sent: Vec<u64> = if from <= latest {
                p.steps.range(from..=latest).map(|(i, _)| *i).collect()
            } else {
                Vec::new()
            };
            for iter in sent {
                if let Some((a, b)) = p.iteration(iter) {
                    self.observe(Some(b - a), at);
                }
            }
            self.seen.insert(p.pid, latest);
            self.observe(None, at);
        }
    }
}

/// s of `ns`.
fn secs(ns: Nanos) -> f64 {
    ns as f64 / 1e9
}

/// Each live loop's last iteration and open phase, the collective entered last, and who is in
/// it and who is not.
fn where_ranks_stand(markers: &MarkerLog, exited: &BTreeMap<u32, Nanos>) -> HangReport {
    let ranks = ranks_at(markers, exited);
    let members = |group: u32| group_ranks(markers, group, &ranks);
    assemble(ranks.clone(), members)
}

/// Where each live loop of `markers` stands: its last iteration and open phase, by rank.
/// A loop that never said its rank is rank 0 when it is the only one.
pub fn ranks_at(markers: &MarkerLog, exited: &BTreeMap<u32, Nanos>) -> Vec<RankAtHang> {
    let live = || {
        markers
            .procs
            .values()
            .filter(|p| p.is_loop() && !exited.contains_key(&p.pid))
    };
    let alone = live().count() == 1;
    let mut ranks: Vec<RankAtHang> = live()
        .filter_map(|p| {
            let rank = p.rank.or(alone.then_some(0))?;
            let open: Vec<_> = p.open_phases().collect();
            let collective = open.iter().find_map(|(name, _, op)| {
                op.filter(|_| *name == phase::COMM).map(|op| Collective {
                    op: op.op.clone(),
                    group: op.group,
                    seq: op.seq,
                })
            });
            let loading = open.iter().any(|(name, _, _)| *name == phase::DATA);
            let state = match (&collective, loading) {
                (Some(_), _) => "collective",
                (None, true) => "data_loading",
                (None, false) if winding_down(p) => "finishing",
                (None, false) => "compute_or_unknown",
            };
            Some(RankAtHang {
                rank,
                pid: p.pid,
                last_iteration: p.steps.keys().next_back().copied(),
                state: state.to_string(),
                collective,
                has_hook: p.meta.contains_key("stacks"),
                node: None,
            })
        })
        .collect();
    ranks.sort_by_key(|r| r.rank);
    ranks
}

/// Corrects, from the stacks fetched at the hang (by rank, as the hook's `faulthandler`
/// dumps them), the state of a rank whose main thread is inside a `DataLoader`'s `__next__`
/// and in no `torch.distributed` call: it is `data_loading`, whatever its markers said
/// (`compute_or_unknown`, or a collective it has since left).
///
/// The markers can be behind the truth where the stack is not: a loop's last events (a
/// collective's end, the next iterations, the `data` begin) may still be in its own process,
/// held because the profiler's socket was full (a loaded machine; see the marker package's
/// `_held`) and sent with its next event, which a hung loop never sends. The stack is taken
/// now. The report's collective, waiting and missing ranks stay the markers' (a rank left
/// behind in an earlier collective is missing from the latest either way).
pub fn refine_by_stacks(ranks: &mut [RankAtHang], stacks: &BTreeMap<String, String>) {
    for r in ranks
        .iter_mut()
        .filter(|r| matches!(r.state.as_str(), "compute_or_unknown" | "collective"))
    {
        let Some(text) = stacks.get(&r.rank.to_string()) else {
            continue;
        };
        let loading = |frames: &Vec<&str>| {
            frames.iter().any(|f| in_dataloader_next(f))
                && !frames.iter().any(|f| f.contains("torch/distributed/"))
        };
        if main_threads(text).any(|t| loading(&t)) {
            r.state = "data_loading".into();
            r.collective = None;
        }
    }
}

/// The frames (`File "…", line N in f` lines, innermost first) of each thread of a
/// `faulthandler` dump that runs the script itself: its outermost frame is `<module>`.
fn main_threads(dump: &str) -> impl Iterator<Item = Vec<&str>> {
    let mut threads: Vec<Vec<&str>> = Vec::new();
    for line in dump.lines() {
        let line = line.trim();
        if line.starts_with("Thread ") || line.starts_with("Current thread ") {
            threads.push(Vec::new());
        } else if line.starts_with("File ") {
            if threads.is_empty() {
                threads.push(Vec::new()); // a dump of one thread, without its heading
            }
            threads.last_mut().expect("pushed").push(line);
        }
    }
    threads
        .into_iter()
        .filter(|frames| frames.last().is_some_and(|f| f.ends_with(" in <module>")))
}

/// Whether stack frame `frame` is a `DataLoader` iterator's `__next__` (torch's own, in
/// `torch/utils/data/dataloader.py`).
fn in_dataloader_next(frame: &str) -> bool {
    frame.contains("torch/utils/data/dataloader.py\"") && frame.ends_with(" in __next__")
}

/// Whether loop `p` said its training is over: it destroyed its default process group (meta
/// `finishing=1`) or is exiting (`exit=1`). A job whose live loops all did is ending, not
/// hung (a torch 2 job's teardown may take longer than a short `--hang-after`).
fn winding_down(p: &crate::loops::ProcessMarks) -> bool {
    p.info().finishing
}

/// Whether every rank of `ranks` is ending (state `finishing`): no hang then.
pub fn all_finishing(ranks: &[RankAtHang]) -> bool {
    ranks.iter().all(|r| r.state == "finishing")
}

/// The process groups the loops of `markers` described (`group.<id>=<size>/<r0:r1:…>`), and
/// the job's world size as they said it: what a node tells the collector, which sees no
/// markers.
pub fn groups_said(markers: &MarkerLog) -> (BTreeMap<u32, Vec<u32>>, Option<u32>) {
    let mut groups = BTreeMap::new();
    for p in markers.procs.values() {
        for (key, value) in &p.meta {
            let Some(id) = key.strip_prefix("group.").and_then(|g| g.parse().ok()) else {
                continue;
            };
            let said = value.split_once('/').and_then(|(_, list)| {
                list.split(':')
                    .map(|r| r.parse::<u32>().ok())
                    .collect::<Option<Vec<u32>>>()
            });
            if let Some(ranks) = said {
                groups.insert(id, ranks);
            }
        }
    }
    let world = markers
        .procs
        .values()
        .filter_map(|p| p.info().world_size)
        .max();
    (groups, world)
}

/// The hang of `ranks` (sorted by rank): the collective entered last (the highest
/// (group, seq) any rank is inside), the ranks inside it and the members of its group
/// (`members`) that are not.
pub fn assemble(ranks: Vec<RankAtHang>, members: impl Fn(u32) -> BTreeSet<u32>) -> HangReport {
    let collective = ranks
        .iter()
        .filter_map(|r| r.collective.clone())
        .max_by(|a, b| (a.group, a.seq).cmp(&(b.group, b.seq)));
    let mut report = HangReport {
        last_iteration: ranks.iter().filter_map(|r| r.last_iteration).max(),
        ..HangReport::default()
    };
    if let Some(c) = &collective {
        report.waiting_ranks = ranks
            .iter()
            .filter(|r| r.collective.as_ref() == Some(c))
            .map(|r| r.rank)
            .collect();
        report.missing_ranks = members(c.group)
            .into_iter()
            .filter(|r| !report.waiting_ranks.contains(r))
            .collect();
    }
    report.collective = collective;
    report.ranks = ranks;
    report
}

/// The global ranks of group `group`, from any process's `group.<id>=<size>/<r0:r1:…>` meta;
/// without one, every rank of the job (by `world_size`) for the default group, or the ranks
/// seen.
fn group_ranks(markers: &MarkerLog, group: u32, seen: &[RankAtHang]) -> BTreeSet<u32> {
    let (groups, world) = groups_said(markers);
    members_of(&groups, world, group, seen)
}

/// The global ranks of group `group`: as `groups` says; else every rank of the job (by
/// `world`) for the default group; else the ranks seen.
pub fn members_of(
    groups: &BTreeMap<u32, Vec<u32>>,
    world: Option<u32>,
    group: u32,
    seen: &[RankAtHang],
) -> BTreeSet<u32> {
    if let Some(ranks) = groups.get(&group) {
        return ranks.iter().copied().collect();
    }
    match world {
        Some(n) if group == 0 => (0..n).collect(),
        _ => seen.iter().map(|r| r.rank).collect(),
    }
}

/// `RANK@NODE`, or the rank alone when its node is not known.
fn at_node(r: &RankAtHang) -> String {
    match &r.node {
        Some(node) => format!("{}@{node}", r.rank),
        None => r.rank.to_string(),
    }
}

impl Collective {
    /// `all_reduce #12 of group 0`.
    pub fn describe(&self) -> String {
        format!("{} #{} of group {}", self.op, self.seq, self.group)
    }
}

/// The hang in words, for stderr: who never arrived where, where each rank stands, and each
/// rank's stacks.
pub fn describe(report: &HangReport) -> String {
    let named = |rank: u32| {
        let node = report.ranks.iter().find(|r| r.rank == rank);
        match node.and_then(|r| r.node.as_deref()) {
            Some(node) => format!("{rank}@{node}"),
            None => rank.to_string(),
        }
    };
    let list = |ranks: &[u32]| {
        let names: Vec<String> = ranks.iter().map(|r| named(*r)).collect();
        let s = if ranks.len() == 1 { "" } else { "s" };
        format!("rank{s} {}", names.join(", "))
    };
    let mut out = format!(
        "stallscope: the job hangs: no rank finished an iteration for {:.0} s",
        report.stalled_seconds
    );
    if let Some(i) = report.last_iteration {
        out += &format!(" (the last: iteration {i})");
    }
    if let Some(c) = &report.collective {
        if !report.missing_ranks.is_empty() {
            out += &format!(
                "; {} never arrived at {}",
                list(&report.missing_ranks),
                c.describe()
            );
            if !report.waiting_ranks.is_empty() {
                let verb = if report.waiting_ranks.len() == 1 {
                    "waits"
                } else {
                    "wait"
                };
                out += &format!(" ({} {verb} in it)", list(&report.waiting_ranks));
            }
        } else {
            out += &format!("; every rank waits in {}", c.describe());
        }
    }
    out += ". The job goes on; stallscope does not stop it.";
    for r in &report.ranks {
        let place = match (&r.collective, r.state.as_str()) {
            (Some(c), _) => format!("inside {}", c.describe()),
            (None, "data_loading") => "stuck in data loading (waiting for a batch)".to_string(),
            (None, "no_answer") => "unknown: its node's agent did not answer".to_string(),
            (None, "finishing") => {
                "finishing (it destroyed its process group, or exits)".to_string()
            }
            _ => "in compute or code the hook does not mark".to_string(),
        };
        let last = r
            .last_iteration
            .map_or_else(|| "none".to_string(), |i| i.to_string());
        out += &format!(
            "\n  rank {} (pid {}): {place}; last iteration {last}",
            at_node(r),
            r.pid
        );
        if !r.has_hook && r.state != "no_answer" {
            out += "; no stallscope hook in it, so no stacks";
        }
    }
    for node in &report.unanswered_nodes {
        out += &format!("\n  node {node}: its agent did not answer, so its ranks' places and stacks are unknown");
    }
    for (rank, text) in &report.stacks {
        let rank = rank.parse().map_or_else(|_| rank.clone(), named);
        out += &format!("\n  rank {rank}'s Python stacks:");
        for line in text.lines() {
            out += &format!("\n    {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests;
