//! Consecutive sample batches packed into one profile frame ([`SampleRun`]).
//!
//! The fast tier reads every process's counters 100 times a second, and written one
//! [`SampleBatch`] per frame that came to about 50 MB per hour of a two-rank run: each frame
//! repeats its 11-byte header, the absolute time and every counter in full, though from one
//! batch to the next most counters move little or not at all. A run stores the first batch as
//! it is and each later one as its time step and the values that changed (as wrapping
//! differences, which postcard writes in a byte or two), naming the series that were no
//! longer read. Unpacking gives back exactly the batches that were packed, values in the same
//! order: a batch that the step form could not reproduce exactly starts a new run.
//!
//! A run stands alone (it needs no earlier frame), so a damaged frame costs its own run and
//! no other, as with every frame of the profile.
//!
//! A step that repeats the previous batch costs a few bytes, so a crafted run of one wide
//! batch and 99 empty steps unpacked to about 50 values per byte of file, and a 16 MB file
//! held gigabytes downstream. A run may unpack to at most [`RUN_MAX_VALUES_PER_BYTE`] values
//! per byte of its encoding (real runs: under 1): the builder ends a run before it would pass
//! that, and a reader refuses a run over it as damage.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::series::{SampleBatch, SeriesId};

/// Batches packed into one run at most (a second of the 100 Hz fast tier).
pub const RUN_MAX_BATCHES: usize = 100;

/// Values (summed over its batches) a run may unpack to per byte of its encoded frame. A
/// real fast tier's runs come to under 1 (counters move, so most steps carry them); only a
/// run of many unchanging series comes near this, and the builder then ends it early.
pub const RUN_MAX_VALUES_PER_BYTE: u64 = 4;

/// Sample batches that followed each other, packed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRun {
    /// The first batch, whole.
    pub first: SampleBatch,
    /// Each later batch, as a change from the one before it.
    pub steps: Vec<SampleStep>,
}

/// One batch as the change from the batch before it.
///
/// Each series is predicted to move as it moved last time (its last value in the run plus
/// its last change, so a steady counter or an unchanged gauge is predicted exactly); only
/// what the prediction missed is written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleStep {
    /// ns, its `t_ns` minus the previous batch's, minus the previous step's (the first
    /// step's: minus 0), wrapping.
    pub dt_ns: i64,
    /// ns, how long its reads took.
    pub dur_ns: u32,
    /// Series read in the previous batch and not in this one.
    pub dropped: Vec<SeriesId>,
    /// Series whose value the prediction missed, and series not in the previous batch: the
    /// value minus the prediction, wrapping.
    pub changed: Vec<(SeriesId, i64)>,
    /// Where each series not in the previous batch stands in this one (index, in the order
    /// they appear in `changed`).
    pub added_at: Vec<u32>,
}

/// What the next step is predicted from: per series its last value in the run and its last
/// change, and the last time step. (Scaling the change to the time step, or to the time since
/// the series was last read, predicted the fast tier's counters worse on a real run: their
/// moves are bursts, not rates.)
#[derive(Clone, Debug, Default)]
struct Prediction {
    last: HashMap<SeriesId, u64>,
    slope: HashMap<SeriesId, u64>,
    dt_ns: u64,
}

impl Prediction {
    fn starting_at(batch: &SampleBatch) -> Prediction {
        Prediction {
            last: batch.values.iter().copied().collect(),
            ..Prediction::default()
        }
    }

    /// The predicted value of `id`: its last value plus its last change.
    fn value(&self, id: SeriesId) -> u64 {
        let last = self.last.get(&id).copied().unwrap_or(0);
        last.wrapping_add(self.slope.get(&id).copied().unwrap_or(0))
    }

    /// Takes a batch as the next one in the run.
    fn observe(&mut self, prev: &SampleBatch, batch: &SampleBatch) {
        for (id, v) in &batch.values {
            let slope = self.last.get(id).map_or(0, |l| v.wrapping_sub(*l));
            self.slope.insert(*id, slope);
            self.last.insert(*id, *v);
        }
        self.dt_ns = batch.t_ns.wrapping_sub(prev.t_ns);
    }
}

