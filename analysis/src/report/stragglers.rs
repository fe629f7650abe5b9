//! What the straggler windows say, in words: one rank that keeps holding the others up is a
//! straggler to act on; a last arrival that moves from rank to rank is noise between ranks.
//!
//! A job whose last-arriving rank alternated between 0 and 1 got its 57 windows listed one by
//! one, as if each were news (issue 30). The reader needs the verdict first, then a few
//! windows as examples.

use super::{StragglerRank, StragglerRow, Stragglers};

/// Windows shown when no rank is a persistent straggler: examples, not a list to read.
pub const EXAMPLE_WINDOWS: usize = 5;

/// A rank is a persistent straggler when it was the last to arrive in at least this share of
/// the windows (two of three): twice its fair share with 3 ranks, and never with two ranks
/// taking turns.
const PERSISTENT_SHARE: f64 = 2.0 / 3.0;

impl Stragglers {
    /// The rank that held the others up in most windows, when it did so persistently (in at
    /// least two thirds of at least 2 windows).
    pub fn persistent(&self) -> Option<&StragglerRank> {
        let top = self.by_rank.iter().max_by_key(|r| r.windows)?;
        let share = top.windows as f64 / self.total_windows.max(1) as f64;
        (top.windows >= 2 && share >= PERSISTENT_SHARE).then_some(top)
    }

    /// The verdict on the windows in one sentence; `None` when there were none.
    pub fn sentence(&self) -> Option<String> {
        if self.total_windows == 0 {
            return None;
        }
        let n = self.total_windows;
        Some(match self.persistent() {
            Some(r) => format!(
                "Rank {} on {} arrived last at the collectives in {} of {n} window(s) of iterations and held the others up {:.2} s in all: it is the straggler to look at.",
                r.rank, r.node, r.windows, r.held_seconds
            ),
            None if self.by_rank.len() == 1 => format!(
                "Rank {} held the others up in {n} window(s) of iterations, too few to call it a persistent straggler.",
                self.by_rank[0].rank
            ),
            None => {
                let mut ranks: Vec<&StragglerRank> = self.by_rank.iter().collect();
                ranks.sort_by(|a, b| b.windows.cmp(&a.windows).then(a.rank.cmp(&b.rank)));
                let turns: Vec<String> = ranks
                    .iter()
                    .take(4)
                    .map(|r| format!("rank {} in {}", r.rank, r.windows))
                    .collect();
                let more = if ranks.len() > 4 { ", …" } else { "" };
                format!(
                    "No persistent straggler: the last rank to arrive changed from window to window ({}{more} of {n}), so the waits are noise between ranks rather than one slow rank.",
                    turns.join(", ")
                )
            }
        })
    }

    /// The windows worth showing, most held first: all of them (at most the 100 kept) for a
    /// persistent straggler, a few examples otherwise.
    pub fn shown_windows(&self) -> &[StragglerRow] {
        let n = if self.persistent().is_some() {
            self.windows.len()
        } else {
            self.windows.len().min(EXAMPLE_WINDOWS)
        };
        &self.windows[..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(last: &[u32]) -> Stragglers {
        let mut by_rank: Vec<StragglerRank> = Vec::new();
        let mut rows = Vec::new();
        for (k, &rank) in last.iter().enumerate() {
            match by_rank.iter_mut().find(|r| r.rank == rank) {
                Some(r) => {
                    r.windows += 1;
                    r.held_seconds += 0.01;
                }
                None => by_rank.push(StragglerRank {
                    rank,
                    node: "a".into(),
                    windows: 1,
                    held_seconds: 0.01,
                }),
            }
            rows.push(StragglerRow {
                first_iter: k as u64 * 10,
                last_iter: k as u64 * 10 + 9,
                rank,
                node: "a".into(),
                held_seconds: 0.01,
                ..StragglerRow::default()
            });
        }
        Stragglers {
            by_rank,
            windows: rows,
            total_windows: last.len() as u64,
        }
    }

    #[test]
    fn ranks_taking_turns_are_no_straggler_and_show_a_few_windows() {
        let alternating: Vec<u32> = (0..57).map(|k| k % 2).collect();
        let s = windows(&alternating);
        assert!(s.persistent().is_none());
        let said = s.sentence().unwrap();
        assert!(said.starts_with("No persistent straggler"), "{said}");
        assert!(said.contains("rank 0 in 29, rank 1 in 28 of 57"), "{said}");
        assert_eq!(s.shown_windows().len(), EXAMPLE_WINDOWS);
    }

    #[test]
    fn one_rank_late_in_most_windows_is_named_and_every_window_shown() {
        let mut last = vec![3u32; 20];
        last.extend([0, 1, 2]);
        let s = windows(&last);
        assert_eq!(s.persistent().map(|r| r.rank), Some(3));
        let said = s.sentence().unwrap();
        assert!(said.starts_with("Rank 3 on a arrived last"), "{said}");
        assert!(said.contains("in 20 of 23 window(s)"), "{said}");
        assert_eq!(s.shown_windows().len(), 23);
        assert!(windows(&[]).sentence().is_none());
        assert!(
            windows(&[1]).persistent().is_none(),
            "one window is no pattern"
        );
    }
}
