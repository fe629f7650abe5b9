//! A profile replayed as the live run saw it: the model at every step of the run's time, so
//! `stallscope top PROFILE` shows the same screens as the live dashboard with a time cursor.
//!
//! The frames go through the same [`Journal`] as live, one at a time (a profile's reader
//! streams them twice: once for the [`Span`], once to replay), attributed as time passes and
//! pruned at every step, and each step keeps only what changed ([`ViewUpdate`]), less what
//! a view would push out at once ([`trimmed`]); past [`PARTS_BUDGET`] parts held, neighbouring
//! steps are merged, so memory is bounded whatever the profile's length and ranks (a day-long profile held every
//! frame decoded, and every iteration's parts). Moving the cursor forward applies the next
//! updates; moving it back rebuilds from the start, which costs one pass over the updates.

use std::borrow::Borrow;
use std::collections::HashMap;

use super::Journal;
use crate::frame::Frame;
use crate::Nanos;

use crate::view::{JobView, ViewUpdate, RECENT_ITERATIONS, RESOURCE_HISTORY, STRAGGLER_WINDOWS};

/// At most this many cursor positions, whatever the profile's length.
pub const MAX_STEPS: usize = 600;

/// Iterations' parts the steps may hold together (about 90 bytes each): beyond, neighbouring
/// steps are merged into one ([`ViewUpdate::then`]), halving the positions. A day of 64
/// ranks held 600 steps × 64 ranks × up to 512 parts, 2.1 GB (392 MB with a budget of 1.5 M
/// parts); a small job keeps its 600 positions.
pub const PARTS_BUDGET: usize = 600_000;

/// The shortest step between cursor positions, ns.
pub const MIN_STEP_NS: Nanos = 1_000_000_000;

/// The instant a frame speaks of, ns on the clock its profile runs on, when it has one.
pub fn frame_time(frame: &Frame) -> Option<Nanos> {
    match frame {
        Frame::Samples(b) => Some(b.at()),
        Frame::Markers(ms) => ms.iter().map(|m| m.t_ns).max(),
        Frame::ProcessExit { t_ns, .. } => Some(*t_ns),
        Frame::NodeClock(c) => Some(c.at_ns),
        Frame::End(e) => Some(e.ended_mono_ns),
        Frame::NodeIteration(_) | Frame::NodeReport(_) => {
            frame.node_iteration().map(|it| it.breakdown.end_ns)
        }
        _ => None,
    }
}

/// `u` less what applying it would push out of any view at once: per rank all but its last
/// [`RECENT_ITERATIONS`] new iterations' parts, all but the last [`STRAGGLER_WINDOWS`] new
/// straggler windows, per node all but its last [`RESOURCE_HISTORY`] readings. A step of a long profile spans many iterations; this keeps a step's
/// memory bounded by the ranks. `view.apply(trimmed(u))` equals `view.apply(u)`.
pub fn trimmed(mut u: ViewUpdate) -> ViewUpdate {
    let mut left: HashMap<u32, usize> = HashMap::new();
    for (rank, _) in &u.parts {
        *left.entry(*rank).or_default() += 1;
    }
    u.parts.retain(|(rank, _)| {
        let n = left.get_mut(rank).expect("counted above");
        *n -= 1;
        *n < RECENT_ITERATIONS
    });
    let extra = u.stragglers.len().saturating_sub(STRAGGLER_WINDOWS);
    u.stragglers.drain(..extra);
    let mut readings: HashMap<String, usize> = HashMap::new();
    for r in &u.readings {
        *readings.entry(r.node.clone()).or_default() += 1;
    }
    u.readings.retain(|r| {
        let n = readings.get_mut(&r.node).expect("counted above");
        *n -= 1;
        *n < RESOURCE_HISTORY
    });
    u
}

/// Merges each pair of neighbouring steps into the later one's position (the first step, the
/// model's start, stays as it is); returns the parts then held.
fn coarsen(steps: &mut Vec<Step>) -> usize {
    let mut merged = Vec::with_capacity(steps.len() / 2 + 2);
    let mut it = std::mem::take(steps).into_iter();
    merged.extend(it.next());
    while let Some(a) = it.next() {
        merged.push(match it.next() {
            Some(b) => Step {
                t_ns: b.t_ns,
                update: trimmed(a.update.then(b.update)),
            },
            None => a,
        });
    }
    *steps = merged;
    steps.iter().map(|s| s.update.parts.len()).sum()
}