impl SampleStep {
    /// The batch this step makes of `prev`, as `p` predicts it.
    fn apply(&self, prev: &SampleBatch, p: &Prediction) -> SampleBatch {
        let residuals: HashMap<SeriesId, i64> = self.changed.iter().copied().collect();
        let dropped: HashSet<SeriesId> = self.dropped.iter().copied().collect();
        let t_ns = prev
            .t_ns
            .wrapping_add(p.dt_ns.wrapping_add(self.dt_ns as u64));
        let values: Vec<(SeriesId, u64)> = prev
            .values
            .iter()
            .filter(|(id, _)| !dropped.contains(id))
            .map(|(id, _)| {
                let r = residuals.get(id).copied().unwrap_or(0);
                (*id, p.value(*id).wrapping_add(r as u64))
            })
            .collect();
        let in_prev = ids(prev);
        let mut added: Vec<(usize, (SeriesId, u64))> = self
            .changed
            .iter()
            .filter(|(id, _)| !in_prev.contains(id))
            .zip(&self.added_at)
            .map(|((id, r), at)| (*at as usize, (*id, p.value(*id).wrapping_add(*r as u64))))
            .collect();
        // Each new series goes where it stood (a writer gives increasing places): merged in
        // one pass, as inserting them one by one would cost the batch's length each (a file
        // adding a million series in one step would take hours).
        added.sort_by_key(|(at, _)| *at);
        let mut merged = Vec::with_capacity(values.len() + added.len());
        let mut kept = values.into_iter();
        for (at, v) in added {
            while merged.len() < at {
                match kept.next() {
                    Some(k) => merged.push(k),
                    None => break,
                }
            }
            merged.push(v);
        }
        merged.extend(kept);
        let values = merged;
        SampleBatch {
            t_ns,
            dur_ns: self.dur_ns,
            values,
        }
    }

    /// The step from `prev` to `next`, as `p` predicts it.
    fn between(prev: &SampleBatch, next: &SampleBatch, p: &Prediction) -> SampleStep {
        let (in_prev, in_next) = (ids(prev), ids(next));
        let dropped = prev
            .values
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !in_next.contains(id))
            .collect();
        let dt = next.t_ns.wrapping_sub(prev.t_ns);
        let changed = next
            .values
            .iter()
            .filter_map(|(id, v)| {
                let missed = v.wrapping_sub(p.value(*id)) as i64;
                (missed != 0 || !in_prev.contains(id)).then_some((*id, missed))
            })
            .collect();
        let added_at = next
            .values
            .iter()
            .enumerate()
            .filter(|(_, (id, _))| !in_prev.contains(id))
            .map(|(i, _)| i as u32)
            .collect();
        SampleStep {
            dt_ns: dt.wrapping_sub(p.dt_ns) as i64,
            dur_ns: next.dur_ns,
            dropped,
            changed,
            added_at,
        }
    }
}

/// The series a batch read.
fn ids(batch: &SampleBatch) -> HashSet<SeriesId> {
    batch.values.iter().map(|(id, _)| *id).collect()
}

impl SampleRun {
    /// Batches in the run.
    pub fn len(&self) -> usize {
        1 + self.steps.len()
    }

    /// Never: a run holds its first batch.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The batches, in order, exactly as they were packed (checked against the run's own
    /// encoded size, as [`into_batches`](Self::into_batches) does).
    pub fn unpack(&self) -> Result<Vec<SampleBatch>, BadRun> {
        let encoded = encoded_len(self) as usize;
        Ok(self.clone().into_batches(encoded)?.collect())
    }

