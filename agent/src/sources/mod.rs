//! Sources: each reads one area of the machine and reports raw values.
//!
//! Every source implements [`Source`] and reads below a [`Roots`], so tests point it at a
//! directory of captured real text. A source never stops the run: the sampler reports its
//! first failure once and goes on without it.

use std::path::PathBuf;

use stallscope_analysis::series::{SeriesDecl, SeriesId, SeriesKind};

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
}

/// Hands out series ids and collects the values of one sampling round.
#[derive(Debug, Default)]
pub struct Registry {
    decls: Vec<SeriesDecl>,
    new_decls: Vec<SeriesDecl>,
    values: Vec<(SeriesId, u64)>,
}

impl Registry {
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
            id: SeriesId(self.decls.len() as u32),
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

    /// Takes the values recorded since the last call.
    pub fn take_values(&mut self) -> Vec<(SeriesId, u64)> {
        std::mem::take(&mut self.values)
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
}

/// How often a source is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Every tick (`--rate`, 100 Hz by default).
    Fast,
    /// About every 100 ms.
    Slow,
}

/// One area of the machine.
pub trait Source: Send {
    /// Short stable name (`cpu`, `disk`, `net`, `psi`).
    fn name(&self) -> &'static str;
    /// How often it wants to be read.
    fn tier(&self) -> Tier;
    /// Reads once, recording raw values in `out`.
    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError>;
}
