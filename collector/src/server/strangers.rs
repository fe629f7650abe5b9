//! Who is let in before proving the token.
//!
//! A stranger costs a socket and a task until it is welcomed or its handshake time is up, so
//! their number is bounded. A plain bound was not enough (issue 30, item 5): 64 idle
//! connections, reopened as they closed, kept every agent and viewer out. So a source address
//! (an IPv4 address, an IPv6 /64: what one host can use) may hold at most
//! [`MAX_STRANGERS_PER_ADDRESS`]; more from it are refused at accept. When all
//! [`MAX_STRANGERS`] places are taken, a newcomer is still let in: the oldest stranger of the
//! address holding the most is closed to make room. A flood from a few addresses then only
//! ever pushes out its own connections, and an agent from any other address gets in.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Connections not yet welcomed served at once.
pub const MAX_STRANGERS: usize = 64;

/// Connections not yet welcomed served at once from one address (IPv4) or /64 (IPv6).
pub const MAX_STRANGERS_PER_ADDRESS: usize = 8;

/// Where strangers are counted: the IPv4 address, or the IPv6 /64 prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Source(u128);

impl Source {
    pub(super) fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source(u128::from(u32::from(v4))),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source(u128::from(u32::from(v4))),
                None => Source((u128::from(v6) >> 64) << 64 | 1 << 32),
            },
        }
    }
}

/// What to do with a newcomer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// There is room.
    Admit,
    /// Let it in and close this stranger (by its number) to make room.
    AdmitEvicting(u64),
    /// Its address holds as many strangers as it may.
    Refuse,
}

/// The policy, over the strangers present (number, ascending = oldest first, and source).
pub(super) fn decide(present: &[(u64, Source)], newcomer: Source) -> Decision {
    let mut per_source: BTreeMap<Source, (usize, u64)> = BTreeMap::new();
    for &(id, source) in present {
        let e = per_source.entry(source).or_insert((0, id));
        e.0 += 1;
        e.1 = e.1.min(id);
    }
    if per_source.get(&newcomer).map_or(0, |e| e.0) >= MAX_STRANGERS_PER_ADDRESS {
        return Decision::Refuse;
    }
    if present.len() < MAX_STRANGERS {
        return Decision::Admit;
    }
    // The address holding the most; of those, the one whose oldest came first.
    per_source
        .values()
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map_or(Decision::Admit, |&(_, oldest)| {
            Decision::AdmitEvicting(oldest)
        })
}

struct Present {
    source: Source,
    evict: oneshot::Sender<()>,
}

/// The strangers being served.
#[derive(Default)]
pub(super) struct Strangers {
    present: Mutex<(u64, BTreeMap<u64, Present>)>,
}

impl Strangers {
    /// Lets a connection from `ip` in, closing another to make room if need be, or says why
    /// not.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<StrangerPass, String> {
        let source = Source::of(ip);
        let Ok(mut guard) = self.present.lock() else {
            return Err("the collector is shutting down".into());
        };
        let (next, present) = &mut *guard;
        let listed: Vec<(u64, Source)> = present.iter().map(|(id, p)| (*id, p.source)).collect();
        match decide(&listed, source) {
            Decision::Refuse => {
                return Err(format!(
                    "the collector already serves {MAX_STRANGERS_PER_ADDRESS} connections from {ip} that have not proven the token, its limit per address: more are closed (is something there opening connections and saying nothing?)"
                ))
            }
            Decision::AdmitEvicting(id) => {
                if let Some(victim) = present.remove(&id) {
                    let _ = victim.evict.send(());
                }
            }
            Decision::Admit => {}
        }
        let id = *next;
        *next += 1;
        let (evict, evicted) = oneshot::channel();
        present.insert(id, Present { source, evict });
        Ok(StrangerPass {
            id,
            strangers: self.clone(),
            evicted,
        })
    }

    /// Strangers served now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.present.lock().map_or(0, |p| p.1.len())
    }
}

/// A stranger's place; dropping it (once welcomed, or gone) frees it.
pub(super) struct StrangerPass {
    id: u64,
    strangers: Arc<Strangers>,
    evicted: oneshot::Receiver<()>,
}

/// Why an evicted stranger is closed, for the peer.
pub(super) const EVICTED: &str = "closed to make room: the collector is at its limit of connections that have not proven the token (something may be opening connections and saying nothing); this one took too long";

impl StrangerPass {
    /// Resolves when the stranger is to be closed to make room for a newer one.
    pub(super) async fn evicted(&mut self) {
        if (&mut self.evicted).await.is_err() {
            // Never evicted now: the registry is gone.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for StrangerPass {
    fn drop(&mut self) {
        if let Ok(mut p) = self.strangers.present.lock() {
            p.1.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(last: u8) -> Source {
        Source::of(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn an_address_at_its_limit_is_refused_and_others_still_come_in() {
        let present: Vec<_> = (0..MAX_STRANGERS_PER_ADDRESS as u64)
            .map(|i| (i, at(1)))
            .collect();
        assert_eq!(decide(&present, at(1)), Decision::Refuse);
        assert_eq!(decide(&present, at(2)), Decision::Admit);
    }

    #[test]
    fn when_full_the_oldest_of_the_busiest_address_makes_room() {
        // 1 from .100 first (the oldest of all), then 8 from each of .1-.7, 7 from .8.
        let mut present = vec![(0, at(100))];
        let mut id = 1;
        for host in 1..=8u8 {
            let n = if host == 8 { 7 } else { 8 };
            for _ in 0..n {
                present.push((id, at(host)));
                id += 1;
            }
        }
        assert_eq!(present.len(), MAX_STRANGERS);
        // Not the lone (and oldest) stranger of .100: the first of .1, which holds 8.
        assert_eq!(decide(&present, at(200)), Decision::AdmitEvicting(1));
        assert_eq!(decide(&present, at(1)), Decision::Refuse);
    }

    #[test]
    fn ipv6_is_counted_per_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(Source::of(mapped), at(1));
    }

    #[tokio::test]
    async fn an_evicted_stranger_is_told_and_its_place_freed() {
        let strangers = Arc::new(Strangers::default());
        let mut passes = Vec::new();
        for i in 0..MAX_STRANGERS {
            let ip = IpAddr::from([10, 0, (i / MAX_STRANGERS_PER_ADDRESS) as u8, 1]);
            passes.push(strangers.admit(ip).unwrap());
        }
        let newcomer = strangers.admit(IpAddr::from([10, 9, 9, 9])).unwrap();
        assert_eq!(strangers.len(), MAX_STRANGERS);
        let mut oldest = passes.remove(0);
        tokio::time::timeout(std::time::Duration::from_secs(10), oldest.evicted())
            .await
            .expect("the oldest is told to go");
        drop(passes);
        drop(oldest);
        assert_eq!(strangers.len(), 1);
        drop(newcomer);
        assert_eq!(strangers.len(), 0);
    }
}
