//! Pressure stall information: how long tasks on the node waited for CPU, I/O and memory.
//!
//! PSI answers "was anything stalled on this resource" for the whole node, which corroborates
//! the per-process evidence (a data stall with high I/O pressure is a fetch stall). The
//! cumulative `total` (us) is kept, not the kernel's 10/60/300 s averages, which are far too
//! coarse for iterations of tens of milliseconds. Kernels without PSI (or booted with psi=0)
//! have no `/proc/pressure`: that is reported once as unsupported. Read on the meter tier
//! (every 500 ms): only the node's one-second readings read it.

use std::fs::File;
use std::path::PathBuf;

use procfs_core::{
    parse_pressure_record, CpuPressure, FromRead, IoPressure, MemoryPressure, ProcResult,
};
use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::{pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// The files under `<proc>/pressure` read, in this order.
const RESOURCES: [&str; 3] = ["cpu", "io", "memory"];

/// `<proc>/pressure/{cpu,io,memory}` `some` and `full` totals.
pub struct PsiSource {
    dir: PathBuf,
    files: Option<[File; 3]>,
    buf: Vec<u8>,
    /// some, full per resource; valid for the registry of `PsiSource::token`.
    ids: Option<[[SeriesId; 2]; 3]>,
    token: u64,
}

impl PsiSource {
    /// Reads below `roots.proc`.
    pub fn new(roots: &Roots) -> Self {
        PsiSource {
            dir: roots.proc.join("pressure"),
            files: None,
            buf: Vec::new(),
            ids: None,
            token: 0,
        }
    }

    fn open(&self) -> Result<[File; 3], SourceError> {
        if !self.dir.is_dir() {
            return Err(SourceError::Unsupported(format!(
                "no PSI: {} missing (kernel without CONFIG_PSI or psi=0)",
                self.dir.display()
            )));
        }
        let open = |resource: &str| {
            let path = self.dir.join(resource);
            File::open(&path).map_err(|source| SourceError::Io { path, source })
        };
        Ok([open("cpu")?, open("io")?, open("memory")?])
    }
}

impl Source for PsiSource {
    fn name(&self) -> &'static str {
        "psi"
    }

    fn tier(&self) -> Tier {
        Tier::Meter
    }

    fn describe(&self) -> String {
        format!(
            "node stall totals from {}/{{cpu,io,memory}}",
            self.dir.display()
        )
    }

    fn sample(&mut self, _watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let files = match self.files.take() {
            Some(files) => files,
            None => self.open()?,
        };
        let mut totals = [(0, None); 3];
        for (i, resource) in RESOURCES.iter().enumerate() {
            let path = || self.dir.join(resource);
            let bytes = pread_all(&files[i], &mut self.buf).map_err(|source| SourceError::Io {
                path: path(),
                source,
            })?;
            totals[i] = parse_totals(resource, bytes).map_err(|e| SourceError::Parse {
                path: path(),
                message: e.to_string(),
            })?;
        }
        self.files = Some(files);
        if self.token != out.token() {
            self.token = out.token();
            self.ids = None;
        }
        let ids = self.ids.get_or_insert_with(|| {
            RESOURCES.map(|resource| {
                let labels = [("resource", resource)];
                [
                    out.series(names::PSI_SOME_US, "us", SeriesKind::Counter, &labels),
                    out.series(names::PSI_FULL_US, "us", SeriesKind::Counter, &labels),
                ]
            })
        });
        for (ids, (some, full)) in ids.iter().zip(totals) {
            out.push(ids[0], some);
            if let Some(full) = full {
                out.push(ids[1], full);
            }
        }
        Ok(())
    }
}

/// `some` and `full` totals, us. Before Linux 5.13 `cpu` has no `full` line: then `None`.
fn parse_totals(resource: &str, bytes: &[u8]) -> ProcResult<(u64, Option<u64>)> {
    let (some, full) = match resource {
        "cpu" => match CpuPressure::from_read(bytes) {
            Ok(p) => (p.some, p.full),
            Err(_) => {
                let first = String::from_utf8_lossy(bytes);
                let some = parse_pressure_record(first.lines().next().unwrap_or_default())?;
                return Ok((some.total, None));
            }
        },
        "io" => IoPressure::from_read(bytes).map(|p| (p.some, p.full))?,
        _ => MemoryPressure::from_read(bytes).map(|p| (p.some, p.full))?,
    };
    Ok((some.total, Some(full.total)))
}

#[cfg(test)]
mod tests {
    use stallscope_analysis::series::names;

    use super::*;
    use crate::sources::fake::{testdata, FakeRoots, Round};

    #[test]
    fn some_and_full_totals_per_resource() {
        let fake = FakeRoots::new();
        for resource in RESOURCES {
            fake.proc(
                &format!("pressure/{resource}"),
                &format!("pressure_{resource}.txt"),
            );
        }
        let mut source = PsiSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        let get = |name, resource| round.get(name, ("resource", resource));
        assert_eq!(get(names::PSI_SOME_US, "cpu"), Some(7_098_217));
        assert_eq!(get(names::PSI_FULL_US, "cpu"), Some(0));
        assert_eq!(get(names::PSI_SOME_US, "io"), Some(2_953_623));
        assert_eq!(get(names::PSI_FULL_US, "io"), Some(2_724_766));
        assert_eq!(get(names::PSI_SOME_US, "memory"), Some(0));
        assert_eq!(round.values.len(), 6);
    }

    #[test]
    fn cpu_without_full_line_before_linux_5_13() {
        let cpu = testdata("pressure_cpu.txt");
        let some_line = cpu.split_inclusive(|&b| b == b'\n').next().unwrap();
        assert_eq!(parse_totals("cpu", some_line).unwrap(), (7_098_217, None));
    }

    #[test]
    fn missing_pressure_dir_is_unsupported() {
        let fake = FakeRoots::new();
        let mut source = PsiSource::new(&fake.roots);
        let err = source
            .sample(&Watched::default(), &mut Registry::default())
            .unwrap_err();
        let SourceError::Unsupported(message) = err else {
            panic!("{err}")
        };
        assert!(message.contains("pressure missing"), "{message}");
        assert!(message.contains("CONFIG_PSI"), "{message}");
    }
}
