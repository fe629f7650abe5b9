//! `stallscope top`: the live terminal dashboard. Where nvitop shows GPUs and processes, this
//! shows where each rank's iterations go: the verdict, a stall timeline, the ranks and the
//! nodes, live or replayed from a profile.
//!
//! Everything here is pure: [`App`] is the dashboard's own state (screen, selection, sort,
//! filter, pause, replay cursor), [`App::on_key`] turns a key into a new state and an
//! [`Outcome`], and [`draw`] renders an [`App`] and a [`JobView`] into a ratatui frame (the
//! only state a frame leaves behind is the Timeline's sums, kept so that the next frame adds
//! only what arrived: the frames are those of a fresh pass). The
//! terminal, the feed and the clock belong to the caller (`stallscope top`, `run --tui`), so
//! every screen is tested on ratatui's `TestBackend` from a model built in the test.

mod chart;
mod column_sums;
mod detail;
pub mod format;
mod frame;
mod hang;
mod help;
mod job;
mod keys;
mod nodes;
mod ranks;
mod timeline;

#[cfg(test)]
mod tests;

pub use frame::draw;
pub use keys::Outcome;

use std::cell::RefCell;

use column_sums::ColumnSums;
use stallscope_analysis::category::Split;
use stallscope_analysis::view::{JobView, NodeView, RankView};

/// The dashboard's screens, in tab order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Screen {
    /// The verdict, the figures, the shares, what was seen.
    #[default]
    Job,
    /// The last iterations as stacked columns.
    Timeline,
    /// One row per rank.
    Ranks,
    /// One row per node, with the selected node's history.
    Nodes,
}

impl Screen {
    /// Every screen, in tab order.
    pub const ALL: [Screen; 4] = [Screen::Job, Screen::Timeline, Screen::Ranks, Screen::Nodes];

    /// Its tab title.
    pub fn title(self) -> &'static str {
        match self {
            Screen::Job => "Job",
            Screen::Timeline => "Timeline",
            Screen::Ranks => "Ranks",
            Screen::Nodes => "Nodes",
        }
    }

    fn index(self) -> usize {
        Screen::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

/// How the Ranks screen orders its rows (`s` cycles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankSort {
    /// By rank number.
    #[default]
    Rank,
    /// Slowest median first.
    Median,
    /// Largest stall share (in the recent window) first.
    Stall,
    /// By node, then rank.
    Node,
}

impl RankSort {
    /// Its name in the footer.
    pub fn name(self) -> &'static str {
        match self {
            RankSort::Rank => "rank",
            RankSort::Median => "median",
            RankSort::Stall => "stall",
            RankSort::Node => "node",
        }
    }

    fn next(self) -> RankSort {
        match self {
            RankSort::Rank => RankSort::Median,
            RankSort::Median => RankSort::Stall,
            RankSort::Stall => RankSort::Node,
            RankSort::Node => RankSort::Rank,
        }
    }
}

/// Where the model comes from, as the header says it.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// A live feed (the socket or address is shown).
    Live(String),
    /// The feed said the run ended.
    Ended(String),
    /// The feed was lost (why).
    Lost(String),
    /// A profile replayed with a cursor.
    Replay(ReplayCursor),
}

/// The replay cursor as the dashboard shows and moves it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayCursor {
    /// The profile's name.
    pub profile: String,
    /// Position, 0-based.
    pub position: usize,
    /// Positions.
    pub len: usize,
    /// s from the profile's start at the position.
    pub seconds: f64,
    /// s the profile covers.
    pub total_seconds: f64,
    /// Whether space set it playing.
    pub playing: bool,
}

