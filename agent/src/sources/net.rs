//! Network interfaces: bytes received and sent on each, every tick.
//!
//! Read from sysfs `statistics/{rx,tx}_bytes` rather than `/proc/net/dev`: one small number per
//! file, kept open and re-read from offset 0, instead of a table of every counter parsed each
//! tick. Interfaces come and go (containers, VPNs, hot-plug), so the list is re-read about once
//! a second. Label `link` tells loopback (traffic between ranks on this node) from NICs (traffic
//! that leaves it); the attribution weighs the two differently.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use stallscope_analysis::series::{names, SeriesId, SeriesKind, LINK_LOOPBACK, LINK_NIC};

use super::{is_gone, Registry, Roots, Source, SourceError, Tier, Watched};

/// Ticks between two listings of the interfaces: about a second at the default 100 Hz.
pub const DEFAULT_RELIST_TICKS: u32 = 100;

/// `IFF_LOOPBACK` in `<sys>/class/net/IFACE/flags` (`include/uapi/linux/if.h`).
const IFF_LOOPBACK: u32 = 0x8;

/// Byte counters of every interface under `<sys>/class/net`.
pub struct NetSource {
    class_net: PathBuf,
    ifaces: Vec<Iface>,
    relist_every: u32,
    since_list: u32,
    token: u64,
}

struct Iface {
    name: String,
    /// [`LINK_LOOPBACK`] or [`LINK_NIC`].
    link: &'static str,
    rx: File,
    tx: File,
    /// rx, tx; valid for the registry of `NetSource::token`.
    ids: Option<[SeriesId; 2]>,
}

impl NetSource {
    /// Reads below `roots.sys`, re-listing interfaces every [`DEFAULT_RELIST_TICKS`] reads.
    pub fn new(roots: &Roots) -> Self {
        NetSource {
            class_net: roots.sys.join("class/net"),
            ifaces: Vec::new(),
            relist_every: DEFAULT_RELIST_TICKS,
            since_list: 0,
            token: 0,
        }
    }

    /// Re-lists interfaces every `ticks` reads instead (at least every read with 1).
    pub fn with_relist_ticks(mut self, ticks: u32) -> Self {
        self.relist_every = ticks.max(1);
        self
    }

    fn relist(&mut self) -> Result<(), SourceError> {
        let io_err = |source| SourceError::Io {
            path: self.class_net.clone(),
            source,
        };
        let mut listed = Vec::new();
        for entry in fs::read_dir(&self.class_net).map_err(io_err)? {
            let Ok(name) = entry.map_err(io_err)?.file_name().into_string() else {
                continue;
            };
            listed.push(name);
        }
        self.ifaces.retain(|i| listed.contains(&i.name));
        for name in listed {
            if self.ifaces.iter().any(|i| i.name == name) {
                continue;
            }
            // Entries that are not interfaces (`bonding_masters`) have no statistics: skipped.
            let dir = self.class_net.join(&name);
            let (Ok(rx), Ok(tx)) = (
                File::open(dir.join("statistics/rx_bytes")),
                File::open(dir.join("statistics/tx_bytes")),
            ) else {
                continue;
            };
            let flags = fs::read_to_string(dir.join("flags")).unwrap_or_default();
            let link = if name == "lo" || parse_flags(&flags) & IFF_LOOPBACK != 0 {
                LINK_LOOPBACK
            } else {
                LINK_NIC
            };
            self.ifaces.push(Iface {
                name,
                link,
                rx,
                tx,
                ids: None,
            });
        }
        Ok(())
    }
}

impl Source for NetSource {
    fn name(&self) -> &'static str {
        "net"
    }

    fn tier(&self) -> Tier {
        Tier::Fast
    }

    fn describe(&self) -> String {
        format!(
            "interface byte counters from {}/IFACE/statistics/{{rx,tx}}_bytes",
            self.class_net.display()
        )
    }

    fn sample(&mut self, _watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        if self.since_list == 0 {
            self.relist()?;
        }
        self.since_list = (self.since_list + 1) % self.relist_every;
        if self.token != out.token() {
            self.token = out.token();
            self.ifaces.iter_mut().for_each(|i| i.ids = None);
        }
        let mut failure = None;
        let class_net = &self.class_net;
        self.ifaces.retain_mut(|i| {
            let (rx, tx) = match (read_counter(&i.rx), read_counter(&i.tx)) {
                (Ok(rx), Ok(tx)) => (rx, tx),
                (Err(e), _) | (_, Err(e)) => {
                    if !is_gone(&e) {
                        let path = class_net.join(&i.name).join("statistics");
                        failure.get_or_insert(SourceError::Io { path, source: e });
                    }
                    return false;
                }
            };
            let ids = *i.ids.get_or_insert_with(|| {
                let labels = [("iface", i.name.as_str()), ("link", i.link)];
                [
                    out.series(names::NET_RX_BYTES, "bytes", SeriesKind::Counter, &labels),
                    out.series(names::NET_TX_BYTES, "bytes", SeriesKind::Counter, &labels),
                ]
            });
            out.push(ids[0], rx);
            out.push(ids[1], tx);
            true
        });
        if self.ifaces.is_empty() {
            // Gone or failed interfaces are looked for again on the next read.
            self.since_list = 0;
            return Err(failure.unwrap_or_else(|| {
                SourceError::Unsupported(format!(
                    "no network interface readable under {}",
                    self.class_net.display()
                ))
            }));
        }
        Ok(())
    }
}

