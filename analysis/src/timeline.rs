//! The node timeline: declared series and their raw samples, and the queries attribution asks
//! of them.
//!
//! Raw counter values are the stored truth (the `Sample` → `Model` pattern of
//! facebookincubator/below): the increase of a counter over any interval is derived here, in
//! one place, by spreading each increase evenly over the time between the two samples that
//! bracket it. Gauges hold their sampled value over the interval that ends at the sample.
//! Samples stand at the middle of their read window ([`SampleBatch::at`]).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind, LINK_LOOPBACK, LINK_NIC};
use crate::Nanos;

/// Increases shorter than this (ns) are not used to estimate a link's peak rate: a single
/// packet burst over a few µs would look like an absurd bandwidth.
const MIN_RATE_WINDOW_NS: u64 = 5_000_000;

/// Hashes a [`SeriesId`] with one multiply. Every sample value and every counter query of
/// the attribution looks its series up; with SipHash (std's default, which resists chosen
/// keys) the hashing alone cost more than the lookups' other work. Ids come from the node's
/// own sampler, or from a profile or an authenticated agent.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|b| self.mix(u64::from(*b)));
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl IdHasher {
    fn mix(&mut self, word: u64) {
        // The multiplier of rustc's FxHasher: odd, its bits spread.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A map by series id, hashed by [`IdHasher`].
type IdMap<V> = HashMap<SeriesId, V, BuildHasherDefault<IdHasher>>;

/// Declared series with their samples, oldest first.
#[derive(Debug, Default)]
pub struct SeriesStore {
    decls: IdMap<SeriesDecl>,
    points: IdMap<Points>,
    by_key: HashMap<(String, String), SeriesId>,
    /// Time of the newest batch, ns.
    watermark: Option<Nanos>,
    /// Time of the oldest batch still held, ns.
    first: Option<Nanos>,
    peaks: LinkPeaks,
    /// When, NIC and loopback byte totals, and how many link counters made them.
    last_link_totals: Option<(Nanos, u64, u64, u32)>,
    /// The peaks of the whole run, when known before its samples ([`Self::assume_link_peaks`]).
    assumed_peaks: Option<LinkPeaks>,
    /// The GPUs (label `gpu`) with link series, in the order first declared.
    gpus: Vec<String>,
    /// Per GPU of `gpus`: when, and the NVLink and PCIe byte totals then.
    last_gpu_totals: Vec<Option<(Nanos, u64, u64)>>,
}

/// One series' samples, and what its values add to the link peaks.
#[derive(Debug, Default)]
struct Points {
    link: LinkRole,
    pts: VecDeque<(Nanos, u64)>,
}

/// What a series' values count towards in [`LinkPeaks`], decided once when it is declared, so
/// that a batch is taken in one lookup per value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum LinkRole {
    /// Nothing (and undeclared series).
    #[default]
    None,
    /// `net.rx_bytes`/`net.tx_bytes` of a network interface, or `rdma.*_bytes` of an RDMA port.
    Nic,
    /// The same of loopback.
    Loopback,
    /// The same with no known link class: it says a network series was read, and adds nothing.
    OtherNet,
    /// `gpu.nvlink.*_bytes` of GPU number `n` of [`SeriesStore::gpus`].
    NvLink(usize),
    /// `gpu.pcie.*_bytes` of GPU number `n`.
    Pcie(usize),
}

/// The highest byte rates seen per link class, bytes/s (rx + tx over every interface).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkPeaks {
    /// bytes/s over the network interfaces and RDMA ports.
    pub nic: f64,
    /// bytes/s over loopback.
    pub loopback: f64,
    /// bytes moved over the NICs since the start, for "has this node a network at all".
    pub nic_bytes_total: u64,
    /// bytes/s over the NVLinks of one GPU (rx + tx, all links), the highest of any GPU.
    pub nvlink: f64,
    /// bytes/s over the PCIe link of one GPU (rx + tx), the highest of any GPU.
    pub pcie: f64,
}

/// The link peaks of a profile's series and samples, taken one at a time (holding one sample
/// per series): what a store given them all would report at the end.
#[derive(Debug, Default)]
pub struct PeaksPass {
    store: SeriesStore,
    batches: u64,
}

