//! The job's hang watch across nodes: when no rank of the job finishes an iteration for the
//! hang threshold, ask every agent where its ranks stand, and fold the answers into one hang.
//!
//! The collector sees iterations, not markers: which collective a rank is inside, whether it
//! waits for a batch, and its Python stacks are known only on its node. So a stall is a
//! question first — [`HangAction::Ask`], which every agent's connection passes on as
//! `CollectorMsg::Stacks` — and a hang once the answers are in ([`Frame::NodeHang`], one per
//! node) or [`ANSWER_WAIT`] has passed: the collective entered last across the job, the ranks
//! waiting in it and the ones missing, as `RANK@NODE`, and every rank's stacks. A stall in
//! which no agent has a live training loop, or only loops that said they are finishing (the
//! job ended, its agents stay) is no hang, and is not asked about again until iterations come. The job is never touched.
//!
//! [`Frame::NodeHang`]: stallscope_analysis::frame::Frame::NodeHang

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use stallscope_analysis::fast_hash::FastMap;

use stallscope_analysis::hang::{
    all_finishing, assemble, members_of, HangEvent, HangReport, HangWatch, NodeHang, RankAtHang,
};
use stallscope_analysis::Nanos;

/// ns the collector waits for the agents' answers before it declares the hang with what came
/// (an agent waits up to 1 s for its ranks' stack dumps).
pub const ANSWER_WAIT_NS: Nanos = 5_000_000_000;

/// What the job task does after a check.
#[derive(Clone, Debug, PartialEq)]
pub enum HangAction {
    /// Ask every agent where its ranks stand (request `id`).
    Ask(u64),
    /// A hang, declared; `answered_after_seconds`: s from the request to the last answer
    /// (`None` when no agent answered).
    Declared {
        /// The hang.
        report: Box<HangReport>,
        /// s from the request to the last answer taken.
        answered_after_seconds: Option<f64>,
    },
    /// The declared hang ended: an iteration came (its report, `resumed_after_seconds` set).
    Resumed(Box<HangReport>),
}

/// A request out, its answers coming in.
#[derive(Debug)]
struct Asking {
    id: u64,
    asked_ns: Nanos,
    /// The nodes connected when asked.
    nodes: BTreeSet<String>,
    /// Answers, by node, with when each came (ns).
    answers: BTreeMap<String, (NodeHang, Nanos)>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct JobHangs {
    watch: HangWatch,
    /// Latest iteration per node, then rank: looked up by the node's name without making a
    /// `String` of it for every iteration (300,000 a second at 10,000 ranks), and hashed: a
    /// tree of 1,250 nodes compared ten names a look-up, and names share long prefixes.
    latest: FastMap<String, FastMap<u32, u64>>,
    asking: Option<Asking>,
    last_id: u64,
    /// The hang declared and not resumed.
    declared: Option<HangReport>,
    /// The agents said no loop runs: ask again only after an iteration.
    quiet: bool,
}

impl JobHangs {
    /// A watch declaring a hang after `after_ns` without an iteration (`None`: the default,
    /// see [`HangWatch::new`]).
    pub fn new(after_ns: Option<Nanos>) -> JobHangs {
        JobHangs {
            watch: HangWatch::new(after_ns),
            ..JobHangs::default()
        }
    }

    /// Takes rank `rank`'s iteration `iter` from `node`, `duration_ns` long, arrived at `now`
    /// (the collector's clock). One already seen (an agent resending) is no progress.
    pub fn on_iteration(
        &mut self,
        node: &str,
        rank: u32,
        iter: u64,
        duration_ns: Nanos,
        now: Nanos,
    ) {
        self.on_iterations(node, [(rank, iter, duration_ns)], now);
    }

    /// [`JobHangs::on_iteration`] of each of `iterations` (rank, iteration, ns long) from
    /// `node`, all arrived at `now`: the node is looked up once (an agent's write holds a step
    /// of each of its ranks; by name, per iteration, that was a hash of a string 300,000
    /// times a second at 10,000 ranks).
    pub fn on_iterations(
        &mut self,
        node: &str,
        iterations: impl IntoIterator<Item = (u32, u64, Nanos)>,
        now: Nanos,
    ) {
        let ranks = match self.latest.get_mut(node) {
            Some(ranks) => ranks,
            None => self.latest.entry(node.to_string()).or_default(),
        };
        let mut progressed = false;
        for (rank, iter, duration_ns) in iterations {
            match ranks.entry(rank) {
                Entry::Occupied(latest) if *latest.get() >= iter => continue,
                Entry::Occupied(mut latest) => {
                    latest.insert(iter);
                }
                Entry::Vacant(v) => {
                    v.insert(iter);
                }
            }
            self.watch.observe(Some(duration_ns), now);
            progressed = true;
        }
        if progressed {
            self.asking = None;
            self.quiet = false;
        }
    }

