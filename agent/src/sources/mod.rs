//! Sources: each reads one area of the machine and reports raw values.
//!
//! Every source implements [`Source`] and reads below a [`Roots`], so tests point it at a
//! directory of captured real text. A source never stops the run: the sampler reports its
//! first failure once and goes on without it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use stallscope_analysis::series::{SeriesDecl, SeriesId, SeriesKind};

pub mod disk;
pub mod flows;
pub mod net;
pub mod packets;
pub mod perf;
pub mod process;
pub mod psi;
pub mod rdma;
pub(crate) mod text;
pub mod thread_states;

/// Where /proc and /sys are (`/proc`, `/sys` on a live machine).
#[derive(Clone, Debug)]
pub struct Roots {
    /// The procfs mount.
    pub proc: PathBuf,
    /// The sysfs mount.
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
        }
    }
}

/// Which processes the job has now, as the sampler's discovery found them.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    /// Process ids of the job (ranks, loaders, helpers, launchers).
    pub pids: Vec<u32>,
    /// Of `pids`, the launchers: processes above a training loop that run none themselves
    /// (`torchrun`, a script that spawns its ranks). Attribution never reads their main
    /// thread, so [`process::ProcessSource`] reads them at the slow tier, not every tick.
    /// Empty until a loop is known.
    pub launchers: Vec<u32>,
    /// Of `pids`, the training loops (processes that sent a step). Empty until one is known.
    pub loops: Vec<u32>,
}

impl Watched {
    /// The job's processes `pids`, none known as a launcher.
    pub fn new(pids: Vec<u32>) -> Self {
        Watched {
            pids,
            launchers: Vec::new(),
            loops: Vec::new(),
        }
    }

    /// Whether `pid` is one of the [`launchers`](Self::launchers).
    pub fn is_launcher(&self, pid: u32) -> bool {
        self.launchers.contains(&pid)
    }

    /// Whether `pid` is a loader worker or another helper of a loop: a job's process that is
    /// neither a loop nor a launcher, once the loops are known.
    pub fn is_worker(&self, pid: u32) -> bool {
        !self.loops.is_empty() && !self.loops.contains(&pid) && !self.is_launcher(pid)
    }
}

/// Hands out series ids and collects the values of one sampling round.
#[derive(Debug)]
pub struct Registry {
    token: u64,
    decls: Vec<SeriesDecl>,
    new_decls: Vec<SeriesDecl>,
    values: Vec<(SeriesId, u64)>,
    /// The most values a round has held: the room each round starts with.
    most_values: usize,
}

static NEXT_REGISTRY_TOKEN: AtomicU64 = AtomicU64::new(1);
/// Series ids are unique in the process, not per registry: several samplers (the CPU one
/// and the NVML thread) each have a registry and feed one recorder, whose series store is
/// keyed by id.
static NEXT_SERIES_ID: AtomicU32 = AtomicU32::new(0);

impl Default for Registry {
    fn default() -> Self {
        Registry {
            token: NEXT_REGISTRY_TOKEN.fetch_add(1, Ordering::Relaxed),
            decls: Vec::new(),
            new_decls: Vec::new(),
            values: Vec::new(),
            most_values: 0,
        }
    }
}

impl Registry {
    /// Tells registries apart: a source that caches series ids across rounds (to skip the
    /// lookup in [`Registry::series`] on hot paths) drops them when the token changes.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The id of a series, declaring it on first use.
    pub fn series(
        &mut self,
        name: &str,
        unit: &str,
        kind: SeriesKind,
        labels: &[(&str, &str)],
    ) -> SeriesId {
        if let Some(d) = self.decls.iter().find(|d| {
            d.name == name
                && d.labels.len() == labels.len()
                && d.labels
                    .iter()
                    .zip(labels)
                    .all(|((k, v), (k2, v2))| k == k2 && v == v2)
        }) {
            return d.id;
        }
        let decl = SeriesDecl {
            id: SeriesId(NEXT_SERIES_ID.fetch_add(1, Ordering::Relaxed)),
            name: name.to_string(),
            unit: unit.to_string(),
            kind,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        self.decls.push(decl.clone());
        self.new_decls.push(decl);
        self.decls.last().expect("just pushed").id
    }

    /// Records a raw value for this round.
    pub fn push(&mut self, id: SeriesId, value: u64) {
        self.values.push((id, value));
    }

    /// Takes the series declared since the last call.
    pub fn take_new_decls(&mut self) -> Vec<SeriesDecl> {
        std::mem::take(&mut self.new_decls)
    }

    /// Takes the values recorded since the last call. The next round starts with room for as
    /// many as the fullest round so far (rounds with the slow tier, or with the thread state,
    /// hold more), so that a round allocates once and never regrows.
    pub fn take_values(&mut self) -> Vec<(SeriesId, u64)> {
        self.most_values = self.most_values.max(self.values.len());
        std::mem::replace(&mut self.values, Vec::with_capacity(self.most_values))
    }

    /// How many values this round holds so far.
    pub fn value_count(&self) -> usize {
        self.values.len()
    }

    /// Drops the values recorded after the first `count` (a failed source's partial round).
    pub fn truncate_values(&mut self, count: usize) {
        self.values.truncate(count);
    }

    /// Every series declared so far.
    pub fn decls(&self) -> &[SeriesDecl] {
        &self.decls
    }
}

/// Why a source could not read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file did not parse.
    #[error("cannot parse {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The machine lacks what the source reads (e.g. no PSI on this kernel).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A library call the source makes failed (an NVML call on a GPU that was lost).
    #[error("{0}")]
    Call(String),
}

