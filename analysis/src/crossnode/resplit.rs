//! Splitting a node's exposed communication again once every rank's arrival is known: the
//! wait for the rank that arrived last is `peer_wait`, the rest the transfer, divided between
//! network and interconnect as the node measured. CPU-timed ranks by their collectives'
//! begins; CUDA-timed ranks by the exposed all-reduce each GPU saw.

use crate::attribution::{is_comm, Basis, Evidence, IterationBreakdown};
use crate::category::{apportion_array, Category, Split};
use crate::Nanos;

/// ns of exposed all-reduce the rank's GPU saw (CUDA events), when it was timed.
pub(super) fn gpu_exposed_comm(b: &IterationBreakdown) -> Option<u64> {
    let gpu = |basis: Basis| matches!(basis, Basis::GpuExposedComm | Basis::GpuSlowestPeer);
    b.evidence.iter().any(|e| gpu(e.basis)).then(|| {
        b.evidence
            .iter()
            .filter(|e| gpu(e.basis))
            .map(|e| e.ns)
            .sum()
    })
}

/// Who held whom up, from the exposed all-reduce each GPU saw (rank, ns): the rank that
/// arrived last waited least, and held the next one up by the difference.
pub(super) fn held_by_least_exposed(
    gpu_comm: impl Iterator<Item = (u32, u64)>,
) -> Option<(u32, u64)> {
    let mut by_wait: Vec<(u64, u32)> = gpu_comm.map(|(r, c)| (c, r)).collect();
    by_wait.sort_unstable();
    match by_wait[..] {
        [(least, rank), (next, _), ..] => Some((rank, next - least)),
        _ => None,
    }
}

/// Splits the exposed all-reduce of a GPU-timed breakdown again, given the least any rank of
/// the job saw (`fastest`, ns): that much is the transfer, in the proportion of network to
/// interconnect the node measured; the rest is waiting for the rank that arrived last. The
/// other categories are kept; the parts still sum to the wall time.
pub fn resplit_gpu(b: &IterationBreakdown, fastest: u64, across_nodes: bool) -> IterationBreakdown {
    resplit_gpu_owned(b.clone(), fastest, across_nodes)
}

/// [`resplit_gpu`] of a breakdown the caller no longer needs: its evidence is changed in
/// place, not copied (the join takes 300,000 a second at 10,000 ranks).
pub(super) fn resplit_gpu_owned(
    b: IterationBreakdown,
    fastest: u64,
    across_nodes: bool,
) -> IterationBreakdown {
    let Some(exposed) = gpu_exposed_comm(&b) else {
        return b;
    };
    let transfer = fastest.min(exposed);
    let measured = |c: Category| -> f64 {
        b.evidence
            .iter()
            .filter(|e| e.basis == Basis::GpuExposedComm && e.category == c)
            .map(|e| e.ns as f64)
            .sum()
    };
    let (net_ns, local_ns) = split_transfer(
        transfer,
        [
            measured(Category::Network),
            measured(Category::Interconnect),
        ],
        across_nodes,
    );
    with_comm(
        b,
        |basis| matches!(basis, Basis::GpuExposedComm | Basis::GpuSlowestPeer),
        [
            (
                Category::PeerWait,
                Basis::GpuSlowestPeer,
                exposed - transfer,
            ),
            (Category::Network, Basis::GpuExposedComm, net_ns),
            (Category::Interconnect, Basis::GpuExposedComm, local_ns),
        ],
    )
}

/// `transfer` ns divided between network and interconnect in the proportion `weights`
/// (network, interconnect); with no weight, all network across nodes, else all interconnect.
/// One weight alone takes it all, as [`apportion_array`] would give it, without its
/// arithmetic (the join divides a transfer per rank-iteration, and a node's collectives
/// nearly always cross one kind of link).
fn split_transfer(transfer: u64, weights: [f64; 2], across_nodes: bool) -> (u64, u64) {
    let weighs = |w: f64| w.is_finite() && w > 0.0;
    match (weighs(weights[0]), weighs(weights[1])) {
        (true, false) => (transfer, 0),
        (false, true) => (0, transfer),
        (false, false) if across_nodes => (transfer, 0),
        (false, false) => (0, transfer),
        (true, true) => match apportion_array(transfer, weights) {
            Some(v) => (v[0], v[1]),
            None if across_nodes => (transfer, 0),
            None => (0, transfer),
        },
    }
}

