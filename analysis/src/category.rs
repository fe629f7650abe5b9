//! The seven places an iteration's wall time can go.
//!
//! A [`Split`] holds nanoseconds per category and is built so that its parts always sum to
//! the span it describes: [`Split::apportion`] divides a span by weights with largest-remainder
//! rounding, so no nanosecond is lost or invented.

use serde::{Deserialize, Serialize};

/// Where wall time went. The order is the order of reports and of `Split`'s array.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
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
    #[default]
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
        let raw: Vec<f64> = weights.iter().map(|(_, w)| *w).collect();
        match apportion(span_ns, &raw) {
            Some(parts) => {
                for ((c, _), ns) in weights.iter().zip(parts) {
                    out.add(*c, ns);
                }
            }
            None => out.add(fallback, span_ns),
        }
        out
    }
}

/// Divides `span_ns` in proportion to `weights` (negative and non-finite weights count as 0),
/// with largest-remainder rounding: the parts sum to exactly `span_ns`. `None` when no weight
/// is positive (and the span is not empty).
pub fn apportion(span_ns: u64, weights: &[f64]) -> Option<Vec<u64>> {
    let n = weights.len();
    let (mut clean, mut exact, mut parts, mut order) =
        (vec![0.0; n], vec![0.0; n], vec![0; n], vec![0; n]);
    apportion_in(
        span_ns,
        weights,
        (&mut clean, &mut exact, &mut parts, &mut order),
    )
    .then_some(parts)
}

/// [`apportion`] of `N` weights, in arrays rather than vectors (the cross-node join divides
/// each rank's transfer in two, 300,000 times a second at 10,000 ranks): the same parts.
pub fn apportion_array<const N: usize>(span_ns: u64, weights: [f64; N]) -> Option<[u64; N]> {
    let (mut clean, mut exact, mut parts, mut order) = ([0.0; N], [0.0; N], [0; N], [0; N]);
    apportion_in(
        span_ns,
        &weights,
        (&mut clean, &mut exact, &mut parts, &mut order),
    )
    .then_some(parts)
}

/// [`apportion`] into buffers of `weights.len()` each (clean weights, exact shares, parts,
/// order of remainders): whether the parts were made.
fn apportion_in(
    span_ns: u64,
    weights: &[f64],
    (clean, exact, parts, order): (&mut [f64], &mut [f64], &mut [u64], &mut [usize]),
) -> bool {
    for (c, w) in clean.iter_mut().zip(weights) {
        *c = if w.is_finite() && *w > 0.0 { *w } else { 0.0 };
    }
    let total: f64 = clean.iter().sum();
    if span_ns == 0 {
        parts.fill(0);
        return true;
    }
    if total <= 0.0 {
        return false;
    }
    for (e, w) in exact.iter_mut().zip(clean.iter()) {
        *e = w / total * span_ns as f64;
    }
    for (p, e) in parts.iter_mut().zip(exact.iter()) {
        *p = e.floor() as u64;
    }
    let given: u64 = parts.iter().sum();
    if given > span_ns {
        // Floating-point overshoot of a few ns: take it back from the largest parts.
        let mut over = given - span_ns;
        while over > 0 {
            let i = (0..parts.len()).max_by_key(|i| parts[*i]).unwrap_or(0);
            parts[i] -= 1;
            over -= 1;
        }
        return true;
    }
    let mut k = 0;
    for (i, c) in clean.iter().enumerate() {
        if *c > 0.0 {
            order[k] = i;
            k += 1;
        }
    }
    let order = &mut order[..k];
    order.sort_by(|a, b| {
        let ra = exact[*a] - exact[*a].floor();
        let rb = exact[*b] - exact[*b].floor();
        rb.total_cmp(&ra).then(a.cmp(b))
    });
    let mut left = span_ns - given;
    while left > 0 {
        for i in order.iter() {
            if left == 0 {
                break;
            }
            parts[*i] += 1;
            left -= 1;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors' reading as it was, to compare with.
    fn apportion_as_it_was(span_ns: u64, weights: &[f64]) -> Option<Vec<u64>> {
        let clean: Vec<f64> = weights
            .iter()
            .map(|w| if w.is_finite() && *w > 0.0 { *w } else { 0.0 })
            .collect();
        let total: f64 = clean.iter().sum();
        if span_ns == 0 {
            return Some(vec![0; weights.len()]);
        }
        if total <= 0.0 {
            return None;
        }
        let exact: Vec<f64> = clean.iter().map(|w| w / total * span_ns as f64).collect();
        let mut parts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
        let given: u64 = parts.iter().sum();
        if given > span_ns {
            let mut over = given - span_ns;
            while over > 0 {
                let i = (0..parts.len()).max_by_key(|i| parts[*i]).unwrap_or(0);
                parts[i] -= 1;
                over -= 1;
            }
            return Some(parts);
        }
        let mut order: Vec<usize> = (0..parts.len()).filter(|i| clean[*i] > 0.0).collect();
        order.sort_by(|a, b| {
            let ra = exact[*a] - exact[*a].floor();
            let rb = exact[*b] - exact[*b].floor();
            rb.total_cmp(&ra).then(a.cmp(b))
        });
        let mut left = span_ns - given;
        while left > 0 {
            for i in &order {
                if left == 0 {
                    break;
                }
                parts[*i] += 1;
                left -= 1;
            }
        }
        Some(parts)
    }

    proptest::proptest! {
        /// Arrays or vectors, the parts are those of the vectors' reading before either.
        #[test]
        fn apportion_in_arrays_gives_the_vectors_parts(
            span in proptest::prop_oneof![0..1_000u64, proptest::num::u64::ANY],
            w in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::num::f64::ANY,
                    0.0..1e12f64,
                    proptest::strategy::Just(0.0),
                    proptest::strategy::Just(1.0),
                ],
                3,
            ),
        ) {
            let want = apportion_as_it_was(span, &w);
            proptest::prop_assert_eq!(apportion(span, &w), want.clone());
            proptest::prop_assert_eq!(
                apportion_array(span, [w[0], w[1], w[2]]).map(|a| a.to_vec()),
                want
            );
            proptest::prop_assert_eq!(
                apportion_array(span, [w[0], w[1]]).map(|a| a.to_vec()),
                apportion_as_it_was(span, &w[..2])
            );
        }
    }

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