/// How often a source is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Every time the sampler wakes: every tick (`--rate`, 100 Hz by default), or every
    /// 100 ms when a source gives the ticks' instants itself ([`Source::replaces_polling`]).
    Fast,
    /// About every 100 ms: what the attribution reads over an iteration (link bytes, storage
    /// reads, launchers).
    Slow,
    /// About every 500 ms: what only the node's one-second readings read (the disks, PSI):
    /// the views show them per second, and reading them ten times a second cost a tenth of
    /// the sampler.
    Meter,
}

/// One area of the machine.
pub trait Source: Send {
    /// Short stable name (`cpu`, `disk`, `net`, `psi`).
    fn name(&self) -> &'static str;
    /// How often it wants to be read.
    fn tier(&self) -> Tier;
    /// Reads once, recording raw values in `out`.
    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError>;
    /// What it reads, in a few words, for the status reported when it comes up.
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// The node's TCP flows that moved since the last call, when this source reads them (the
    /// flow source, about once a second); `None` otherwise.
    fn take_flows(&mut self) -> Option<stallscope_analysis::flows::NodeFlows> {
        None
    }
    /// Batches of past instants this source rebuilt in its last read (the eBPF thread
    /// states, [`thread_states`]), oldest first, all before the read; the sampler sends them
    /// ahead of the round's own batch.
    fn take_backfill(&mut self, _out: &mut Vec<stallscope_analysis::series::SampleBatch>) {}
    /// Whether this source gives the fast tier's instants itself ([`Self::take_backfill`]),
    /// so that the sampler need wake only at the slow tier's rate.
    fn replaces_polling(&self) -> bool {
        false
    }
    /// Tells the source the fast tier's period, ns (before the first read).
    fn set_period(&mut self, _period: stallscope_analysis::Nanos) {}
}

/// Reads a file kept open from offset 0 (`pread`) into `buf`, which grows as needed and is
/// reused across rounds. One system call for a whole procfs or sysfs record: both hand over
/// everything that fits per read, so a read shorter than the room left is the end.
pub(crate) fn pread_all<'a>(file: &File, buf: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
    if buf.len() < 512 {
        buf.resize(512, 0);
    }
    let mut n = 0;
    loop {
        let room = buf.len() - n;
        let got = match file.read_at(&mut buf[n..], n as u64) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        n += got;
        if got < room {
            return Ok(&buf[..n]);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// Whether an error means the process (or interface, or device) went away between listing
/// and reading: not a failure of the source.
pub(crate) fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENODEV))
}

/// A fake `/proc` and `/sys` in a temporary directory, filled from `agent/testdata`.
#[cfg(test)]
pub(crate) mod fake {
    use std::fs;
    use std::path::{Path, PathBuf};

    use stallscope_analysis::series::SeriesId;

    use super::{Registry, Roots};

    /// The roots and the directory that holds them (removed on drop).
    pub struct FakeRoots {
        _dir: tempfile::TempDir,
        pub roots: Roots,
    }

    impl FakeRoots {
        pub fn new() -> Self {
            let dir = tempfile::tempdir().expect("temp dir");
            let roots = Roots {
                proc: dir.path().join("proc"),
                sys: dir.path().join("sys"),
            };
            fs::create_dir_all(&roots.proc).expect("fake proc");
            fs::create_dir_all(&roots.sys).expect("fake sys");
            FakeRoots { _dir: dir, roots }
        }

        /// Writes `contents` at `rel` below `root`, creating directories.
        pub fn write(&self, root: &Path, rel: &str, contents: &[u8]) -> PathBuf {
            let path = root.join(rel);
            fs::create_dir_all(path.parent().expect("a parent")).expect("fake dir");
            fs::write(&path, contents).expect("fake file");
            path
        }

        /// Copies `agent/testdata/NAME` to `rel` below `/proc`.
        pub fn proc(&self, rel: &str, name: &str) -> PathBuf {
            self.write(&self.roots.proc, rel, &testdata(name))
        }

        /// Copies `agent/testdata/NAME` to `rel` below `/sys`.
        pub fn sys(&self, rel: &str, name: &str) -> PathBuf {
            self.write(&self.roots.sys, rel, &testdata(name))
        }
    }

    /// The bytes of a captured file.
    pub fn testdata(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name);
        fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The values of one round by series name and one label, e.g. `("pid", "42")`.
    pub struct Round {
        pub decls: Vec<stallscope_analysis::series::SeriesDecl>,
        pub values: Vec<(SeriesId, u64)>,
    }

    impl Round {
        pub fn take(registry: &mut Registry) -> Self {
            registry.take_new_decls();
            Round {
                decls: registry.decls().to_vec(),
                values: registry.take_values(),
            }
        }

        pub fn get(&self, name: &str, label: (&str, &str)) -> Option<u64> {
            let decl = self
                .decls
                .iter()
                .find(|d| d.name == name && d.label(label.0) == Some(label.1))?;
            self.values
                .iter()
                .find(|(id, _)| *id == decl.id)
                .map(|&(_, v)| v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU sampler and the NVML thread each declare series in a registry of their own,
    /// and one recorder stores both: an id handed out twice would file GPU bytes under a
    /// process's CPU series.
    #[test]
    fn registries_of_one_process_never_share_a_series_id() {
        let (mut cpu, mut gpu) = (Registry::default(), Registry::default());
        let a = cpu.series("proc.cpu_ns", "ns", SeriesKind::Counter, &[("pid", "1")]);
        let b = gpu.series("gpu.power_mw", "mW", SeriesKind::Gauge, &[("gpu", "0")]);
        assert_ne!(a, b);
        assert_eq!(
            cpu.series("proc.cpu_ns", "ns", SeriesKind::Counter, &[("pid", "1")]),
            a,
            "a series declared again keeps its id"
        );
    }
}
