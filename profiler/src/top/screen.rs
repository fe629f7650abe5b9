//! The dashboard's loop: keys in, the model folded by its own thread (live) or a replay
//! cursor, frames out at a bounded rate. Generic over the ratatui backend and the key source,
//! so the benchmark drives the very loop users run, against a sink instead of a terminal.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::backend::Backend;
use ratatui::crossterm::event::{self, Event, KeyEvent, KeyEventKind};
use ratatui::Terminal;
use stallscope_analysis::journal::replay::{Replay, ReplayCursor};
use stallscope_analysis::view::JobView;
use stallscope_dashboards::top::{self, App, Mode, Outcome};

use super::live::{FeedStatus, FollowedModel};
use super::log_tail::LogTail;

/// What arrives between frames.
pub enum Input {
    /// A key was pressed.
    Key(KeyEvent),
    /// The terminal was resized: draw again.
    Redraw,
}

/// Where keys come from.
pub trait Keys {
    /// The next input within `timeout`, if any.
    fn next(&mut self, timeout: Duration) -> io::Result<Option<Input>>;
}

/// The terminal's keys (crossterm).
pub struct TerminalKeys;

/// Waits up to `timeout` for stdin to be readable; an error once the terminal hung up (a
/// closed tmux pane, a dropped ssh session), where crossterm would read end-of-file forever.
fn stdin_ready(timeout: Duration) -> io::Result<bool> {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one pollfd we own, for the length of the call.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the terminal went away",
        ));
    }
    Ok(n > 0)
}

impl Keys for TerminalKeys {
    fn next(&mut self, timeout: Duration) -> io::Result<Option<Input>> {
        // crossterm may hold input it already read (a burst of keys): ask it first.
        let pending =
            event::poll(Duration::ZERO)? || (stdin_ready(timeout)? && event::poll(Duration::ZERO)?);
        if !pending {
            return Ok(None);
        }
        Ok(match event::read()? {
            Event::Key(k) if k.kind != KeyEventKind::Release => Some(Input::Key(k)),
            Event::Resize(..) => Some(Input::Redraw),
            _ => None,
        })
    }
}

/// What the dashboard shows.
pub enum Model<'a> {
    /// A feed, folded by its own thread; `at` names it in the header.
    Live {
        /// The shared model.
        model: FollowedModel,
        /// The socket or address.
        at: String,
    },
    /// A profile, at a cursor.
    Replay {
        /// The replay.
        replay: &'a Replay,
        /// Its cursor.
        cursor: Box<ReplayCursor<'a>>,
    },
}

/// How the loop runs.
pub struct Options {
    /// Frames per second at most for the model's changes (redraws happen only when something
    /// changed; a key redraws at once).
    pub fps: f64,
    /// Set when the run the dashboard watches ended (`run --tui`): the loop returns.
    pub stop: Option<Arc<AtomicBool>>,
    /// The training's output (`run --tui`).
    pub output: Option<LogTail>,
    /// Stop after this long (benchmarks).
    pub for_at_most: Option<Duration>,
}

/// Why the loop returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// `q`.
    Quit,
    /// Ctrl-C.
    Interrupt,
    /// The watched run ended, or the time given ran out.
    Stopped,
}

/// An empty model, drawn before the feed's snapshot arrives.
fn waiting() -> JobView {
    JobView::new("")
}

