//! `stallscope top` and `run --tui`, seen where people see them: in a terminal (tmux), around
//! the real example training.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tmux session running `command` in a 100×30 pane (then `EXIT=<code>`), ended on drop.
struct Pane {
    session: String,
}

impl Pane {
    fn start(name: &str, command: &str) -> Option<Pane> {
        if Command::new("tmux").arg("-V").output().is_err() {
            skip("tmux is not installed (scripts/install-deps.sh installs it)");
            return None;
        }
        let session = format!("stallscope-top-{name}-{}", std::process::id());
        let _ = tmux(&[
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "100",
            "-y",
            "30",
            &format!("{command}; echo EXIT=$?; sleep 60"),
        ]);
        Some(Pane { session })
    }

    fn screen(&self) -> String {
        tmux(&["capture-pane", "-p", "-t", &self.session])
    }

    fn keys(&self, keys: &str) {
        let _ = tmux(&["send-keys", "-t", &self.session, keys]);
    }

    /// Waits up to `secs` for the screen to hold every one of `texts`; the screen either way.
    fn wait_for(&self, secs: u64, texts: &[&str]) -> (bool, String) {
        let mut screen = String::new();
        let ok = wait_for(Duration::from_secs(secs), || {
            screen = self.screen();
            texts.iter().all(|t| screen.contains(t))
        });
        (ok, screen)
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.session]);
    }
}

/// The example under `run --tui`, ending with exit code 3 (to see it pass through).
fn tui_run(profile: &Path) -> String {
    format!(
        "{} run --tui --job train -o {} -- bash -c '{} {} --iters 120 --workers 1 --data-dir {}; exit 3'",
        env!("CARGO_BIN_EXE_stallscope"),
        profile.display(),
        python(),
        example(),
        data_dir()
    )
}

#[test]
fn run_tui_shows_ranks_and_categories_and_q_leaves_the_training_running() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.stallscope");
    let Some(pane) = Pane::start("tui", &tui_run(&profile)) else {
        return;
    };
    let (live, screen) = pane.wait_for(60, &["live ·", "counted", "data_prep", "iter 2"]);
    assert!(
        live,
        "the Job screen with the training's output never showed:\n{screen}"
    );

    pane.keys("3");
    let rank_row = |screen: &str| {
        screen
            .lines()
            .find(|l| l.trim_start().starts_with("0 vm ") || l.trim_start().starts_with("0 "))
            .filter(|l| l.contains(" ms "))
            .map(str::to_string)
    };
    let mut screen = String::new();
    let ranks = wait_for(Duration::from_secs(15), || {
        screen = pane.screen();
        screen.contains("largest stall") && rank_row(&screen).is_some()
    });
    assert!(ranks, "no Ranks screen with rank 0's figures:\n{screen}");
    let row = rank_row(&screen).unwrap_or_default();
    assert!(row.contains('█'), "no parts bar: {row}");

    pane.keys("2");
    let (timeline, screen) = pane.wait_for(10, &["mean over ranks", "compute", "peer_wait"]);
    assert!(timeline, "no Timeline screen:\n{screen}");

    pane.keys("q");
    let (closed, screen) = pane.wait_for(10, &["dashboard closed; the training goes on"]);
    assert!(closed, "q did not close the dashboard:\n{screen}");
    assert!(
        !screen.contains("EXIT="),
        "the training should still run after q:\n{screen}"
    );
    let (ended, screen) = pane.wait_for(90, &["EXIT=3"]);
    assert!(
        ended,
        "the training did not end with its exit code 3:\n{screen}"
    );
    assert!(screen.contains("finding:"), "no summary:\n{screen}");
    assert!(
        screen.contains("iter 119"),
        "the output after q was not shown:\n{screen}"
    );

    // The log holds all of the training's output, in order.
    let log = std::fs::read_to_string(dir.path().join("p.log")).expect("the log");
    let iters: Vec<&str> = log.lines().filter(|l| l.starts_with("iter ")).collect();
    assert_eq!(iters.len(), 120, "{log}");
    assert!(iters[0].starts_with("iter 0 ") && iters[119].starts_with("iter 119 "));
}

