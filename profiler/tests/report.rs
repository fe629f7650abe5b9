//! `stallscope report` on profiles that went wrong (cut, damaged, empty, not a profile), in
//! each format, and `--compare`: each gives a report that says what happened, never a crash.
//! The reports of real runs are checked in Chromium by the tests that make those runs
//! (run_single_node, run_two_nodes, multinode, experiment).

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use common::*;
use stallscope_analysis::report::sample::two_rank_profile;
use stallscope_collector::profile::ProfileWriter;

/// Writes the constructed two-rank profile (a 2 s checkpoint at iteration 100) to `path`.
fn write_profile(path: &Path, cut: bool) {
    let mut w = ProfileWriter::create(path).unwrap();
    for f in two_rank_profile(cut) {
        w.write(&f).unwrap();
    }
    w.finish().unwrap();
}

fn report(args: &[&OsStr], out: &Path) -> String {
    let o = run_ok(stallscope().arg("report").args(args).arg("-o").arg(out));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("report written to"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn a_damaged_frame_is_skipped_and_named_and_the_rest_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("damaged.stallscope");
    write_profile(&p, false);
    let mut bytes = std::fs::read(&p).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle..middle + 16].fill(0xFF);
    std::fs::write(&p, &bytes).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&report(&[p.as_os_str()], &dir.path().join("r.json"))).unwrap();
    assert_eq!(json["schema"], "stallscope.report/1");
    let problems = json["problems"].to_string();
    assert!(problems.contains("damaged at byte"), "{problems}");
    // The frames before and after the damage still count: nearly all 2 × 200 iterations.
    let iterations = json["breakdown"]["ranks"][0]["iterations"]
        .as_u64()
        .unwrap();
    assert!((190..=199).contains(&iterations), "{iterations}");
    assert_eq!(json["sources"][0]["complete"], true);
}

#[test]
fn an_empty_file_and_a_file_that_is_not_a_profile_give_a_page_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.stallscope");
    std::fs::write(&empty, b"").unwrap();
    let page = report(&[empty.as_os_str()], &dir.path().join("empty.html"));
    assert!(page.contains("id=\"problems\""), "{page}");
    assert!(page.contains("the file is empty"), "{page}");
    assert!(page.contains("unreadable"), "{page}");

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"hello\n").unwrap();
    let md = report(&[text.as_os_str()], &dir.path().join("notes.md"));
    assert!(md.contains("not a stallscope profile"), "{md}");
}

#[test]
fn a_cut_profile_reports_what_it_holds_and_says_it_was_cut() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.stallscope");
    write_profile(&p, true);
    // Cut inside the last frame too, as kill -9 during a write leaves it.
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 7]).unwrap();
    let md = report(&[p.as_os_str()], &dir.path().join("cut.md"));
    assert!(md.contains("the profile was cut"), "{md}");
    assert!(md.contains("partial frame"), "{md}");
    assert!(md.contains("![The mean iteration's parts per column](cut-timeline.svg)"));
    let svg = std::fs::read_to_string(dir.path().join("cut-timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
}

#[test]
fn compare_shows_what_changed_per_category_and_rank() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after): (PathBuf, PathBuf) = (
        dir.path().join("before.stallscope"),
        dir.path().join("after.stallscope"),
    );
    write_profile(&before, false);
    write_profile(&after, true);
    let args = [
        OsStr::new("--compare"),
        before.as_os_str(),
        after.as_os_str(),
    ];
    let page = report(&args, &dir.path().join("diff.html"));
    assert!(page.contains("before and after"), "{page}");
    assert!(page.contains("data-rank=\"0\"") && page.contains("data-rank=\"1\""));
    assert!(page.contains("id=\"chart-compare\""));
    assert!(!page.contains("<script"));
}

#[test]
fn an_unknown_extension_is_refused_before_anything_is_read() {
    let out = stallscope()
        .args(["report", "nothing.stallscope", "-o", "r.pdf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use .html, .md or .json"), "{err}");
}
