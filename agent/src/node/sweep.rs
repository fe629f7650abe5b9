//! What killed runs, agents and collectors leave behind, swept at start and on exit.
//!
//! A process that exits cleanly removes its feed socket and its staging directories (their
//! `Drop`s do). One killed with SIGKILL, or by the OOM killer, leaves them: after a day of
//! runs and tests the runtime directory held dead `run-PID.feed` and `collector-PORT.feed`
//! sockets and seven `python-XXXXXX` staging folders (issue 30, item 11), and `stallscope top`
//! with no argument attached to "the newest feed", which could be a dead one.
//!
//! Whose a thing is must be told without trusting a pid alone (pids are reused):
//! - a staging directory is *claimed*: its creator holds an exclusive `flock` on its
//!   `.owner` file for as long as it lives ([`Claim`]). The kernel drops the lock when the
//!   process dies however it dies, so a lock that can be taken means the owner is gone. The
//!   descriptor is close-on-exec, so a training left running does not keep it;
//! - a feed socket is dead when nothing listens on it: connecting is refused
//!   ([`is_dead_socket`]); `run-PID.feed` is dead, more cheaply, when PID is gone.
//!
//! Only what this user owns is touched: the runtime directory is owner-only, and a directory
//! of another user in the shared temporary directory cannot be opened to be locked.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The file in a claimed directory whose lock says its owner is alive.
const OWNER_FILE: &str = ".owner";

/// A directory's claim: held (an exclusive `flock`) while the process that made it lives.
#[derive(Debug)]
pub struct Claim {
    _lock: File,
}

/// Claims `dir` for this process until the returned [`Claim`] is dropped or the process dies.
/// The file is locked under another name and then renamed into place, so a sweep can never
/// find an `.owner` that is not locked yet and take the directory for a dead process's.
pub fn claim(dir: &Path) -> std::io::Result<Claim> {
    let locking = dir.join(".owner-locking");
    let file = File::create(&locking)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    std::fs::rename(&locking, dir.join(OWNER_FILE))?;
    Ok(Claim { _lock: file })
}

/// Whether `dir` was claimed by a process that is gone: its `.owner` exists and can be
/// locked. A directory with no `.owner` (not ours, or made before claims) is left alone.
fn owner_is_gone(dir: &Path) -> bool {
    let Ok(file) = File::open(dir.join(OWNER_FILE)) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; closing it releases the lock.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Whether nothing listens on the Unix stream socket at `path` (a connection is refused).
pub fn is_dead_socket(path: &Path) -> bool {
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
    }
}

/// The pid in a run's feed socket name (`run-PID.feed`).
fn run_feed_pid(name: &str) -> Option<u32> {
    name.strip_prefix("run-")?
        .strip_suffix(".feed")?
        .parse()
        .ok()
}

/// What a sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Dead feed sockets.
    pub sockets: Vec<PathBuf>,
    /// Staging directories whose owner is gone.
    pub dirs: Vec<PathBuf>,
}

/// Removes from `dir` what belongs to processes that are gone: `run-PID.feed` sockets whose
/// PID is gone, other `*.feed` sockets nothing listens on (with `probe_feeds`; a probe makes
/// a live server send a snapshot, so it is left to where the feed is about to be read
/// anyway), and claimed directories named with one of `prefixes` whose owner is gone.
/// Errors are ignored: a sweep never stops what runs it.
pub fn sweep(dir: &Path, prefixes: &[&str], probe_feeds: bool) -> Swept {
    let mut swept = Swept::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return swept;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && prefixes.iter().any(|p| name.starts_with(p)) {
            if owner_is_gone(&path) && std::fs::remove_dir_all(&path).is_ok() {
                swept.dirs.push(path);
            }
        } else if name.ends_with(".feed") && !kind.is_dir() {
            let dead = match run_feed_pid(&name) {
                Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                None => probe_feeds && is_dead_socket(&path),
            };
            if dead && std::fs::remove_file(&path).is_ok() {
                swept.sockets.push(path);
            }
        }
    }
    swept
}

/// Sweeps this user's runtime directory (the agent's `python-*` staging, dead feeds) and
/// the temporary directory (a run's `stallscope-*` directories): what `run`, `agent` and
/// `collector` call at start and on exit.
pub fn sweep_leftovers() {
    if let Ok(dir) = super::feed_dir() {
        sweep(&dir, &["python-"], false);
    }
    sweep(&std::env::temp_dir(), &["stallscope-"], false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A dead process's leftovers go; a live one's stay.
    #[test]
    fn what_dead_processes_left_is_swept_and_what_live_ones_hold_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        // A staging directory whose owner lives (this process holds the claim)…
        let live = dir.join("python-live");
        std::fs::create_dir(&live).unwrap();
        let held = claim(&live).unwrap();
        // …one whose owner died (its lock released, as the kernel does at the owner's death)…
        let dead = dir.join("python-dead");
        std::fs::create_dir(&dead).unwrap();
        drop(claim(&dead).unwrap());
        // …and one that was never claimed (not ours to judge).
        let unclaimed = dir.join("python-unclaimed");
        std::fs::create_dir(&unclaimed).unwrap();
        // Feeds: a run whose pid is gone, a run that lives (this test), a socket nothing
        // listens on, and one a live server holds.
        let gone_pid = {
            let mut c = std::process::Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            pid
        };
        let run_dead = dir.join(format!("run-{gone_pid}.feed"));
        std::fs::write(&run_dead, "").unwrap();
        let run_live = dir.join(format!("run-{}.feed", std::process::id()));
        std::fs::write(&run_live, "").unwrap();
        let closed = dir.join("collector-7571.feed");
        drop(UnixListener::bind(&closed).unwrap());
        let listening = dir.join("agent.feed");
        let _server = UnixListener::bind(&listening).unwrap();

        let swept = sweep(dir, &["python-"], true);
        assert_eq!(swept.dirs, vec![dead.clone()]);
        let mut sockets = swept.sockets.clone();
        sockets.sort();
        let mut expected = vec![closed.clone(), run_dead.clone()];
        expected.sort();
        assert_eq!(sockets, expected);
        for kept in [&live, &unclaimed, &run_live, &listening] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        // Without probing, a socket that names no pid is left for the reader to judge.
        let closed_again = dir.join("collector-7572.feed");
        drop(UnixListener::bind(&closed_again).unwrap());
        assert!(sweep(dir, &["python-"], false).sockets.is_empty());
        // Once its owner lets go, the live one is swept too.
        drop(held);
        assert_eq!(sweep(dir, &["python-"], false).dirs, vec![live]);
    }
}
