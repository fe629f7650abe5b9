//! RDMA ports (InfiniBand, RoCE, AWS EFA): bytes, transmit wait, congestion and retransmissions.
//!
//! Collectives over NCCL's IB or EFA transports bypass the kernel's network stack, so
//! `/proc/net/dev` (the [`super::net`] source) never sees their bytes; the ports' own counters
//! do. Layout (Linux `Documentation/ABI/stable/sysfs-class-infiniband`): every port is
//! `<sys>/class/infiniband/DEVICE/ports/N/`, with
//! - `counters/`, the IB core's PortCounters group (`drivers/infiniband/core/sysfs.c`, made for
//!   devices that answer performance-management queries: mlx4, mlx5, not EFA), where
//!   `port_xmit_data` and `port_rcv_data` count octets divided by 4 — the IBTA InfiniBand
//!   Architecture Specification Vol. 1, PortCounters and PortCountersExtended (§16.1.3.5),
//!   define PortXmitData/PortRcvData in units of 4 octets; this source multiplies by 4;
//! - `hw_counters/`, the driver's own statistics, one file each: EFA's port stats names are in
//!   `drivers/infiniband/hw/efa/efa_verbs.c` (`tx_bytes`, `rx_bytes` in bytes, `retrans_*`,
//!   `rdma_read_bytes`), mlx5's in `drivers/infiniband/hw/mlx5/counters.c` (`np_cnp_sent`,
//!   `rp_cnp_handled`, `out_of_sequence`, `packet_seq_err`).
//!
//! Two sources read them: [`RdmaSource::bytes`] at the fast tier, as the NIC bytes are, because
//! the attribution compares them with the same comm waits; [`RdmaSource::counters`] at the slow
//! tier, because each `hw_counters` read asks the device's firmware for its whole counter set.
//! Files are kept open and re-read from offset 0 (sysfs regenerates an attribute on a read at
//! offset 0). Traffic of an IPoIB interface is also in its `/proc/net/dev` line: counted twice,
//! which only makes a network wait look more like one.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::text::parse_u64;
use super::{is_gone, pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// `<sys>/class/infiniband`, where RDMA devices are listed.
pub fn class_dir(roots: &Roots) -> PathBuf {
    roots.sys.join("class/infiniband")
}

/// Byte counters of a port: IB core `counters/` in 4-octet units (IBTA PortXmitData), else
/// EFA's `hw_counters/` in bytes. (rx file, tx file, bytes per unit.)
const BYTE_FILES: [(&str, &str, u64); 2] = [
    ("counters/port_rcv_data", "counters/port_xmit_data", 4),
    ("hw_counters/rx_bytes", "hw_counters/tx_bytes", 1),
];

/// `counters/port_xmit_wait` (IBTA PortXmitWait), read as [`names::RDMA_XMIT_WAIT`].
const XMIT_WAIT_FILE: &str = "counters/port_xmit_wait";

/// Congestion and retransmission counters read when the port has them, as
/// [`names::RDMA_COUNTER`] with label `counter` = the file name.
const EVENT_FILES: [&str; 10] = [
    // IB core PortCounters: packets dropped because the port was down or congested.
    "counters/port_xmit_discards",
    // mlx5 (counters.c): DCQCN congestion notifications sent (as notification point) and
    // acted on (as reaction point); RoCE packets out of order, NAK sequence errors.
    "hw_counters/np_cnp_sent",
    "hw_counters/rp_cnp_handled",
    "hw_counters/out_of_sequence",
    "hw_counters/packet_seq_err",
    // EFA (efa_verbs.c): bytes read by RDMA read, retransmissions, timeouts, lost peers.
    "hw_counters/rdma_read_bytes",
    "hw_counters/retrans_bytes",
    "hw_counters/retrans_pkts",
    "hw_counters/retrans_timeout_events",
    "hw_counters/unresponsive_remote_events",
];

/// Which counters a source reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    Bytes,
    Events,
}

