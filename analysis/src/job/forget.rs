//! Forgetting what is done. A node's agent runs for weeks and serves job after job, so what
//! the timeline holds of a training process (its marks, its process record, its per-process
//! series) goes once it has exited and every one of its iterations is attributed: the
//! attribution round that attributed the last one has shipped it (the agent's tap runs
//! before the prune). What the summary still reads of it is folded first
//! ([`crate::loops::MarkerLog::forget`]); its figures already are, in the running totals.
//!
//! A loop stays while forgetting it would change what is still to be attributed: while a
//! slower peer has yet to pass its iterations (their collectives are joined by iteration
//! number), or while forgetting it would renumber a loop that never said its rank.
//! Samples go once no pending iteration can need them; with no loop pending, the last
//! [`IDLE_KEEP_NS`] are kept for a loop whose first step is yet to come.

use crate::loops::ProcessMarks;
use crate::Nanos;

use super::node::NodeTimeline;

/// With no loop pending, samples this recent are kept (ns): a loop's first iteration starts
/// at its first marker, which may come long before its first step.
pub const IDLE_KEEP_NS: Nanos = 60_000_000_000;

/// How long after a process is seen gone its marks are kept (ns), for datagrams it sent just
/// before it exited that are read after the exit is seen.
pub const GONE_GRACE_NS: Nanos = 2_000_000_000;

impl NodeTimeline {
    /// When process `pid` went, ns: when it was seen exited, or, for one never seen as a
    /// process (it lived less than a discovery round), its last marker once it has been
    /// silent for [`IDLE_KEEP_NS`].
    fn gone_at(&self, pid: u32) -> Option<Nanos> {
        if let Some(t) = self.exited.get(&pid) {
            return Some(*t);
        }
        if self.processes.contains_key(&pid) {
            return None;
        }
        let last = self.markers.procs.get(&pid)?.last_ns?;
        let latest = self.series.watermark()?;
        (last.saturating_add(IDLE_KEEP_NS) < latest).then_some(last)
    }

    /// Whether loop `m` is gone and every iteration of it attributed.
    fn finished(&self, m: &ProcessMarks) -> bool {
        let last = m.steps.keys().next_back();
        self.gone_at(m.pid).is_some() && last.is_none_or(|l| self.progress(m.pid).next_iter > *l)
    }

    /// The start of the earliest iteration a loop not finished has yet to attribute, ns.
    fn oldest_needed(&self) -> Option<Nanos> {
        self.markers
            .loops()
            .filter(|m| !self.finished(m))
            .filter_map(|m| {
                let next = self.progress(m.pid).next_iter;
                m.iteration(next)
                    .map(|(a, _)| a)
                    .or_else(|| next.checked_sub(1).and_then(|p| m.steps.get(&p).copied()))
            })
            .min()
    }

    /// From when samples and marks are still needed, ns: the oldest pending iteration's
    /// start, or, with none pending, [`IDLE_KEEP_NS`] before the latest samples.
    pub(super) fn keep_from(&self) -> Option<Nanos> {
        self.oldest_needed().or_else(|| {
            self.series
                .watermark()
                .map(|w| w.saturating_sub(IDLE_KEEP_NS))
        })
    }

    /// Whether loop `m`, finished, can be forgotten without changing any attribution to come:
    /// every loop still going is past its last iteration or started its pending ones after
    /// it went, and no loop still going would be renumbered (a loop that never said its rank
    /// is numbered among the loops present).
    fn forgettable_loop(&self, m: &ProcessMarks, gone: Nanos) -> bool {
        let last = m.steps.keys().next_back().copied().unwrap_or(0);
        let peers_past = self
            .markers
            .loops()
            .filter(|q| q.pid != m.pid && !self.finished(q))
            .all(|q| self.progress(q.pid).next_iter > last);
        let needed_after = self.oldest_needed().is_none_or(|t| gone < t);
        let ranks = self.markers.ranks();
        let without = self.markers.ranks_without(Some(m.pid));
        let going = |pid: u32| {
            self.markers
                .procs
                .get(&pid)
                .is_some_and(|q| !self.finished(q))
        };
        let same_ranks = ranks
            .iter()
            .filter(|(pid, _)| **pid != m.pid && going(**pid))
            .all(|(pid, r)| without.get(pid) == Some(r));
        (peers_past || needed_after) && same_ranks
    }

    /// Forgets the processes gone that nothing pending needs: loops once finished (see
    /// [`NodeTimeline::forgettable_loop`]), other processes (loaders, helpers, launchers)
    /// once they went before `keep_from`.
    pub(super) fn forget_gone(&mut self, keep_from: Option<Nanos>) {
        let latest = self.series.watermark().unwrap_or(0);
        let unseen = self
            .markers
            .procs
            .keys()
            .filter(|p| !self.processes.contains_key(p));
        let mut candidates: Vec<u32> = self.exited.keys().chain(unseen).copied().collect();
        candidates.sort_unstable();
        candidates.dedup();
        for pid in candidates {
            let Some(gone) = self.gone_at(pid) else {
                continue;
            };
            if gone.saturating_add(GONE_GRACE_NS) > latest {
                continue;
            }
            let forget = match self.markers.procs.get(&pid).filter(|m| m.is_loop()) {
                Some(m) => self.finished(m) && self.forgettable_loop(m, gone),
                None => keep_from.is_some_and(|t| gone < t),
            };
            if forget {
                self.forget(pid);
            }
        }
    }

