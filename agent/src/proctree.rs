//! Which processes belong to the job: the process subtree of the command stallscope started.
//!
//! A full [`scan`] reads every `<proc>/PID/stat` on the node: about 10 us each, so ~1 ms for
//! 100 processes and ~10 ms on a GPU node with 1000 — too much even once a second against a
//! budget of 1% of a core. [`Discovery`] therefore remembers what it saw: a process outside the
//! job cannot join it later (a parent is only ever replaced by a reaper above it), so a pass
//! lists `/proc` and reads `stat` only for new pids and for the job's own processes, and a
//! full pass every [`FULL_PASS_EVERY`] catches a pid reused in between. Processes that end
//! while a pass runs are simply not in it. Everything reads below a proc root, so tests run it
//! on captured text.

use stallscope_analysis::process::ancestors;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::sources::text::{parse_u64, stat_fields};

/// Every how many passes [`Discovery`] re-reads every process, not only new ones.
pub const FULL_PASS_EVERY: u32 = 10;

/// A process as one scan saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    /// Process id (`stat` field 1).
    pub pid: u32,
    /// Parent process id (`stat` field 4).
    pub ppid: u32,
    /// Executable name, at most 15 bytes (`stat` field 2, without the parentheses).
    pub comm: String,
    /// Clock ticks after boot when it started (`stat` field 22); with `pid`, it tells a
    /// reused pid from the process that had it before.
    pub starttime: u64,
}

/// Every process under `proc_root` (`<proc>/[0-9]*/stat`). Fails only if `proc_root` itself
/// cannot be listed.
pub fn scan(proc_root: &Path) -> io::Result<Vec<ProcEntry>> {
    let mut entries = Vec::new();
    let mut buf = Vec::with_capacity(512);
    for pid in list_pids(proc_root)? {
        entries.extend(read_entry(proc_root, pid, &mut buf));
    }
    Ok(entries)
}

/// `root_pid` and every process below it (children, grandchildren, …), root first, then by
/// depth, siblings by pid. Empty when `root_pid` is not in `entries`.
pub fn descendants(entries: &[ProcEntry], root_pid: u32) -> Vec<ProcEntry> {
    subtree(entries.iter(), root_pid)
}

/// The launchers of a job: the processes of `tree` above any of `loops` (the training loops)
/// that are no loop themselves, e.g. `torchrun`, or a script that spawns its ranks. In tree
/// order; empty when no loop is in the tree.
pub fn launchers(tree: &[ProcEntry], loops: &BTreeSet<u32>) -> Vec<u32> {
    let parent: HashMap<u32, u32> = tree.iter().map(|e| (e.pid, e.ppid)).collect();
    let mut above = HashSet::new();
    for &pid in loops.iter().filter(|p| parent.contains_key(p)) {
        above.extend(
            ancestors(pid, |p| parent.get(&p).copied()).take_while(|up| parent.contains_key(up)),
        );
    }
    tree.iter()
        .map(|e| e.pid)
        .filter(|p| above.contains(p) && !loops.contains(p))
        .collect()
}

/// The arguments of `pid` (`<proc>/PID/cmdline`, NUL-separated); empty for a kernel thread or
/// a zombie, `None` when it cannot be read (gone, or hidden by `hidepid`).
pub fn cmdline(proc_root: &Path, pid: u32) -> Option<Vec<String>> {
    let bytes = fs::read(proc_root.join(pid.to_string()).join("cmdline")).ok()?;
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(&bytes);
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    Some(
        bytes
            .split(|&b| b == 0)
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect(),
    )
}

/// Repeated discovery of one subtree, reading only what can have changed.
#[derive(Debug)]
pub struct Discovery {
    proc_root: PathBuf,
    root_pid: u32,
    /// Further roots whose subtrees belong to the job too (an agent's marker senders).
    extra_roots: Vec<u32>,
    /// Every process the last pass saw, by pid.
    known: HashMap<u32, ProcEntry>,
    /// The pids of the subtree the last pass found.
    members: HashSet<u32>,
    passes: u32,
    buf: Vec<u8>,
}

impl Discovery {
    /// Discovery of `root_pid`'s subtree below `proc_root`; the first pass is a full one.
    pub fn new(proc_root: impl Into<PathBuf>, root_pid: u32) -> Self {
        Discovery {
            proc_root: proc_root.into(),
            root_pid,
            extra_roots: Vec::new(),
            known: HashMap::new(),
            members: HashSet::new(),
            passes: 0,
            buf: Vec::with_capacity(512),
        }
    }

    /// Whether process `pid` was there at the last [`Discovery::refresh`].
    pub fn is_alive(&self, pid: u32) -> bool {
        self.known.contains_key(&pid)
    }

    /// Sets further roots whose subtrees are part of the job (replacing earlier ones).
    pub fn set_extra_roots(&mut self, roots: Vec<u32>) {
        self.extra_roots = roots;
    }