/// One cursor position: the model's change up to `t_ns`.
#[derive(Clone, Debug)]
struct Step {
    t_ns: Nanos,
    update: ViewUpdate,
}

/// A replayed profile: the model before the first step and each step's change.
#[derive(Clone, Debug)]
pub struct Replay {
    start: JobView,
    first_ns: Nanos,
    steps: Vec<Step>,
}

/// The first and last instants of a profile's frames, ns: what a replay's steps divide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// ns, the earliest [`frame_time`] (0 when no frame has one).
    pub first_ns: Nanos,
    /// ns, the latest.
    pub last_ns: Nanos,
}

impl Span {
    /// The span of `frames` (a profile's, in order), taken one at a time.
    pub fn of<F: Borrow<Frame>>(frames: impl IntoIterator<Item = F>) -> Span {
        let times = frames.into_iter().filter_map(|f| frame_time(f.borrow()));
        let (first, last) = times.fold((Nanos::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        let first_ns = if first == Nanos::MAX { 0 } else { first };
        Span {
            first_ns,
            last_ns: last.max(first_ns),
        }
    }
}

impl Replay {
    /// Replays `frames` (a profile's, in order) as job `name`, in steps of at least
    /// [`MIN_STEP_NS`] and at most [`MAX_STEPS`] of them; the last step is the end of the
    /// run, everything attributed.
    pub fn of_frames(frames: &[Frame], name: &str) -> Replay {
        Replay::of_stream(Span::of(frames), frames, name)
    }

    /// Replays `frames`, whose [`Span`] is `span` (a first pass over the profile), taking
    /// them one at a time: the journal forgets what no pending iteration needs at every
    /// step, and each step keeps only what a view keeps of its change ([`trimmed`]), so
    /// memory is bounded by [`MAX_STEPS`] and the ranks, whatever the profile's length.
    pub fn of_stream<F: Borrow<Frame>>(
        span: Span,
        frames: impl IntoIterator<Item = F>,
        name: &str,
    ) -> Replay {
        Replay::of_stream_within(span, frames, name, PARTS_BUDGET)
    }

    /// As [`Replay::of_stream`], holding at most about `budget` parts.
    fn of_stream_within<F: Borrow<Frame>>(
        span: Span,
        frames: impl IntoIterator<Item = F>,
        name: &str,
        budget: usize,
    ) -> Replay {
        let Span {
            first_ns: first,
            last_ns: last,
        } = span;
        let step_ns = MIN_STEP_NS.max(last.saturating_sub(first).div_ceil(MAX_STEPS as Nanos));

        let mut journal = Journal::reader(name);
        let mut steps = Vec::new();
        let mut next = first + step_ns;
        let mut start: Option<JobView> = None;
        let mut held = 0;
        for f in frames {
            let f = f.borrow();
            if let Some(t) = frame_time(f) {
                if start.is_none() {
                    journal.take_update();
                    start = Some(journal.view().clone());
                    // Position 0 is the run's start, whatever happened in its first second
                    // (Home showed 2 iterations of a loop that started at once).
                    steps.push(Step {
                        t_ns: first,
                        update: ViewUpdate::default(),
                    });
                }
                if t >= next {
                    // Whole steps passed: one cursor position at the last boundary before t.
                    let boundary = next + (t - next) / step_ns * step_ns;
                    journal.attribute(boundary, false);
                    let update = trimmed(journal.take_update());
                    held += update.parts.len();
                    steps.push(Step {
                        t_ns: boundary,
                        update,
                    });
                    if held > budget {
                        held = coarsen(&mut steps);
                    }
                    journal.prune();
                    next = boundary + step_ns;
                }
            }
            journal.ingest(f);
        }
        let start = start.unwrap_or_else(|| {
            journal.take_update();
            journal.view().clone()
        });
        journal.attribute(u64::MAX, true);
        steps.push(Step {
            t_ns: last,
            update: trimmed(journal.take_update()),
        });
        Replay {
            start,
            first_ns: first,
            steps,
        }
    }

    /// Iterations' parts held over every step (what a replay's memory grows with).
    pub fn parts_held(&self) -> usize {
        self.steps.iter().map(|s| s.update.parts.len()).sum()
    }

    /// Cursor positions: 1 (the end) and up.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Never: the end of the run is always a position.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// s from the profile's first frame to position `k`.
    pub fn seconds_at(&self, k: usize) -> f64 {
        let k = k.min(self.steps.len() - 1);
        self.steps[k].t_ns.saturating_sub(self.first_ns) as f64 / 1e9
    }

    /// A cursor at position 0: the run's start, before its first frame of time.
    pub fn cursor(&self) -> ReplayCursor<'_> {
        let mut c = ReplayCursor {
            replay: self,
            at: 0,
            view: self.start.clone(),
        };
        c.view.apply(self.steps[0].update.clone());
        c
    }
}

/// A position in a [`Replay`] and the model there.
pub struct ReplayCursor<'a> {
    replay: &'a Replay,
    at: usize,
    view: JobView,
}