    /// Forgets everything of process `pid`.
    fn forget(&mut self, pid: u32) {
        self.markers.forget(pid);
        self.processes.remove(&pid);
        self.exited.remove(&pid);
        self.progress.remove(&pid);
        self.series.forget_labelled("pid", &pid.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Held, JobTimeline};
    use crate::attribution::IterationBreakdown;
    use crate::frame::{Frame, ProcessInfo, Role};
    use crate::marker::{phase, Marker, MarkerEvent};
    use crate::series::{names, SampleBatch, SeriesDecl, SeriesId, SeriesKind};
    use crate::Nanos;

    const MS: Nanos = 1_000_000;
    const JOBS: u32 = 50;
    const ITERS: u64 = 40;
    /// Iteration length, ns.
    const ITER_NS: Nanos = 20 * MS;
    /// From one job's start to the next one's, ns.
    const JOB_EVERY_NS: Nanos = 1_500 * MS;
    /// The sampler's period, ns.
    const TICK_NS: Nanos = 10 * MS;

    /// Job `k`'s loop and its DataLoader worker.
    fn pids(k: u32) -> [u32; 2] {
        [1_000 + 2 * k, 1_001 + 2 * k]
    }

    fn decls(k: u32) -> Vec<SeriesDecl> {
        let mut out = Vec::new();
        for (n, pid) in pids(k).into_iter().enumerate() {
            let kinds = [
                (names::PROC_CPU_NS, SeriesKind::Counter),
                (names::PROC_RUNQ_NS, SeriesKind::Counter),
                (names::PROC_BLOCKED_IO, SeriesKind::Gauge),
            ];
            for (j, (name, kind)) in kinds.into_iter().enumerate() {
                out.push(SeriesDecl {
                    id: SeriesId(1 + 6 * k + 3 * n as u32 + j as u32),
                    name: name.into(),
                    unit: "ns".into(),
                    kind,
                    labels: vec![("pid".into(), pid.to_string())],
                });
            }
        }
        out
    }

    fn marker(pid: u32, seq: u64, t_ns: Nanos, iter: u64, event: MarkerEvent) -> Marker {
        Marker {
            seq,
            t_ns,
            pid,
            rank: None, // every job's loop is numbered afresh: rank 0
            iter,
            event,
        }
    }

    /// Job `k`'s markers, by time: a `data` phase and a step per iteration; the loop loses
    /// one datagram (sequence 3).
    fn markers(k: u32, t0: Nanos) -> Vec<Marker> {
        let [pid, loader] = pids(k);
        let meta = |kv: &[(&str, &str)]| {
            MarkerEvent::Meta(
                kv.iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
            )
        };
        let mut out = vec![
            marker(
                pid,
                0,
                t0,
                0,
                meta(&[("workers", "1"), ("batch_size", "32")]),
            ),
            marker(
                loader,
                0,
                t0,
                0,
                meta(&[("role", "loader"), ("parent", &pid.to_string())]),
            ),
        ];
        let mut seq = 0; // the meta marker's
        for i in 0..ITERS {
            let a = t0 + i * ITER_NS;
            for (t, event) in [
                (a + 1, MarkerEvent::Begin(phase::DATA.into())),
                (a + 5 * MS, MarkerEvent::End(phase::DATA.into())),
                (a + ITER_NS, MarkerEvent::Step),
            ] {
                seq += if seq == 3 { 2 } else { 1 };
                out.push(marker(pid, seq, t, i, event));
            }
        }
        out
    }

    /// What [`serve_jobs`] saw: what the timeline held just before each next job started,
    /// every breakdown in the order attributed, and the timeline.
    struct Served {
        held: Vec<Held>,
        breakdowns: Vec<IterationBreakdown>,
        job: JobTimeline,
    }

    /// Feeds `JOBS` short jobs in a row to one timeline, as the agent's recorder does (frames
    /// as they come, an attribution round every 100 ms, then a prune when `prune`).
    fn serve_jobs(prune: bool) -> Served {
        let mut job = JobTimeline::default();
        job.ingest(&Frame::Series(SeriesDecl {
            id: SeriesId(0),
            name: "cpu.busy_ns".into(),
            unit: "ns".into(),
            kind: SeriesKind::Counter,
            labels: Vec::new(),
        }));
        let start = 1_000 * MS;
        let end = start + u64::from(JOBS) * JOB_EVERY_NS;
        let mut held = Vec::new();
        let mut breakdowns = Vec::new();
        let mut pending: Vec<Marker> = Vec::new();
        let mut t = start;
        while t < end {
            let k = ((t - start) / JOB_EVERY_NS) as u32;
            let t0 = start + u64::from(k) * JOB_EVERY_NS;
            let into = t - t0;
            let lives = into < ITERS * ITER_NS + 50 * MS;
            if into == 0 {
                if k > 0 {
                    held.push(job.node.held());
                }
                decls(k)
                    .into_iter()
                    .for_each(|d| job.ingest(&Frame::Series(d)));
                pending.extend(markers(k, t0));
            }
            if into == 100 * MS {
                for (n, pid) in pids(k).into_iter().enumerate() {
                    job.ingest(&Frame::Process(ProcessInfo {
                        pid,
                        ppid: if n == 0 { 1 } else { pids(k)[0] },
                        comm: "python3".into(),
                        role: if n == 0 { Role::Rank } else { Role::Loader },
                        rank: Some(0),
                        rank_pid: Some(pids(k)[0]),
                        seen_ns: t,
                    }));
                }
            }
            if into == ITERS * ITER_NS + 200 * MS {
                for pid in pids(k) {
                    job.ingest(&Frame::ProcessExit { pid, t_ns: t });
                }
            }
            let mut values = vec![(SeriesId(0), t)];
            if lives {
                for id in decls(k).iter().map(|d| d.id) {
                    values.push((id, into / 2));
                }
            }
            job.ingest(&Frame::Samples(SampleBatch {
                t_ns: t,
                dur_ns: 0,
                values,
            }));
            if (t - start) % (100 * MS) == 0 {
                let (due, later): (Vec<Marker>, Vec<Marker>) =
                    pending.drain(..).partition(|m| m.t_ns <= t);
                pending = later;
                job.ingest(&Frame::Markers(due));
                breakdowns.extend(job.attribute_ready(t, false));
                if prune {
                    job.prune();
                }
            }
            t += TICK_NS;
        }
        held.push(job.node.held());
        breakdowns.extend(job.attribute_ready(end, true));
        Served {
            held,
            breakdowns,
            job,
        }
    }

    /// Issue 17, item 10: an agent serving job after job holds what one job needs, not what
    /// every job it served left behind; and what it forgot still counts in the summary.
    #[test]
    fn an_agent_serving_job_after_job_keeps_bounded_state() {
        let Served { held, job, .. } = serve_jobs(true);
        let most_early = |f: fn(&Held) -> usize| held[..5].iter().map(f).max().unwrap();
        let last = held.last().unwrap();
        for (what, f) in [
            (
                "marked processes",
                (|h: &Held| h.marked_procs) as fn(&Held) -> usize,
            ),
            ("spans", |h| h.spans),
            ("steps", |h| h.steps),
            ("process records", |h| h.processes),
            ("series", |h| h.series),
            ("samples", |h| h.samples),
        ] {
            assert!(
                f(last) <= most_early(f),
                "{what} grew with the jobs served: {} after {JOBS} jobs, at most {} after 5",
                f(last),
                most_early(f)
            );
        }
        assert!(
            last.marked_procs <= 4,
            "two jobs' processes at most: {last:?}"
        );
        assert!(last.series <= 1 + 2 * 6, "{last:?}");

        let totals = &job.summary.totals;
        assert_eq!(
            totals.job.iterations,
            u64::from(JOBS) * ITERS,
            "all attributed"
        );
        // A loop that never said its rank is numbered among the loops present: its own job's
        // and, for a while after it went, the previous job's (see `forgettable_loop`).
        assert!(
            totals.ranks.keys().all(|(rank, _)| *rank <= 1),
            "each job's loop is numbered among two jobs' loops at most, not every job served: {:?}",
            totals.ranks.keys().collect::<Vec<_>>()
        );
        assert_eq!(
            job.node.markers.dropped(),
            u64::from(JOBS),
            "one lost datagram a job"
        );
        assert_eq!(job.node.markers.loader_workers(), Some(1));
        assert_eq!(job.node.markers.batch_size(), Some(32));
    }

    /// Forgetting changes no attribution: every iteration of every job is attributed the
    /// same, in the same order, and the job's figures are the same, as when nothing is
    /// pruned nor forgotten. Only the number given to a loop that never said its rank may
    /// differ (it is numbered among the loops present).
    #[test]
    fn forgetting_changes_no_attribution() {
        let kept = serve_jobs(false);
        let forgot = serve_jobs(true);
        let unranked = |bs: &[IterationBreakdown]| -> Vec<IterationBreakdown> {
            bs.iter()
                .map(|b| IterationBreakdown {
                    rank: 0,
                    ..b.clone()
                })
                .collect()
        };
        assert_eq!(kept.breakdowns.len(), (JOBS as usize) * (ITERS as usize));
        assert_eq!(unranked(&kept.breakdowns), unranked(&forgot.breakdowns));
        let (a, b) = (&kept.job.summary.totals.job, &forgot.job.summary.totals.job);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(
            kept.job.node.markers.dropped(),
            forgot.job.node.markers.dropped()
        );
        assert!(
            forgot.held.last().unwrap().samples * 10 < kept.held.last().unwrap().samples,
            "the reference kept everything"
        );
    }
}