    /// Whether the run unpacks to at most `limit` values, summed over its batches: counted
    /// from the series each step keeps and adds (no value is unpacked), and stopped as soon
    /// as the count passes `limit`, so the count costs at most `limit` steps of work.
    fn unpacks_within(&self, limit: u64) -> bool {
        // Values per series in the batch (a crafted batch may repeat a series).
        let mut counts: HashMap<SeriesId, u64> = HashMap::new();
        for (id, _) in &self.first.values {
            *counts.entry(*id).or_default() += 1;
        }
        let mut width = self.first.values.len() as u64;
        let mut total = width;
        for step in &self.steps {
            if total > limit {
                return false;
            }
            // As `SampleStep::apply` makes the batch: the previous batch's values less the
            // series dropped, then each value of a series not in it that has a place.
            let added: Vec<SeriesId> = step
                .changed
                .iter()
                .filter(|(id, _)| !counts.contains_key(id))
                .zip(&step.added_at)
                .map(|((id, _), _)| *id)
                .collect();
            for id in &step.dropped {
                width -= counts.remove(id).unwrap_or(0);
            }
            for id in added {
                *counts.entry(id).or_default() += 1;
                width += 1;
            }
            total = total.saturating_add(width);
        }
        total <= limit
    }

    /// The batches, in order, exactly as they were packed, one at a time: a reader holds one
    /// batch, not the run unpacked (a few bytes of steps can stand for many batches of many
    /// values). `encoded_bytes` is the size of the frame it was read from. A run of more
    /// batches than a writer packs ([`RUN_MAX_BATCHES`]), or of more values than
    /// [`RUN_MAX_VALUES_PER_BYTE`] per encoded byte, is refused.
    pub fn into_batches(self, encoded_bytes: usize) -> Result<Unpacking, BadRun> {
        if self.len() > RUN_MAX_BATCHES {
            return Err(BadRun::TooLong(self.len()));
        }
        if !self.unpacks_within(RUN_MAX_VALUES_PER_BYTE.saturating_mul(encoded_bytes as u64)) {
            return Err(BadRun::TooWide {
                bytes: encoded_bytes,
            });
        }
        Ok(Unpacking {
            p: Prediction::starting_at(&self.first),
            first: Some(self.first),
            prev: None,
            steps: self.steps.into_iter(),
        })
    }
}

/// A run read from a file that no writer packs: damaged, crafted or not a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadRun {
    /// It holds more batches than a writer packs.
    #[error("a run of {0} sample batches, over the {RUN_MAX_BATCHES} a writer packs")]
    TooLong(usize),
    /// It unpacks to more values than its encoded size allows.
    #[error(
        "a run of {bytes} bytes that unpacks to more than {RUN_MAX_VALUES_PER_BYTE} sample \
         values per byte, more than a writer packs"
    )]
    TooWide {
        /// bytes, its encoded frame.
        bytes: usize,
    },
}

/// The batches of a run, unpacked as they are asked for ([`SampleRun::into_batches`]).
#[derive(Debug)]
pub struct Unpacking {
    first: Option<SampleBatch>,
    prev: Option<SampleBatch>,
    steps: std::vec::IntoIter<SampleStep>,
    p: Prediction,
}

impl Iterator for Unpacking {
    type Item = SampleBatch;

    fn next(&mut self) -> Option<SampleBatch> {
        if let Some(first) = self.first.take() {
            self.prev = Some(first.clone());
            return Some(first);
        }
        let step = self.steps.next()?;
        let prev = self.prev.as_ref()?;
        let next = step.apply(prev, &self.p);
        self.p.observe(prev, &next);
        self.prev = Some(next.clone());
        Some(next)
    }
}

/// Packs batches into a run as they come.
#[derive(Clone, Debug)]
pub struct SampleRunBuilder {
    run: SampleRun,
    last: SampleBatch,
    prediction: Prediction,
    /// Values in the run so far, summed over its batches.
    values: u64,
    /// bytes, the run's encoding so far less its frame tag and the steps' count (so at
    /// most the frame's size).
    encoded: u64,
}

impl SampleRunBuilder {
    /// A run starting with `first`.
    pub fn new(first: SampleBatch) -> SampleRunBuilder {
        SampleRunBuilder {
            prediction: Prediction::starting_at(&first),
            values: first.values.len() as u64,
            encoded: encoded_len(&first),
            last: first.clone(),
            run: SampleRun {
                first,
                steps: Vec::new(),
            },
        }
    }

