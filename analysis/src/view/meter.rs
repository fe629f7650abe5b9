//! A node's resources over the last second, from the raw samples the journal sees.
//!
//! The attribution reads counters per iteration; the views want the node as a whole: how
//! many cores the job used, how long its threads queued for a CPU, what the NICs, RDMA ports,
//! disks and GPUs moved. The meter folds every sample batch into one-second buckets as it arrives
//! (counters as deltas between consecutive raw values of the same series, gauges as means),
//! so it needs no history and replays the same from a profile. It also counts each NIC's bytes
//! since the start, which `/metrics` exposes per interface, and every counter's increases
//! since the start ([`NodeCounters`]), which `/metrics` exposes as its `_total` counters.

use std::collections::HashMap;

use crate::frame::{Frame, NicBytes, RdmaCount};
use crate::resources::{NodeCounters, NodeResources};
use crate::series::{names, SeriesDecl, SeriesId, SeriesKind, LINK_NIC};
use crate::Nanos;

/// Length of one reading, ns.
pub const BUCKET_NS: Nanos = 1_000_000_000;

/// Shortest partial bucket [`NodeMeter::flush`] makes a reading of, ns.
pub const MIN_FLUSH_NS: Nanos = 200_000_000;

/// What a series contributes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quantity {
    CpuNs,
    RunqNs,
    NicRx,
    NicTx,
    DiskRead,
    DiskWrite,
    PsiCpuUs,
    PsiIoUs,
    PsiMemoryUs,
    GpuUtilPct,
    PcieRx,
    PcieTx,
    NvlinkRx,
    NvlinkTx,
    RdmaRx,
    RdmaTx,
}

const QUANTITIES: usize = 16;

impl Quantity {
    fn of(d: &SeriesDecl) -> Option<Quantity> {
        Some(match d.name.as_str() {
            names::PROC_ALL_CPU_NS => Quantity::CpuNs,
            names::PROC_RUNQ_NS => Quantity::RunqNs,
            names::NET_RX_BYTES if d.label("link") == Some(LINK_NIC) => Quantity::NicRx,
            names::NET_TX_BYTES if d.label("link") == Some(LINK_NIC) => Quantity::NicTx,
            names::DISK_READ_BYTES => Quantity::DiskRead,
            names::DISK_WRITE_BYTES => Quantity::DiskWrite,
            names::PSI_SOME_US => match d.label("resource") {
                Some("cpu") => Quantity::PsiCpuUs,
                Some("io") => Quantity::PsiIoUs,
                Some("memory") => Quantity::PsiMemoryUs,
                _ => return None,
            },
            names::GPU_UTIL_PCT => Quantity::GpuUtilPct,
            names::GPU_PCIE_RX_BYTES => Quantity::PcieRx,
            names::GPU_PCIE_TX_BYTES => Quantity::PcieTx,
            names::GPU_NVLINK_RX_BYTES => Quantity::NvlinkRx,
            names::GPU_NVLINK_TX_BYTES => Quantity::NvlinkTx,
            names::RDMA_RX_BYTES => Quantity::RdmaRx,
            names::RDMA_TX_BYTES => Quantity::RdmaTx,
            _ => return None,
        })
    }
}

/// One series the meter follows.
#[derive(Clone, Copy, Debug)]
struct Followed {
    quantity: Quantity,
    kind: SeriesKind,
    /// The last raw value of a counter.
    last: Option<u64>,
    /// For a NIC's counter, its index in [`NodeMeter::nics`].
    nic: Option<usize>,
}

/// Sums over the open bucket: per quantity, the counter increase or the gauge sum and count.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    start: Option<Nanos>,
    /// The last sample folded in.
    last: Option<Nanos>,
    sum: [f64; QUANTITIES],
    count: [u32; QUANTITIES],
}

/// Folds one node's samples into one-second [`NodeResources`].
#[derive(Debug, Default)]
pub struct NodeMeter {
    followed: HashMap<SeriesId, Followed>,
    bucket: Bucket,
    /// Bytes per NIC since the first sample, by the order the NICs were declared.
    nics: Vec<NicBytes>,
    /// Per quantity, the counters' increases since the first sample; `None` until one moved.
    totals: [Option<f64>; QUANTITIES],
    /// RDMA ports' wait, congestion and retransmission counters: by series, the index in
    /// `rdma_counts` and the last raw value.
    rdma_followed: HashMap<SeriesId, (usize, Option<u64>)>,
    /// Their increases since the first sample, in the order first declared.
    rdma_counts: Vec<RdmaCount>,
}

