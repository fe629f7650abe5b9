//! The wrapped command: spawned in its own process group, given the terminal, sent the
//! signals stallscope receives, waited for, and cleaned up after.
//!
//! Its own process group lets a signal reach every process of the job (torchrun, its ranks,
//! their data-loader workers) with one `kill(-pgid)`, and lets stallscope end whatever the
//! job left behind. When stallscope runs in the foreground of a terminal, the job's group is
//! made the foreground group, so Ctrl-C and reads from the terminal behave as without
//! stallscope; the terminal is handed back when the job ends.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::Context;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};

/// How long leftovers of the job get after SIGTERM before SIGKILL.
const LEFTOVER_GRACE: Duration = Duration::from_secs(3);

/// The running command.
pub struct Job {
    pub child: Child,
    pgid: i32,
    gave_terminal: bool,
    signals: signal_hook::iterator::Handle,
}

impl Drop for Job {
    /// Stops forwarding signals: a later job (the next run of an experiment) has its own.
    fn drop(&mut self) {
        self.signals.close();
    }
}

fn terminal_foreground_is_ours() -> bool {
    // SAFETY: plain queries on fd 0 and our own process.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

fn set_terminal_foreground(pgid: i32) {
    // SAFETY: blocking SIGTTOU around tcsetpgrp is the documented way for a process that may
    // be in the background to take the terminal back; the mask is restored afterwards.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        libc::tcsetpgrp(0, pgid);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

impl Job {
    /// Spawns `command` in a new process group, gives it the terminal when stallscope has
    /// it, and starts forwarding SIGINT, SIGTERM, SIGHUP and SIGQUIT to that group.
    pub fn spawn(command: Command) -> anyhow::Result<Job> {
        Job::spawn_with(command, true)
    }

    /// As [`Job::spawn`], but stallscope keeps the terminal (its dashboard reads the keys).
    pub fn spawn_keeping_terminal(command: Command) -> anyhow::Result<Job> {
        Job::spawn_with(command, false)
    }

    fn spawn_with(mut command: Command, give_terminal: bool) -> anyhow::Result<Job> {
        use std::os::unix::process::CommandExt;
        let foreground = give_terminal && terminal_foreground_is_ours();
        command.process_group(0);
        let child = command.spawn().context("cannot start the command")?;
        let pgid = child.id() as i32;
        if foreground {
            set_terminal_foreground(pgid);
        }
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])
            .context("cannot install signal handlers")?;
        let handle = signals.handle();
        std::thread::Builder::new()
            .name("stallscope-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    // SAFETY: sending a signal to a process group we created.
                    let delivered = unsafe { libc::kill(-pgid, sig) } == 0;
                    if !delivered {
                        // The command is gone: the signal is for stallscope itself, which
                        // must not outlive it by ignoring it (issue 30: a recorder stuck on
                        // a bad input pinned a core and ignored SIGTERM). The profile keeps
                        // what was flushed, and reads up to its last whole frame.
                        let _ = signal_hook::low_level::emulate_default_handler(sig);
                    }
                }
            })?;
        Ok(Job {
            child,
            pgid,
            gave_terminal: foreground,
            signals: handle,
        })
    }

    /// The process id of the command.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the command and takes the terminal back.
    pub fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        let status = self.child.wait().context("waiting for the command")?;
        if self.gave_terminal {
            // SAFETY: our own process group.
            set_terminal_foreground(unsafe { libc::getpgrp() });
            self.gave_terminal = false;
        }
        Ok(status)
    }

    /// Ends what the command left behind: its process group, and the `descendants` (pid,
    /// start time in clock ticks) found while it ran that are still the same processes.
    pub fn end_leftovers(&self, descendants: &[(u32, u64)]) {
        end_leftovers(self.pgid, descendants);
    }
}

fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Start time (clock ticks since boot, `stat` field 22) of a live pid.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

fn end_leftovers(pgid: i32, descendants: &[(u32, u64)]) {
    let same_process = |pid: u32, start: u64| start_time(pid) == Some(start);
    let leftovers: Vec<u32> = descendants
        .iter()
        .filter(|(pid, start)| same_process(*pid, *start))
        .map(|(pid, _)| *pid)
        .collect();
    if !group_alive(pgid) && leftovers.is_empty() {
        return;
    }
    // SAFETY: signals to the job's own group and to processes verified by start time.
    unsafe {
        libc::kill(-pgid, libc::SIGTERM);
        for pid in &leftovers {
            libc::kill(*pid as i32, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + LEFTOVER_GRACE;
    while Instant::now() < deadline {
        let any = group_alive(pgid) || descendants.iter().any(|(p, s)| same_process(*p, *s));
        if !any {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
        for (pid, start) in descendants {
            if same_process(*pid, *start) {
                libc::kill(*pid as i32, libc::SIGKILL);
            }
        }
    }
}

/// The exit code a shell would show for `status`: the code, or 128 + the signal.
pub fn exit_code(status: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Ends stallscope the way the command ended: with its exit code, or killed by its signal.
pub fn exit_like(status: &ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        // SAFETY: restoring the default action, unblocking, and raising the signal on
        // ourselves, so our parent sees the same death as the command's.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
    }
    std::process::exit(exit_code(status))
}
