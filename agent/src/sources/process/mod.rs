//! The job's processes, as the attribution needs them.
//!
//! Every tick, only the main thread (tid == pid) of each rank and loader
//! ([`ProcessSource`]): it runs the training loop (or the loader worker's loop), and reading
//! every thread at 100 Hz would cost more than the rest of the agent. Launchers (processes
//! above the loops, [`Watched::launchers`]) are read by a second instance on the slow tier:
//! attribution never asks for their main thread.
//!
//! Every tick too, the other threads of the loader workers ([`WorkerThreadsSource`]: the
//! job's processes that are neither loops nor launchers): a worker that reads from an object
//! store or decodes on a thread pool leaves its main thread asleep, and what the loop waits
//! for is then on those threads. They are few (PyTorch sets a worker's own thread count to 1),
//! and are read only once the loops are known.
//!
//! Slowly, whole-process totals ([`ProcessTotalsSource`]): CPU time of all threads (live and
//! exited) and bytes read from storage.
//!
//! A process that ends is forgotten without a word: in a job, processes end all the time, and
//! that is not a failure of the source. The files stay open and are re-read from offset 0,
//! since an open and close per tick would cost more than the read; the few fields needed are
//! parsed by hand (`sources::text`).

use std::io;
use std::path::PathBuf;

use super::{is_gone, SourceError, Watched};

mod main_thread;
mod totals;
mod worker_threads;

pub(crate) use main_thread::{parse_schedstat, stat_state};
pub use main_thread::{ProcessSource, STATE_EVERY};
pub use totals::ProcessTotalsSource;
pub use worker_threads::WorkerThreadsSource;

/// Forgets entries whose pid is no longer watched (or no longer `wanted`) and opens entries
/// for newly watched, wanted pids. Returns the first failure to open that was not the process
/// going away (the round goes on without that pid); `Unsupported` stops the round.
fn sync<T>(
    entries: &mut Vec<T>,
    pid_of: impl Fn(&T) -> u32,
    watched: &Watched,
    wanted: impl Fn(u32) -> bool,
    mut open: impl FnMut(u32) -> Result<Option<T>, SourceError>,
) -> Result<Option<SourceError>, SourceError> {
    entries.retain(|e| {
        let pid = pid_of(e);
        watched.pids.contains(&pid) && wanted(pid)
    });
    let mut failure = None;
    for &pid in &watched.pids {
        if !wanted(pid) || entries.iter().any(|e| pid_of(e) == pid) {
            continue;
        }
        match open(pid) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err(e @ SourceError::Unsupported(_)) => return Err(e),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    Ok(failure)
}

fn open_failed<T>(path: PathBuf, e: io::Error) -> Result<Option<T>, SourceError> {
    if is_gone(&e) {
        Ok(None)
    } else {
        Err(SourceError::Io { path, source: e })
    }
}

/// Why reading one process failed: it went away, or something worth reporting.
enum Failure {
    Gone,
    Other(Unnamed),
}

/// A failure before its path is known (built only when reported).
enum Unnamed {
    Io(io::Error),
    Parse(String),
}

impl Unnamed {
    fn with_path(self, path: PathBuf) -> SourceError {
        match self {
            Unnamed::Io(source) => SourceError::Io { path, source },
            Unnamed::Parse(message) => SourceError::Parse { path, message },
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        if is_gone(&e) {
            Failure::Gone
        } else {
            Failure::Other(Unnamed::Io(e))
        }
    }
}

/// A parse failure quoting the start of what was read.
fn unparsed(what: &str, bytes: &[u8]) -> Failure {
    let line = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into_owned();
    Failure::Other(Unnamed::Parse(format!("{what} in {line:?}")))
}

#[cfg(test)]
fn watched(pids: &[u32]) -> Watched {
    Watched::new(pids.to_vec())
}