#[test]
fn the_dashboard_closes_with_the_run_and_top_replays_its_profile() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.stallscope");
    let Some(pane) = Pane::start("end", &tui_run(&profile)) else {
        return;
    };
    let (ended, screen) = pane.wait_for(120, &["EXIT=3"]);
    assert!(ended, "the run did not end:\n{screen}");
    assert!(
        !screen.contains("libnvidia-ml"),
        "a source's warning went to the screen:\n{screen}"
    );
    assert!(
        screen.contains("the training's output is in") && screen.contains("iter 119"),
        "the end of the log and where it is were not said:\n{screen}"
    );
    assert!(screen.contains("finding:"), "no summary:\n{screen}");
    drop(pane);

    let replay = format!(
        "{} top {}",
        env!("CARGO_BIN_EXE_stallscope"),
        profile.display()
    );
    let Some(pane) = Pane::start("replay", &replay) else {
        return;
    };
    let (at_end, screen) = pane.wait_for(20, &["replay p.stallscope", "120 it × 1 rank"]);
    assert!(
        at_end,
        "the replay does not open at the run's end:\n{screen}"
    );
    pane.keys("Home");
    let (at_start, screen) = pane.wait_for(10, &["0 it × 0 ranks"]);
    assert!(at_start, "Home did not go to the start:\n{screen}");
    // → steps to the profile's next step, which is a second later on a quiet machine and
    // more under load (a second without an iteration has no step): the position only grows.
    let mut last_position = replay_position(&pane.screen()).unwrap_or(0.0);
    for step in 1..=8 {
        pane.keys("Right");
        let mut screen = String::new();
        let moved = wait_for(Duration::from_secs(10), || {
            screen = pane.screen();
            replay_position(&screen).is_some_and(|p| p > last_position)
        });
        assert!(
            moved,
            "→ number {step} did not step forward from {last_position} s:\n{screen}"
        );
        last_position = replay_position(&screen).unwrap_or(last_position);
    }
    let (moved, screen) = pane.wait_for(10, &["counted"]);
    assert!(moved, "→ did not step through the run:\n{screen}");
    let shown: u64 = screen
        .lines()
        .next()
        .and_then(|l| l.split(" it × ").next())
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no iteration count in the header:\n{screen}"));
    assert!(
        shown > 0 && shown < 120,
        "{last_position} s into the run, 8 steps: {shown}"
    );
    pane.keys("q");
    let (quit, screen) = pane.wait_for(10, &["EXIT=0"]);
    assert!(quit, "q did not end the replay:\n{screen}");
}

/// The replay's position in seconds, from the header's `replay FILE ⏸ 9.0/120.0 s`.
fn replay_position(screen: &str) -> Option<f64> {
    let header = screen.lines().next()?;
    let after = header.split(['⏸', '▶']).nth(1)?;
    after.trim_start().split('/').next()?.parse().ok()
}

#[test]
fn without_a_terminal_tui_falls_back_to_the_status_line() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        stallscope()
            .args(["run", "--tui", "-o"])
            .arg(dir.path().join("p.stallscope"))
            .args([
                "--",
                &python(),
                &example(),
                "--iters",
                "10",
                "--workers",
                "0",
            ])
            .args(["--data-dir", &data_dir()]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tui needs a terminal on stdin and stdout; showing the status line"),
        "{stderr}"
    );
    assert!(stderr.contains("finding:"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("iter 9 "));
}

