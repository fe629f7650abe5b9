//! The two samplers' batches, put back in time order before the journal takes them.
//!
//! Why: the node has two sampler threads, the CPU one and the GPU one (NVML calls block, so
//! the GPU sources have a thread of their own), and both put their batches in one inbox. Each
//! thread's batches come in time order, but not the two together: with the eBPF thread
//! states the CPU sampler wakes ten times a second and sends the 100 Hz instants of the
//! last 100 ms at once ([`crate::sampler`]), while the GPU sampler sends one batch every
//! 10 ms. The timeline drops a batch older than the newest it holds (a series must not go
//! back in time), so 40% of the CPU batches were lost on a node with a GPU, and an
//! iteration was attributed as soon as a GPU batch passed its end, before the CPU's samples
//! of it came: 15–20% of such a run was `other` ("nothing seen explains it"), and a
//! rank whose samples came late for a while looked like it had turned slow.
//!
//! [`SampleMerge`] holds each thread's batches and gives them back in time order, up to the
//! newest instant both threads have reached. A thread that has sent nothing for
//! [`MAX_LAG_NS`] while the other went on (a GPU source that stopped reading, an NVML call
//! that blocks) holds nothing back: the other's batches go on past it, and its late ones are
//! the timeline's to drop, as before.

use std::collections::VecDeque;

use stallscope_analysis::series::{SampleBatch, SeriesDecl};
use stallscope_analysis::Nanos;

/// The sampler thread a batch came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The CPU sampler: processes, threads, disks, NICs, flows.
    Cpu,
    /// The GPU sampler (NVML).
    Gpu,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Stream::Cpu => 0,
            Stream::Gpu => 1,
        }
    }
}

/// ns a thread may fall behind the other's newest batch before it holds nothing back.
pub const MAX_LAG_NS: Nanos = 1_000_000_000;

/// One round of a sampler: the series it declared first, and its values.
pub type Round = (Vec<SeriesDecl>, SampleBatch);

/// Both threads' batches not yet given, each thread's in its own order.
#[derive(Debug, Default)]
pub struct SampleMerge {
    queues: [VecDeque<Round>; 2],
    /// ns, the instant of each thread's newest batch; `None` before its first.
    newest: [Option<Nanos>; 2],
}

impl SampleMerge {
    /// Takes a batch of `stream` (after its earlier ones).
    pub fn push(&mut self, stream: Stream, decls: Vec<SeriesDecl>, batch: SampleBatch) {
        let i = stream.index();
        let at = batch.at();
        self.newest[i] = Some(self.newest[i].map_or(at, |n| n.max(at)));
        self.queues[i].push_back((decls, batch));
    }

    /// ns, the instant up to which every batch has come: the older of the two threads'
    /// newest, leaving out a thread not heard from yet or behind by more than
    /// [`MAX_LAG_NS`].
    fn horizon(&self) -> Option<Nanos> {
        let newest = self.newest.iter().flatten().copied().max()?;
        self.newest
            .iter()
            .flatten()
            .copied()
            .filter(|n| n.saturating_add(MAX_LAG_NS) >= newest)
            .min()
    }

    /// Gives `out` every batch up to the horizon (all of them with `all`: the run ended), in
    /// time order; on a tie, the CPU's first.
    pub fn release(&mut self, all: bool, mut out: impl FnMut(Round)) {
        let horizon = if all {
            Some(Nanos::MAX)
        } else {
            self.horizon()
        };
        let Some(horizon) = horizon else { return };
        loop {
            let next = match (self.queues[0].front(), self.queues[1].front()) {
                (Some(c), Some(g)) if g.1.at() < c.1.at() => 1,
                (Some(_), _) => 0,
                (None, Some(_)) => 1,
                (None, None) => return,
            };
            if self.queues[next]
                .front()
                .is_some_and(|r| r.1.at() > horizon)
            {
                return;
            }
            if let Some(round) = self.queues[next].pop_front() {
                out(round);
            }
        }
    }

    /// Batches held.
    pub fn held(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn batch(t_ns: Nanos) -> SampleBatch {
        SampleBatch {
            t_ns,
            dur_ns: 0,
            values: vec![],
        }
    }

    fn released(m: &mut SampleMerge, all: bool) -> Vec<Nanos> {
        let mut out = vec![];
        m.release(all, |(_, b)| out.push(b.t_ns));
        out
    }

    /// The CPU sampler sends 100 ms of instants at once while the GPU one sends every 10 ms:
    /// what comes out is in time order, and a GPU batch newer than the CPU's newest waits
    /// for the CPU's next round.
    #[test]
    fn a_backfilling_cpu_sampler_and_a_fast_gpu_sampler_come_out_in_time_order() {
        let mut m = SampleMerge::default();
        for t in (5..=205).step_by(10) {
            m.push(Stream::Gpu, vec![], batch(t * MS));
        }
        for t in (0..=100).step_by(10) {
            m.push(Stream::Cpu, vec![], batch(t * MS));
        }
        let first = released(&mut m, false);
        assert!(first.windows(2).all(|w| w[0] < w[1]), "{first:?}");
        assert_eq!(first.last(), Some(&(100 * MS)), "{first:?}");
        assert_eq!(first.len(), 11 + 10);
        for t in (110..=200).step_by(10) {
            m.push(Stream::Cpu, vec![], batch(t * MS));
        }
        let second = released(&mut m, false);
        assert!(second[0] > first[first.len() - 1]);
        assert!(second.windows(2).all(|w| w[0] < w[1]), "{second:?}");
        assert_eq!(second.last(), Some(&(200 * MS)));
        assert_eq!(m.held(), 1, "the GPU's batch at 205 ms waits");
        assert_eq!(released(&mut m, true), vec![205 * MS]);
    }

    /// A thread that stopped sending holds the other back for at most [`MAX_LAG_NS`].
    #[test]
    fn a_silent_sampler_holds_the_other_back_no_longer_than_the_lag() {
        let mut m = SampleMerge::default();
        m.push(Stream::Gpu, vec![], batch(0));
        for t in (10..=500).step_by(10) {
            m.push(Stream::Cpu, vec![], batch(t * MS));
        }
        assert_eq!(
            released(&mut m, false),
            vec![0],
            "held while the GPU may still come"
        );
        for t in (510..=1200).step_by(10) {
            m.push(Stream::Cpu, vec![], batch(t * MS));
        }
        let out = released(&mut m, false);
        assert_eq!(
            out.len(),
            120,
            "the GPU is 1.2 s behind: nothing waits for it"
        );
        assert_eq!(m.held(), 0);
    }

    /// Before any batch there is nothing to give, and a single thread is given as it comes.
    #[test]
    fn one_sampler_alone_is_given_as_it_comes() {
        let mut m = SampleMerge::default();
        assert!(released(&mut m, false).is_empty());
        m.push(Stream::Cpu, vec![], batch(MS));
        m.push(Stream::Cpu, vec![], batch(2 * MS));
        assert_eq!(released(&mut m, false), vec![MS, 2 * MS]);
    }
}