/// Runs the dashboard until `q`, Ctrl-C or the stop flag; returns why, and how many frames
/// it drew.
pub fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    model: &mut Model<'_>,
    keys: &mut dyn Keys,
    opts: &mut Options,
) -> io::Result<(Exit, u64)> {
    let frame_every = Duration::from_secs_f64(1.0 / opts.fps.clamp(0.2, 60.0));
    let started = Instant::now();
    let empty = waiting();
    let mut next_frame = Instant::now();
    let mut drawn_messages = u64::MAX;
    let mut dirty = true;
    let mut frames = 0u64;
    loop {
        if opts
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Acquire))
            || opts.for_at_most.is_some_and(|d| started.elapsed() >= d)
        {
            return Ok((Exit::Stopped, frames));
        }
        let wait = next_frame.saturating_duration_since(Instant::now());
        match keys.next(wait)? {
            Some(Input::Key(k)) => {
                let outcome = match model {
                    Model::Live { model, .. } => {
                        let live = model.lock();
                        app.on_key(k, live.view.as_ref().unwrap_or(&empty))
                    }
                    Model::Replay { cursor, .. } => app.on_key(k, cursor.view()),
                };
                match outcome {
                    Outcome::Quit => return Ok((Exit::Quit, frames)),
                    Outcome::Interrupt => return Ok((Exit::Interrupt, frames)),
                    Outcome::Seek(to) => seek(app, model, to),
                    Outcome::Continue => {}
                }
                dirty = true;
            }
            Some(Input::Redraw) => dirty = true,
            None => {}
        }
        // A key or a resize draws at once; the model's news wait for the next tick.
        let due = Instant::now() >= next_frame;
        if !due && !dirty {
            continue;
        }
        if due {
            next_frame = Instant::now() + frame_every;
            if let Some(out) = opts.output.as_mut() {
                if out.poll() {
                    app.output = Some(out.pane());
                    dirty = true;
                }
            }
            if let Model::Replay { cursor, .. } = model {
                if let Mode::Replay(c) = &app.mode {
                    if c.playing {
                        let to = cursor.position() + 1;
                        seek(app, model, to);
                        dirty = true;
                    }
                }
            }
        }
        match model {
            Model::Live { model, at } => {
                let live = model.lock();
                if live.messages != drawn_messages || dirty {
                    app.mode = match &live.status {
                        FeedStatus::Live => Mode::Live(at.clone()),
                        FeedStatus::Ended => Mode::Ended(at.clone()),
                        FeedStatus::Lost(why) => Mode::Lost(why.clone()),
                    };
                    let view = live.view.as_ref().unwrap_or(&empty);
                    terminal.draw(|f| top::draw(f, app, view))?;
                    frames += 1;
                    drawn_messages = live.messages;
                }
            }
            Model::Replay { cursor, .. } => {
                if dirty {
                    terminal.draw(|f| top::draw(f, app, cursor.view()))?;
                    frames += 1;
                }
            }
        }
        dirty = false;
    }
}

/// Moves a replay's cursor and the header's account of it.
fn seek(app: &mut App, model: &mut Model<'_>, to: usize) {
    let Model::Replay { replay, cursor } = model else {
        return;
    };
    cursor.seek(to);
    if let Mode::Replay(c) = &mut app.mode {
        c.position = cursor.position();
        c.seconds = replay.seconds_at(c.position);
        if c.position + 1 >= c.len {
            c.playing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::{KeyCode, KeyModifiers};
    use stallscope_dashboards::top::Screen;

    use super::*;

    /// Nothing while the first frame is drawn, then Tab once, then nothing (each wait cut to
    /// 10 ms, so the loop soon sees its time is up).
    struct OneTab {
        calls: u32,
    }

    impl Keys for OneTab {
        fn next(&mut self, timeout: Duration) -> io::Result<Option<Input>> {
            self.calls += 1;
            if self.calls == 2 {
                let tab = KeyEvent::new(KeyCode::Tab, KeyModifiers::NONE);
                return Ok(Some(Input::Key(tab)));
            }
            std::thread::sleep(timeout.min(Duration::from_millis(10)));
            Ok(None)
        }
    }

    #[test]
    fn a_key_redraws_at_once_without_waiting_for_the_next_tick() {
        // A feed that says nothing: only the first frame and the key's may be drawn.
        let (tx, rx) = std::sync::mpsc::channel();
        drop(tx);
        let model = FollowedModel::follow_hub(rx).expect("feed thread");
        let mut terminal = Terminal::new(TestBackend::new(80, 24)).expect("terminal");
        let mut app = App::new(Mode::Live("test".into()));
        let mut opts = Options {
            // One tick every 5 s: the loop ends long before the second.
            fps: 0.2,
            stop: None,
            output: None,
            for_at_most: Some(Duration::from_millis(300)),
        };
        let mut model = Model::Live {
            model,
            at: "test".into(),
        };
        let (exit, frames) = run(
            &mut terminal,
            &mut app,
            &mut model,
            &mut OneTab { calls: 0 },
            &mut opts,
        )
        .expect("loop");
        assert_eq!(exit, Exit::Stopped);
        assert_eq!(app.screen, Screen::Timeline);
        assert_eq!(frames, 2, "the first frame, then the key's at once");
        let shown: String = terminal
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(shown.contains("no iteration yet"), "{shown}");
    }
}