/// One counter file of one port and the series it feeds.
struct Reading {
    path: PathBuf,
    file: File,
    name: &'static str,
    unit: &'static str,
    /// bytes per unit of the file (4 for `port_*_data`), else 1.
    scale: u64,
    /// `device`, `port`, and `counter` for [`names::RDMA_COUNTER`].
    labels: Vec<(&'static str, String)>,
    /// Valid for the registry of `RdmaSource::token`.
    id: Option<SeriesId>,
}

/// The counters of every port below `<sys>/class/infiniband`.
pub struct RdmaSource {
    class: PathBuf,
    set: Set,
    /// Found on the first read, and again after a port went away.
    readings: Option<Vec<Reading>>,
    buf: Vec<u8>,
    token: u64,
}

impl RdmaSource {
    /// Bytes received and sent per port ([`names::RDMA_RX_BYTES`], [`names::RDMA_TX_BYTES`]).
    pub fn bytes(roots: &Roots) -> Self {
        Self::new(roots, Set::Bytes)
    }

    /// Transmit wait, congestion and retransmission counters per port.
    pub fn counters(roots: &Roots) -> Self {
        Self::new(roots, Set::Events)
    }

    fn new(roots: &Roots, set: Set) -> Self {
        RdmaSource {
            class: class_dir(roots),
            set,
            readings: None,
            buf: Vec::new(),
            token: 0,
        }
    }

    fn discover(&self) -> Result<Vec<Reading>, SourceError> {
        let mut readings = Vec::new();
        for (device, port, dir) in ports(&self.class)? {
            let labels = vec![("device", device), ("port", port)];
            let mut add = |rel: &str, name, unit, scale, labels: Vec<(&'static str, String)>| {
                let path = dir.join(rel);
                if let Ok(file) = File::open(&path) {
                    readings.push(Reading {
                        path,
                        file,
                        name,
                        unit,
                        scale,
                        labels,
                        id: None,
                    });
                }
            };
            match self.set {
                Set::Bytes => {
                    let found = BYTE_FILES
                        .iter()
                        .find(|(rx, tx, _)| dir.join(rx).is_file() && dir.join(tx).is_file());
                    if let Some(&(rx, tx, scale)) = found {
                        add(rx, names::RDMA_RX_BYTES, "bytes", scale, labels.clone());
                        add(tx, names::RDMA_TX_BYTES, "bytes", scale, labels);
                    }
                }
                Set::Events => {
                    add(
                        XMIT_WAIT_FILE,
                        names::RDMA_XMIT_WAIT,
                        "ticks",
                        1,
                        labels.clone(),
                    );
                    for rel in EVENT_FILES {
                        let counter = rel.rsplit('/').next().unwrap_or(rel);
                        let unit = if counter.ends_with("_bytes") {
                            "bytes"
                        } else {
                            "count"
                        };
                        let mut labels = labels.clone();
                        labels.push(("counter", counter.to_string()));
                        add(rel, names::RDMA_COUNTER, unit, 1, labels);
                    }
                }
            }
        }
        if readings.is_empty() {
            let what = match self.set {
                Set::Bytes => "port_xmit_data/port_rcv_data or tx_bytes/rx_bytes",
                Set::Events => "port_xmit_wait or congestion counters",
            };
            return Err(SourceError::Unsupported(format!(
                "no RDMA port with {what} under {}",
                self.class.display()
            )));
        }
        Ok(readings)
    }
}

/// Every `(device, port, directory)` under `class`, sorted; an error when `class` is missing.
fn ports(class: &Path) -> Result<Vec<(String, String, PathBuf)>, SourceError> {
    let io_err = |path: &Path, source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for device in fs::read_dir(class).map_err(|e| io_err(class, e))? {
        let device = device.map_err(|e| io_err(class, e))?;
        let ports_dir = device.path().join("ports");
        let Ok(ports) = fs::read_dir(&ports_dir) else {
            continue;
        };
        for port in ports.flatten() {
            found.push((
                device.file_name().to_string_lossy().into_owned(),
                port.file_name().to_string_lossy().into_owned(),
                port.path(),
            ));
        }
    }
    found.sort();
    Ok(found)
}

/// A sysfs counter: one decimal number and a newline.
fn parse_counter(text: &[u8]) -> Option<u64> {
    parse_u64(text.trim_ascii())
}

impl Source for RdmaSource {
    fn name(&self) -> &'static str {
        match self.set {
            Set::Bytes => "rdma",
            Set::Events => "rdma_counters",
        }
    }

