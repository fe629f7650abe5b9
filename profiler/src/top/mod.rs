//! `stallscope top`: the live terminal dashboard, attached to a run's or an agent's feed on
//! this node, to a collector's port (the whole job), or replaying a profile; and the same
//! dashboard inside `stallscope run --tui`.
//!
//! The screens are pure renderers in `stallscope_dashboards::top`; this module owns the
//! terminal (raw mode and the alternate screen, restored on every way out, panics included),
//! the feed thread and the loop.

pub mod live;
pub mod log_tail;
pub mod run_tui;
pub mod screen;

#[cfg(test)]
mod bench;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ratatui::DefaultTerminal;
use stallscope_analysis::frame::Frame;
use stallscope_analysis::journal::replay::{Replay, Span};
use stallscope_collector::profile::{ProfileReader, ReadIssue};
use stallscope_dashboards::top::{App, Mode, ReplayCursor};

use crate::cli::TopArgs;
use live::FollowedModel;
use screen::{Exit, Model, Options, TerminalKeys};

/// Whether stdin and stdout are both a terminal (a dashboard needs keys and a screen).
pub fn is_terminal() -> bool {
    // SAFETY: isatty only queries the descriptors.
    unsafe { libc::isatty(0) == 1 && libc::isatty(1) == 1 }
}

/// Runs `f` on the terminal in raw mode on the alternate screen, and restores it however `f`
/// ends (ratatui's panic hook restores it on a panic too).
pub fn on_terminal<R>(
    f: impl FnOnce(&mut DefaultTerminal) -> std::io::Result<R>,
) -> anyhow::Result<R> {
    let mut terminal = ratatui::try_init().context("cannot take the terminal")?;
    let result = f(&mut terminal);
    ratatui::restore();
    Ok(result?)
}

/// `stallscope top`: exit code 0, or 130 after Ctrl-C.
pub fn top(args: TopArgs) -> anyhow::Result<i32> {
    if !is_terminal() {
        anyhow::bail!(
            "stallscope top draws on a terminal and this is not one; `stallscope feed` prints the live model as text or JSON lines"
        );
    }
    if let Some(profile) = &args.profile {
        return replay(profile, args.fps);
    }
    let socket = args
        .collector
        .as_ref()
        .map(PathBuf::from)
        .or(args.attach.clone());
    // A run may say nothing for a long time (an evaluation, a checkpoint): wait an hour.
    let (client, at) = crate::feed_cmd::attach(
        socket.as_deref(),
        args.token_file.as_deref(),
        &args.tls,
        Duration::from_secs(3600),
        // The binary form: at 1,024 ranks parsing JSON cost as much as drawing (issue 31).
        true,
    )?;
    let model = FollowedModel::follow_client(client)?;
    let mut app = App::new(Mode::Live(at.clone()));
    let mut opts = Options {
        fps: args.fps,
        stop: None,
        output: None,
        for_at_most: None,
    };
    let (exit, _) = on_terminal(|t| {
        screen::run(
            t,
            &mut app,
            &mut Model::Live { model, at },
            &mut TerminalKeys,
            &mut opts,
        )
    })?;
    Ok(if exit == Exit::Interrupt { 130 } else { 0 })
}

/// Runs `f` over the frames of `profile` as its reader streams them; returns what `f` made
/// and the reader's issues, or the I/O error that cut the stream.
fn streamed<T>(
    profile: &Path,
    f: impl FnOnce(&mut dyn Iterator<Item = Frame>) -> T,
) -> anyhow::Result<(T, Vec<ReadIssue>)> {
    let cannot_read = || format!("cannot read {}", profile.display());
    let mut reader = ProfileReader::open(profile).with_context(cannot_read)?;
    let mut failure = None;
    let mut frames = reader
        .by_ref()
        .map_while(|f| f.map_err(|e| failure = Some(e)).ok());
    let made = f(&mut frames);
    if let Some(e) = failure {
        return Err(e).with_context(cannot_read);
    }
    Ok((made, reader.take_issues()))
}

/// Replays `profile` with a time cursor.
fn replay(profile: &Path, fps: f64) -> anyhow::Result<i32> {
    // Two passes over the file, neither holding its frames: the span, then the replay.
    let mut header = false;
    let (span, issues) = streamed(profile, |frames| {
        Span::of(frames.inspect(|f| header |= matches!(f, Frame::Header(_))))
    })?;
    let notes: Vec<String> = issues.iter().map(|i| i.describe()).collect();
    if !header {
        anyhow::bail!(
            "{} holds no run header: it is empty or was cut before its first frame",
            profile.display()
        );
    }
    let (replay, _) = streamed(profile, |frames| Replay::of_stream(span, frames, ""))?;
    let name = profile.file_name().map_or_else(
        || profile.display().to_string(),
        |n| n.to_string_lossy().to_string(),
    );
    let profile_label = match notes.len() {
        0 => name,
        n => format!(
            "{name} ({n} read issue{}, listed on exit)",
            if n == 1 { "" } else { "s" }
        ),
    };
    let mut app = App::new(Mode::Replay(ReplayCursor {
        profile: profile_label,
        position: 0,
        len: replay.len(),
        seconds: replay.seconds_at(0),
        total_seconds: replay.seconds_at(replay.len().saturating_sub(1)),
        playing: false,
    }));
    let mut model = Model::Replay {
        replay: &replay,
        cursor: Box::new(replay.cursor()),
    };
    // Open at the end of the run: what its summary says; ← and Home go back.
    let last = replay.len().saturating_sub(1);
    if let Model::Replay { cursor, .. } = &mut model {
        cursor.seek(last);
    }
    if let Mode::Replay(c) = &mut app.mode {
        c.position = last;
        c.seconds = replay.seconds_at(last);
    }
    let mut opts = Options {
        fps,
        stop: None,
        output: None,
        for_at_most: None,
    };
    let (exit, _) =
        on_terminal(|t| screen::run(t, &mut app, &mut model, &mut TerminalKeys, &mut opts))?;
    for n in notes {
        eprintln!("stallscope: {}: {n}", profile.display());
    }
    Ok(if exit == Exit::Interrupt { 130 } else { 0 })
}
