//! The live status line, seen where people see it: in a terminal (tmux).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a run in a 160×50 tmux pane showed: whether it finished within 30 s, the last live
/// status line seen while it ran, and the final screen. `gpu` puts the run on the scripted
/// GPU (`STALLSCOPE_FAKE_NVML`).
fn run_in_tmux(gpu: Option<&str>) -> Option<(bool, Option<String>, String)> {
    if Command::new("tmux").arg("-V").output().is_err() {
        skip("tmux is not installed (scripts/install-deps.sh installs it)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let session = format!("stallscope-test-{}-{}", std::process::id(), gpu.is_some());
    let script = dir.path().join("train.sh");
    // A training that prints a line per step and marks steps with the Python package.
    let py = "import stallscope, time\nfor i in range(40):\n    with stallscope.phase('data'):\n        time.sleep(0.05)\n    time.sleep(0.05)\n    stallscope.step()\n    print('step', i, flush=True)\n";
    std::fs::write(dir.path().join("loop.py"), py).unwrap();
    let env = gpu.map_or_else(String::new, |g| {
        format!(
            "{}={} STALLSCOPE_FAKE_NVML={g} ",
            stallscope_agent::gpu::nvml::LIB_ENV,
            fake_nvml().display()
        )
    });
    std::fs::write(
        &script,
        format!(
            "{env}{} run -o {} -- python3 {}; echo EXIT=$?; sleep 30\n",
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
    let mut status = None;
    let finished = wait_for(Duration::from_secs(30), || {
        let screen = tmux(&["capture-pane", "-p", "-t", &session]);
        if let Some(line) = screen
            .lines()
            .find(|l| l.starts_with("stallscope: ") && l.contains(" it × 1 rank"))
        {
            status = Some(line.trim_end().to_string());
        }
        screen.contains("EXIT=0")
    });
    let screen = tmux(&["capture-pane", "-p", "-t", &session]);
    let _ = tmux(&["kill-session", "-t", &session]);
    Some((finished, status, screen))
}

#[test]
fn the_status_line_is_live_in_a_terminal_and_the_summary_follows() {
    let Some((finished, status, screen)) = run_in_tmux(None) else {
        return;
    };
    assert!(finished, "the run did not finish in 30 s:\n{screen}");
    let status = status.unwrap_or_else(|| panic!("no live status line was seen:\n{screen}"));
    assert!(!status.contains("GPU"), "no GPU here: {status}");
    assert!(screen.contains("data_prep"), "{screen}");
    assert!(screen.contains("finding: "), "{screen}");
    assert!(screen.contains("step 39"), "{screen}");
}

/// On a GPU, the live line says how busy it is: here the scripted GPU runs kernels 20% of the
/// time (an all-reduce over NVLink), read through the real NVML calls.
#[test]
fn on_a_gpu_the_status_line_says_how_busy_it_is() {
    let Some((finished, status, screen)) = run_in_tmux(Some("activity=allreduce_nvlink")) else {
        return;
    };
    assert!(finished, "the run did not finish in 30 s:\n{screen}");
    let status = status.unwrap_or_else(|| panic!("no live status line was seen:\n{screen}"));
    assert!(status.ends_with(" · GPU 20% busy"), "{status}");
    assert!(
        screen.contains("gpu: rank 0 on GPU 0: 20% busy"),
        "{screen}"
    );
}
