//! A per-rank table: values in a vector indexed by rank number, for the collector's per-rank
//! state looked up once or more per rank-iteration.
//!
//! Why not a hash map: at 10,000 ranks and 300,000 rank-iterations a second, each look-up in a
//! hash map lands at a scattered place (consecutive ranks hash far apart), so every look-up
//! misses the cache. The join hands its iterations on by rank ([`crate::crossnode`]) and an
//! agent's records come by rank too, so in a vector indexed by rank the look-ups walk
//! memory in order, which the processor fetches ahead of them.
//!
//! Rank numbers come from the agents and could be anything: only ranks below
//! [`DENSE_RANKS`] are kept by index (the vector grows to the largest rank seen, so an
//! agent that says rank 131,071 costs 131,072 empty slots of the value's size), the others in
//! a hash map.

use crate::fast_hash::FastMap;

/// Ranks kept by index: 131,072, thirteen times the largest job the collector is measured
/// with.
pub const DENSE_RANKS: u32 = 1 << 17;

/// Values by rank number; see the module docs.
#[derive(Clone, Debug)]
pub struct RankTable<T> {
    /// Ranks below [`DENSE_RANKS`], by index; `None`: not in the table.
    dense: Vec<Option<T>>,
    /// Ranks from [`DENSE_RANKS`] on.
    sparse: FastMap<u32, T>,
    /// Values held.
    len: usize,
}

impl<T> Default for RankTable<T> {
    fn default() -> RankTable<T> {
        RankTable {
            dense: Vec::new(),
            sparse: FastMap::default(),
            len: 0,
        }
    }
}

impl<T> RankTable<T> {
    /// The value of `rank`, if any.
    #[inline]
    pub fn get(&self, rank: u32) -> Option<&T> {
        if rank < DENSE_RANKS {
            self.dense.get(rank as usize).and_then(Option::as_ref)
        } else {
            self.sparse.get(&rank)
        }
    }

    /// The value of `rank`, if any, to change.
    #[inline]
    pub fn get_mut(&mut self, rank: u32) -> Option<&mut T> {
        if rank < DENSE_RANKS {
            self.dense.get_mut(rank as usize).and_then(Option::as_mut)
        } else {
            self.sparse.get_mut(&rank)
        }
    }

    /// The value of `rank`, made with `make` when it has none.
    #[inline]
    pub fn get_or_insert_with(&mut self, rank: u32, make: impl FnOnce() -> T) -> &mut T {
        if rank < DENSE_RANKS {
            let i = rank as usize;
            if i >= self.dense.len() {
                self.dense.resize_with(i + 1, || None);
            }
            let slot = &mut self.dense[i];
            if slot.is_none() {
                self.len += 1;
            }
            slot.get_or_insert_with(make)
        } else {
            let len = &mut self.len;
            self.sparse.entry(rank).or_insert_with(|| {
                *len += 1;
                make()
            })
        }
    }

    /// Sets `rank`'s value.
    pub fn insert(&mut self, rank: u32, value: T) {
        match self.get_mut(rank) {
            Some(v) => *v = value,
            None => {
                self.get_or_insert_with(rank, || value);
            }
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every (rank, value): the dense ranks in order, then the others in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.dense
            .iter()
            .enumerate()
            .filter_map(|(rank, v)| v.as_ref().map(|v| (rank as u32, v)))
            .chain(self.sparse.iter().map(|(rank, v)| (*rank, v)))
    }

    /// Every value, as [`RankTable::iter`] orders them.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.iter().map(|(_, v)| v)
    }
}

impl<T: Default> RankTable<T> {
    /// The value of `rank`, a default one when it has none.
    #[inline]
    pub fn entry_or_default(&mut self, rank: u32) -> &mut T {
        self.get_or_insert_with(rank, T::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_near_and_far_are_kept_alike() {
        let mut t: RankTable<String> = RankTable::default();
        assert!(t.is_empty() && t.get(3).is_none());
        for rank in [3, 0, DENSE_RANKS + 5, u32::MAX, 7] {
            t.entry_or_default(rank).push_str(&format!("rank {rank}"));
        }
        t.entry_or_default(3).push('!');
        assert_eq!(t.len(), 5);
        assert_eq!(t.get(3).map(String::as_str), Some("rank 3!"));
        assert_eq!(t.get(u32::MAX).map(String::as_str), Some("rank 4294967295"));
        assert!(t.get(4).is_none() && t.get(1_000).is_none() && t.get(DENSE_RANKS).is_none());
        let dense: Vec<u32> = t.iter().map(|(r, _)| r).take(3).collect();
        assert_eq!(dense, [0, 3, 7], "the dense ranks in order");
        t.insert(7, "seven".into());
        t.insert(DENSE_RANKS + 5, "far".into());
        assert_eq!(t.len(), 5, "set again, not added");
        *t.get_mut(0).expect("rank 0") = "zero".into();
        let mut all: Vec<&str> = t.values().map(String::as_str).collect();
        all.sort_unstable();
        assert_eq!(all, ["far", "rank 3!", "rank 4294967295", "seven", "zero"]);
    }
}
