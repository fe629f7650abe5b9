//! The Timeline's per-iteration sums kept from one frame to the next. A live job of 1,024
//! ranks shows 200 columns: summing every rank's parts for each of them re-reads 200,000
//! parts (16 MB) a frame, most of the dashboard's drawing. Kept, a frame adds only the parts
//! that arrived since, and drops the columns that scrolled out.
//!
//! What was added is remembered per rank (the newest part looked at, by iteration and end); a
//! frame whose model does not continue the one before (a part added then is gone, a rank went,
//! the paused copy, a replay stepped back, another job or rank, the range moved back) sums
//! everything again, so the columns are always those of a full pass.

use std::collections::{BTreeMap, VecDeque};

use stallscope_analysis::view::JobView;

/// One column's sums: ns per category (by `Category::index`) over the ranks that finished the
/// iteration, and how many did.
pub type Sum = ([u64; 7], u64);

/// What of one rank's parts is in the sums.
#[derive(Clone, Copy, Debug)]
struct Added {
    /// The newest part looked at (its iteration at most the last column then): iteration and
    /// end (ns), to know it again.
    newest: (u64, u64),
    /// The oldest iteration added, if any was.
    oldest: Option<u64>,
}

/// The sums of the columns drawn last, and what they hold.
#[derive(Clone, Debug, Default)]
pub struct ColumnSums {
    /// The job's name and the rank summed (all: `None`); `None` before the first frame.
    of: Option<(String, Option<u32>)>,
    /// The iteration of `sums[0]`.
    first: u64,
    /// One per iteration from `first`.
    sums: VecDeque<Sum>,
    /// Per rank, what was added.
    ranks: BTreeMap<u32, Added>,
}

impl ColumnSums {
    /// The sums of iterations `first..=last` over `view`'s ranks (only `rank`, when given):
    /// `sums[i]` is iteration `first + i`'s.
    pub fn update(
        &mut self,
        view: &JobView,
        rank: Option<u32>,
        first: u64,
        last: u64,
    ) -> &VecDeque<Sum> {
        let same = self
            .of
            .as_ref()
            .is_some_and(|(name, r)| *name == view.name && *r == rank);
        let kept_last = (self.first + self.sums.len() as u64).checked_sub(1);
        let continues =
            same && first >= self.first && kept_last.is_none_or(|kept| last >= kept) && {
                self.shift(first, last);
                self.add_new(view, rank, first, last)
            };
        if !continues {
            self.of = Some((view.name.clone(), rank));
            self.ranks.clear();
            self.sums.clear();
            self.first = first;
            self.shift(first, last);
            // Nothing remembered: every part in range is added, as a full pass does.
            self.add_new(view, rank, first, last);
        }
        &self.sums
    }

    /// Drops the columns before `first` and makes room up to `last`.
    fn shift(&mut self, first: u64, last: u64) {
        let gone = (first - self.first).min(self.sums.len() as u64) as usize;
        self.sums.drain(..gone);
        self.first = first;
        self.sums
            .resize((last - first + 1) as usize, Sum::default());
    }

    /// Adds each rank's parts in `first..=last` newer than those added before; false when the
    /// model does not continue the one the sums were made of.
    fn add_new(&mut self, view: &JobView, rank: Option<u32>, first: u64, last: u64) -> bool {
        let known = self.ranks.len();
        let mut seen = 0;
        for r in view
            .ranks
            .values()
            .filter(|r| rank.is_none_or(|want| r.rank == want))
        {
            let before = self.ranks.get(&r.rank).copied();
            seen += usize::from(before.is_some());
            let Some(front) = r.recent.front() else {
                if before.is_some() {
                    return false;
                }
                continue;
            };
            // A part added, in a column still shown, fell out of the rank's window.
            if let Some(Added {
                oldest: Some(oldest),
                ..
            }) = before
            {
                if front.iter > oldest.max(first) {
                    return false;
                }
            }
            let mut met = before.is_none();
            let mut newest = None;
            let mut oldest = before.and_then(|b| b.oldest);
            for p in r.recent.iter().rev() {
                if let Some(b) = before {
                    if p.iter <= b.newest.0 {
                        met = p.iter == b.newest.0 && p.end_ns == b.newest.1;
                        break;
                    }
                }
                if p.iter > last {
                    continue;
                }
                newest.get_or_insert((p.iter, p.end_ns));
                if p.iter < first {
                    // Whatever was added before is older still: its columns are gone.
                    met = true;
                    break;
                }
                let (ns, n) = &mut self.sums[(p.iter - first) as usize];
                for (sum, part) in ns.iter_mut().zip(p.split.ns) {
                    *sum += part;
                }
                *n += 1;
                oldest = Some(oldest.map_or(p.iter, |o| o.min(p.iter)));
            }
            if !met {
                return false;
            }
            if let Some(newest) = newest.or(before.map(|b| b.newest)) {
                self.ranks.insert(r.rank, Added { newest, oldest });
            }
        }
        seen == known
    }
}

