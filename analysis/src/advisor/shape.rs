//! How many ranks and nodes the measured job had.
//!
//! A user profiles a multi-node job with `stallscope run` on each node, so one profile holds
//! one node's ranks; a collector's job profile holds the ranks of the agents it heard from.
//! Neither is the job's size. The ranks say it themselves in the hook's meta: `world_size`
//! (torch.distributed) and `local_world_size` (torchrun's `LOCAL_WORLD_SIZE`), so the job has
//! `world_size` ranks on `world_size / local_world_size` nodes. Host names only cross-check
//! that: nodes in network namespaces (or containers sharing the host's UTS namespace) share
//! one name, and a profile of one node names one host whatever the job's size. A job read as
//! smaller than it was predicts its own measured network away (one node needs none).

use super::measured::Measured;

/// What the measurement was made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// One `stallscope run` profile: one node's ranks.
    Run,
    /// A collector's job profile: the ranks of every agent it heard from.
    Job,
    /// Several run profiles pooled (`advisor::pool`): `profiles` of them, the most nodes any
    /// one of them was read as `most_nodes`.
    Pooled {
        /// Run profiles pooled.
        profiles: usize,
        /// The most nodes any of them was read as.
        most_nodes: u32,
    },
}

/// Sets `m.ranks`, `m.nodes` and `m.nodes_from` from the ranks' meta (`m.world_size`,
/// `m.local_world_size`), the ranks the profile holds (`m.ranks_measured`) and the hosts it
/// names (`m.hosts`), and says in `m.node_count_notes` where they disagree.
pub(super) fn settle(m: &mut Measured, source: Source) {
    m.node_count_notes.clear();
    let held = m.ranks_measured.max(1);
    let hosts = m.hosts.len() as u32;
    m.ranks = m.world_size.unwrap_or(0).max(held);
    let from_meta = match (m.world_size, m.local_world_size) {
        (Some(w), Some(l)) if l > 0 => {
            if w % l != 0 {
                m.node_count_notes.push(format!(
                    "world_size {w} is not a multiple of local_world_size {l}: nodes rounded up"
                ));
            }
            Some((
                w.div_ceil(l),
                format!("world_size {w} / local_world_size {l}"),
            ))
        }
        _ => None,
    };
    let inferred = match (source, m.world_size) {
        // A run profile holds every rank of its node: the rest are on other nodes.
        (Source::Run, Some(w)) if w > held => Some((
            w.div_ceil(held),
            format!(
                "world_size {w} over the {held} rank(s) this node's profile holds (the ranks did not say local_world_size)"
            ),
        )),
        _ => None,
    };
    let by_hosts = match source {
        Source::Pooled { most_nodes, .. } if most_nodes > hosts => (
            most_nodes,
            "the node count its profiles were read as".to_string(),
        ),
        _ => (hosts.max(1), "distinct host names".to_string()),
    };
    let told = from_meta.is_some();
    let (nodes, how) = from_meta.or(inferred).unwrap_or(by_hosts);
    m.nodes = nodes;
    m.nodes_from = how;
    cross_check(m, source, hosts, told);
    if source == Source::Run && m.nodes > 1 {
        m.node_count_notes.push(format!(
            "this profile holds {held} of the job's {} ranks (one node's): predictions are for the whole job, its other nodes taken as like this one",
            m.ranks
        ));
    }
}

/// Says where the host names disagree with the node count the ranks gave (`told`).
fn cross_check(m: &mut Measured, source: Source, hosts: u32, told: bool) {
    let nodes = m.nodes;
    let names = m.hosts.join(", ");
    match source {
        Source::Job if told && hosts != nodes => m.node_count_notes.push(format!(
            "the collector heard from {hosts} node(s) ({names}); the ranks' meta says the job has {nodes}: {nodes} taken"
        )),
        Source::Pooled { profiles, .. } if hosts < profiles as u32 && (told || hosts > 1) => {
            m.node_count_notes.push(format!(
                "{profiles} profiles name {hosts} host name(s) ({names}): network namespaces and containers share their host's name; {nodes} node(s) taken from {}",
                m.nodes_from
            ))
        }
        Source::Pooled { .. } if told && hosts > nodes => m.node_count_notes.push(format!(
            "the profiles name {hosts} hosts ({names}), more than the {nodes} nodes the ranks' meta gives: {nodes} taken"
        )),
        _ => {}
    }
}

/// `--measured-nodes`: the user's node count over the profile's, said where it contradicts
/// what the profile told. The job keeps its ranks (at least one per node).
pub fn override_nodes(m: &mut Measured, nodes: u32) {
    let nodes = nodes.max(1);
    if nodes != m.nodes {
        m.node_count_notes.push(format!(
            "--measured-nodes {nodes} contradicts the profile's {} node(s) ({}): {nodes} taken",
            m.nodes, m.nodes_from
        ));
    }
    m.nodes = nodes;
    m.ranks = m.ranks.max(nodes);
    m.nodes_from = "--measured-nodes".into();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(world: Option<u32>, local: Option<u32>, held: u32) -> Measured {
        let mut m = Measured {
            world_size: world,
            local_world_size: local,
            ranks_measured: held,
            hosts: vec!["node0".into()],
            ..Default::default()
        };
        settle(&mut m, Source::Run);
        m
    }

    #[test]
    fn nodes_are_world_size_over_local_world_size() {
        let m = run(Some(4), Some(2), 2);
        assert_eq!((m.ranks, m.nodes), (4, 2));
        assert_eq!(m.nodes_from, "world_size 4 / local_world_size 2");
        assert!(m.node_count_notes[0].contains("holds 2 of the job's 4 ranks"));
        let single = run(Some(2), Some(2), 2);
        assert_eq!((single.ranks, single.nodes), (2, 1));
        assert!(single.node_count_notes.is_empty());
    }

    #[test]
    fn without_local_world_size_a_run_profile_holds_its_nodes_ranks() {
        let m = run(Some(2), None, 1);
        assert_eq!((m.ranks, m.nodes), (2, 2));
        assert!(m.nodes_from.contains("did not say local_world_size"));
        // Without any meta: one profile, one host, one node.
        assert_eq!(run(None, None, 3).nodes, 1);
    }

    #[test]
    fn measured_nodes_overrides_and_says_it_contradicts() {
        let mut m = run(Some(4), Some(2), 2);
        override_nodes(&mut m, 4);
        assert_eq!((m.ranks, m.nodes), (4, 4));
        let said = m.node_count_notes.join("\n");
        assert!(said.contains("--measured-nodes 4 contradicts the profile's 2 node(s) (world_size 4 / local_world_size 2)"), "{said}");
        let mut same = run(Some(4), Some(2), 2);
        override_nodes(&mut same, 2);
        assert_eq!(
            same.node_count_notes.len(),
            1,
            "{:?}",
            same.node_count_notes
        );
    }
}
