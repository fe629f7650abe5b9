//! Keys, as nvitop, bottom and k9s users expect them: `q` quit, `?` help, Tab and number keys
//! for screens, ↑↓ select, Enter detail, `s` sort, `p` pause, `/` filter; in a replay ←/→
//! step, Home/End, space play/pause.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use stallscope_analysis::view::JobView;

use super::{App, Mode, Screen};

/// What the caller does after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Redraw and go on.
    Continue,
    /// Leave the dashboard (`q`).
    Quit,
    /// Ctrl-C: leave the dashboard and interrupt the training as a terminal's Ctrl-C would.
    Interrupt,
    /// Replay: move the cursor to this position.
    Seek(usize),
}

/// Rows PageUp and PageDown move.
const PAGE: usize = 10;

impl App {
    /// Takes one key; `view` is the model shown (needed to pause it and to bound the
    /// selection).
    pub fn on_key(&mut self, key: KeyEvent, view: &JobView) -> Outcome {
        if key.kind == KeyEventKind::Release {
            return Outcome::Continue;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Outcome::Interrupt;
        }
        if self.editing_filter {
            self.edit_filter(key.code);
            return Outcome::Continue;
        }
        if self.help {
            self.help = false;
            return match key.code {
                KeyCode::Char('q') => Outcome::Quit,
                _ => Outcome::Continue,
            };
        }
        match key.code {
            KeyCode::Char('q') => return Outcome::Quit,
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Tab => self.go(Screen::ALL[(self.screen.index() + 1) % Screen::ALL.len()]),
            KeyCode::BackTab => {
                self.go(Screen::ALL[(self.screen.index() + Screen::ALL.len() - 1) % 4])
            }
            KeyCode::Char(c @ '1'..='4') => self.go(Screen::ALL[c as usize - '1' as usize]),
            KeyCode::Up | KeyCode::Char('k') => self.select(-1, view),
            KeyCode::Down | KeyCode::Char('j') => self.select(1, view),
            KeyCode::PageUp => self.select(-(PAGE as i64), view),
            KeyCode::PageDown => self.select(PAGE as i64, view),
            KeyCode::Enter => self.open_detail(view),
            KeyCode::Esc | KeyCode::Backspace => {
                if self.detail.take().is_none() {
                    self.filter.clear();
                }
            }
            KeyCode::Char('s') => {
                self.rank_sort = self.rank_sort.next();
                self.rank_row = 0;
            }
            KeyCode::Char('p') => self.toggle_pause(view),
            KeyCode::Char('/') => {
                self.editing_filter = true;
                self.filter.clear();
                self.rank_row = 0;
                self.node_row = 0;
            }
            code => return self.move_in_time(code),
        }
        Outcome::Continue
    }

    fn go(&mut self, screen: Screen) {
        self.screen = screen;
        self.detail = None;
    }

    fn edit_filter(&mut self, code: KeyCode) {
        match code {
            KeyCode::Enter => self.editing_filter = false,
            KeyCode::Esc => {
                self.editing_filter = false;
                self.filter.clear();
            }
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Char(c) if !c.is_control() && self.filter.len() < 32 => self.filter.push(c),
            _ => {}
        }
    }

    fn select(&mut self, by: i64, view: &JobView) {
        let (row, len) = match self.screen {
            Screen::Ranks if self.detail.is_none() => {
                let len = self.ranks(view).len();
                (&mut self.rank_row, len)
            }
            Screen::Nodes => {
                let len = self.nodes(view).len();
                (&mut self.node_row, len)
            }
            _ => return,
        };
        let last = len.saturating_sub(1) as i64;
        *row = (*row as i64 + by).clamp(0, last) as usize;
    }

    fn open_detail(&mut self, view: &JobView) {
        if self.screen == Screen::Ranks {
            self.detail = self.ranks(view).get(self.rank_row).map(|r| r.rank);
        }
    }

    fn toggle_pause(&mut self, view: &JobView) {
        if matches!(self.mode, Mode::Replay(_)) {
            return;
        }
        self.paused = match self.paused.take() {
            Some(_) => None,
            None => Some(Box::new(view.clone())),
        };
    }

    /// ←/→, Home/End and space: the replay cursor, or the timeline's scroll when live.
    fn move_in_time(&mut self, code: KeyCode) -> Outcome {
        if let Mode::Replay(c) = &mut self.mode {
            let last = c.len.saturating_sub(1);
            let to = match code {
                KeyCode::Left => c.position.saturating_sub(1),
                KeyCode::Right => (c.position + 1).min(last),
                KeyCode::Home => 0,
                KeyCode::End => last,
                KeyCode::Char(' ') => {
                    c.playing = !c.playing;
                    if c.playing && c.position == last {
                        return Outcome::Seek(0);
                    }
                    return Outcome::Continue;
                }
                _ => return Outcome::Continue,
            };
            c.playing = false;
            return Outcome::Seek(to);
        }
        if self.screen == Screen::Timeline || self.detail.is_some() {
            match code {
                KeyCode::Left => self.timeline_back += 10,
                KeyCode::Right => self.timeline_back = self.timeline_back.saturating_sub(10),
                KeyCode::Home => self.timeline_back = u64::MAX / 2,
                KeyCode::End => self.timeline_back = 0,
                _ => {}
            }
        }
        Outcome::Continue
    }
}