/// `b` with the evidence `replaced` says is its exposed communication put back as `parts`
/// (those of 0 ns left out), and its split summed again from the evidence.
fn with_comm(
    mut b: IterationBreakdown,
    replaced: fn(Basis) -> bool,
    parts: [(Category, Basis, u64); 3],
) -> IterationBreakdown {
    b.evidence.retain(|e| !replaced(e.basis));
    b.evidence.extend(
        parts
            .into_iter()
            .filter(|p| p.2 > 0)
            .map(|(category, basis, ns)| Evidence {
                category,
                basis,
                ns,
            }),
    );
    let mut split = Split::default();
    for e in &b.evidence {
        split.add(e.category, e.ns);
    }
    b.split = split;
    b
}

/// Splits the exposed communication of one breakdown again, given its collectives
/// (`own`, collector clock) and when the last rank of the job began each (`latest`).
/// The other categories are kept; the parts still sum to the wall time.
pub fn resplit(
    b: &IterationBreakdown,
    own: &[(Nanos, Nanos)],
    latest: &[Option<Nanos>],
    across_nodes: bool,
) -> IterationBreakdown {
    resplit_owned(b.clone(), own, latest, across_nodes)
}

/// [`resplit`] of a breakdown the caller no longer needs: its evidence is changed in place,
/// not copied.
pub(super) fn resplit_owned(
    b: IterationBreakdown,
    own: &[(Nanos, Nanos)],
    latest: &[Option<Nanos>],
    across_nodes: bool,
) -> IterationBreakdown {
    // One pass over the evidence: the exposed communication, and what the node measured
    // over each kind of link (every basis read here is communication's).
    let (mut exposed, mut nic, mut local) = (0u64, 0.0, 0.0);
    for e in b.evidence.iter().filter(|e| is_comm(e.basis)) {
        exposed += e.ns;
        match (e.basis, e.category) {
            (Basis::CommNicBytes, _) | (Basis::CommNoBytes, Category::Network) => {
                nic += e.ns as f64
            }
            (Basis::CommLocalBytes | Basis::CommGpuLinkBytes, _)
            | (Basis::CommNoBytes, Category::Interconnect) => local += e.ns as f64,
            _ => {}
        }
    }
    if exposed == 0 {
        return b;
    }
    let waited: u64 = own
        .iter()
        .zip(latest)
        .map(|((begin, end), last)| match last {
            Some(l) if l > begin => (l.min(end)) - begin,
            _ => 0,
        })
        .sum::<u64>()
        .min(exposed);
    let (net_ns, local_ns) = split_transfer(exposed - waited, [nic, local], across_nodes);
    with_comm(
        b,
        is_comm,
        [
            (Category::PeerWait, Basis::PeerArrival, waited),
            (Category::Network, Basis::CommNicBytes, net_ns),
            (Category::Interconnect, Basis::CommLocalBytes, local_ns),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcut for one weight alone gives what the apportioning gives, whatever the
    /// weights (zero, negative, infinite, NaN) and transfers (past 2^53, where `f64` rounds).
    #[test]
    fn a_transfer_is_split_as_the_apportioning_splits_it() {
        let weights = [
            0.0,
            -0.0,
            1.0,
            3.5,
            1e12,
            -2.0,
            f64::INFINITY,
            f64::NAN,
            1e-300,
        ];
        let transfers = [0, 1, 7, 1_000_003, (1 << 53) + 1, u64::MAX / 3];
        for &a in &weights {
            for &b in &weights {
                for &t in &transfers {
                    for across in [false, true] {
                        let want = match apportion_array(t, [a, b]) {
                            Some(v) => (v[0], v[1]),
                            None if across => (t, 0),
                            None => (0, t),
                        };
                        assert_eq!(split_transfer(t, [a, b], across), want, "{t} {a} {b}");
                    }
                }
            }
        }
    }
}
