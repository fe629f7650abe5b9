//! Walking up a process tree: the one parent walk that the node's recorder (which rank does a
//! helper process work for), the job timeline (which processes descend from a loop) and the
//! launcher search use, bounded because a racy /proc scan can show a cycle.

/// Parents followed at most.
pub const MAX_DEPTH: usize = 64;

/// The ancestors of `pid`, nearest first, as `parent_of` knows them: stops at a process whose
/// parent is unknown, after the init process (pid ≤ 1), or after [`MAX_DEPTH`].
pub fn ancestors<F: Fn(u32) -> Option<u32>>(pid: u32, parent_of: F) -> Ancestors<F> {
    Ancestors {
        at: Some(pid),
        parent_of,
        left: MAX_DEPTH,
    }
}

/// See [`ancestors`].
pub struct Ancestors<F> {
    at: Option<u32>,
    parent_of: F,
    left: usize,
}

impl<F: Fn(u32) -> Option<u32>> Iterator for Ancestors<F> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let up = (self.parent_of)(self.at?)?;
        self.left = self.left.checked_sub(1)?;
        self.at = (up > 1 && self.left > 0).then_some(up);
        Some(up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn walks_up_to_init_and_no_further() {
        let parent: HashMap<u32, u32> = [(30, 20), (20, 10), (10, 1), (1, 0)].into();
        let up: Vec<u32> = ancestors(30, |p| parent.get(&p).copied()).collect();
        assert_eq!(up, [20, 10, 1]);
    }

    #[test]
    fn a_cycle_in_a_racy_scan_ends() {
        let parent: HashMap<u32, u32> = [(5, 6), (6, 5)].into();
        assert_eq!(ancestors(5, |p| parent.get(&p).copied()).count(), MAX_DEPTH);
    }
}