    /// The subtree now, root first (empty once the root is gone), as [`descendants`] of a
    /// full [`scan`] would give it. Fails only if the proc root cannot be listed.
    pub fn refresh(&mut self) -> io::Result<Vec<ProcEntry>> {
        let full = self.passes % FULL_PASS_EVERY == 0;
        self.passes = self.passes.wrapping_add(1);
        let pids = list_pids(&self.proc_root)?;
        let mut known = HashMap::with_capacity(pids.len());
        for pid in pids {
            let unchanged = !full && !self.members.contains(&pid);
            if let Some(entry) = self.known.remove(&pid).filter(|_| unchanged) {
                known.insert(pid, entry);
            } else if let Some(entry) = read_entry(&self.proc_root, pid, &mut self.buf) {
                known.insert(pid, entry);
            }
        }
        self.known = known;
        let mut tree = subtree(self.known.values(), self.root_pid);
        for root in &self.extra_roots {
            if !tree.iter().any(|e| e.pid == *root) {
                let more = subtree(self.known.values(), *root);
                let fresh: Vec<ProcEntry> = more
                    .into_iter()
                    .filter(|e| !tree.iter().any(|t| t.pid == e.pid))
                    .collect();
                tree.extend(fresh);
            }
        }
        self.members.clear();
        self.members.extend(tree.iter().map(|e| e.pid));
        Ok(tree)
    }
}