    /// Batches packed so far.
    pub fn len(&self) -> usize {
        self.run.len()
    }

    /// Never: a run holds its first batch.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Adds `next`; `false` when the step form cannot give it back exactly (the series it
    /// shares with the last batch in another order), or when the run would unpack to more
    /// than [`RUN_MAX_VALUES_PER_BYTE`] values per byte, and the caller starts a new run
    /// with it.
    pub fn push(&mut self, next: &SampleBatch) -> bool {
        let step = SampleStep::between(&self.last, next, &self.prediction);
        if step.apply(&self.last, &self.prediction) != *next {
            return false;
        }
        let values = self.values + next.values.len() as u64;
        let encoded = self.encoded + encoded_len(&step);
        if values > RUN_MAX_VALUES_PER_BYTE.saturating_mul(encoded) {
            return false;
        }
        (self.values, self.encoded) = (values, encoded);
        self.prediction.observe(&self.last, next);
        self.last = next.clone();
        self.run.steps.push(step);
        true
    }

    /// The run.
    pub fn finish(self) -> SampleRun {
        self.run
    }
}

/// bytes, the postcard encoding of `v` (counted, not written).
fn encoded_len(v: &impl Serialize) -> u64 {
    postcard::serialize_with_flavor(v, postcard::ser_flavors::Size::default())
        .map_or(0, |n: usize| n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Nanos;

    fn batch(t: Nanos, values: &[(u32, u64)]) -> SampleBatch {
        SampleBatch {
            t_ns: t,
            dur_ns: 20_000,
            values: values.iter().map(|(i, v)| (SeriesId(*i), *v)).collect(),
        }
    }

    fn pack(batches: &[SampleBatch]) -> Vec<SampleRun> {
        let mut runs: Vec<SampleRun> = Vec::new();
        let mut building: Option<SampleRunBuilder> = None;
        for b in batches {
            if let Some(r) = &mut building {
                if r.push(b) {
                    continue;
                }
                runs.extend(building.take().map(SampleRunBuilder::finish));
            }
            building = Some(SampleRunBuilder::new(b.clone()));
        }
        runs.extend(building.map(SampleRunBuilder::finish));
        runs
    }

    #[test]
    fn batches_come_back_exactly_through_appearing_vanishing_and_wrapping_series() {
        let batches = vec![
            batch(1_000, &[(1, 5_000_000_000), (2, 0), (3, 7)]),
            batch(11_000, &[(1, 5_010_000_000), (2, 0), (3, 7)]),
            // Series 3 is no longer read, 4 appears, 2 goes backwards (a gauge).
            batch(21_000, &[(1, 5_020_000_000), (2, 1), (4, u64::MAX)]),
            batch(31_000, &[(1, 5_020_000_000), (2, 0), (4, 3)]),
            // Time goes backwards (a reordered read): still exact.
            batch(29_000, &[(1, 5_030_000_000), (2, 0), (4, 3)]),
        ];
        let runs = pack(&batches);
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0].unpack().unwrap(), batches);
        // Steps carry only what the prediction missed: series 1 moved by 10 ms of CPU with
        // nothing to predict from yet, then as predicted.
        assert_eq!(runs[0].steps[0].changed, vec![(SeriesId(1), 10_000_000)]);
        assert_eq!(runs[0].steps[1].dropped, vec![SeriesId(3)]);
        assert!(!runs[0].steps[1]
            .changed
            .iter()
            .any(|(id, _)| *id == SeriesId(1)));
    }

    #[test]
    fn a_batch_whose_order_the_step_cannot_give_starts_a_new_run() {
        let batches = vec![
            batch(1_000, &[(1, 1), (2, 2)]),
            batch(2_000, &[(2, 2), (1, 1)]),
            batch(3_000, &[(2, 3), (1, 1)]),
        ];
        let runs = pack(&batches);
        assert_eq!(runs.len(), 2);
        let back: Vec<SampleBatch> = runs.iter().flat_map(|r| r.unpack().unwrap()).collect();
        assert_eq!(back, batches);
    }

    #[test]
    fn a_run_of_steady_counters_is_far_smaller_than_its_batches() {
        let batches: Vec<SampleBatch> = (0..100u64)
            .map(|k| {
                let t = 10_000_000_000 + k * 10_000_000;
                batch(
                    t,
                    &[
                        (1, 900_000_000_000 + k * 9_000_000),
                        (2, 40_000_000 + k * 5_000),
                        (3, 0),
                        (4, 1_234_567_890_123 + (k / 10) * 1_500),
                        (5, 1),
                    ],
                )
            })
            .collect();
        let runs = pack(&batches);
        assert_eq!(runs.len(), 1);
        let single: usize = batches
            .iter()
            .map(|b| postcard::to_allocvec(b).unwrap().len())
            .sum();
        let packed = postcard::to_allocvec(&runs[0]).unwrap().len();
        assert!(
            packed * 2 < single,
            "packed {packed} bytes, single {single}"
        );
    }

    impl SampleRun {
        /// The batches, with no check of the run's size.
        fn unpack_unchecked(self) -> Vec<SampleBatch> {
            self.into_batches(usize::MAX / 8).unwrap().collect()
        }
    }

    /// One wide batch and steps that repeat it: a few bytes per batch of 2,000 values.
    fn repeating(steps: usize) -> SampleRun {
        let first = batch(0, &(0..2_000).map(|i| (i, 7)).collect::<Vec<_>>());
        SampleRun {
            first,
            steps: vec![
                SampleStep {
                    dt_ns: 1,
                    ..SampleStep::default()
                };
                steps
            ],
        }
    }

    #[test]
    fn a_run_unpacking_to_far_more_values_than_its_bytes_is_refused() {
        let run = repeating(RUN_MAX_BATCHES - 1);
        let bytes = postcard::to_allocvec(&run).unwrap().len();
        assert!(bytes * 20 < 200_000, "{bytes} bytes");
        let err = run.clone().into_batches(bytes).unwrap_err();
        assert_eq!(err, BadRun::TooWide { bytes });
        assert!(err
            .to_string()
            .contains("unpacks to more than 4 sample values per byte"));
        // Refused before anything is unpacked, whatever the frame's claimed size.
        assert!(run.unpack().is_err());
    }

    #[test]
    fn the_builder_ends_a_run_of_unchanging_series_before_a_reader_would_refuse_it() {
        let batches: Vec<SampleBatch> = repeating(RUN_MAX_BATCHES - 1).unpack_unchecked();
        let runs = pack(&batches);
        assert!(runs.len() > 1, "one run of {} batches", runs[0].len());
        for r in &runs {
            let bytes = postcard::to_allocvec(&crate::frame::Frame::SampleRun(Box::new(r.clone())))
                .unwrap()
                .len();
            assert!(r.clone().into_batches(bytes).is_ok(), "{} batches", r.len());
        }
        let back: Vec<SampleBatch> = runs.iter().flat_map(|r| r.unpack().unwrap()).collect();
        assert_eq!(back, batches);
    }

    #[test]
    fn a_series_read_every_other_batch_is_counted_once_per_batch() {
        // A worker's thread series, read every other tick: dropped, then added again.
        let batches: Vec<SampleBatch> = (0..100u64)
            .map(|k| {
                let mut v: Vec<(u32, u64)> = vec![(1, 1_000 * k)];
                if k % 2 == 0 {
                    v.extend((10..40).map(|i| (i, 5)));
                }
                batch(10_000_000 * k, &v)
            })
            .collect();
        let runs = pack(&batches);
        assert_eq!(runs.len(), 1);
        let bytes = postcard::to_allocvec(&runs[0]).unwrap().len();
        assert_eq!(runs[0].clone().into_batches(bytes).unwrap().count(), 100);
    }
}
