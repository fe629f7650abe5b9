//! The live status line, seen where people see it: in a terminal (tmux).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_status_line_is_live_in_a_terminal_and_the_summary_follows() {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("SKIP: tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let session = format!("stallscope-test-{}", std::process::id());
    let script = dir.path().join("train.sh");
    // A training that prints a line per step and marks steps with the Python package.
    let py = "import stallscope, time\nfor i in range(40):\n    with stallscope.phase('data'):\n        time.sleep(0.05)\n    time.sleep(0.05)\n    stallscope.step()\n    print('step', i, flush=True)\n";
    std::fs::write(dir.path().join("loop.py"), py).unwrap();
    std::fs::write(
        &script,
        format!(
            "{} run -o {} -- python3 {}; echo EXIT=$?; sleep 30\n",
            env!("CARGO_BIN_EXE_stallscope"),
            dir.path().join("p.stallscope").display(),
            dir.path().join("loop.py").display()
        ),
    )
    .unwrap();
    let _ = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "50",
        &format!("bash {}", script.display()),
    ]);
    let mut seen_status = false;
    let finished = wait_for(Duration::from_secs(30), || {
        let screen = tmux(&["capture-pane", "-p", "-t", &session]);
        seen_status |= screen.contains("stallscope: ") && screen.contains(" it × 1 rank");
        screen.contains("EXIT=0")
    });
    let screen = tmux(&["capture-pane", "-p", "-t", &session]);
    let _ = tmux(&["kill-session", "-t", &session]);
    assert!(finished, "the run did not finish in 30 s:\n{screen}");
    assert!(seen_status, "no live status line was seen:\n{screen}");
    assert!(screen.contains("data_prep"), "{screen}");
    assert!(screen.contains("finding: "), "{screen}");
    assert!(screen.contains("step 39"), "{screen}");
}