/// A sysfs counter: one decimal number and a newline, read from offset 0 into a stack buffer.
fn read_counter(file: &File) -> io::Result<u64> {
    let mut buf = [0u8; 32];
    let n = file.read_at(&mut buf, 0)?;
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a decimal counter"))
}

/// `flags` is hexadecimal with a `0x` prefix (`0x1003`); unreadable flags are none.
fn parse_flags(text: &str) -> u32 {
    let text = text.trim();
    u32::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use stallscope_analysis::series::names;

    use super::*;
    use crate::sources::fake::{FakeRoots, Round};

    fn add_iface(fake: &FakeRoots, name: &str, captured: &str) {
        for file in ["statistics/rx_bytes", "statistics/tx_bytes", "flags"] {
            let captured = format!(
                "net_{captured}_{}.txt",
                file.trim_start_matches("statistics/")
            );
            fake.sys(&format!("class/net/{name}/{file}"), &captured);
        }
    }

    #[test]
    fn bytes_per_interface_with_link_class() {
        let fake = FakeRoots::new();
        add_iface(&fake, "lo", "lo");
        add_iface(&fake, "eth0", "eth0");
        // Loopback by its flags (0x9 has IFF_LOOPBACK), whatever its name.
        add_iface(&fake, "lo-ns", "lo");
        fake.write(&fake.roots.sys, "class/net/bonding_masters", b"\n");
        let mut source = NetSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert_eq!(
            round.get(names::NET_RX_BYTES, ("iface", "eth0")),
            Some(197_715_144)
        );
        assert_eq!(
            round.get(names::NET_TX_BYTES, ("iface", "eth0")),
            Some(245_432)
        );
        assert_eq!(round.get(names::NET_RX_BYTES, ("iface", "lo")), Some(3193));
        let link = |iface| {
            let decl = round
                .decls
                .iter()
                .find(|d| d.label("iface") == Some(iface))
                .unwrap();
            decl.label("link").unwrap().to_string()
        };
        assert_eq!(link("lo"), LINK_LOOPBACK);
        assert_eq!(link("lo-ns"), LINK_LOOPBACK);
        assert_eq!(link("eth0"), LINK_NIC);
        assert_eq!(round.values.len(), 6, "bonding_masters is no interface");
    }

    #[test]
    fn interfaces_are_relisted_every_n_ticks() {
        let fake = FakeRoots::new();
        add_iface(&fake, "lo", "lo");
        add_iface(&fake, "eth0", "eth0");
        let mut source = NetSource::new(&fake.roots).with_relist_ticks(3);
        let mut reg = Registry::default();
        let mut rounds = Vec::new();
        for tick in 0..4 {
            if tick == 1 {
                add_iface(&fake, "eth1", "eth0");
                fs::remove_dir_all(fake.roots.sys.join("class/net/eth0")).unwrap();
            }
            source.sample(&Watched::default(), &mut reg).unwrap();
            rounds.push(Round::take(&mut reg));
        }
        let has = |tick: usize, iface| {
            rounds[tick]
                .get(names::NET_RX_BYTES, ("iface", iface))
                .is_some()
        };
        assert!(has(1, "eth0") && has(2, "eth0") && !has(2, "eth1"));
        assert!(has(3, "eth1") && !has(3, "eth0") && has(3, "lo"));
    }

    #[test]
    fn no_interface_is_an_error() {
        let fake = FakeRoots::new();
        let mut source = NetSource::new(&fake.roots);
        let missing = source.sample(&Watched::default(), &mut Registry::default());
        assert!(matches!(missing, Err(SourceError::Io { .. })));
        fs::create_dir_all(fake.roots.sys.join("class/net")).unwrap();
        let empty = source.sample(&Watched::default(), &mut Registry::default());
        assert!(matches!(empty, Err(SourceError::Unsupported(_))));
    }
}
