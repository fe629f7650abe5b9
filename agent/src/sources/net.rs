//! Network interfaces: bytes received and sent on each, every tick.
//!
//! Read from `/proc/net/dev`, kept open and re-read from offset 0: one system call a tick for
//! every interface. The per-interface sysfs files (`statistics/{rx,tx}_bytes`) hold one number
//! each, but two reads per interface, each asking the driver for all its statistics, cost more
//! than formatting the one table (on the 2-core development VM, with 4 interfaces, ~28 µs a
//! tick against ~20 µs, wake-up excluded). The table names every interface of the sampler's
//! network namespace, so interfaces that come and go (containers, VPNs, hot-plug) are seen at
//! once. Label `link` tells loopback (traffic between ranks on this node) from NICs (traffic
//! that leaves it), from `<sys>/class/net/IFACE/flags`, read once per interface; the
//! attribution weighs the two differently.

use std::borrow::Cow;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SeriesId, SeriesKind, LINK_LOOPBACK, LINK_NIC};

use super::text::{fields, parse_u64};
use super::{pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// `IFF_LOOPBACK` in `<sys>/class/net/IFACE/flags` (`include/uapi/linux/if.h`).
const IFF_LOOPBACK: u32 = 0x8;

/// Byte counters of every interface in `<proc>/net/dev`.
pub struct NetSource {
    /// `<proc>/net/dev`.
    path: PathBuf,
    /// `<sys>/class/net`, for the flags of new interfaces.
    class_net: PathBuf,
    /// The table, opened on the first read (and again after a failed one).
    file: Option<File>,
    buf: Vec<u8>,
    /// Interfaces of the last read.
    ifaces: Vec<Iface>,
    /// Reads so far, to tell interfaces gone from the table.
    rounds: u64,
    token: u64,
}

struct Iface {
    name: String,
    /// [`LINK_LOOPBACK`] or [`LINK_NIC`].
    link: &'static str,
    /// rx, tx; valid for the registry of `NetSource::token`.
    ids: Option<[SeriesId; 2]>,
    /// The last read that listed it.
    seen: u64,
}

/// One interface's line of the table.
#[derive(Debug, PartialEq, Eq)]
struct Counters<'a> {
    name: &'a str,
    /// bytes received (first column).
    rx: u64,
    /// bytes sent (ninth column, the first of the transmit half).
    tx: u64,
}

impl NetSource {
    /// Reads `roots.proc/net/dev`, and the interfaces' flags below `roots.sys`.
    pub fn new(roots: &Roots) -> Self {
        NetSource {
            path: roots.proc.join("net/dev"),
            class_net: roots.sys.join("class/net"),
            file: None,
            buf: Vec::new(),
            ifaces: Vec::new(),
            rounds: 0,
            token: 0,
        }
    }
}

/// [`LINK_LOOPBACK`] for `lo` and for interfaces flagged `IFF_LOOPBACK` in
/// `class_net/NAME/flags`; else [`LINK_NIC`] (also when the flags cannot be read).
fn link_of(class_net: &Path, name: &str) -> &'static str {
    let flags = fs::read_to_string(class_net.join(name).join("flags")).unwrap_or_default();
    if name == "lo" || parse_flags(&flags) & IFF_LOOPBACK != 0 {
        LINK_LOOPBACK
    } else {
        LINK_NIC
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
        format!("interface byte counters from {}", self.path.display())
    }

    fn sample(&mut self, _watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let io_err = |path: &PathBuf, source| SourceError::Io {
            path: path.clone(),
            source,
        };
        if self.file.is_none() {
            self.file = Some(File::open(&self.path).map_err(|e| io_err(&self.path, e))?);
        }
        let file = self.file.as_ref().expect("just opened");
        let text = match pread_all(file, &mut self.buf) {
            Ok(text) => text,
            Err(e) => {
                self.file = None;
                return Err(io_err(&self.path, e));
            }
        };
        if self.token != out.token() {
            self.token = out.token();
            self.ifaces.iter_mut().for_each(|i| i.ids = None);
        }
        self.rounds += 1;
        // As text, lines and colons are found with memchr: a byte-by-byte walk of the table
        // cost more instructions than the rest of the round. (A name that is not UTF-8, which
        // Linux allows, costs a copy.) The two header lines hold no `:`; every other line is
        // an interface.
        let text = match std::str::from_utf8(text) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(text),
        };
        for (n, line) in text.split('\n').enumerate() {
            let Some(colon) = line.find(':') else {
                continue;
            };
            let Some(c) = parse_line(line, colon) else {
                return Err(SourceError::Parse {
                    path: self.path.clone(),
                    message: format!("not an interface line: {line:?}"),
                });
            };
            // The table keeps its order from one read to the next: try the same place first.
            let at = n.saturating_sub(2);
            let i = match self.ifaces.get(at) {
                Some(i) if i.name == c.name => at,
                _ => match self.ifaces.iter().position(|i| i.name == c.name) {
                    Some(i) => i,
                    None => {
                        // Only a new interface allocates and reads its flags.
                        let link = link_of(&self.class_net, c.name);
                        self.ifaces.push(Iface {
                            name: c.name.to_string(),
                            link,
                            ids: None,
                            seen: 0,
                        });
                        self.ifaces.len() - 1
                    }
                },
            };
            let iface = &mut self.ifaces[i];
            iface.seen = self.rounds;
            let ids = *iface.ids.get_or_insert_with(|| {
                let labels = [("iface", iface.name.as_str()), ("link", iface.link)];
                [
                    out.series(names::NET_RX_BYTES, "bytes", SeriesKind::Counter, &labels),
                    out.series(names::NET_TX_BYTES, "bytes", SeriesKind::Counter, &labels),
                ]
            });
            out.push(ids[0], c.rx);
            out.push(ids[1], c.tx);
        }
        let rounds = self.rounds;
        self.ifaces.retain(|i| i.seen == rounds);
        if self.ifaces.is_empty() {
            return Err(SourceError::Unsupported(format!(
                "no network interface in {}",
                self.path.display()
            )));
        }
        Ok(())
    }
}