    fn tier(&self) -> Tier {
        match self.set {
            Set::Bytes => Tier::Fast,
            Set::Events => Tier::Slow,
        }
    }

    /// Each port (`device/port`) with the files read of it, e.g.
    /// `mlx5_0/1: port_rcv_data, port_xmit_data (× 4 bytes)`.
    fn describe(&self) -> String {
        let Some(readings) = &self.readings else {
            return format!("RDMA port counters under {}", self.class.display());
        };
        let mut ports: Vec<(String, Vec<String>)> = Vec::new();
        for r in readings {
            let port = format!("{}/{}", r.labels[0].1, r.labels[1].1);
            let file = r.path.file_name().map_or(String::new(), |f| {
                let f = f.to_string_lossy();
                if r.scale == 1 {
                    f.into_owned()
                } else {
                    format!("{f} (× {} bytes)", r.scale)
                }
            });
            match ports.iter_mut().find(|(p, _)| *p == port) {
                Some((_, files)) => files.push(file),
                None => ports.push((port, vec![file])),
            }
        }
        let ports: Vec<String> = ports
            .into_iter()
            .map(|(port, files)| format!("{port}: {}", files.join(", ")))
            .collect();
        format!("{} under {}", ports.join("; "), self.class.display())
    }

    fn sample(&mut self, _watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        if self.readings.is_none() {
            self.readings = Some(self.discover()?);
        }
        if self.token != out.token() {
            self.token = out.token();
            for r in self.readings.iter_mut().flatten() {
                r.id = None;
            }
        }
        let readings = self.readings.as_mut().expect("just discovered");
        for r in readings.iter_mut() {
            let text = match pread_all(&r.file, &mut self.buf) {
                Ok(text) => text,
                Err(e) => {
                    let path = r.path.clone();
                    // A device unbound or reset: find the ports again next round.
                    self.readings = None;
                    return Err(if is_gone(&e) {
                        SourceError::Unsupported(format!("{} went away", path.display()))
                    } else {
                        SourceError::Io { path, source: e }
                    });
                }
            };
            let Some(value) = parse_counter(text) else {
                return Err(SourceError::Parse {
                    path: r.path.clone(),
                    message: format!("not a counter: {:?}", String::from_utf8_lossy(text).trim()),
                });
            };
            let id = *r.id.get_or_insert_with(|| {
                let labels: Vec<(&str, &str)> =
                    r.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                out.series(r.name, r.unit, SeriesKind::Counter, &labels)
            });
            out.push(id, value.saturating_mul(r.scale));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::fake::{FakeRoots, Round};

    /// The recorded trees of `agent/testdata/rdma`: `mlx5_0` port 1 with `counters/` and
    /// `hw_counters/`, `efa_0` port 1 with `hw_counters/` only.
    fn fake_rdma() -> FakeRoots {
        let fake = FakeRoots::new();
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/rdma");
        copy_tree(&from, &fake.roots.sys);
        fake
    }

    fn copy_tree(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for entry in fs::read_dir(from).unwrap().flatten() {
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                fs::copy(entry.path(), target).unwrap();
            }
        }
    }

    fn round(source: &mut RdmaSource) -> Round {
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        Round::take(&mut reg)
    }

    fn with(round: &Round, name: &str, device: &str, counter: Option<&str>) -> Option<u64> {
        let decl = round.decls.iter().find(|d| {
            d.name == name && d.label("device") == Some(device) && d.label("counter") == counter
        })?;
        assert_eq!(decl.label("port"), Some("1"));
        round
            .values
            .iter()
            .find(|(id, _)| *id == decl.id)
            .map(|v| v.1)
    }

    #[test]
    fn port_data_counts_4_byte_units_and_efa_counts_bytes() {
        let fake = fake_rdma();
        let mut source = RdmaSource::bytes(&fake.roots);
        assert_eq!(source.tier(), Tier::Fast);
        let r = round(&mut source);
        let (rx, tx) = (names::RDMA_RX_BYTES, names::RDMA_TX_BYTES);
        assert_eq!(with(&r, tx, "mlx5_0", None), Some(2_500_000_000 * 4));
        assert_eq!(with(&r, rx, "mlx5_0", None), Some(1_250_000_000 * 4));
        assert_eq!(with(&r, tx, "efa_0", None), Some(8_589_934_592));
        assert_eq!(with(&r, rx, "efa_0", None), Some(4_294_967_296));
        assert_eq!(r.values.len(), 4);
        assert!(r.decls.iter().all(|d| d.unit == "bytes"));
        let said = source.describe();
        assert!(said.starts_with("efa_0/1: rx_bytes, tx_bytes; mlx5_0/1: port_rcv_data (× 4 bytes), port_xmit_data (× 4 bytes) under "), "{said}");
    }

    #[test]
    fn wait_congestion_and_retransmissions_per_counter() {
        let fake = fake_rdma();
        let mut source = RdmaSource::counters(&fake.roots);
        assert_eq!(source.tier(), Tier::Slow);
        let r = round(&mut source);
        let c = names::RDMA_COUNTER;
        assert_eq!(
            with(&r, names::RDMA_XMIT_WAIT, "mlx5_0", None),
            Some(73_421)
        );
        assert_eq!(with(&r, names::RDMA_XMIT_WAIT, "efa_0", None), None);
        assert_eq!(with(&r, c, "mlx5_0", Some("np_cnp_sent")), Some(4210));
        assert_eq!(with(&r, c, "mlx5_0", Some("rp_cnp_handled")), Some(3977));
        assert_eq!(with(&r, c, "mlx5_0", Some("out_of_sequence")), Some(17));
        assert_eq!(with(&r, c, "mlx5_0", Some("packet_seq_err")), Some(3));
        assert_eq!(with(&r, c, "mlx5_0", Some("port_xmit_discards")), Some(12));
        assert_eq!(with(&r, c, "efa_0", Some("retrans_pkts")), Some(8));
        assert_eq!(
            with(&r, c, "efa_0", Some("retrans_timeout_events")),
            Some(1)
        );
        assert_eq!(
            with(&r, c, "efa_0", Some("rdma_read_bytes")),
            Some(6_442_450_944)
        );
        let unit = |counter| {
            let d = r.decls.iter().find(|d| d.label("counter") == Some(counter));
            d.unwrap().unit.clone()
        };
        assert_eq!(unit("retrans_bytes"), "bytes");
        assert_eq!(unit("retrans_pkts"), "count");
    }

    #[test]
    fn a_missing_counter_is_not_declared_and_a_bad_one_is_named() {
        let fake = fake_rdma();
        let port = fake.roots.sys.join("class/infiniband/mlx5_0/ports/1");
        fs::remove_file(port.join("hw_counters/np_cnp_sent")).unwrap();
        let mut source = RdmaSource::counters(&fake.roots);
        let r = round(&mut source);
        let c = names::RDMA_COUNTER;
        assert_eq!(with(&r, c, "mlx5_0", Some("np_cnp_sent")), None);
        assert_eq!(with(&r, c, "mlx5_0", Some("rp_cnp_handled")), Some(3977));
        fs::write(port.join("hw_counters/rp_cnp_handled"), "N/A\n").unwrap();
        let bad = source.sample(&Watched::default(), &mut Registry::default());
        assert!(
            matches!(&bad, Err(SourceError::Parse { path, .. }) if path.ends_with("rp_cnp_handled")),
            "{bad:?}"
        );
    }

    #[test]
    fn without_rdma_devices_the_source_says_so() {
        let fake = FakeRoots::new();
        let mut source = RdmaSource::bytes(&fake.roots);
        let missing = source.sample(&Watched::default(), &mut Registry::default());
        assert!(
            matches!(missing, Err(SourceError::Io { .. })),
            "{missing:?}"
        );
        fs::create_dir_all(class_dir(&fake.roots).join("mlx5_0/ports/1")).unwrap();
        let empty = source.sample(&Watched::default(), &mut Registry::default());
        assert!(
            matches!(&empty, Err(SourceError::Unsupported(m)) if m.contains("no RDMA port")),
            "{empty:?}"
        );
    }
}