impl ReplayCursor<'_> {
    /// The position.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The model at the position.
    pub fn view(&self) -> &JobView {
        &self.view
    }

    /// Moves to position `k` (clamped to the last).
    pub fn seek(&mut self, k: usize) {
        let k = k.min(self.replay.steps.len() - 1);
        if k < self.at {
            self.view = self.replay.start.clone();
            self.at = 0;
            self.view.apply(self.replay.steps[0].update.clone());
        }
        for step in &self.replay.steps[self.at + 1..=k] {
            self.view.apply(step.update.clone());
        }
        self.at = k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{RunEnd, RunHeader};
    use crate::marker::{Marker, MarkerEvent};

    const MS: u64 = 1_000_000;

    /// A 20 s run of one loop stepping every 100 ms, as a profile holds it.
    fn profile() -> Vec<Frame> {
        let mut frames = vec![Frame::Header(RunHeader {
            host: "node-a".into(),
            command: vec!["python3".into(), "train.py".into()],
            ..RunHeader::default()
        })];
        for i in 0..200u64 {
            frames.push(Frame::Markers(vec![Marker {
                seq: i,
                t_ns: 1_000 * MS + (i + 1) * 100 * MS,
                pid: 7,
                rank: Some(0),
                iter: i,
                event: MarkerEvent::Step,
            }]));
        }
        frames.push(Frame::End(RunEnd {
            ended_mono_ns: 1_000 * MS + 20_100 * MS,
            ..RunEnd::default()
        }));
        frames
    }

    #[test]
    fn the_cursor_shows_the_run_as_it_went_and_ends_where_the_run_ended() {
        let frames = profile();
        let replay = Replay::of_frames(&frames, "");
        assert!(replay.len() >= 15 && replay.len() <= 22, "{}", replay.len());
        let mut cursor = replay.cursor();
        let mut seen = Vec::new();
        for k in 0..replay.len() {
            cursor.seek(k);
            seen.push(cursor.view().iterations());
        }
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert!(
            seen[replay.len() / 2] > 0 && seen[replay.len() / 2] < 200,
            "{seen:?}"
        );
        let whole = Journal::replay(&frames, "");
        assert_eq!(cursor.view().iterations(), whole.view().iterations());
        assert_eq!(cursor.view().summary, whole.view().summary);
        assert!((replay.seconds_at(replay.len() - 1) - 20.0).abs() < 1e-9);

        // Back to the middle: the same model as on the way there.
        let middle = replay.len() / 2;
        cursor.seek(middle);
        assert_eq!(cursor.view().iterations(), seen[middle]);
    }

    #[test]
    fn a_profile_without_frames_of_time_is_one_position() {
        let frames = vec![Frame::Header(RunHeader::default())];
        let replay = Replay::of_frames(&frames, "x");
        assert_eq!(replay.len(), 1);
        assert_eq!(replay.cursor().view().iterations(), 0);
        assert_eq!(replay.seconds_at(0), 0.0);
    }

    /// A loop stepping every millisecond for 3 s: far more iterations per step than a view
    /// keeps.
    fn fast_profile() -> Vec<Frame> {
        let mut frames = vec![Frame::Header(RunHeader::default())];
        for i in 0..3_000u64 {
            frames.push(Frame::Markers(vec![Marker {
                seq: i,
                t_ns: 1_000 * MS + (i + 1) * MS,
                pid: 7,
                rank: Some(0),
                iter: i,
                event: MarkerEvent::Step,
            }]));
        }
        frames.push(Frame::End(RunEnd {
            ended_mono_ns: 1_000 * MS + 3_001 * MS,
            ..RunEnd::default()
        }));
        frames
    }

    /// CI: a loop that stepped from its first frame on had 2 iterations at position 0, and
    /// Home never showed the run's start.
    #[test]
    fn position_0_is_the_runs_start_even_when_the_loop_starts_at_once() {
        let frames = fast_profile();
        let replay = Replay::of_frames(&frames, "");
        let mut cursor = replay.cursor();
        assert_eq!(replay.seconds_at(0), 0.0);
        assert_eq!(cursor.view().iterations(), 0);
        assert!((replay.seconds_at(1) - 1.0).abs() < 1e-9);
        cursor.seek(replay.len() - 1);
        assert!(cursor.view().iterations() > 0);
        cursor.seek(0);
        assert_eq!(cursor.view().iterations(), 0);
    }

    #[test]
    fn a_step_keeps_no_more_of_its_iterations_than_a_view_shows() {
        let frames = fast_profile();
        let replay = Replay::of_frames(&frames, "");
        assert!(
            replay.parts_held() <= replay.len() * RECENT_ITERATIONS,
            "{} parts held over {} steps",
            replay.parts_held(),
            replay.len()
        );
        let mut cursor = replay.cursor();
        let whole = Journal::replay(&frames, "");
        cursor.seek(replay.len() - 1);
        assert_eq!(cursor.view().iterations(), whole.view().iterations());
        assert_eq!(cursor.view().ranks, whole.view().ranks);
        assert_eq!(cursor.view().ranks[&0].recent.len(), RECENT_ITERATIONS);
        // Back and forth: the same model at the middle both ways.
        cursor.seek(1);
        let middle = cursor.view().clone();
        cursor.seek(replay.len() - 1);
        cursor.seek(1);
        assert_eq!(cursor.view().ranks, middle.ranks);
    }

    #[test]
    fn trimming_an_update_changes_no_view_it_is_applied_to() {
        let frames = fast_profile();
        let mut j = Journal::reader("");
        for f in &frames {
            j.ingest(f);
        }
        j.attribute(u64::MAX, true);
        let u = j.take_update();
        assert!(u.parts.len() > RECENT_ITERATIONS);
        let (mut a, mut b) = (JobView::new(""), JobView::new(""));
        a.apply(u.clone());
        b.apply(trimmed(u));
        assert_eq!(a, b);
    }

    /// A replay past its parts budget merges neighbouring steps: it holds no more than the
    /// budget and a step's worth, and still ends on the model the whole profile makes (a day
    /// of 64 ranks held 2.1 GB before).
    #[test]
    fn a_replay_over_its_budget_merges_steps_and_ends_on_the_same_model() {
        let frames = fast_profile();
        let full = Replay::of_frames(&frames, "");
        let budget = full.parts_held() / 4;
        let small = Replay::of_stream_within(Span::of(&frames), &frames, "", budget);
        assert!(
            small.len() < full.len(),
            "{} vs {}",
            small.len(),
            full.len()
        );
        assert!(
            small.parts_held() <= budget + 2 * RECENT_ITERATIONS,
            "{} parts held, budget {budget}",
            small.parts_held()
        );
        let (mut a, mut b) = (full.cursor(), small.cursor());
        a.seek(full.len() - 1);
        b.seek(small.len() - 1);
        assert_eq!(a.view().ranks, b.view().ranks);
        assert_eq!(a.view().iterations(), b.view().iterations());
    }

    /// Applying an update then another does what applying the two merged does.
    #[test]
    fn two_updates_merged_apply_as_both_in_turn() {
        let frames = fast_profile();
        let mut j = Journal::reader("");
        let half = frames.len() / 2;
        let mut updates = Vec::new();
        for part in [&frames[..half], &frames[half..]] {
            for f in part {
                j.ingest(f);
            }
            j.attribute(u64::MAX, part.len() != half);
            updates.push(j.take_update());
        }
        let (mut a, mut b) = (JobView::new(""), JobView::new(""));
        for u in updates.clone() {
            a.apply(u);
        }
        let [first, second]: [ViewUpdate; 2] = updates.try_into().unwrap();
        b.apply(first.then(second));
        assert_eq!(a, b);
    }
}