/// `  eth0: 3277086558   62674 0 … 2866494 40957 …`: the name before the first `:` (a name
/// never holds one), then 16 counters of which the 1st and the 9th are bytes.
fn parse_line(line: &str, colon: usize) -> Option<Counters<'_>> {
    let name = line[..colon].trim_ascii();
    let mut fields = fields(&line.as_bytes()[colon + 1..]);
    let rx = parse_u64(fields.next()?)?;
    let tx = parse_u64(fields.nth(7)?)?;
    (!name.is_empty()).then_some(Counters { name, rx, tx })
}

/// `flags` is hexadecimal with a `0x` prefix (`0x1003`); unreadable flags are none.
fn parse_flags(text: &str) -> u32 {
    let text = text.trim();
    u32::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use stallscope_analysis::series::names;

    use super::*;
    use crate::sources::fake::{testdata, FakeRoots, Round};

    /// The captured table (lo, ifb0, ifb1, eth0) with lo's and eth0's captured flags; ifb0
    /// gets lo's flags, to be loopback by its flags whatever its name; ifb1 has none.
    fn fake_net() -> FakeRoots {
        let fake = FakeRoots::new();
        fake.proc("net/dev", "net_dev.txt");
        fake.sys("class/net/lo/flags", "net_lo_flags.txt");
        fake.sys("class/net/eth0/flags", "net_eth0_flags.txt");
        fake.sys("class/net/ifb0/flags", "net_lo_flags.txt");
        fake
    }

    #[test]
    fn bytes_per_interface_with_link_class() {
        let fake = fake_net();
        let mut source = NetSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        let eth0 = ("iface", "eth0");
        assert_eq!(round.get(names::NET_RX_BYTES, eth0), Some(3_277_086_558));
        assert_eq!(round.get(names::NET_TX_BYTES, eth0), Some(2_866_494));
        let lo = ("iface", "lo");
        assert_eq!(round.get(names::NET_RX_BYTES, lo), Some(12_394_672_763));
        assert_eq!(round.get(names::NET_TX_BYTES, ("iface", "ifb1")), Some(0));
        let link = |iface| {
            let decl = round
                .decls
                .iter()
                .find(|d| d.label("iface") == Some(iface))
                .unwrap();
            decl.label("link").unwrap().to_string()
        };
        assert_eq!(link("lo"), LINK_LOOPBACK);
        assert_eq!(link("ifb0"), LINK_LOOPBACK);
        assert_eq!(link("eth0"), LINK_NIC);
        assert_eq!(link("ifb1"), LINK_NIC, "no flags: a NIC");
        assert_eq!(round.values.len(), 8);
    }

    #[test]
    fn interfaces_come_and_go_with_the_table() {
        let fake = fake_net();
        let mut source = NetSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        Round::take(&mut reg);
        // eth0 gone, a new eth1 (eth0's line under a new name): the same open file, re-read.
        let text = String::from_utf8(testdata("net_dev.txt")).unwrap();
        let text = text.replace("  eth0:", "  eth1:");
        fake.write(&fake.roots.proc, "net/dev", text.as_bytes());
        source.sample(&Watched::default(), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert_eq!(round.get(names::NET_RX_BYTES, ("iface", "eth0")), None);
        assert_eq!(
            round.get(names::NET_RX_BYTES, ("iface", "eth1")),
            Some(3_277_086_558)
        );
        assert!(round.get(names::NET_RX_BYTES, ("iface", "lo")).is_some());
        assert_eq!(source.ifaces.len(), 4, "eth0 forgotten");
        assert_eq!(round.decls.len(), 10, "series are declared once");
    }

    #[test]
    fn a_missing_or_empty_table_is_an_error_and_a_bad_line_is_named() {
        let fake = FakeRoots::new();
        let mut source = NetSource::new(&fake.roots);
        let missing = source.sample(&Watched::default(), &mut Registry::default());
        assert!(matches!(missing, Err(SourceError::Io { .. })));
        let header: String = String::from_utf8(testdata("net_dev.txt"))
            .unwrap()
            .lines()
            .take(2)
            .map(|l| format!("{l}\n"))
            .collect();
        fake.write(&fake.roots.proc, "net/dev", header.as_bytes());
        let empty = source.sample(&Watched::default(), &mut Registry::default());
        assert!(
            matches!(empty, Err(SourceError::Unsupported(_))),
            "{empty:?}"
        );
        fake.write(&fake.roots.proc, "net/dev", b"  eth0: 12 x\n");
        let bad = source.sample(&Watched::default(), &mut Registry::default());
        assert!(
            matches!(&bad, Err(SourceError::Parse { message, .. }) if message.contains("eth0")),
            "{bad:?}"
        );
    }

    #[test]
    fn a_line_is_its_name_and_two_byte_counters() {
        let line = "verylongname0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16";
        assert_eq!(
            parse_line(line, 13),
            Some(Counters {
                name: "verylongname0",
                rx: 1,
                tx: 9
            })
        );
        assert_eq!(parse_line("  eth0: 1 2 3", 6), None);
        assert_eq!(parse_line("  : 1 2 3 4 5 6 7 8 9", 2), None);
    }
}