impl PeaksPass {
    /// Takes a declaration.
    pub fn declare(&mut self, decl: SeriesDecl) {
        self.store.declare(decl);
    }

    /// Takes a batch.
    pub fn ingest(&mut self, batch: &SampleBatch) {
        self.store.ingest(batch);
        self.batches += 1;
        if self.batches % 1024 == 0 {
            if let Some(w) = self.store.watermark() {
                self.store.prune_before(w);
            }
        }
    }

    /// The peaks of every batch taken.
    pub fn peaks(&self) -> LinkPeaks {
        self.store.link_peaks()
    }
}

/// Byte totals of one batch: per link class, and per GPU (index, NVLink, PCIe).
#[derive(Default)]
struct BatchTotals {
    net_seen: bool,
    /// How many NIC and loopback counters the totals sum.
    links: u32,
    nic: u64,
    loopback: u64,
    gpus: Vec<(usize, u64, u64)>,
}

impl BatchTotals {
    fn add(&mut self, role: LinkRole, v: u64) {
        match role {
            LinkRole::None => {}
            LinkRole::Nic => {
                self.net_seen = true;
                self.links += 1;
                self.nic = self.nic.wrapping_add(v);
            }
            LinkRole::Loopback => {
                self.net_seen = true;
                self.links += 1;
                self.loopback = self.loopback.wrapping_add(v);
            }
            LinkRole::OtherNet => self.net_seen = true,
            LinkRole::NvLink(gpu) | LinkRole::Pcie(gpu) => {
                let slot = match self.gpus.iter().position(|t| t.0 == gpu) {
                    Some(i) => &mut self.gpus[i],
                    None => {
                        self.gpus.push((gpu, 0, 0));
                        self.gpus.last_mut().expect("just pushed")
                    }
                };
                if matches!(role, LinkRole::NvLink(_)) {
                    slot.1 = slot.1.wrapping_add(v);
                } else {
                    slot.2 = slot.2.wrapping_add(v);
                }
            }
        }
    }
}

impl SeriesStore {
    /// Records a declaration. Re-declaring an id replaces it.
    pub fn declare(&mut self, decl: SeriesDecl) {
        let key_label = decl
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        self.by_key.insert((decl.name.clone(), key_label), decl.id);
        let link = self.link_role(&decl);
        self.points.entry(decl.id).or_default().link = link;
        self.decls.insert(decl.id, decl);
    }

    fn link_role(&mut self, d: &SeriesDecl) -> LinkRole {
        use crate::series::names::{
            GPU_NVLINK_RX_BYTES, GPU_NVLINK_TX_BYTES, GPU_PCIE_RX_BYTES, GPU_PCIE_TX_BYTES,
            NET_RX_BYTES, NET_TX_BYTES, RDMA_RX_BYTES, RDMA_TX_BYTES,
        };
        let name = d.name.as_str();
        if name == RDMA_RX_BYTES || name == RDMA_TX_BYTES {
            return LinkRole::Nic;
        }
        if name == NET_RX_BYTES || name == NET_TX_BYTES {
            return match d.label("link") {
                Some(LINK_LOOPBACK) => LinkRole::Loopback,
                Some(LINK_NIC) => LinkRole::Nic,
                _ => LinkRole::OtherNet,
            };
        }
        let nvlink = name == GPU_NVLINK_RX_BYTES || name == GPU_NVLINK_TX_BYTES;
        if !nvlink && name != GPU_PCIE_RX_BYTES && name != GPU_PCIE_TX_BYTES {
            return LinkRole::None;
        }
        let gpu = d.label(crate::series::LABEL_GPU).unwrap_or("");
        let n = match self.gpus.iter().position(|g| g == gpu) {
            Some(n) => n,
            None => {
                self.gpus.push(gpu.to_string());
                self.last_gpu_totals.push(None);
                self.gpus.len() - 1
            }
        };
        if nvlink {
            LinkRole::NvLink(n)
        } else {
            LinkRole::Pcie(n)
        }
    }