/// The numeric entries of `proc_root`.
fn list_pids(proc_root: &Path) -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for dirent in fs::read_dir(proc_root)? {
        let Ok(dirent) = dirent else { continue };
        if let Some(pid) = dirent.file_name().to_str().and_then(|n| n.parse().ok()) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// `<proc>/PID/stat` as an entry; `None` when the process is gone or its stat unreadable.
fn read_entry(proc_root: &Path, pid: u32, buf: &mut Vec<u8>) -> Option<ProcEntry> {
    buf.clear();
    let path = proc_root.join(pid.to_string()).join("stat");
    File::open(path).and_then(|mut f| f.read_to_end(buf)).ok()?;
    parse_entry(pid, buf)
}

/// The comm, ppid (field 4) and starttime (field 22) of a `stat` line.
fn parse_entry(pid: u32, stat: &[u8]) -> Option<ProcEntry> {
    let (comm, mut fields) = stat_fields(stat)?;
    // Field 3 (the state) is the first after the comm.
    let ppid = parse_u64(fields.nth(4 - 3)?)?;
    let starttime = parse_u64(fields.nth(22 - 4 - 1)?)?;
    Some(ProcEntry {
        pid,
        ppid: u32::try_from(ppid).unwrap_or(0),
        comm: String::from_utf8_lossy(comm).into_owned(),
        starttime,
    })
}

fn subtree<'a>(entries: impl Iterator<Item = &'a ProcEntry>, root_pid: u32) -> Vec<ProcEntry> {
    let mut root = None;
    let mut children: HashMap<u32, Vec<&ProcEntry>> = HashMap::new();
    for e in entries {
        if e.pid == root_pid {
            root = Some(e);
        }
        children.entry(e.ppid).or_default().push(e);
    }
    let Some(root) = root else {
        return Vec::new();
    };
    // Siblings by pid: the same processes give the same list from pass to pass (`entries`
    // comes from a hash map), so whoever compares two discoveries sees no change.
    children
        .values_mut()
        .for_each(|c| c.sort_unstable_by_key(|e| e.pid));
    let mut seen = HashSet::from([root_pid]);
    let mut tree = vec![root.clone()];
    let mut next = 0;
    while next < tree.len() {
        let parent = tree[next].pid;
        next += 1;
        for child in children.get(&parent).into_iter().flatten() {
            if seen.insert(child.pid) {
                tree.push((*child).clone());
            }
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::fake::{testdata, FakeRoots};

    /// bash 6927 → {sh 6929 → {w (x) y 6931, sleep 6932}, sleep 6930}; sleep 6933 elsewhere.
    fn fake_tree() -> FakeRoots {
        let fake = FakeRoots::new();
        let text = String::from_utf8(testdata("tree_stat.txt")).unwrap();
        for line in text.lines() {
            let pid = line.split(' ').next().unwrap();
            fake.write(&fake.roots.proc, &format!("{pid}/stat"), line.as_bytes());
        }
        // Not processes: skipped. A pid directory without stat: gone mid-scan.
        fake.write(&fake.roots.proc, "self/stat", b"");
        fake.write(&fake.roots.proc, "uptime", b"1.0 1.0\n");
        std::fs::create_dir_all(fake.roots.proc.join("6999")).unwrap();
        fake
    }

    fn pids(entries: &[ProcEntry]) -> Vec<u32> {
        entries.iter().map(|e| e.pid).collect()
    }

    #[test]
    fn scan_reads_each_process_and_skips_the_rest() {
        let fake = fake_tree();
        let mut all = scan(&fake.roots.proc).unwrap();
        all.sort_by_key(|e| e.pid);
        assert_eq!(pids(&all), [6927, 6929, 6930, 6931, 6932, 6933]);
        let odd = &all[3];
        assert_eq!(
            (odd.pid, odd.ppid, odd.comm.as_str(), odd.starttime),
            (6931, 6929, "w (x) y", 27586)
        );
    }

    /// Issue 17, item 2: the sampler forgets a marker sender's root once its process is gone.
    #[test]
    fn a_process_is_alive_until_a_refresh_no_longer_finds_it() {
        let fake = fake_tree();
        let mut discovery = Discovery::new(fake.roots.proc.clone(), 6927);
        discovery.refresh().unwrap();
        assert!(discovery.is_alive(6933));
        assert!(!discovery.is_alive(1), "no such process here");
        std::fs::remove_dir_all(fake.roots.proc.join("6933")).unwrap();
        discovery.refresh().unwrap();
        assert!(!discovery.is_alive(6933));
    }

    #[test]
    fn descendants_are_the_whole_subtree_and_nothing_else() {
        let all = scan(&fake_tree().roots.proc).unwrap();
        let tree = descendants(&all, 6927);
        assert_eq!(tree[0].pid, 6927, "root first");
        let mut found = pids(&tree);
        found.sort_unstable();
        assert_eq!(found, [6927, 6929, 6930, 6931, 6932]);
        let mut below_sh = pids(&descendants(&all, 6929));
        below_sh.sort_unstable();
        assert_eq!(below_sh, [6929, 6931, 6932]);
        assert!(
            descendants(&all, 1).is_empty(),
            "a root not seen has no tree"
        );
    }

    #[test]
    fn launchers_are_the_ancestors_of_loops_that_run_none() {
        let all = scan(&fake_tree().roots.proc).unwrap();
        let tree = descendants(&all, 6927);
        let loops = |pids: &[u32]| pids.iter().copied().collect::<BTreeSet<u32>>();
        assert!(launchers(&tree, &loops(&[])).is_empty());
        // bash 6927 → sh 6929 → w (x) y 6931: bash and sh launch the loop.
        assert_eq!(launchers(&tree, &loops(&[6931])), [6927, 6929]);
        // A loop above another loop is still a loop; a loop outside the tree adds nothing.
        assert_eq!(launchers(&tree, &loops(&[6931, 6929, 6933])), [6927]);
        assert!(launchers(&tree, &loops(&[6927])).is_empty());
    }

    #[test]
    fn cmdline_splits_arguments() {
        let fake = FakeRoots::new();
        fake.proc("6927/cmdline", "cmdline.bin");
        fake.write(&fake.roots.proc, "2/cmdline", b"");
        let args = cmdline(&fake.roots.proc, 6927).unwrap();
        assert_eq!(args.len(), 3);
        assert_eq!(args[..2], ["bash", "-c"]);
        assert!(
            args[2].starts_with("sh -c \"\\\"/tmp/cap/w (x) y\\\" 30"),
            "{args:?}"
        );
        assert_eq!(cmdline(&fake.roots.proc, 2), Some(Vec::new()));
        assert_eq!(cmdline(&fake.roots.proc, 4242), None);
    }

    #[test]
    fn discovery_follows_the_tree_reading_only_what_can_change() {
        let fake = fake_tree();
        let proc = &fake.roots.proc;
        let mut discovery = Discovery::new(proc, 6927);
        let sorted = |tree: Vec<ProcEntry>| {
            let mut pids = pids(&tree);
            pids.sort_unstable();
            pids
        };
        assert_eq!(
            sorted(discovery.refresh().unwrap()),
            [6927, 6929, 6930, 6931, 6932]
        );

        // A new child of sh 6929 (sleep 6932's captured line, under a new pid), and sleep 6930
        // gone.
        let text = String::from_utf8(testdata("tree_stat.txt")).unwrap();
        let line_of = |pid: &str| text.lines().find(|l| l.starts_with(pid)).unwrap();
        fake.write(proc, "7000/stat", line_of("6932").as_bytes());
        std::fs::remove_dir_all(proc.join("6930")).unwrap();
        // The unrelated 6933 now claims sh 6929 as parent, as a reused pid would: an
        // incremental pass trusts what it knew, the next full pass sees it.
        fake.write(proc, "6933/stat", line_of("6931").as_bytes());
        assert_eq!(
            sorted(discovery.refresh().unwrap()),
            [6927, 6929, 6931, 6932, 7000]
        );
        for _ in 2..FULL_PASS_EVERY {
            assert!(!pids(&discovery.refresh().unwrap()).contains(&6933));
        }
        let tree = discovery.refresh().unwrap();
        assert_eq!(tree[0].pid, 6927);
        assert_eq!(sorted(tree), [6927, 6929, 6931, 6932, 6933, 7000]);

        std::fs::remove_dir_all(proc.join("6927")).unwrap();
        assert!(discovery.refresh().unwrap().is_empty(), "the root is gone");
    }
}