impl NodeMeter {
    /// Takes a frame; returns a reading when a bucket closed.
    pub fn ingest(&mut self, frame: &Frame) -> Option<NodeResources> {
        match frame {
            Frame::Series(d) => {
                self.follow_rdma_counter(d);
                match Quantity::of(d) {
                    Some(quantity) => {
                        let nic = matches!(quantity, Quantity::NicRx | Quantity::NicTx)
                            .then(|| d.label("iface"))
                            .flatten()
                            .map(|iface| self.nic_index(iface));
                        self.followed.insert(
                            d.id,
                            Followed {
                                quantity,
                                kind: d.kind,
                                last: None,
                                nic,
                            },
                        );
                    }
                    None => {
                        self.followed.remove(&d.id);
                    }
                }
                None
            }
            Frame::Samples(batch) => {
                let at = batch.at();
                // A counter's increase belongs to (its previous sample, this one]: a bucket
                // spans (start, end], its start the sample that closed the one before.
                let start = *self.bucket.start.get_or_insert(at);
                self.bucket.last = Some(at);
                for (id, raw) in &batch.values {
                    if let Some((i, last)) = self.rdma_followed.get_mut(id) {
                        if let Some(last) = last {
                            self.rdma_counts[*i].value += raw.saturating_sub(*last);
                        }
                        *last = Some(*raw);
                        continue;
                    }
                    let Some(f) = self.followed.get_mut(id) else {
                        continue;
                    };
                    let q = f.quantity as usize;
                    match f.kind {
                        SeriesKind::Counter => {
                            if let Some(last) = f.last {
                                // A counter that went back (a device reset) adds nothing.
                                let delta = raw.saturating_sub(last);
                                self.bucket.sum[q] += delta as f64;
                                *self.totals[q].get_or_insert(0.0) += delta as f64;
                                self.bucket.count[q] += 1;
                                if let Some(nic) = f.nic.and_then(|i| self.nics.get_mut(i)) {
                                    match f.quantity {
                                        Quantity::NicRx => nic.rx_bytes += delta,
                                        _ => nic.tx_bytes += delta,
                                    }
                                }
                            }
                            f.last = Some(*raw);
                        }
                        SeriesKind::Gauge => {
                            self.bucket.sum[q] += *raw as f64;
                            self.bucket.count[q] += 1;
                        }
                    }
                }
                if at.saturating_sub(start) < BUCKET_NS {
                    return None;
                }
                let r = self.reading(start, at - start);
                self.bucket = Bucket {
                    start: Some(at),
                    ..Bucket::default()
                };
                Some(r)
            }
            _ => None,
        }
    }

    /// The open bucket as a reading, at the end of a run: the last second is rarely whole, and
    /// without it a report's resource charts stopped up to a second before the run did.
    /// `None` when it spans less than [`MIN_FLUSH_NS`] (rates over a few samples mislead).
    pub fn flush(&mut self) -> Option<NodeResources> {
        let (start, last) = (self.bucket.start?, self.bucket.last?);
        let dur = last.saturating_sub(start);
        if dur < MIN_FLUSH_NS {
            return None;
        }
        let r = self.reading(start, dur);
        self.bucket = Bucket {
            start: Some(last),
            ..Bucket::default()
        };
        Some(r)
    }

    /// Bytes per NIC (loopback left out) since the first sample, by interface name.
    pub fn nics(&self) -> Vec<NicBytes> {
        let mut out = self.nics.clone();
        out.sort();
        out
    }

    /// Each RDMA port's wait, congestion and retransmission counters' increases since the
    /// first sample, sorted by device, port and counter.
    pub fn rdma_counters(&self) -> Vec<RdmaCount> {
        let mut out = self.rdma_counts.clone();
        out.sort();
        out
    }

