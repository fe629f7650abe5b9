//! Exposed network time of DDP's gradient all-reduce on another link rate or node count.
//!
//! DDP starts a bucket's all-reduce as soon as backward has made that bucket's gradients, and
//! the link serves the buckets one after another in that order. What stallscope measures as
//! network time is what is left of them once backward has ended (the next forward waits for
//! it). So a fast link that finishes a bucket before backward has made the next one idles in
//! between, and a slow one queues the buckets behind each other. Scaling the measured
//! transfer with the rate, as a first version did, counts that idle time as transfer, and so
//! predicts a slower link too slow wherever the measured one idled (a fast link, many
//! buckets: a real cluster). Here the buckets are replayed through the link at their measured
//! ready times instead, and the share of the nominal rate the run achieved is found from its
//! measured exposed time. (On the benchmark's local shapes the link never idles below
//! 1 Gbit/s, and the two agree: docs/BENCHMARKS.md.)

use super::catalog::Instance;
use super::measured::Measured;
use super::notes::Notes;

/// s, per-collective latency (α) assumed for the ring all-reduce when it cannot be measured:
/// TCP over Ethernet (gloo, NCCL sockets) is tens of µs per step.
pub const ALPHA_SECONDS: f64 = 50e-6;
/// Fraction of a link's nominal rate a ring reaches when none was measured (NCCL's bus
/// bandwidth on Ethernet is typically 60–80% of line rate).
pub const DEFAULT_LINK_EFFICIENCY: f64 = 0.7;

/// s, one ring all-reduce of `bytes` over `ranks` at `bytes_per_s` in `collectives` steps.
pub fn ring_seconds(bytes: f64, collectives: f64, ranks: u32, bytes_per_s: f64) -> f64 {
    if ranks <= 1 {
        return 0.0;
    }
    let w = ranks as f64;
    2.0 * (w - 1.0) * ALPHA_SECONDS * collectives + 2.0 * (w - 1.0) / w * bytes / bytes_per_s
}

/// Ranks per node of a job on `inst`: its GPUs, or for a CPU machine the measured ranks per
/// node.
pub fn ranks_per_node(m: &Measured, inst: &Instance) -> u32 {
    if inst.has_gpu() {
        inst.accelerator_count
    } else {
        (m.ranks / m.nodes.max(1)).max(1)
    }
}

/// s below which exposed communication counts as hidden behind backward: the link's rate then
/// has only a lower bound.
const HIDDEN_SECONDS: f64 = 1e-3;

/// Share of the nominal rate below which the link is not what bounded the measured transfer:
/// TCP over Ethernet reaches ~94% (1448 payload bytes of 1538 on the wire); the local shapes
/// measured 84–92% at 50–400 Mbit/s, and 47% at 1 Gbit/s, where two ranks sharing two cores
/// bound it instead.
const LOW_SHARE: f64 = 0.6;

/// The gradient buckets of one backward, in the order they became ready.
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    /// bytes of each bucket.
    pub bytes: Vec<f64>,
    /// s after the first bucket was ready at which each became ready (non-decreasing).
    pub ready: Vec<f64>,
    /// Whether the ready times were measured per bucket (else spread over the measured span).
    pub measured_ready: bool,
}

impl Buckets {
    /// The buckets as the profile has them; `None` without the gradient bytes per iteration.
    ///
    /// Sizes from the hook's `comm_bucket_kb`, else the bytes split evenly over the measured
    /// collectives; ready times from `comm_bucket_ready_ms`, else spread over the measured
    /// first-to-last span in proportion to the bytes backward made before each bucket.
    pub fn of(m: &Measured) -> Option<Buckets> {
        let total = m.comm_bytes_per_iteration.filter(|b| *b > 0.0)?;
        let mut bytes = match &m.bucket_bytes {
            Some(sizes) if !sizes.is_empty() => sizes.clone(),
            _ => {
                let k = m.collectives_per_iteration.unwrap_or(1.0).round().max(1.0);
                vec![total / k; k as usize]
            }
        };
        if m.compressed() {
            // The hook measured the buckets as DDP holds them (FP32); half of that is sent.
            bytes.iter_mut().for_each(|b| *b /= 2.0);
        }
        if let Some(ready) = m
            .bucket_ready_seconds
            .as_ref()
            .filter(|r| r.len() == bytes.len())
        {
            let mut latest: f64 = 0.0;
            let ready = ready
                .iter()
                .map(|r| {
                    latest = latest.max(*r);
                    latest
                })
                .collect();
            return Some(Buckets {
                bytes,
                ready,
                measured_ready: true,
            });
        }
        let span = m.comm_overlap_seconds.unwrap_or(0.0);
        let before_last: f64 = bytes[..bytes.len() - 1].iter().sum();
        let mut made = 0.0;
        let ready = bytes
            .iter()
            .map(|b| {
                let r = if before_last > 0.0 {
                    span * made / before_last
                } else {
                    0.0
                };
                made += b;
                r
            })
            .collect();
        Some(Buckets {
            bytes,
            ready,
            measured_ready: false,
        })
    }