    /// Takes a node's answer, arrived at `now`; answers to an older request are dropped.
    pub fn on_answer(&mut self, answer: NodeHang, now: Nanos) {
        if let Some(a) = self.asking.as_mut().filter(|a| a.id == answer.id) {
            a.answers.insert(answer.node.clone(), (answer, now));
        }
    }

    /// What to do at `now` (the collector's clock; the job started at `started_ns`), with
    /// `nodes` connected.
    pub fn check(
        &mut self,
        now: Nanos,
        started_ns: Nanos,
        nodes: &BTreeSet<String>,
    ) -> Option<HangAction> {
        if let Some(HangEvent::Resumed { after_seconds, .. }) = self.watch.resumed() {
            let mut report = self.declared.take()?;
            report.resumed_after_seconds = Some(after_seconds);
            return Some(HangAction::Resumed(Box::new(report)));
        }
        if let Some(a) = &self.asking {
            let all_in = a
                .nodes
                .iter()
                .all(|n| a.answers.contains_key(n) || !nodes.contains(n));
            if !all_in && now.saturating_sub(a.asked_ns) < ANSWER_WAIT_NS {
                return None;
            }
            let a = self.asking.take()?;
            return self.declare(a, now, started_ns);
        }
        if self.quiet || nodes.is_empty() {
            return None;
        }
        self.watch.stalled_ns(now)?;
        self.last_id += 1;
        self.asking = Some(Asking {
            id: self.last_id,
            asked_ns: now,
            nodes: nodes.clone(),
            answers: BTreeMap::new(),
        });
        Some(HangAction::Ask(self.last_id))
    }

    /// The hang the answers of `a` make, or none when every answer says no loop runs.
    fn declare(&mut self, a: Asking, now: Nanos, started_ns: Nanos) -> Option<HangAction> {
        let no_loop = a.answers.values().all(|(h, _)| all_finishing(&h.ranks));
        if no_loop && !a.answers.is_empty() {
            self.quiet = true;
            return None;
        }
        let mut ranks: Vec<RankAtHang> = a
            .answers
            .values()
            .flat_map(|(h, _)| h.ranks.iter().cloned())
            .collect();
        let unanswered: Vec<String> = a
            .nodes
            .iter()
            .filter(|n| !a.answers.contains_key(*n))
            .cloned()
            .collect();
        // By node name, then rank: a rank two unanswered nodes both ran is named with the
        // first, whatever the map's order.
        let mut latest: Vec<(&String, &u32, &u64)> = self
            .latest
            .iter()
            .flat_map(|(node, ranks)| ranks.iter().map(move |(rank, iter)| (node, rank, iter)))
            .collect();
        latest.sort_unstable();
        for (node, rank, iter) in latest {
            if unanswered.contains(node) && !ranks.iter().any(|r| r.rank == *rank) {
                ranks.push(RankAtHang {
                    rank: *rank,
                    pid: 0,
                    last_iteration: Some(*iter),
                    state: "no_answer".into(),
                    collective: None,
                    has_hook: false,
                    node: Some(node.clone()),
                });
            }
        }
        ranks.sort_by_key(|r| r.rank);
        let mut groups = BTreeMap::new();
        for (h, _) in a.answers.values() {
            groups.extend(h.groups.clone());
        }
        let world = a.answers.values().filter_map(|(h, _)| h.world_size).max();
        let seen = ranks.clone();
        let mut report = assemble(ranks, |g| members_of(&groups, world, g, &seen));
        let at = |rank: &u32| match seen
            .iter()
            .find(|r| r.rank == *rank)
            .and_then(|r| r.node.as_ref())
        {
            Some(node) => format!("{rank}@{node}"),
            None => rank.to_string(),
        };
        report.missing_at = report.missing_ranks.iter().map(at).collect();
        report.waiting_at = report.waiting_ranks.iter().map(at).collect();
        report.unanswered_nodes = unanswered;
        for (h, _) in a.answers.values() {
            report.stacks.extend(h.stacks.clone());
        }
        let stalled = self.watch.stalled_ns(now).unwrap_or_default();
        report.stalled_seconds = stalled as f64 / 1e9;
        report.at_seconds = now.saturating_sub(started_ns) as f64 / 1e9;
        self.watch.declare(report.at_seconds, now);
        self.declared = Some(report.clone());
        let answered = a.answers.values().map(|(_, at)| *at).max();
        Some(HangAction::Declared {
            report: Box::new(report),
            answered_after_seconds: answered.map(|t| t.saturating_sub(a.asked_ns) as f64 / 1e9),
        })
    }
}

#[cfg(test)]
mod tests;
