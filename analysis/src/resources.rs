//! A node's resources over one reading: what the live model shows per node and what an agent
//! ships to the collector (`Frame::NodeResources`). Data only; the node meter
//! (`crate::view::NodeMeter`) fills it from raw samples.
//!
//! Both structs are postcard-encoded (in `Frame::NodeResources` and `Frame::NodeCounters`, in
//! job profiles and on the agent wire), and postcard is not self-describing: a field added
//! to an encoded struct makes every profile and agent written before it unreadable. Fields
//! added later are therefore [`json_only`]: in the JSON model (the feed, `top`) they are
//! ordinary fields; in postcard they take no byte, so the frames encode as before. The meter
//! fills them wherever it reads the series (a run, its profile replayed, an agent's own
//! view); an agent sends the RDMA ones to its collector in `Frame::NodeRdma` (appended last to
//! `Frame`, protocol 9), just before the reading and counters they complete.

use serde::{Deserialize, Serialize};

use crate::Nanos;

/// A node's resources over one bucket. A quantity no source measured is `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResources {
    /// ns, the bucket's start (the node's clock).
    pub t_ns: Nanos,
    /// ns, the bucket's length.
    pub dur_ns: Nanos,
    /// cores, CPU time the job's processes used per second.
    pub cpu_busy_cores: Option<f64>,
    /// s per s, time the loops' threads waited in the run queue (summed over them).
    pub runq_delay: Option<f64>,
    /// bytes/s received on the NICs (loopback left out).
    pub nic_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent on the NICs.
    pub nic_tx_bytes_per_s: Option<f64>,
    /// bytes/s read from whole disks.
    pub disk_read_bytes_per_s: Option<f64>,
    /// bytes/s written to whole disks.
    pub disk_write_bytes_per_s: Option<f64>,
    /// Share of the time some task waited for a CPU (PSI `some`), 0–1.
    pub psi_cpu: Option<f64>,
    /// Share of the time some task waited for I/O (PSI `some`), 0–1.
    pub psi_io: Option<f64>,
    /// Share of the time some task waited for memory (PSI `some`), 0–1.
    pub psi_memory: Option<f64>,
    /// Mean GPU utilisation over the node's GPUs (NVML), 0–1.
    pub gpu_busy: Option<f64>,
    /// bytes/s received over PCIe by the GPUs (NVML field 198), summed.
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent over PCIe by the GPUs (NVML field 197), summed.
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// bytes/s received over NVLink, summed.
    pub nvlink_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent over NVLink, summed.
    pub nvlink_tx_bytes_per_s: Option<f64>,
    /// bytes/s received on the RDMA ports (InfiniBand, RoCE, EFA), summed; `None` on a node
    /// without them. In the JSON model, not in postcard: agents send it in `Frame::NodeRdma`
    /// (see [the module](self)).
    #[serde(default, with = "json_only")]
    pub rdma_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent on the RDMA ports, summed. JSON only.
    #[serde(default, with = "json_only")]
    pub rdma_tx_bytes_per_s: Option<f64>,
}

/// What a node's counters moved since its agent or run started counting: exact sums of the
/// raw counters' increases, not rates integrated back (an agent ships its latest one-second
/// reading only every 2 s, so integrating those counted about half of what moved). What
/// `/metrics` exposes as `_total` counters. A quantity no source measured is `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCounters {
    /// s of CPU the job's processes used.
    pub cpu_seconds: Option<f64>,
    /// s the loops' threads waited in the run queue.
    pub runq_delay_seconds: Option<f64>,
    /// bytes received on the NICs (loopback left out).
    pub nic_rx_bytes: Option<f64>,
    /// bytes sent on the NICs.
    pub nic_tx_bytes: Option<f64>,
    /// bytes read from whole disks.
    pub disk_read_bytes: Option<f64>,
    /// bytes written to whole disks.
    pub disk_write_bytes: Option<f64>,
    /// bytes the GPUs received over PCIe.
    pub pcie_rx_bytes: Option<f64>,
    /// bytes the GPUs sent over PCIe.
    pub pcie_tx_bytes: Option<f64>,
    /// bytes the GPUs received over NVLink.
    pub nvlink_rx_bytes: Option<f64>,
    /// bytes the GPUs sent over NVLink.
    pub nvlink_tx_bytes: Option<f64>,
    /// bytes received on the RDMA ports. JSON only, as [`NodeResources::rdma_rx_bytes_per_s`].
    #[serde(default, with = "json_only")]
    pub rdma_rx_bytes: Option<f64>,
    /// bytes sent on the RDMA ports. JSON only.
    #[serde(default, with = "json_only")]
    pub rdma_tx_bytes: Option<f64>,
}

/// A field that only human-readable formats (JSON) carry: binary ones (postcard) get a unit,
/// which postcard writes as no byte at all and reads back as `None`.
pub mod json_only {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// The value in JSON; nothing in postcard.
    pub fn serialize<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            value.serialize(s)
        } else {
            s.serialize_unit()
        }
    }

    /// The value from JSON; `None` from postcard.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        if d.is_human_readable() {
            Option::<f64>::deserialize(d)
        } else {
            <()>::deserialize(d).map(|()| None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Frame, NodeCountersReport, NodeResourcesReport};

    /// Profiles and agents written before the RDMA fields read the same: the fields are not in
    /// the encoding, so a frame with them encodes byte for byte as one without them did.
    #[test]
    fn rdma_fields_leave_the_encoding_as_it_was() {
        let plain = NodeResources {
            t_ns: 7,
            nic_rx_bytes_per_s: Some(1e9),
            ..Default::default()
        };
        let with_rdma = NodeResources {
            rdma_rx_bytes_per_s: Some(2e9),
            rdma_tx_bytes_per_s: Some(3e9),
            ..plain.clone()
        };
        let frame = |resources| {
            Frame::NodeResources(Box::new(NodeResourcesReport {
                node: "b".into(),
                resources,
            }))
        };
        let bytes = frame(with_rdma).encode();
        assert_eq!(bytes, frame(plain.clone()).encode());
        assert_eq!(Frame::decode(&bytes).unwrap(), frame(plain));
        let counters = |rdma_rx_bytes| {
            Frame::NodeCounters(NodeCountersReport {
                node: "b".into(),
                counters: NodeCounters {
                    cpu_seconds: Some(1.5),
                    rdma_rx_bytes,
                    ..Default::default()
                },
            })
        };
        assert_eq!(counters(Some(1e12)).encode(), counters(None).encode());
    }

    /// The JSON model (the feed, `top`) carries them, and reads a model written before them.
    #[test]
    fn rdma_fields_are_in_the_json_model() {
        let r = NodeResources {
            rdma_tx_bytes_per_s: Some(3e9),
            ..Default::default()
        };
        let json = serde_json::to_string(&r).unwrap();
        let rdma = ",\"rdma_rx_bytes_per_s\":null,\"rdma_tx_bytes_per_s\":3000000000.0";
        assert!(json.contains(rdma), "{json}");
        assert_eq!(serde_json::from_str::<NodeResources>(&json).unwrap(), r);
        let old = json.replace(rdma, "");
        assert_eq!(
            serde_json::from_str::<NodeResources>(&old).unwrap(),
            NodeResources::default()
        );
    }
}