    /// bytes over all buckets.
    pub fn total(&self) -> f64 {
        self.bytes.iter().sum()
    }

    /// s from the last bucket ready until every bucket is all-reduced over `ranks` at
    /// `bytes_per_s` per rank, the buckets served one after another, each when backward
    /// has made it; backward's times stretched by `backward_scale`.
    pub fn exposed(&self, ranks: u32, bytes_per_s: f64, backward_scale: f64) -> f64 {
        let mut done: f64 = 0.0;
        for (bytes, ready) in self.bytes.iter().zip(&self.ready) {
            done = done.max(ready * backward_scale) + ring_seconds(*bytes, 1.0, ranks, bytes_per_s);
        }
        let last = self.ready.last().copied().unwrap_or(0.0) * backward_scale;
        (done - last).max(0.0)
    }

    /// The share of `nominal_bytes_per_s` at which the buckets, replayed, leave `exposed` s
    /// after backward (the measured run's); with communication hidden behind backward, the
    /// least share that hides it (`hidden` set).
    pub fn efficiency(&self, ranks: u32, nominal_bytes_per_s: f64, exposed: f64) -> Efficiency {
        let at = |share: f64| self.exposed(ranks, share * nominal_bytes_per_s, 1.0);
        let hidden = exposed < HIDDEN_SECONDS;
        let target = exposed.max(HIDDEN_SECONDS * f64::from(u8::from(hidden)));
        let (mut lo, mut hi) = (1e-4_f64, 100.0_f64);
        if at(hi) > target {
            return Efficiency { share: hi, hidden };
        }
        // at() falls as the share grows: the least share that leaves at most `target`.
        for _ in 0..100 {
            let mid = (lo * hi).sqrt();
            if at(mid) > target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Efficiency { share: hi, hidden }
    }
}

/// The achieved share of a link's nominal rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Efficiency {
    /// Fraction of the nominal rate.
    pub share: f64,
    /// The communication was hidden behind backward: `share` is only a lower bound.
    pub hidden: bool,
}

impl Efficiency {
    /// The share the model takes: as measured, or for hidden communication the larger of its
    /// lower bound and [`DEFAULT_LINK_EFFICIENCY`].
    pub fn taken(&self) -> f64 {
        if self.hidden {
            self.share.max(DEFAULT_LINK_EFFICIENCY)
        } else {
            self.share
        }
    }
}