    /// Records one round of samples. Values of undeclared series are dropped (writers
    /// declare a series before its first sample; nothing could name one that is not), and a
    /// series read again at the instant of its last point keeps that point: a second value
    /// at one instant has no interval to spread over or hold for, and a file repeating
    /// batches at one instant must not grow the store.
    pub fn ingest(&mut self, batch: &SampleBatch) {
        let at = batch.at();
        if self.watermark.is_some_and(|w| at < w) {
            // Out of order: the agent's recorder puts its two samplers' batches in time order
            // (agent/src/node/sample_merge.rs) unless one falls over a second behind. Dropped
            // rather than corrupting every series the batch holds.
            return;
        }
        let mut totals = BatchTotals::default();
        for (id, v) in &batch.values {
            let Some(series) = self.points.get_mut(id) else {
                continue;
            };
            if series.pts.back().is_none_or(|(t, _)| *t < at) {
                series.pts.push_back((at, *v));
            }
            totals.add(series.link, *v);
        }
        self.watermark = Some(at);
        self.first.get_or_insert(at);
        self.update_link_peaks(at, &totals);
        self.update_gpu_peaks(at, &totals);
    }

    /// Appends a batch even if it is older than the newest one (tests build series one at a
    /// time).
    #[cfg(test)]
    pub(crate) fn ingest_unordered_for_tests(&mut self, batch: &SampleBatch) {
        let at = batch.at();
        for (id, v) in &batch.values {
            self.points.entry(*id).or_default().pts.push_back((at, *v));
        }
        self.watermark = Some(self.watermark.map_or(at, |w| w.max(at)));
    }

    fn update_link_peaks(&mut self, at: Nanos, totals: &BatchTotals) {
        if !totals.net_seen {
            return;
        }
        let (nic, lo, links) = (totals.nic, totals.loopback, totals.links);
        if let Some((t0, nic0, lo0, links0)) = self.last_link_totals {
            let dt = at.saturating_sub(t0);
            if links != links0 {
                // A counter came or went (an interface, an RDMA port, a source that failed a
                // round): the totals are of other sums, and one that came holds everything
                // since boot. Start again from these.
                self.last_link_totals = Some((at, nic, lo, links));
            } else if dt >= MIN_RATE_WINDOW_NS {
                let dn = nic.saturating_sub(nic0);
                let dl = lo.saturating_sub(lo0);
                self.peaks.nic_bytes_total += dn;
                let secs = dt as f64 / 1e9;
                self.peaks.nic = self.peaks.nic.max(dn as f64 / secs);
                self.peaks.loopback = self.peaks.loopback.max(dl as f64 / secs);
                self.last_link_totals = Some((at, nic, lo, links));
            }
        } else {
            self.last_link_totals = Some((at, nic, lo, links));
        }
    }

    fn update_gpu_peaks(&mut self, at: Nanos, totals: &BatchTotals) {
        for &(gpu, nvlink, pcie) in &totals.gpus {
            let Some(last) = self.last_gpu_totals.get_mut(gpu) else {
                continue;
            };
            match last {
                Some(last) => {
                    let dt = at.saturating_sub(last.0);
                    if dt >= MIN_RATE_WINDOW_NS {
                        let secs = dt as f64 / 1e9;
                        let nv_rate = nvlink.saturating_sub(last.1) as f64 / secs;
                        let pcie_rate = pcie.saturating_sub(last.2) as f64 / secs;
                        self.peaks.nvlink = self.peaks.nvlink.max(nv_rate);
                        self.peaks.pcie = self.peaks.pcie.max(pcie_rate);
                        *last = (at, nvlink, pcie);
                    }
                }
                None => *last = Some((at, nvlink, pcie)),
            }
        }
    }

    /// A series' declaration.
    pub fn decl(&self, id: SeriesId) -> Option<&SeriesDecl> {
        self.decls.get(&id)
    }