#[cfg(test)]
mod tests {
    use stallscope_analysis::category::{Category, Split};
    use stallscope_analysis::view::{IterationParts, JobView, RankView};

    use super::ColumnSums;
    use crate::top::chart::{columns, columns_kept};

    const KEPT: usize = 40;

    fn part(rank: u32, iter: u64) -> IterationParts {
        let mut split = Split::default();
        split.add(Category::Compute, 1_000 + (iter * 7 + u64::from(rank)) % 13);
        split.add(Category::PeerWait, u64::from(rank) * 10 + iter % 5);
        IterationParts {
            iter,
            end_ns: (iter + 1) * 10_000 + u64::from(rank),
            split,
            gpu_busy_ppm: None,
        }
    }

    /// Rank `rank`'s next iteration, its window bounded to [`KEPT`] parts.
    fn push(v: &mut JobView, rank: u32, iter: u64) {
        let r = v.ranks.entry(rank).or_insert_with(|| RankView {
            rank,
            ..RankView::default()
        });
        r.recent.push_back(part(rank, iter));
        if r.recent.len() > KEPT {
            r.recent.pop_front();
        }
    }

    /// The kept columns are those of a full pass, frame after frame, whatever the model does.
    #[test]
    fn kept_sums_give_the_columns_of_a_full_pass() {
        let mut v = JobView::new("job");
        let mut kept = ColumnSums::default();
        let mut paused: Option<JobView> = None;
        let mut frames = 0;
        for step in 0u64..160 {
            for rank in 0..4u32 {
                // Rank 3 lags two iterations and skips every 9th; rank 2 leaves at 60 and
                // comes back at 80 as a new process (a fresh window).
                let iter = if rank == 3 {
                    step.saturating_sub(2)
                } else {
                    step
                };
                if (rank == 3 && (step < 2 || iter % 9 == 4))
                    || (rank == 2 && (60..80).contains(&step))
                {
                    continue;
                }
                push(&mut v, rank, iter);
            }
            if step == 60 {
                v.ranks.remove(&2);
            }
            if step == 100 {
                paused = Some(v.clone());
            }
            let shown = match (&paused, step) {
                (Some(p), 100..=110) => p,
                _ => &v,
            };
            let back = match step {
                0..=30 => 0,
                31..=50 => 3 + step % 4,
                51..=55 => 1_000,
                _ => 0,
            };
            let rank = if (120..130).contains(&step) {
                Some(1)
            } else {
                None
            };
            let width = if step < 140 { 25 } else { 12 };
            // Twice: a frame drawn again without news (a key) reuses the sums as they are.
            for (w, b) in [(width, back), (width, back)] {
                let fresh = columns(shown, rank, w, b);
                let got = columns_kept(&mut kept, shown, rank, w, b);
                assert_eq!(got.splits, fresh.splits, "step {step}");
                assert_eq!(got.iters, fresh.iters, "step {step}");
                assert_eq!(got.max_ns, fresh.max_ns, "step {step}");
                frames += 1;
            }
        }
        assert_eq!(frames, 320);
        // And a model of another job starts afresh.
        let mut other = JobView::new("other");
        push(&mut other, 0, 500);
        let got = columns_kept(&mut kept, &other, None, 25, 0);
        assert_eq!(got.iters, Some((500, 500)));
        assert_eq!(got.splits, vec![part(0, 500).split]);
    }

    #[test]
    fn a_frame_that_continues_the_last_reads_only_the_new_parts() {
        let mut v = JobView::new("job");
        for iter in 0..30 {
            push(&mut v, 0, iter);
        }
        let mut kept = ColumnSums::default();
        columns_kept(&mut kept, &v, None, 10, 0);
        // A part changed behind the sums' back is not seen: only newer parts are read.
        v.ranks.get_mut(&0).unwrap().recent[25]
            .split
            .add(Category::Compute, 1_000_000);
        push(&mut v, 0, 30);
        let got = columns_kept(&mut kept, &v, None, 10, 0);
        assert_eq!(got.iters, Some((21, 30)));
        assert_eq!(
            got.splits[4],
            part(0, 25).split,
            "column 25 kept from the frame before"
        );
        assert_eq!(got.splits[9], part(0, 30).split);
    }
}