    /// Follows `d` when it is an RDMA port's wait or event counter (a series declared again,
    /// by a restarted source, keeps its count).
    fn follow_rdma_counter(&mut self, d: &SeriesDecl) {
        let counter = match d.name.as_str() {
            names::RDMA_XMIT_WAIT => "port_xmit_wait",
            names::RDMA_COUNTER => match d.label("counter") {
                Some(c) => c,
                None => return,
            },
            _ => return,
        };
        let count = RdmaCount {
            device: d.label("device").unwrap_or_default().to_string(),
            port: d.label("port").unwrap_or_default().to_string(),
            counter: counter.to_string(),
            value: 0,
        };
        let same = |c: &RdmaCount| {
            c.device == count.device && c.port == count.port && c.counter == count.counter
        };
        let i = match self.rdma_counts.iter().position(same) {
            Some(i) => i,
            None => {
                self.rdma_counts.push(count);
                self.rdma_counts.len() - 1
            }
        };
        self.rdma_followed.insert(d.id, (i, None));
    }

    /// What the node's counters moved since the first sample (exact sums of increases).
    pub fn counters(&self) -> NodeCounters {
        let total = |q: Quantity, scale: f64| self.totals[q as usize].map(|t| t * scale);
        NodeCounters {
            cpu_seconds: total(Quantity::CpuNs, 1e-9),
            runq_delay_seconds: total(Quantity::RunqNs, 1e-9),
            nic_rx_bytes: total(Quantity::NicRx, 1.0),
            nic_tx_bytes: total(Quantity::NicTx, 1.0),
            disk_read_bytes: total(Quantity::DiskRead, 1.0),
            disk_write_bytes: total(Quantity::DiskWrite, 1.0),
            pcie_rx_bytes: total(Quantity::PcieRx, 1.0),
            pcie_tx_bytes: total(Quantity::PcieTx, 1.0),
            nvlink_rx_bytes: total(Quantity::NvlinkRx, 1.0),
            nvlink_tx_bytes: total(Quantity::NvlinkTx, 1.0),
            rdma_rx_bytes: total(Quantity::RdmaRx, 1.0),
            rdma_tx_bytes: total(Quantity::RdmaTx, 1.0),
        }
    }

    /// The index of NIC `iface` in [`NodeMeter::nics`], added when new (an interface
    /// declared again, by a restarted source, keeps its count).
    fn nic_index(&mut self, iface: &str) -> usize {
        match self.nics.iter().position(|n| n.iface == iface) {
            Some(i) => i,
            None => {
                self.nics.push(NicBytes {
                    iface: iface.to_string(),
                    ..NicBytes::default()
                });
                self.nics.len() - 1
            }
        }
    }

