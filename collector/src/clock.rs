//! Clock alignment of one agent, NTP-style, over its own connection.
//!
//! The collector sends a ping at `t1` (its clock); the agent stamps `t2` on arrival and `t3`
//! on departure (its clock); the pong is back at `t4`. Then the agent's clock minus the
//! collector's is `((t2 - t1) + (t3 - t4)) / 2`, wrong by at most half the round trip
//! `(t4 - t1) - (t3 - t2)` — and far less when the two directions took equally long. Exchanges
//! that waited in a queue somewhere have long round trips and skewed offsets, so only the
//! quickest exchanges are believed: of every [`BUCKET`] consecutive exchanges the one with the
//! shortest round trip is kept, and offset and drift are a least-squares line through the kept
//! ones. The uncertainty reported is half the shortest round trip among them.

use std::collections::VecDeque;

use stallscope_analysis::frame::NodeClock;
use stallscope_analysis::Nanos;

/// Consecutive exchanges of which the quickest is kept.
pub const BUCKET: usize = 4;

/// Kept exchanges the fit uses (the newest).
const KEPT: usize = 64;

/// ns, a round trip this much over the best still counts as near-best.
const NEAR_BEST_NS: u64 = 100_000;

/// ns, the span of near-best exchanges below which drift is not fitted.
const MIN_DRIFT_SPAN_NS: u64 = 10_000_000_000;

/// One exchange: offset and round trip, at the collector's time.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Exchange {
    /// ns, collector clock, the middle of the exchange.
    at: Nanos,
    /// ns, agent minus collector.
    offset: i64,
    /// ns.
    rtt: u64,
}

/// The estimate of one agent's clock.
#[derive(Debug, Default)]
pub struct ClockEstimator {
    bucket: Vec<Exchange>,
    kept: VecDeque<Exchange>,
    exchanges: u32,
}

impl ClockEstimator {
    /// Takes one ping/pong exchange. `t1`, `t4`: collector clock; `t2`, `t3`: agent clock (ns).
    /// An exchange whose times contradict each other (negative round trip) is ignored.
    pub fn add(&mut self, t1: Nanos, t2: Nanos, t3: Nanos, t4: Nanos) {
        let (Some(total), Some(held)) = (t4.checked_sub(t1), t3.checked_sub(t2)) else {
            return;
        };
        let Some(rtt) = total.checked_sub(held) else {
            return;
        };
        let offset = ((t2 as i128 - t1 as i128) + (t3 as i128 - t4 as i128)) / 2;
        self.exchanges += 1;
        self.bucket.push(Exchange {
            at: t1 + total / 2,
            offset: offset as i64,
            rtt,
        });
        if self.bucket.len() >= BUCKET {
            self.close_bucket();
        }
    }

    fn close_bucket(&mut self) {
        if let Some(best) = self.bucket.drain(..).min_by_key(|e| e.rtt) {
            self.kept.push_back(best);
            while self.kept.len() > KEPT {
                self.kept.pop_front();
            }
        }
    }

    /// Exchanges taken so far.
    pub fn exchanges(&self) -> u32 {
        self.exchanges
    }

    /// The current estimate for `node`, once a bucket has closed.
    pub fn estimate(&self, node: &str) -> Option<NodeClock> {
        let best = *self.kept.iter().min_by_key(|e| e.rtt)?;
        // Exchanges that queued (round trip well over the best) skew the offset by up to half
        // their extra delay: only near-best ones are believed.
        let limit = best.rtt.saturating_mul(2).max(best.rtt + NEAR_BEST_NS);
        let pts: Vec<Exchange> = self
            .kept
            .iter()
            .copied()
            .filter(|e| e.rtt <= limit)
            .collect();
        let at = self.kept.back()?.at;
        let (offset, drift_ppm) = fit(&pts, at);
        Some(NodeClock {
            node: node.to_string(),
            offset_ns: offset,
            drift_ppm,
            at_ns: at,
            uncertainty_ns: best.rtt / 2,
            samples: self.exchanges,
        })
    }
}

/// Least-squares line through (at, offset): the offset at `at0` and the slope in ppm. With
/// fewer than 3 points, or a span under [`MIN_DRIFT_SPAN_NS`], the slope is not trusted and
/// the offset is the one of the quickest exchange.
fn fit(pts: &[Exchange], at0: Nanos) -> (i64, f64) {
    let span = pts.last().map_or(0, |l| l.at) - pts.first().map_or(0, |f| f.at);
    if pts.len() < 3 || span < MIN_DRIFT_SPAN_NS {
        let best = pts.iter().min_by_key(|e| e.rtt).expect("non-empty");
        return (best.offset, 0.0);
    }
    let n = pts.len() as f64;
    let x: Vec<f64> = pts.iter().map(|e| e.at as f64 - at0 as f64).collect();
    let y: Vec<f64> = pts.iter().map(|e| e.offset as f64).collect();
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|v| (v - mx) * (v - mx)).sum();
    let sxy: f64 = x.iter().zip(&y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    ((my - slope * mx).round() as i64, slope * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// An exchange with the agent `offset` ns ahead (plus `drift` ns per ns), one-way delays
    /// `up` and `down` ns.
    fn exchange(c: &mut ClockEstimator, t1: Nanos, offset: i64, drift: f64, up: u64, down: u64) {
        let agent = |t: Nanos| (t as i64 + offset + (t as f64 * drift) as i64) as Nanos;
        let t2 = agent(t1 + up);
        let t3 = t2 + 20_000;
        let t4 = t1 + up + 20_000 + down;
        c.add(t1, t2, t3, t4);
    }

    #[test]
    fn an_offset_is_recovered_within_the_best_half_round_trip_despite_queued_exchanges() {
        let mut c = ClockEstimator::default();
        for i in 0..16u64 {
            // Every exchange but one per bucket sat 5 ms in a queue on the way back.
            let down = if i % BUCKET as u64 == 2 {
                60_000
            } else {
                5 * MS
            };
            exchange(
                &mut c,
                1_000 * MS + i * 50 * MS,
                -50 * MS as i64,
                0.0,
                40_000,
                down,
            );
        }
        let e = c.estimate("b").unwrap();
        let err = (e.offset_ns + 50 * MS as i64).abs();
        assert!(err <= e.uncertainty_ns as i64, "{e:?}");
        assert!(err < 20_000, "off by {err} ns: {e:?}");
        assert_eq!(e.uncertainty_ns, 50_000);
    }

    #[test]
    fn drift_is_followed() {
        let mut c = ClockEstimator::default();
        // 20 ppm fast, exchanges every 200 ms for 50 s.
        for i in 0..250u64 {
            exchange(
                &mut c,
                1_000 * MS + i * 200 * MS,
                30 * MS as i64,
                20e-6,
                30_000,
                30_000,
            );
        }
        let e = c.estimate("a").unwrap();
        assert!((e.drift_ppm - 20.0).abs() < 0.5, "{e:?}");
        let truth = 30 * MS as i64 + (e.at_ns as f64 * 20e-6) as i64;
        assert!((e.offset_ns - truth).abs() < 5_000, "{e:?} vs {truth}");
    }

    #[test]
    fn contradictory_times_are_ignored() {
        let mut c = ClockEstimator::default();
        c.add(100, 50, 10, 200);
        c.add(300, 50, 60, 200);
        assert_eq!(c.exchanges(), 0);
        assert!(c.estimate("x").is_none());
    }
}