#[test]
fn top_without_a_terminal_says_what_to_use_instead() {
    let out = stallscope().args(["top"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`stallscope feed`"), "{stderr}");
}

/// Processes whose command line mentions `text`.
fn processes_with(text: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(text))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn a_terminal_that_goes_away_ends_the_dashboard_and_the_run() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.stallscope");
    let Some(pane) = Pane::start("hangup", &tui_run(&profile)) else {
        return;
    };
    let (live, screen) = pane.wait_for(60, &["live ·", "iter 2"]);
    assert!(live, "the dashboard never showed:\n{screen}");
    let marker = dir.path().display().to_string();
    assert!(!processes_with(&marker).is_empty());
    drop(pane); // tmux kill-session: the terminal hangs up.
    let gone = wait_for(Duration::from_secs(20), || {
        processes_with(&marker).is_empty()
    });
    let left = processes_with(&marker);
    for pid in &left {
        kill(*pid, libc::SIGKILL);
    }
    assert!(
        gone,
        "still running 20 s after the terminal went away: {left:?}"
    );
}

/// Issue 28: a hang is on the screen while it lasts. Two ranks under `run --tui
/// --hang-after 5`; at iteration 12 rank 1 sleeps 25 s in `stuck_in_here` while rank 0 waits
/// in the all-reduce: the dashboard opens with the hang banner naming rank 1 and its stack,
/// the banner goes when iterations resume, and the job ends by itself.
#[test]
fn a_hang_shows_as_a_banner_with_the_missing_rank_and_its_stack_until_it_resumes() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.py");
    std::fs::write(&script, include_str!("common/stuck_rank.py")).unwrap();
    let command = format!(
        "STUCK_SECONDS=25 {bin} run --tui --hang-after 5 -o {} -- {bin} launch --nproc-per-node 2 --master-port 29615 -- {} {}",
        dir.path().join("p.stallscope").display(),
        python(),
        script.display(),
        bin = env!("CARGO_BIN_EXE_stallscope"),
    );
    let Some(pane) = Pane::start("hang", &command) else {
        return;
    };
    let (hung, screen) = pane.wait_for(
        120,
        &[
            "HANG: no rank finishes an iteration",
            "all_reduce #12 of group 0",
            "rank 1's Python stacks",
            "in stuck_in_here",
        ],
    );
    assert!(hung, "no hang banner:\n{screen}");
    let stack = screen.find("rank 1's Python stacks").unwrap_or_default();
    let (own, next) = (
        screen[stack..].find("in stuck_in_here"),
        screen[stack..].find("rank 0's Python stacks"),
    );
    assert!(
        own.is_some() && (next.is_none() || own < next),
        "the missing rank's stack comes first:\n{screen}"
    );
    let mut screen = String::new();
    let resumed = wait_for(Duration::from_secs(60), || {
        screen = pane.screen();
        !screen.contains("HANG:") || screen.contains("EXIT=")
    });
    assert!(
        resumed,
        "the banner stayed after the job resumed:\n{screen}"
    );
    let (ended, screen) = pane.wait_for(90, &["EXIT=0"]);
    assert!(ended, "the job did not end by itself:\n{screen}");
}

/// Issue 31: `top` attached to a run's feed socket reads the binary form and draws the live
/// model; `stallscope feed --json` on the same socket still prints JSON lines.
#[test]
fn top_attached_to_a_runs_feed_draws_it_and_feed_json_still_prints_lines() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let mut run = stallscope()
        .args(["run", "-q", "--job", "train", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .args([
            "--",
            &python(),
            &example(),
            "--iters",
            "150",
            "--workers",
            "1",
        ])
        .args(["--data-dir", &data_dir()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run starts");
    // The run's socket: run-PID.feed in root's feed directory (README, "The live feed").
    let socket = Path::new("/run/stallscope").join(format!("run-{}.feed", run.id()));
    let appeared = wait_for(Duration::from_secs(60), || socket.exists());
    let top = format!(
        "{} top --attach {}",
        env!("CARGO_BIN_EXE_stallscope"),
        socket.display()
    );
    let pane = appeared.then(|| Pane::start("attach", &top)).flatten();
    let drawn = pane
        .as_ref()
        .map(|p| p.wait_for(60, &["live ·", "counted"]));
    let json = stallscope()
        .args(["feed", "--json", "--count", "2", "--timeout", "30"])
        .arg(&socket)
        .output()
        .expect("feed runs");
    let _ = run.kill();
    let _ = run.wait();
    if !appeared {
        if is_root() {
            panic!("no feed socket at {}", socket.display());
        }
        return; // not root: the socket is elsewhere
    }
    let Some((drawn, screen)) = drawn else {
        return; // no tmux
    };
    assert!(
        drawn,
        "top over the binary feed drew no live model:\n{screen}"
    );
    let lines = String::from_utf8_lossy(&json.stdout);
    let mut lines = lines.lines();
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("{\"snapshot\":")),
        "feed --json: {:?}",
        String::from_utf8_lossy(&json.stderr)
    );
    assert!(lines.next().is_some_and(|l| l.starts_with("{\"update\":")));
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
