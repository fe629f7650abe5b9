//! The end of the training's log, as `run --tui` shows it in its output pane: read from where
//! the last look stopped, so a long log costs nothing per frame.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use stallscope_dashboards::top::OutputPane;

/// Lines kept for the pane.
const KEPT: usize = 200;

/// Bytes read per look at most (a burst of output is skimmed, not replayed).
const READ_AT_MOST: u64 = 256 * 1024;

/// The log being followed.
pub struct LogTail {
    path: PathBuf,
    file: Option<File>,
    at: u64,
    partial: Vec<u8>,
    lines: VecDeque<String>,
}

impl LogTail {
    /// Follows the log at `path` from its start.
    pub fn new(path: &Path) -> LogTail {
        LogTail {
            path: path.to_path_buf(),
            file: None,
            at: 0,
            partial: Vec::new(),
            lines: VecDeque::new(),
        }
    }

    /// Reads what was added; whether any line was.
    pub fn poll(&mut self) -> bool {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(f) = self.file.as_mut() else {
            return false;
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.at {
            // Truncated: start again.
            self.at = 0;
            self.partial.clear();
        }
        if len == self.at {
            return false;
        }
        let from = self.at.max(len.saturating_sub(READ_AT_MOST));
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(from)).is_err()
            || f.take(len - from).read_to_end(&mut buf).is_err()
        {
            return false;
        }
        self.at = from + buf.len() as u64;
        let before = self.lines.len();
        for &b in &buf {
            if b == b'\n' {
                self.push_line();
            } else if self.partial.len() < 4096 {
                self.partial.push(b);
            }
        }
        self.lines.len() != before || !buf.is_empty()
    }

    fn push_line(&mut self) {
        let line = String::from_utf8_lossy(&self.partial);
        // A progress bar redraws with \r: its latest state is what a terminal shows.
        let shown = line.rsplit('\r').find(|s| !s.is_empty()).unwrap_or("");
        let clean: String = shown.chars().filter(|c| !c.is_control()).collect();
        self.lines.push_back(clean);
        while self.lines.len() > KEPT {
            self.lines.pop_front();
        }
        self.partial.clear();
    }

    /// The pane: the log's name and its last lines.
    pub fn pane(&self) -> OutputPane {
        OutputPane {
            log: self.path.display().to_string(),
            lines: self.lines.iter().cloned().collect(),
        }
    }

    /// The last `n` lines read.
    pub fn last(&self, n: usize) -> Vec<String> {
        let skip = self.lines.len().saturating_sub(n);
        self.lines.iter().skip(skip).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn follows_lines_as_they_are_written_and_shows_a_progress_bar_s_latest_state() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("train.log");
        let mut tail = LogTail::new(&path);
        assert!(!tail.poll(), "no log yet");
        let mut f = File::create(&path).expect("log");
        f.write_all(b"epoch 0\nloss 2.").expect("write");
        assert!(tail.poll());
        assert_eq!(tail.last(5), ["epoch 0"]);
        f.write_all(b"3\n 10%|#\r 50%|#####\n").expect("write");
        assert!(tail.poll());
        assert_eq!(tail.last(5), ["epoch 0", "loss 2.3", " 50%|#####"]);
        assert!(!tail.poll(), "nothing new");
    }
}