/// The dashboard's state, apart from the model it shows.
#[derive(Clone, Debug)]
pub struct App {
    /// The screen shown.
    pub screen: Screen,
    /// The Ranks screen's order.
    pub rank_sort: RankSort,
    /// Selected row on the Ranks screen (index into the shown rows).
    pub rank_row: usize,
    /// Selected row on the Nodes screen.
    pub node_row: usize,
    /// The rank whose detail is open (Enter on the Ranks screen).
    pub detail: Option<u32>,
    /// Ranks and nodes are shown when their number or node name contains this.
    pub filter: String,
    /// `/` was pressed: keys edit the filter.
    pub editing_filter: bool,
    /// The help overlay is open.
    pub help: bool,
    /// `p`: the model as it was when paused.
    pub paused: Option<Box<JobView>>,
    /// Timeline screen: iterations scrolled back from the latest.
    pub timeline_back: u64,
    /// Live, ended, lost or replay.
    pub mode: Mode,
    /// `run --tui`: the last lines of the training's output, and where all of it goes.
    pub output: Option<OutputPane>,
    /// The Timeline's (or a rank detail's) column sums from the frame before: a frame adds
    /// only the iterations that arrived since.
    pub(crate) column_sums: RefCell<ColumnSums>,
}

/// The training's output as `run --tui` shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputPane {
    /// The log file that holds all of it.
    pub log: String,
    /// Its last lines, oldest first.
    pub lines: Vec<String>,
}

impl App {
    /// A dashboard on the Job screen, in `mode`.
    pub fn new(mode: Mode) -> App {
        App {
            screen: Screen::Job,
            rank_sort: RankSort::Rank,
            rank_row: 0,
            node_row: 0,
            detail: None,
            filter: String::new(),
            editing_filter: false,
            help: false,
            paused: None,
            timeline_back: 0,
            mode,
            output: None,
            column_sums: RefCell::default(),
        }
    }

    /// The model to draw: the paused copy, else `live`.
    pub fn shown<'a>(&'a self, live: &'a JobView) -> &'a JobView {
        self.paused.as_deref().unwrap_or(live)
    }

    /// The ranks the Ranks screen lists, filtered and sorted.
    pub fn ranks<'a>(&self, view: &'a JobView) -> Vec<&'a RankView> {
        let mut rows: Vec<&RankView> = view
            .ranks
            .values()
            .filter(|r| {
                // No filter, no formatting: 1,024 ranks a frame.
                self.filter.is_empty() || self.matches(&r.rank.to_string()) || self.matches(&r.node)
            })
            .collect();
        match self.rank_sort {
            RankSort::Rank => {}
            RankSort::Median => rows.sort_by(|a, b| {
                b.figures
                    .median_iteration_seconds
                    .total_cmp(&a.figures.median_iteration_seconds)
                    .then(a.rank.cmp(&b.rank))
            }),
            RankSort::Stall => {
                // Each rank's window summed once, not at every comparison.
                let mut keyed: Vec<(f64, &RankView)> = rows
                    .into_iter()
                    .map(|r| (largest_stall_share(&r.window()), r))
                    .collect();
                keyed.sort_by(|(ka, a), (kb, b)| kb.total_cmp(ka).then(a.rank.cmp(&b.rank)));
                rows = keyed.into_iter().map(|(_, r)| r).collect();
            }
            RankSort::Node => rows.sort_by(|a, b| a.node.cmp(&b.node).then(a.rank.cmp(&b.rank))),
        }
        rows
    }

    /// The nodes the Nodes screen lists, filtered, by name.
    pub fn nodes<'a>(&self, view: &'a JobView) -> Vec<&'a NodeView> {
        view.nodes
            .values()
            .filter(|n| self.matches(&n.node))
            .collect()
    }

    fn matches(&self, text: &str) -> bool {
        self.filter.is_empty() || text.contains(self.filter.as_str())
    }
}

/// The share of the largest stall in `split`, 0–1 (0 when there is none).
pub fn largest_stall_share(split: &Split) -> f64 {
    match split.largest_stall() {
        Some(c) if split.total() > 0 => split.get(c) as f64 / split.total() as f64,
        _ => 0.0,
    }
}