/// Exposed communication over the network, s per iteration, on `nodes` of `new`; backward's
/// bucket times scale with compute (`compute_ratio`).
pub(super) fn network(
    m: &Measured,
    cur: &Instance,
    new: &Instance,
    nodes: u32,
    compute_ratio: f64,
    notes: &mut Notes,
) -> f64 {
    let measured = m.breakdown.network;
    if nodes <= 1 {
        if measured > 0.0 {
            notes.assume(format!(
                "network: one node has none; the {measured:.3} s of network measured is left out"
            ));
        }
        return 0.0;
    }
    let Some(new_gbps) = new.network_gbps else {
        notes.extrapolate("the candidate's network rate is unknown: network kept as measured");
        return measured;
    };
    let ranks = nodes * ranks_per_node(m, new);
    let Some(buckets) = Buckets::of(m) else {
        if m.nodes > 1 {
            notes.assume("network scales with the nominal rate (gradient bytes not measured)");
            return match cur.network_gbps {
                Some(c) => measured * c / new_gbps,
                None => measured,
            };
        }
        if let Some(t) = sharded_and_p2p(m, new_gbps, ranks, notes) {
            return t;
        }
        notes.extrapolate(
            "gradient bytes per iteration not measured: network time unknown, taken as 0",
        );
        return 0.0;
    };
    let new_rate = new_gbps * 1e9 / 8.0;
    let (share, source) = match cur.network_gbps {
        Some(cur_gbps) if m.nodes > 1 => {
            let e = buckets.efficiency(m.ranks, cur_gbps * 1e9 / 8.0, measured);
            if e.hidden {
                let share = e.taken();
                notes.assume(format!(
                    "network: the measured all-reduce was hidden behind backward, so its rate is known only to be at least {:.0}% of nominal; {:.0}% taken",
                    e.share * 100.0,
                    share * 100.0
                ));
                (share, "at least what the measured run achieved")
            } else {
                if e.share < LOW_SHARE {
                    notes.extrapolate(format!(
                        "the measured run moved its gradients at only {:.0}% of the link's nominal {cur_gbps} Gbit/s: something else bounded the transfer (CPU, a slower peer, a congested path), so the time on another link is uncertain",
                        e.share * 100.0
                    ));
                }
                if e.share > 1.05 {
                    notes.assume(format!(
                        "network: the measured run moved its gradients at {:.0}% of the catalog's {cur_gbps} Gbit/s: is NetworkGbps right?",
                        e.share * 100.0
                    ));
                }
                (e.share, "what the measured run achieved")
            }
        }
        _ => {
            notes.extrapolate(format!(
                "{nodes} nodes but measured on one: the link's share of its nominal {new_gbps} Gbit/s taken as {:.0}%",
                DEFAULT_LINK_EFFICIENCY * 100.0
            ));
            (DEFAULT_LINK_EFFICIENCY, "typical of Ethernet, not measured")
        }
    };
    if m.nodes > 1 && nodes != m.nodes {
        notes.extrapolate(format!("{nodes} nodes; measured on {}", m.nodes));
    }
    if let Some(hook) = m.comm_hook.as_deref().filter(|_| m.compressed()) {
        notes.assume(format!(
            "network: the program's comm hook {hook} sends half the buckets' bytes"
        ));
    }
    notes.assume(format!(
        "network: ring all-reduce of {:.0} KiB in {} buckets served in the order backward made them ({}), α = {:.0} µs, at {:.0}% of the nominal rate ({source})",
        buckets.total() / 1024.0,
        buckets.bytes.len(),
        if buckets.measured_ready {
            "their ready times as measured".to_string()
        } else {
            format!(
                "spread over the measured {:.0} ms from first to last",
                m.comm_overlap_seconds.unwrap_or(0.0) * 1e3
            )
        },
        ALPHA_SECONDS * 1e6,
        share * 100.0
    ));
    buckets.exposed(ranks, share * new_rate, compute_ratio)
}

