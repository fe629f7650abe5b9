//! The node's UDP sockets by local address, from `<proc>/net/udp` and `udp6` (procfs-core),
//! so that a captured datagram finds the socket, and through its inode the process, it
//! belongs to.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use procfs_core::net::UdpNetEntries;
use procfs_core::{ExplicitSystemInfo, FromBufReadSI};

use crate::sources::Roots;

/// Local address → socket inode, as last read.
#[derive(Debug, Default)]
pub struct UdpSockets {
    by_local: HashMap<SocketAddr, u32>,
    /// How many times the tables were read (for tests and the benchmark).
    pub reads: u64,
}

impl UdpSockets {
    /// Reads the tables again (a table that cannot be read, such as `udp6` without IPv6,
    /// adds nothing).
    pub fn refresh(&mut self, roots: &Roots) {
        self.reads += 1;
        self.by_local.clear();
        let info = ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: cfg!(target_endian = "little"),
        };
        for table in ["udp", "udp6"] {
            let Ok(file) = std::fs::File::open(roots.proc.join("net").join(table)) else {
                continue;
            };
            let Ok(entries) = UdpNetEntries::from_buf_read(BufReader::new(file), &info) else {
                continue;
            };
            for e in entries.0 {
                if let Ok(inode) = u32::try_from(e.inode) {
                    self.by_local.insert(e.local_address, inode);
                }
            }
        }
    }

    /// The inode of the socket that `addr` reaches on this node: bound to it, or to the
    /// wildcard address of its family (or IPv6's, which takes IPv4 too) on its port.
    pub fn find(&self, addr: SocketAddr) -> Option<u32> {
        let port = addr.port();
        let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
        let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        let mapped = match addr.ip() {
            IpAddr::V4(v4) => Some(SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), port)),
            IpAddr::V6(_) => None,
        };
        let wildcard = if addr.is_ipv4() {
            [Some(any4), Some(any6)]
        } else {
            [Some(any6), None]
        };
        std::iter::once(Some(addr))
            .chain(std::iter::once(mapped))
            .chain(wildcard)
            .flatten()
            .find_map(|a| self.by_local.get(&a).copied())
    }

    /// Every socket: its local address and inode.
    pub fn iter(&self) -> impl Iterator<Item = (SocketAddr, u32)> + '_ {
        self.by_local.iter().map(|(a, i)| (*a, *i))
    }
}