    /// Every declared series named `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a SeriesDecl> + 'a {
        self.decls.values().filter(move |d| d.name == name)
    }

    /// The device-wide series named `name` of GPU `gpu` (its NVML index label), not one of a
    /// process on it.
    pub fn on_gpu(&self, name: &str, gpu: &str) -> Option<&SeriesDecl> {
        self.decls.values().find(|d| {
            d.name == name
                && d.label(crate::series::LABEL_GPU) == Some(gpu)
                && d.label("pid").is_none()
        })
    }

    /// The series named `name` with exactly the labels `labels` (in declaration order).
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<SeriesId> {
        let key_label = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        self.by_key.get(&(name.to_string(), key_label)).copied()
    }

    /// Time of the newest sample round, ns.
    pub fn watermark(&self) -> Option<Nanos> {
        self.watermark
    }

    /// Peak link rates seen so far, or the whole run's when assumed.
    pub fn link_peaks(&self) -> LinkPeaks {
        self.assumed_peaks.unwrap_or(self.peaks)
    }

    /// Takes `peaks` (a first pass over a profile: [`PeaksPass`]) as the link
    /// peaks from now on, so that iterations attributed as a replay goes get what attributing
    /// them all at the end would.
    pub fn assume_link_peaks(&mut self, peaks: LinkPeaks) {
        self.assumed_peaks = Some(peaks);
    }

    /// The sample times of a series inside `[a, b]`, ns.
    pub fn times_within(&self, id: SeriesId, a: Nanos, b: Nanos) -> Vec<Nanos> {
        let Some(pts) = self.pts(id) else {
            return Vec::new();
        };
        let from = pts.partition_point(|(t, _)| *t < a);
        pts.iter()
            .skip(from)
            .take_while(|(t, _)| *t <= b)
            .map(|(t, _)| *t)
            .collect()
    }

    /// How much of `[a, b]` lies between the first and the last sample of `id`, ns.
    pub fn covered(&self, id: SeriesId, a: Nanos, b: Nanos) -> u64 {
        let Some(pts) = self.pts(id) else {
            return 0;
        };
        match (pts.front(), pts.back()) {
            (Some((first, _)), Some((last, _))) => overlap(*first, *last, a, b),
            _ => 0,
        }
    }

    /// Increase of counter `id` over `[a, b]`: each increase between two consecutive samples
    /// is spread evenly over the time between them and the part inside `[a, b]` is summed.
    /// `None` when no pair of samples overlaps the interval. A decrease (a counter reset, a
    /// process replaced under the same label) contributes nothing.
    pub fn counter_delta(&self, id: SeriesId, a: Nanos, b: Nanos) -> Option<f64> {
        let pts = self.pts(id)?;
        if pts.len() < 2 || b <= a {
            return None;
        }
        // First pair whose end is after a.
        let mut i = pts.partition_point(|(t, _)| *t <= a).max(1);
        let mut total = 0.0;
        let mut any = false;
        while i < pts.len() {
            let (t0, v0) = pts[i - 1];
            let (t1, v1) = pts[i];
            if t0 >= b {
                break;
            }
            let ov = overlap(t0, t1, a, b);
            if ov > 0 && t1 > t0 {
                any = true;
                total += v1.saturating_sub(v0) as f64 * ov as f64 / (t1 - t0) as f64;
            }
            i += 1;
        }
        any.then_some(total)
    }

    /// Time-weighted mean of gauge `id` over `[a, b]`, each sample's value holding over the
    /// interval since the previous sample. `None` when nothing overlaps.
    pub fn gauge_mean(&self, id: SeriesId, a: Nanos, b: Nanos) -> Option<f64> {
        let pts = self.pts(id)?;
        if pts.len() < 2 || b <= a {
            return None;
        }
        let mut i = pts.partition_point(|(t, _)| *t <= a).max(1);
        let (mut sum, mut span) = (0.0, 0u64);
        while i < pts.len() {
            let (t0, _) = pts[i - 1];
            let (t1, v1) = pts[i];
            if t0 >= b {
                break;
            }
            let ov = overlap(t0, t1, a, b);
            sum += v1 as f64 * ov as f64;
            span += ov;
            i += 1;
        }
        (span > 0).then(|| sum / span as f64)
    }

    /// Forgets samples older than `t` (keeping one before it per series, so intervals that
    /// start at `t` can still be bracketed).
    pub fn prune_before(&mut self, t: Nanos) {
        for Points { pts, .. } in self.points.values_mut() {
            let keep_from = pts.partition_point(|(at, _)| *at < t).saturating_sub(1);
            pts.drain(..keep_from);
        }
        self.first = self
            .points
            .values()
            .filter_map(|p| p.pts.front().map(|x| x.0))
            .min();
    }

    /// Forgets every series labelled `key=value` (the series of a process gone), with its
    /// samples.
    pub fn forget_labelled(&mut self, key: &str, value: &str) {
        let gone: Vec<SeriesId> = self
            .decls
            .values()
            .filter(|d| d.label(key) == Some(value))
            .map(|d| d.id)
            .collect();
        for id in &gone {
            self.decls.remove(id);
            self.points.remove(id);
        }
        self.by_key.retain(|_, id| !gone.contains(id));
    }

    /// Time of the newest sample of series `id`, ns.
    pub fn latest(&self, id: SeriesId) -> Option<Nanos> {
        self.pts(id)?.back().map(|(t, _)| *t)
    }

    /// How much is held: series declared (or with samples), and samples over all of them.
    pub fn held(&self) -> (usize, usize) {
        let series = self.decls.len().max(self.points.len());
        (series, self.points.values().map(|p| p.pts.len()).sum())
    }

    /// The samples of a series, oldest first.
    fn pts(&self, id: SeriesId) -> Option<&VecDeque<(Nanos, u64)>> {
        self.points.get(&id).map(|p| &p.pts)
    }

    /// Kind of a series, if declared.
    pub fn kind(&self, id: SeriesId) -> Option<SeriesKind> {
        self.decls.get(&id).map(|d| d.kind)
    }
}