    fn reading(&self, t_ns: Nanos, dur_ns: Nanos) -> NodeResources {
        let b = &self.bucket;
        let secs = dur_ns as f64 / 1e9;
        let rate = |q: Quantity, scale: f64| {
            (b.count[q as usize] > 0).then(|| b.sum[q as usize] * scale / secs)
        };
        let gpu_busy = (b.count[Quantity::GpuUtilPct as usize] > 0).then(|| {
            b.sum[Quantity::GpuUtilPct as usize]
                / f64::from(b.count[Quantity::GpuUtilPct as usize])
                / 100.0
        });
        NodeResources {
            t_ns,
            dur_ns,
            cpu_busy_cores: rate(Quantity::CpuNs, 1e-9),
            runq_delay: rate(Quantity::RunqNs, 1e-9),
            nic_rx_bytes_per_s: rate(Quantity::NicRx, 1.0),
            nic_tx_bytes_per_s: rate(Quantity::NicTx, 1.0),
            disk_read_bytes_per_s: rate(Quantity::DiskRead, 1.0),
            disk_write_bytes_per_s: rate(Quantity::DiskWrite, 1.0),
            psi_cpu: rate(Quantity::PsiCpuUs, 1e-6),
            psi_io: rate(Quantity::PsiIoUs, 1e-6),
            psi_memory: rate(Quantity::PsiMemoryUs, 1e-6),
            gpu_busy,
            pcie_rx_bytes_per_s: rate(Quantity::PcieRx, 1.0),
            pcie_tx_bytes_per_s: rate(Quantity::PcieTx, 1.0),
            nvlink_rx_bytes_per_s: rate(Quantity::NvlinkRx, 1.0),
            nvlink_tx_bytes_per_s: rate(Quantity::NvlinkTx, 1.0),
            rdma_rx_bytes_per_s: rate(Quantity::RdmaRx, 1.0),
            rdma_tx_bytes_per_s: rate(Quantity::RdmaTx, 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::SampleBatch;

    /// The counters are the raw counters' increases summed exactly, whether or not a bucket
    /// closed; a counter that went back (a reset) adds nothing; an unread quantity is `None`.
    #[test]
    fn counters_sum_every_increase_since_the_first_sample() {
        let mut m = NodeMeter::default();
        m.ingest(&Frame::Series(SeriesDecl {
            id: SeriesId(1),
            name: names::DISK_READ_BYTES.into(),
            unit: "bytes".into(),
            kind: SeriesKind::Counter,
            labels: Vec::new(),
        }));
        for (k, raw) in [1_000u64, 1_500, 4_000, 100, 700].into_iter().enumerate() {
            m.ingest(&Frame::Samples(SampleBatch {
                t_ns: k as u64 * 300_000_000,
                dur_ns: 0,
                values: vec![(SeriesId(1), raw)],
            }));
        }
        let c = m.counters();
        assert_eq!(c.disk_read_bytes, Some(500.0 + 2_500.0 + 600.0));
        assert_eq!(c.nic_rx_bytes, None);
    }

    /// RDMA ports' bytes (already in bytes: the source multiplied the 4-octet units) are a
    /// quantity of their own, summed over ports, beside the NICs; a node without them has none.
    #[test]
    fn rdma_bytes_are_summed_over_ports_beside_the_nics() {
        let mut m = NodeMeter::default();
        for (id, name, device) in [
            (1, names::RDMA_RX_BYTES, "mlx5_0"),
            (2, names::RDMA_RX_BYTES, "mlx5_1"),
            (3, names::RDMA_TX_BYTES, "mlx5_0"),
        ] {
            m.ingest(&Frame::Series(SeriesDecl {
                id: SeriesId(id),
                name: name.into(),
                unit: "bytes".into(),
                kind: SeriesKind::Counter,
                labels: vec![
                    ("device".into(), device.into()),
                    ("port".into(), "1".into()),
                ],
            }));
        }
        let mut readings = Vec::new();
        for k in 0..=4u64 {
            let values = vec![
                (SeriesId(1), k * 1_000_000_000),
                (SeriesId(2), k * 500_000_000),
                (SeriesId(3), k * 4_000),
            ];
            readings.extend(m.ingest(&Frame::Samples(SampleBatch {
                t_ns: k * 500_000_000,
                dur_ns: 0,
                values,
            })));
        }
        let r = &readings[0];
        assert_eq!(r.rdma_rx_bytes_per_s, Some(3e9));
        assert_eq!(r.rdma_tx_bytes_per_s, Some(8_000.0));
        assert_eq!(r.nic_rx_bytes_per_s, None);
        let c = m.counters();
        assert_eq!(c.rdma_rx_bytes, Some(6e9));
        assert_eq!(c.rdma_tx_bytes, Some(16_000.0));
        assert_eq!(NodeMeter::default().counters().rdma_rx_bytes, None);
    }

    /// A port's wait and event counters are counted per device, port and counter from the
    /// first sample on, and are not node resources.
    #[test]
    fn rdma_port_counters_count_their_increases() {
        let mut m = NodeMeter::default();
        let labels = |counter: Option<&str>| {
            let mut l = vec![
                ("device".into(), "mlx5_0".into()),
                ("port".into(), "1".into()),
            ];
            l.extend(counter.map(|c| ("counter".into(), c.into())));
            l
        };
        for (id, name, counter) in [
            (1, names::RDMA_XMIT_WAIT, None),
            (2, names::RDMA_COUNTER, Some("np_cnp_sent")),
        ] {
            m.ingest(&Frame::Series(SeriesDecl {
                id: SeriesId(id),
                name: name.into(),
                unit: "count".into(),
                kind: SeriesKind::Counter,
                labels: labels(counter),
            }));
        }
        for (k, (wait, cnp)) in [(73_421u64, 4_210u64), (73_500, 4_215), (74_000, 4_215)]
            .into_iter()
            .enumerate()
        {
            m.ingest(&Frame::Samples(SampleBatch {
                t_ns: k as u64 * 100_000_000,
                dur_ns: 0,
                values: vec![(SeriesId(1), wait), (SeriesId(2), cnp)],
            }));
        }
        let c = m.rdma_counters();
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].counter.as_str(), c[0].value), ("np_cnp_sent", 5));
        assert_eq!((c[1].counter.as_str(), c[1].value), ("port_xmit_wait", 579));
        assert_eq!((c[0].device.as_str(), c[0].port.as_str()), ("mlx5_0", "1"));
        assert_eq!(m.counters(), NodeCounters::default(), "not node resources");
    }
}
