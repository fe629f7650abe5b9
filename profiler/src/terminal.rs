//! The live status on a terminal, pinned to the bottom row.
//!
//! The training writes to the same terminal whenever it likes, so a status redrawn in place
//! with `\r` would be torn by its output. Instead the terminal's scrolling region is set to
//! every row but the last (DECSTBM, as apt's progress bar does): the training's output
//! scrolls above, and the status is drawn on the last row between a cursor save and restore,
//! in one write, so it never moves the training's cursor. The region is reset at the end.

use std::io::Write;

/// The terminal behind stderr, with the status row reserved.
pub struct PinnedStatus {
    rows: u16,
}

fn size() -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ fills the winsize we own; fd 2 is only queried.
    let ws = unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) != 0 {
            return None;
        }
        ws
    };
    (ws.ws_row >= 3 && ws.ws_col >= 20).then_some((ws.ws_row, ws.ws_col))
}

fn write_all(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

fn reserve(rows: u16) -> String {
    // A new line first, so the cursor is never on the row being taken away; then save the
    // cursor, set the region (which homes the cursor), restore it, and step back up.
    format!("\n\x1b7\x1b[1;{}r\x1b8\x1b[1A", rows - 1)
}

impl PinnedStatus {
    /// Reserves the bottom row, if stderr is a terminal of a usable size.
    pub fn begin() -> Option<PinnedStatus> {
        let (rows, _) = size()?;
        write_all(&reserve(rows));
        Some(PinnedStatus { rows })
    }

    /// Draws `line` on the bottom row (cut to the width), following a resize.
    pub fn draw(&mut self, line: &str) {
        let Some((rows, cols)) = size() else { return };
        let mut out = String::new();
        if rows != self.rows {
            out.push_str(&reserve(rows));
            self.rows = rows;
        }
        let shown: String = line.chars().take(cols as usize - 1).collect();
        out.push_str(&format!("\x1b7\x1b[{rows};1H\x1b[2K{shown}\x1b8"));
        write_all(&out);
    }

    /// Clears the status row and gives the whole terminal back.
    pub fn end(self) {
        write_all(&format!("\x1b7\x1b[r\x1b[{};1H\x1b[2K\x1b8", self.rows));
    }
}

/// Where `stallscope run` puts its live status: pinned to a terminal's bottom row and redrawn
/// every second, a plain line every ten seconds elsewhere (logs, CI), or nowhere (`-q`).
pub enum StatusLine {
    /// No status; messages still go to stderr.
    Off,
    /// Pinned to the bottom row, once the first draw reserved it.
    Terminal(Option<PinnedStatus>),
    /// A plain line every ten seconds.
    Lines,
}

impl StatusLine {
    /// In place on a terminal, plain lines otherwise, or off.
    pub fn for_stderr(quiet: bool) -> StatusLine {
        use std::io::IsTerminal;
        match (quiet, std::io::stderr().is_terminal()) {
            (true, _) => StatusLine::Off,
            (false, true) => StatusLine::Terminal(None),
            (false, false) => StatusLine::Lines,
        }
    }
}

impl stallscope_agent::node::recorder::StatusOut for StatusLine {
    fn every(&self) -> Option<std::time::Duration> {
        match self {
            StatusLine::Off => None,
            StatusLine::Terminal(_) => Some(std::time::Duration::from_secs(1)),
            StatusLine::Lines => Some(std::time::Duration::from_secs(10)),
        }
    }

    fn draw(&mut self, view: &stallscope_analysis::view::JobView) {
        let line = stallscope_dashboards::status::render(view);
        match self {
            StatusLine::Off => {}
            StatusLine::Terminal(pinned) => {
                if pinned.is_none() {
                    *pinned = PinnedStatus::begin();
                }
                if let Some(p) = pinned.as_mut() {
                    p.draw(&line);
                }
            }
            StatusLine::Lines => write_all(&format!("{line}\n")),
        }
    }

    fn say(&mut self, message: &str) {
        self.clear();
        eprintln!("{message}");
    }

    fn clear(&mut self) {
        if let StatusLine::Terminal(pinned) = self {
            if let Some(p) = pinned.take() {
                p.end();
            }
        }
    }
}
