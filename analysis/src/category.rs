//! The seven places an iteration's wall time can go.
//!
//! A [`Split`] holds nanoseconds per category and is built so that its parts always sum to
//! the span it describes: [`Split::apportion`] divides a span by weights with largest-remainder
//! rounding, so no nanosecond is lost or invented.

use serde::{Deserialize, Serialize};

/// Where wall time went. The order is the order of reports and of `Split`'s array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Category {
    /// The accelerator (or, on CPU, the rank's compute threads) did useful work.
    Compute,
    /// The loop waited for data while the loader waited on storage (I/O).
    DataFetch,
    /// The loop waited for data while the loader used the CPU (decode, augmentation).
    DataPrep,
    /// Exposed communication moving bytes inside the node (NVLink, PCIe peer, loopback).
    Interconnect,
    /// Exposed communication moving bytes over the network interfaces.
    Network,
    /// Exposed communication spent waiting for the last rank to arrive at the collective.
    PeerWait,
    /// Nothing seen explains it.
    Other,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 7] = [
        Category::Compute,
        Category::DataFetch,
        Category::DataPrep,
        Category::Interconnect,
        Category::Network,
        Category::PeerWait,
        Category::Other,
    ];

    /// The stable snake_case name used in JSON, metrics and reports.
    pub fn name(self) -> &'static str {
        match self {
            Category::Compute => "compute",
            Category::DataFetch => "data_fetch",
            Category::DataPrep => "data_prep",
            Category::Interconnect => "interconnect",
            Category::Network => "network",
            Category::PeerWait => "peer_wait",
            Category::Other => "other",
        }
    }

    /// Index into [`Split::ns`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Nanoseconds per category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// ns, indexed by [`Category::index`].
    pub ns: [u64; 7],
}

impl Split {
    /// The time in one category, ns.
    pub fn get(&self, c: Category) -> u64 {
        self.ns[c.index()]
    }

    /// Adds `ns` to category `c`.
    pub fn add(&mut self, c: Category, ns: u64) {
        self.ns[c.index()] += ns;
    }

    /// Adds every category of `other`.
    pub fn add_split(&mut self, other: &Split) {
        for (a, b) in self.ns.iter_mut().zip(other.ns.iter()) {
            *a += b;
        }
    }

    /// Sum of all categories, ns.
    pub fn total(&self) -> u64 {
        self.ns.iter().sum()
    }

    /// The category holding the most time (ties go to the earlier category).
    pub fn largest(&self) -> Category {
        let mut best = Category::Compute;
        for c in Category::ALL {
            if self.get(c) > self.get(best) {
                best = c;
            }
        }
        best
    }

    /// The largest category other than compute, if it holds any time.
    pub fn largest_stall(&self) -> Option<Category> {
        Category::ALL
            .into_iter()
            .filter(|c| *c != Category::Compute && self.get(*c) > 0)
            .fold(None, |best: Option<Category>, c| match best {
                Some(b) if self.get(b) >= self.get(c) => Some(b),
                _ => Some(c),
            })
    }

    /// Divides `span_ns` over categories in proportion to `weights` (any non-negative
    /// units), with largest-remainder rounding so the parts sum to exactly `span_ns`.
    /// With all weights zero, the whole span goes to `fallback`.
    pub fn apportion(span_ns: u64, weights: &[(Category, f64)], fallback: Category) -> Split {
        let mut out = Split::default();
        let total: f64 = weights.iter().map(|(_, w)| w.max(0.0)).sum();
        if span_ns == 0 {
            return out;
        }
        if total <= 0.0 || !total.is_finite() {
            out.add(fallback, span_ns);
            return out;
        }
        let mut exact = [0f64; 7];
        for (c, w) in weights {
            exact[c.index()] += w.max(0.0) / total * span_ns as f64;
        }
        let mut given = 0u64;
        for (i, e) in exact.iter().enumerate() {
            out.ns[i] = e.floor() as u64;
            given += out.ns[i];
        }
        let mut remainders: Vec<(usize, f64)> = exact
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e - e.floor()))
            .collect();
        remainders.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut left = span_ns.saturating_sub(given);
        for (i, _) in remainders.iter().cycle() {
            if left == 0 {
                break;
            }
            out.ns[*i] += 1;
            left -= 1;
        }
        // Floating-point overshoot (never more than a few ns) is taken back from the largest.
        while out.total() > span_ns {
            let big = out.largest();
            out.ns[big.index()] -= 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apportion_sums_exactly_and_keeps_proportions() {
        let s = Split::apportion(
            1_000_000_007,
            &[
                (Category::DataPrep, 2.0),
                (Category::DataFetch, 1.0),
                (Category::Other, 0.0),
            ],
            Category::Other,
        );
        assert_eq!(s.total(), 1_000_000_007);
        assert_eq!(s.get(Category::DataPrep), 666_666_671);
        assert_eq!(s.get(Category::DataFetch), 333_333_336);
        assert_eq!(s.get(Category::Other), 0);
    }

    #[test]
    fn apportion_with_no_weight_uses_fallback() {
        let s = Split::apportion(10, &[(Category::Network, 0.0)], Category::Other);
        assert_eq!(s.get(Category::Other), 10);
    }

    #[test]
    fn largest_stall_skips_compute() {
        let mut s = Split::default();
        s.add(Category::Compute, 100);
        s.add(Category::Network, 5);
        s.add(Category::DataPrep, 7);
        assert_eq!(s.largest(), Category::Compute);
        assert_eq!(s.largest_stall(), Some(Category::DataPrep));
    }
}