/// s per iteration over the network of a job without DDP measured on one node, on `ranks`
/// ranks over nodes at `gbps`: FSDP's all-gathers and reduce-scatters over every rank, and a
/// pipeline's activations across the boundary between two nodes' stages (`super::sharded`),
/// at [`DEFAULT_LINK_EFFICIENCY`] of the nominal rate; `None` when the job had neither.
fn sharded_and_p2p(m: &Measured, gbps: f64, ranks: u32, notes: &mut Notes) -> Option<f64> {
    if m.sharded_bytes_per_iteration.is_none() && m.p2p_bytes_per_iteration.is_none() {
        return None;
    }
    let rate = DEFAULT_LINK_EFFICIENCY * gbps * 1e9 / 8.0;
    notes.extrapolate(format!(
        "measured on one node: the link's share of its nominal {gbps} Gbit/s taken as {:.0}%",
        DEFAULT_LINK_EFFICIENCY * 100.0
    ));
    let mut t = 0.0;
    if let (Some(bytes), Some(ops)) = (
        m.sharded_bytes_per_iteration,
        m.sharded_collectives_per_iteration,
    ) {
        t += super::sharded::sharded_seconds(m, ranks, rate);
        notes.assume(format!(
            "network: FSDP's {ops:.0} all-gathers and reduce-scatters of {:.1} MB per iteration as rings over all {ranks} ranks, α = {:.0} µs, all exposed (an upper bound: prefetching hides part)",
            bytes / 1e6,
            ALPHA_SECONDS * 1e6
        ));
    }
    if let (Some(bytes), Some(ops)) = (m.p2p_bytes_per_iteration, m.p2p_ops_per_iteration) {
        t += super::sharded::p2p_seconds(m, rate);
        notes.assume(format!(
            "network: the pipeline's stages span the nodes; the stage at a node boundary sends and receives {:.1} kB of activations and gradients per iteration in {ops:.0} operations across it, on the critical path",
            bytes / 1e3
        ));
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advisor::measured::Breakdown;

    const MBIT: f64 = 1e6 / 8.0;

    /// Two nodes, one rank each: a 1 MB bucket ready first, a 3.9 MB one `span` s later.
    fn two_buckets(exposed: f64, span: f64, ready: bool) -> Measured {
        Measured {
            iteration_seconds: 0.1 + exposed,
            breakdown: Breakdown {
                compute: 0.1,
                network: exposed,
                ..Default::default()
            },
            ranks: 2,
            nodes: 2,
            comm_bytes_per_iteration: Some(4.9e6),
            collectives_per_iteration: Some(2.0),
            bucket_bytes: Some(vec![1e6, 3.9e6]),
            bucket_ready_seconds: ready.then(|| vec![0.0, span]),
            comm_overlap_seconds: Some(span),
            ..Default::default()
        }
    }

    fn link(mbit: f64) -> Instance {
        let csv = format!(
            "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,NetworkGbps\nnet{mbit},,0,2,4,1.0,{}\n",
            mbit / 1e3
        );
        super::super::parse_instances(&csv).unwrap().remove(0)
    }

    fn predict(m: &Measured, from: f64, to: f64) -> (f64, Notes) {
        let mut notes = Notes::default();
        let t = network(m, &link(from), &link(to), 2, 1.0, &mut notes);
        (t, notes)
    }

    #[test]
    fn a_fast_link_that_idled_between_buckets_is_not_scaled_as_if_it_had_been_busy() {
        // At 400 Mbit/s the first bucket is done (20 ms) long before backward makes the
        // second (47 ms): the 83 ms exposed are the second bucket alone, at 94% of nominal.
        let m = two_buckets(0.083, 0.047, true);
        let (slow, _) = predict(&m, 400.0, 100.0);
        // At 100 Mbit/s the link is busy from the first bucket on: all 4.9 MB at that share,
        // less the 47 ms backward still ran.
        let share = 3.9e6 / 0.083 / (400.0 * MBIT);
        let busy = 4.9e6 / (share * 100.0 * MBIT) - 0.047;
        assert!((slow - busy).abs() < 0.002, "{slow} against {busy}");
        // Scaling exposed + span (130 ms) by 4 and taking the span off again gave 0.473 s.
        assert!(slow < 0.40, "{slow}");
    }

    #[test]
    fn the_measured_link_predicts_itself() {
        for (exposed, span, mbit) in [
            (0.083, 0.047, 400.0),
            (0.401, 0.031, 100.0),
            (0.9, 0.03, 50.0),
            (0.2, 0.0, 200.0),
        ] {
            for ready in [true, false] {
                let m = two_buckets(exposed, span, ready);
                let (same, _) = predict(&m, mbit, mbit);
                assert!((same - exposed).abs() < 1e-6, "{same} for {exposed}");
            }
        }
    }

    #[test]
    fn communication_hidden_behind_backward_gives_only_a_lower_bound_on_the_rate() {
        // 4.9 MB made early in a 2 s backward and a 1 kB bucket at its end, nothing exposed
        // at 400 Mbit/s: the link reached at least 5% of nominal, and 70% is taken.
        let m = Measured {
            bucket_bytes: Some(vec![4.899e6, 1e3]),
            ..two_buckets(0.0, 2.0, true)
        };
        let (slow, notes) = predict(&m, 400.0, 5.0);
        let said = notes.assumptions.join("\n");
        assert!(said.contains("hidden behind backward"), "{said}");
        assert!(said.contains("at least 5%"), "{said}");
        // At 5 Mbit/s the first bucket outlasts backward by the rest of its transfer.
        let expect = 4.9e6 / (DEFAULT_LINK_EFFICIENCY * 5.0 * MBIT) - 2.0;
        assert!((slow - expect).abs() < 0.01, "{slow} against {expect}");
    }

    #[test]
    fn a_link_far_below_its_nominal_rate_makes_the_prediction_uncertain() {
        // The net1000 shape's profile: 2.5 and 2.4 MB buckets 42 ms apart, 45 ms exposed at
        // 1 Gbit/s: the link busy throughout at 45% of nominal.
        let m = Measured {
            bucket_bytes: Some(vec![2.505e6, 2.411e6]),
            ..two_buckets(0.045, 0.042, true)
        };
        let (_, notes) = predict(&m, 1000.0, 100.0);
        let said = notes.extrapolations.join("\n");
        assert!(said.contains("only 4"), "{said}");
        let (_, fine) = predict(&two_buckets(0.083, 0.047, true), 400.0, 100.0);
        assert!(fine.extrapolations.is_empty(), "{:?}", fine.extrapolations);
    }

    #[test]
    fn ready_times_not_sent_are_spread_over_the_measured_span_by_bytes() {
        let m = Measured {
            bucket_bytes: Some(vec![1e6, 2e6, 3e6]),
            comm_bytes_per_iteration: Some(6e6),
            comm_overlap_seconds: Some(0.03),
            ..two_buckets(0.1, 0.03, false)
        };
        let b = Buckets::of(&m).unwrap();
        assert_eq!(b.ready, vec![0.0, 0.01, 0.03]);
        assert!(!b.measured_ready);
        // Without sizes, the bytes are split evenly over the collectives.
        let even = Buckets::of(&Measured {
            bucket_bytes: None,
            ..two_buckets(0.1, 0.03, false)
        })
        .unwrap();
        assert_eq!(even.bytes, vec![2.45e6, 2.45e6]);
        assert_eq!(even.ready, vec![0.0, 0.03]);
    }

    #[test]
    fn an_fsdp_job_measured_on_one_node_pays_its_gathers_and_scatters_on_two() {
        // 2 ranks on one node, per iteration 8 all-gathers and 4 reduce-scatters, 3 MB in all.
        let m = Measured {
            nodes: 1,
            ranks: 2,
            sharded_bytes_per_iteration: Some(3e6),
            sharded_collectives_per_iteration: Some(12.0),
            ..Measured::default()
        };
        let mut notes = Notes::default();
        // 2 nodes of 2 ranks (CPU instances keep the measured ranks per node): 4 ranks.
        let t = network(&m, &link(400.0), &link(100.0), 2, 1.0, &mut notes);
        let rate = DEFAULT_LINK_EFFICIENCY * 100.0 * MBIT;
        let expect = 3.0 * ALPHA_SECONDS * 12.0 + 0.75 * 3e6 / rate;
        assert!((t - expect).abs() < 1e-9, "{t} against {expect}");
        assert!(
            notes.assumptions.join(" ").contains("FSDP's 12"),
            "{:?}",
            notes.assumptions
        );
        let one = network(&m, &link(400.0), &link(100.0), 1, 1.0, &mut notes);
        assert_eq!(one, 0.0, "one node has no network");
    }

    #[test]
    fn a_pipeline_measured_on_one_node_sends_its_activations_across_the_boundary() {
        let m = Measured {
            nodes: 1,
            ranks: 2,
            p2p_bytes_per_iteration: Some(131_072.0),
            p2p_ops_per_iteration: Some(8.0),
            ..Measured::default()
        };
        let mut notes = Notes::default();
        let t = network(&m, &link(400.0), &link(100.0), 2, 1.0, &mut notes);
        let expect = ALPHA_SECONDS * 8.0 + 131_072.0 / (DEFAULT_LINK_EFFICIENCY * 100.0 * MBIT);
        assert!((t - expect).abs() < 1e-9, "{t} against {expect}");
        assert!(
            notes.assumptions.join(" ").contains("node boundary"),
            "{:?}",
            notes.assumptions
        );
    }

    #[test]
    fn measured_on_one_node_the_link_share_is_assumed_and_said() {
        let m = Measured {
            nodes: 1,
            ranks: 1,
            ..two_buckets(0.0, 0.047, true)
        };
        let (t, notes) = predict(&m, 400.0, 100.0);
        let expect = 4.9e6 / (DEFAULT_LINK_EFFICIENCY * 100.0 * MBIT) - 0.047;
        assert!((t - expect).abs() < 0.002, "{t} against {expect}");
        assert!(notes.extrapolations.join(" ").contains("measured on one"));
    }
}
