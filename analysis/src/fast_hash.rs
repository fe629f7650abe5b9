//! A hasher for the small integer keys of the collector's per-rank maps (rank, process,
//! iteration): a multiply and a rotate per word, where the standard library's SipHash, made
//! to resist keys chosen against it, takes tens of instructions per key. The keys come from
//! authenticated agents and the maps are per rank, so that resistance buys nothing here; at
//! 10,000 ranks the maps are looked up 300,000 times a second.

use std::hash::{BuildHasherDefault, Hasher};

/// `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// FxHash's step (rustc's own hasher): fold each word in with a rotate, a xor and a multiply.
#[derive(Clone, Copy, Debug, Default)]
pub struct FastHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_and_neighbours_spread() {
        let mut m: FastMap<(u32, u32), u32> = FastMap::default();
        for r in 0..10_000u32 {
            m.insert((r, 10_000 + r), r);
        }
        assert!((0..10_000u32).all(|r| m[&(r, 10_000 + r)] == r));
        assert_eq!(m.get(&(1, 1)), None);
        let h = |k: (u32, u32)| {
            use std::hash::{BuildHasher, BuildHasherDefault};
            BuildHasherDefault::<FastHasher>::default().hash_one(k)
        };
        assert_ne!(h((1, 2)), h((2, 1)));
    }
}
