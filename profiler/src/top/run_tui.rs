//! `stallscope run --tui`: the dashboard instead of the status line, on a thread beside the
//! run. The training's output goes to a log file (never a pipe, so the training cannot die of
//! SIGPIPE whatever happens to stallscope) that the dashboard shows in a pane. `q` closes the
//! dashboard and the log is then followed on the terminal while the training runs on; the
//! terminal is restored before the summary is printed, whichever way the run ends.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use stallscope_agent::node::feed::{FeedHub, SUBSCRIBER_QUEUE};
use stallscope_dashboards::top::{App, Mode};

use super::live::FollowedModel;
use super::log_tail::LogTail;
use super::screen::{self, Exit, Model, Options, TerminalKeys};
use super::{is_terminal, on_terminal};

/// Lines of the log printed after the dashboard closes with the run.
const TAIL_AT_END: usize = 20;

/// The log file beside the profile: `PROFILE.log`.
pub fn log_path(profile: &Path) -> PathBuf {
    profile.with_extension("log")
}

/// Whether `--tui` can draw; says why not (and that the status line is used) when it cannot.
pub fn usable() -> bool {
    if is_terminal() {
        return true;
    }
    eprintln!(
        "stallscope: --tui needs a terminal on stdin and stdout; showing the status line instead"
    );
    false
}

/// The dashboard running beside a run.
pub struct Dashboard {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<Exit>>,
    log: PathBuf,
    stderr: Arc<StderrToLog>,
}

/// stallscope's own stderr sent to the log while the dashboard owns the terminal, so that a
/// source's warning lands in the output pane instead of across the screen.
struct StderrToLog {
    /// A copy of the original fd 2; -1 once restored.
    saved: std::sync::atomic::AtomicI32,
}

impl StderrToLog {
    fn new(log: &std::fs::File) -> StderrToLog {
        use std::os::fd::AsRawFd;
        // SAFETY: dup and dup2 on descriptors this process owns; on failure nothing changes.
        let saved = unsafe {
            let saved = libc::dup(2);
            if saved >= 0 && libc::dup2(log.as_raw_fd(), 2) < 0 {
                libc::close(saved);
                -1
            } else {
                saved
            }
        };
        StderrToLog {
            saved: saved.into(),
        }
    }

    /// Puts the original stderr back (once).
    fn restore(&self) {
        let saved = self.saved.swap(-1, Ordering::AcqRel);
        if saved >= 0 {
            // SAFETY: the copy made in `new`, put back and closed once.
            unsafe {
                libc::dup2(saved, 2);
                libc::close(saved);
            }
        }
    }
}

/// Starts the dashboard on the run's feed `hub`, showing the log at `log`.
pub fn start(hub: &FeedHub, log: &Path, at: String) -> std::io::Result<Dashboard> {
    let model = FollowedModel::follow_hub(hub.subscribe(SUBSCRIBER_QUEUE))?;
    let stop = Arc::new(AtomicBool::new(false));
    let log_file = std::fs::OpenOptions::new().append(true).open(log)?;
    let stderr = Arc::new(StderrToLog::new(&log_file));
    let thread = {
        let stop = stop.clone();
        let log = log.to_path_buf();
        let stderr = stderr.clone();
        std::thread::Builder::new()
            .name("stallscope-tui".into())
            .spawn(move || show(model, at, &log, stop, &stderr))
    };
    let thread = match thread {
        Ok(t) => t,
        Err(e) => {
            stderr.restore();
            return Err(e);
        }
    };
    Ok(Dashboard {
        stop,
        thread,
        log: log.to_path_buf(),
        stderr,
    })
}

fn show(
    model: FollowedModel,
    at: String,
    log: &Path,
    stop: Arc<AtomicBool>,
    stderr: &StderrToLog,
) -> anyhow::Result<Exit> {
    let mut app = App::new(Mode::Live(at.clone()));
    let mut opts = Options {
        fps: 4.0,
        stop: Some(stop.clone()),
        output: Some(LogTail::new(log)),
        for_at_most: None,
    };
    let result = on_terminal(|t| {
        screen::run(
            t,
            &mut app,
            &mut Model::Live { model, at },
            &mut TerminalKeys,
            &mut opts,
        )
    });
    stderr.restore();
    let (exit, _) = result?;
    if exit == Exit::Stopped {
        return Ok(exit);
    }
    eprintln!(
        "stallscope: dashboard closed; the training goes on and its output follows (all of it in {})",
        log.display()
    );
    if exit == Exit::Interrupt {
        // What Ctrl-C does without a dashboard: the run forwards it to the training.
        // SAFETY: a signal to our own process, whose handler forwards it.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
    }
    follow(log, &stop);
    Ok(exit)
}

/// Copies what the training writes to its log onto stdout until the run ends.
fn follow(log: &Path, stop: &AtomicBool) {
    let mut file = match std::fs::File::open(log) {
        Ok(f) => f,
        Err(_) => return,
    };
    use std::io::{Seek, SeekFrom};
    let _ = file.seek(SeekFrom::End(0));
    let mut out = std::io::stdout();
    loop {
        let done = stop.load(Ordering::Acquire);
        if std::io::copy(&mut file, &mut out).is_err() || out.flush().is_err() {
            return;
        }
        if done {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Dashboard {
    /// Ends the dashboard (the run ended): restores the terminal, prints the end of the log
    /// when the dashboard was still showing it, and says where the log is.
    pub fn finish(self) {
        self.stop.store(true, Ordering::Release);
        let joined = self.thread.join();
        self.stderr.restore();
        let exit = match joined {
            Ok(Ok(exit)) => Some(exit),
            Ok(Err(e)) => {
                eprintln!("stallscope: the dashboard failed: {e:#}");
                None
            }
            Err(_) => {
                ratatui::restore();
                eprintln!("stallscope: the dashboard failed");
                None
            }
        };
        if exit == Some(Exit::Stopped) {
            let mut tail = LogTail::new(&self.log);
            tail.poll();
            for line in tail.last(TAIL_AT_END) {
                println!("{line}");
            }
        }
        eprintln!(
            "stallscope: the training's output is in {}",
            self.log.display()
        );
    }
}
