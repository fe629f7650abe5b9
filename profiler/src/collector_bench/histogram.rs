//! A latency histogram of fixed size: exact below 1,024 µs, then 512 sub-buckets per power of
//! two (under 0.2% relative error), so the collector side can record every one of 100,000+
//! latencies a second without its memory growing with the run, and percentiles stay exact
//! enough to compare against a goal in milliseconds.

use serde::{Deserialize, Serialize};

/// Values below this are their own bucket, µs.
const LINEAR: u64 = 1024;
/// Sub-buckets per power of two above [`LINEAR`].
const SUB: u64 = 512;
/// Powers of two covered above [`LINEAR`]: up to 2^(10 + 22) µs, about 71 minutes.
const OCTAVES: u64 = 22;

/// Counts of latencies, µs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Histogram {
    counts: Vec<u64>,
    /// Values recorded.
    pub count: u64,
    /// µs, the largest value recorded.
    pub max_us: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; (LINEAR + SUB * OCTAVES) as usize],
            count: 0,
            max_us: 0,
        }
    }
}

fn bucket(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let octave = 63 - u64::from(us.leading_zeros()); // ≥ 10
    let shift = octave - 9; // keep the 9 bits below the leading one
    let sub = (us >> shift) & (SUB - 1);
    let index = LINEAR + (octave - 10) * SUB + sub;
    index.min(LINEAR + SUB * OCTAVES - 1) as usize
}

/// The smallest value of a bucket, µs.
fn bucket_floor(index: usize) -> u64 {
    let index = index as u64;
    if index < LINEAR {
        return index;
    }
    let octave = (index - LINEAR) / SUB + 10;
    let sub = (index - LINEAR) % SUB;
    (1 << octave) | (sub << (octave - 9))
}

impl Histogram {
    /// Records one latency, µs.
    pub fn record(&mut self, us: u64) {
        self.counts[bucket(us)] += 1;
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    /// The value at quantile `q` (0–1), ms; `None` when empty. Reports a bucket's lower
    /// bound, so it is never above the true value by more than the bucket's width.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bucket_floor(i).min(self.max_us) as f64 / 1000.0);
            }
        }
        Some(self.max_us as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact_and_large_ones_within_a_fifth_of_a_percent() {
        for us in [0, 1, 999, 1023, 1024, 1500, 250_000, 3_000_000, 1 << 31] {
            let floor = bucket_floor(bucket(us));
            assert!(floor <= us, "{us}: floor {floor}");
            assert!(
                (us - floor) as f64 <= us as f64 * 0.002 + 0.5,
                "{us}: {floor}"
            );
        }
    }

    #[test]
    fn quantiles_of_a_uniform_spread() {
        let mut h = Histogram::default();
        for ms in 1..=1000u64 {
            h.record(ms * 1000);
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!((p50 - 500.0).abs() < 1.0, "{p50}");
        assert!((p99 - 990.0).abs() < 2.0, "{p99}");
        assert!((h.quantile_ms(1.0).unwrap() - 1000.0).abs() < 2.0);
        assert_eq!(Histogram::default().quantile_ms(0.5), None);
    }
}