/// Length of the intersection of `[a0, a1]` and `[b0, b1]`, ns.
pub fn overlap(a0: Nanos, a1: Nanos, b0: Nanos, b1: Nanos) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::names;

    fn store_with(kind: SeriesKind, pts: &[(Nanos, u64)]) -> (SeriesStore, SeriesId) {
        let mut s = SeriesStore::default();
        let id = SeriesId(0);
        s.declare(SeriesDecl {
            id,
            name: "x".into(),
            unit: "ns".into(),
            kind,
            labels: vec![("pid".into(), "1".into())],
        });
        for (t, v) in pts {
            s.ingest(&SampleBatch {
                t_ns: *t,
                dur_ns: 0,
                values: vec![(id, *v)],
            });
        }
        (s, id)
    }

    #[test]
    fn counter_delta_prorates_across_samples() {
        let (s, id) = store_with(
            SeriesKind::Counter,
            &[(0, 0), (10, 100), (20, 100), (30, 400)],
        );
        assert_eq!(s.counter_delta(id, 0, 30), Some(400.0));
        assert_eq!(s.counter_delta(id, 5, 15), Some(50.0));
        assert_eq!(s.counter_delta(id, 25, 30), Some(150.0));
        assert_eq!(s.counter_delta(id, 40, 50), None);
        assert_eq!(s.find("x", &[("pid", "1")]), Some(id));
        assert_eq!(s.covered(id, 20, 50), 10);
    }

    #[test]
    fn counter_reset_adds_nothing() {
        let (s, id) = store_with(SeriesKind::Counter, &[(0, 500), (10, 20), (20, 30)]);
        assert_eq!(s.counter_delta(id, 0, 20), Some(10.0));
    }

    #[test]
    fn gauge_mean_is_time_weighted() {
        let (s, id) = store_with(SeriesKind::Gauge, &[(0, 0), (10, 1), (30, 0)]);
        // (0,10] holds 1, (10,30] holds 0.
        assert_eq!(s.gauge_mean(id, 0, 20), Some(0.5));
    }

    #[test]
    fn prune_keeps_a_bracketing_sample() {
        let (mut s, id) = store_with(SeriesKind::Counter, &[(0, 0), (10, 10), (20, 20), (30, 30)]);
        s.prune_before(25);
        assert_eq!(s.counter_delta(id, 25, 30), Some(5.0));
        assert_eq!(s.counter_delta(id, 0, 10), None);
    }

    #[test]
    fn link_peaks_follow_the_fastest_window() {
        let mut s = SeriesStore::default();
        for (i, link) in [LINK_NIC, LINK_LOOPBACK].iter().enumerate() {
            s.declare(SeriesDecl {
                id: SeriesId(i as u32),
                name: names::NET_RX_BYTES.into(),
                unit: "bytes".into(),
                kind: SeriesKind::Counter,
                labels: vec![
                    ("iface".into(), format!("if{i}")),
                    ("link".into(), (*link).into()),
                ],
            });
        }
        let ms = 1_000_000;
        for (t, nic, lo) in [
            (0, 0, 0),
            (10 * ms, 1_000_000, 50),
            (20 * ms, 1_500_000, 100),
        ] {
            s.ingest(&SampleBatch {
                t_ns: t,
                dur_ns: 0,
                values: vec![(SeriesId(0), nic), (SeriesId(1), lo)],
            });
        }
        let p = s.link_peaks();
        assert!((p.nic - 100_000_000.0).abs() < 1.0, "{p:?}");
        assert!((p.loopback - 5_000.0).abs() < 1.0, "{p:?}");
        assert_eq!(p.nic_bytes_total, 1_500_000);
    }

    /// An RDMA port counts everything since boot: when its source comes up late (or misses a
    /// round), the jump of the node's NIC total is not a rate.
    #[test]
    fn a_link_counter_that_comes_late_sets_no_peak() {
        let mut s = SeriesStore::default();
        for (id, name) in [(0, names::NET_RX_BYTES), (1, names::RDMA_RX_BYTES)] {
            s.declare(SeriesDecl {
                id: SeriesId(id),
                name: name.into(),
                unit: "bytes".into(),
                kind: SeriesKind::Counter,
                labels: vec![("link".into(), LINK_NIC.into())],
            });
        }
        let ms = 1_000_000;
        let rdma = 1u64 << 44; // 16 TiB since boot
        let rounds: [(u64, u64, Option<u64>); 5] = [
            (0, 0, None),
            (10 * ms, 1_000, None),
            (20 * ms, 2_000, Some(rdma)),
            (30 * ms, 3_000, Some(rdma + 1_000_000)),
            (40 * ms, 4_000, None),
        ];
        for (t, nic, port) in rounds {
            let mut values = vec![(SeriesId(0), nic)];
            values.extend(port.map(|v| (SeriesId(1), v)));
            s.ingest(&SampleBatch {
                t_ns: t,
                dur_ns: 0,
                values,
            });
        }
        let p = s.link_peaks();
        assert!((p.nic - 100_100_000.0).abs() < 1.0, "{p:?}");
        assert_eq!(p.nic_bytes_total, 1_000 + 1_001_000);
    }

    #[test]
    fn samples_of_undeclared_series_are_not_kept() {
        let (mut s, id) = store_with(SeriesKind::Counter, &[(0, 0)]);
        s.ingest(&SampleBatch {
            t_ns: 10,
            dur_ns: 0,
            values: (0..1_000).map(|i| (SeriesId(i), 5)).collect(),
        });
        assert_eq!(s.held(), (1, 2));
        assert_eq!(s.counter_delta(id, 0, 10), Some(5.0));
    }

    #[test]
    fn a_batch_repeated_at_one_instant_adds_no_point_and_loses_no_increase() {
        let (mut s, id) = store_with(SeriesKind::Counter, &[(0, 0), (10, 100)]);
        for v in [100, 150, 150] {
            s.ingest(&SampleBatch {
                t_ns: 10,
                dur_ns: 0,
                values: vec![(id, v)],
            });
        }
        s.ingest(&SampleBatch {
            t_ns: 20,
            dur_ns: 0,
            values: vec![(id, 200)],
        });
        assert_eq!(s.held(), (1, 3));
        assert_eq!(s.times_within(id, 0, 20), vec![0, 10, 20]);
        assert_eq!(s.counter_delta(id, 0, 20), Some(200.0));
        assert_eq!(s.counter_delta(id, 0, 10), Some(100.0));
    }
}
