//! Helpers for the end-to-end tests: they run the real `stallscope` binary around the real
//! PyTorch example with Debian's python3-torch, and read what a user would read.

#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Python that has torch (Debian's python3-torch installs for /usr/bin/python3).
pub fn python() -> String {
    std::env::var("STALLSCOPE_TEST_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into())
}

/// Says why an end-to-end test skips. In CI (`CI=true`) a skip is a failure: a test that
/// cannot run there must not count as passed.
pub fn skip(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("an end-to-end test cannot run in CI: {why}");
    }
    eprintln!("SKIP: {why}");
}

/// Whether torch imports; tests that need it say why they skip.
pub fn have_torch() -> bool {
    let ok = Command::new(python())
        .args(["-c", "import torch, torchvision, PIL"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        skip(&format!(
            "{} cannot import torch/torchvision/PIL (run scripts/install-deps.sh)",
            python()
        ));
    }
    ok
}

/// Whether we are root; tests that need it say why they skip.
pub fn am_root(why: &str) -> bool {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    if !root {
        skip(&format!("needs root to {why}"));
    }
    root
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn example() -> String {
    repo()
        .join("examples/pytorch_ddp/train.py")
        .display()
        .to_string()
}

pub fn stallscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stallscope"))
}

/// `stallscope` inside network namespace `ns` (`ip netns exec NS stallscope`): a node of the
/// namespace tests.
pub fn stallscope_in(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_stallscope")]);
    c
}

/// Waits up to `within` for `path` to exist (a helper's "ready" file); fails naming `what`.
pub fn wait_for_file(path: &Path, within: Duration, what: &str) {
    assert!(
        wait_for(within, || path.exists()),
        "{what} did not start in {within:?}"
    );
}

/// The count a test's receiver wrote into `path` when it finished (bytes it received).
pub fn count_written_in(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}: {text:?}", path.display()))
}

/// A data folder shared by the tests of one run, so the images are generated once.
pub fn data_dir() -> String {
    std::env::temp_dir()
        .join("stallscope-test-data")
        .display()
        .to_string()
}

/// How long an end-to-end command may take before the test fails (and ends it).
pub const COMMAND_LIMIT: Duration = Duration::from_secs(240);

/// Runs `cmd` to completion within [`COMMAND_LIMIT`] and returns its output; panics with
/// both streams if it fails, and ends it (by pid) if it overruns.
pub fn run_ok(cmd: &mut Command) -> Output {
    run_exiting_with(cmd, &[0])
}

/// [`run_ok`] for a command whose exit code may be any of `codes` (a benchmark says with 1
/// that a goal was not met: the test judges delivery, not this machine's speed).
pub fn run_exiting_with(cmd: &mut Command, codes: &[i32]) -> Output {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("command runs");
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + COMMAND_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait works") {
            break st;
        }
        if Instant::now() > deadline {
            kill(child.id(), libc::SIGTERM);
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let st = child.wait().expect("wait works");
            panic!("{cmd:?} ran over {COMMAND_LIMIT:?} and was ended ({st:?})");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    };
    if !out.status.code().is_some_and(|c| codes.contains(&c)) {
        panic!(
            "{:?} failed with {:?}\nstdout:\n{}\nstderr:\n{}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// The JSON file at `path` (a summary, most often); a summary must name no rank that turned
/// slow ([`no_slowdowns`]): read one that should with [`read_json_with_slowdowns`].
pub fn read_json(path: &Path) -> Value {
    let v = read_json_with_slowdowns(path);
    no_slowdowns(&v);
    v
}

/// The JSON file at `path`, a summary that may name ranks that turned slow.
pub fn read_json_with_slowdowns(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("summary JSON parses")
}

/// The summary JSON `stallscope summary --json` printed, which must name no rank that turned
/// slow ([`no_slowdowns`]).
pub fn summary_json(stdout: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(stdout).expect("summary JSON parses");
    no_slowdowns(&v);
    v
}

/// Steady jobs raise no alarm: every end-to-end test reads its summaries through
/// [`read_json`] or [`summary_json`], so a slowdown declared on a job that did not turn slow
/// (a false alarm) fails the test whose job raised it, wherever in the suite. The count of
/// false alarms over the suite is the count of these failures, and it must be 0.
pub fn no_slowdowns(summary: &Value) {
    let found = summary["slowdowns"].as_array().cloned().unwrap_or_default();
    assert!(
        found.is_empty(),
        "false alarm: a steady job named ranks that turned slow: {found:#?}"
    );
}

/// The job's share of one category, 0–1.
pub fn fraction(summary: &Value, category: &str) -> f64 {
    summary["job"]["categories"][category]["fraction"]
        .as_f64()
        .expect("fraction present")
}

/// The job's largest category.
pub fn largest(summary: &Value) -> String {
    let cats = summary["job"]["categories"]
        .as_object()
        .expect("categories");
    cats.iter()
        .max_by(|a, b| {
            a.1["seconds"]
                .as_f64()
                .unwrap()
                .total_cmp(&b.1["seconds"].as_f64().unwrap())
        })
        .map(|(k, _)| k.clone())
        .unwrap()
}

/// Waits until `f` holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The text of a child's log so far (empty when there is none yet).
pub fn log_of(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Whether `log` says `text` yet.
pub fn log_has(log: &Path, text: &str) -> bool {
    log_of(log).contains(text)
}

/// Waits (bounded by `within`) until `log` says `text`; whether it did.
pub fn wait_for_log(log: &Path, text: &str, within: Duration) -> bool {
    wait_for(within, || log_has(log, text))
}

/// Children of `pid`, from /proc.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if rest
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u32>().ok())
            == Some(pid)
        {
            out.push(p);
        }
    }
    out
}

pub fn alive(pid: u32) -> bool {
    // A zombie is dead for our purposes.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rfind(')').map(|i| &s[i + 2..i + 3]) != Some("Z"))
        .unwrap_or(false)
}

pub fn kill(pid: u32, sig: i32) {
    // SAFETY: a signal to a pid this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// The processes below `pid` (children first found through `/proc/PID/task/*/children`),
/// deepest last.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if !out.contains(&c) && out.len() < 4096 {
                    out.push(c);
                    todo.push(c);
                }
            }
        }
    }
    out
}

/// SIGKILLs `pid` and everything below it, by pid: a `stallscope run` killed alone leaves its
/// training running on purpose, and a test that failed must not leave one behind (a gloo rank
/// whose peer is gone can spin on a core for minutes, slowing every test after it).
pub fn kill_tree(pid: u32) {
    let below = descendants(pid);
    kill(pid, libc::SIGKILL);
    for p in below {
        kill(p, libc::SIGKILL);
    }
}

/// `stallscope run -q -o DIR/p.stallscope --summary-json DIR/s.json [run_flags] -- python
/// example.py [example_flags] --data-dir <shared>`: runs the real example under stallscope,
/// which must succeed, and returns its output and summary JSON.
pub fn run_example(dir: &Path, run_flags: &[&str], example_flags: &[&str]) -> (Output, Value) {
    let out = run_ok(&mut example_under(
        stallscope(),
        dir,
        run_flags,
        example_flags,
    ));
    (out, read_json(&dir.join("s.json")))
}

/// `stallscope` (as given: its environment set) with the arguments of [`run_example`], to be
/// run by the caller.
pub fn example_under(
    mut stallscope: Command,
    dir: &Path,
    run_flags: &[&str],
    example_flags: &[&str],
) -> Command {
    stallscope
        .args(["run", "-q", "-o"])
        .arg(dir.join("p.stallscope"))
        .arg("--summary-json")
        .arg(dir.join("s.json"))
        .args(run_flags)
        .args(["--", &python(), &example()])
        .args(example_flags)
        .args(["--data-dir", &data_dir()]);
    stallscope
}

/// Generates the example's images (64 of them) in [`data_dir`] before a test's clock starts,
/// so ranks that start together read a complete folder.
pub fn generate_images() {
    run_ok(Command::new(python()).args([
        &example(),
        "--iters",
        "1",
        "--workers",
        "0",
        "--images",
        "64",
        "--data-dir",
        &data_dir(),
    ]));
}

/// The scripted `libnvidia-ml` (`fake-nvml/`), built beside the binary under test
/// (`scripts/test.sh` builds it).
pub fn fake_nvml() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_stallscope"));
    let lib = bin.with_file_name("libstallscope_fake_nvml.so");
    assert!(
        lib.exists(),
        "{} is missing: build it first with `cargo build -p stallscope-fake-nvml` \
         (scripts/test.sh does)",
        lib.display()
    );
    lib
}

/// Puts `cmd` on the scripted GPU described by `script` (`STALLSCOPE_FAKE_NVML`, see
/// `fake-nvml/`), loaded through `STALLSCOPE_NVML_LIB`.
pub fn fake_gpu<'a>(cmd: &'a mut Command, script: &str) -> &'a mut Command {
    cmd.env(stallscope_agent::gpu::nvml::LIB_ENV, fake_nvml())
        .env("STALLSCOPE_FAKE_NVML", script)
}

/// bytes a screenshot of a report page must exceed: a 1280×2400 page holding only a heading
/// is about 15 kB as PNG, a report with its charts several hundred.
pub const NON_TRIVIAL_SCREENSHOT: u64 = 100_000;

/// `stallscope report ARGS -o DIR/NAME.html`, then the page where people read it: headless
/// Chromium takes a screenshot (checked non-trivial) and dumps the DOM it built, which is
/// returned. `None` (a skip) when Chromium is missing.
pub fn report_in_chromium(dir: &Path, name: &str, args: &[&std::ffi::OsStr]) -> Option<String> {
    let Ok(chromium) = which("chromium") else {
        skip("chromium is not installed (run scripts/install-deps.sh)");
        return None;
    };
    let page = dir.join(format!("{name}.html"));
    let out = run_ok(stallscope().arg("report").args(args).arg("-o").arg(&page));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("report written to"), "{said}");
    let shot = dir.join(format!("{name}.png"));
    let profile_dir = dir.join(format!("{name}-chromium"));
    let headless = |extra: &str| {
        let mut c = Command::new(&chromium);
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .arg("--window-size=1280,2400")
        .arg(extra)
        .arg(format!("file://{}", page.display()));
        c
    };
    run_ok(&mut headless(&format!("--screenshot={}", shot.display())));
    let bytes = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        bytes > NON_TRIVIAL_SCREENSHOT,
        "the screenshot of {} is {bytes} bytes: the page did not render",
        page.display()
    );
    let dom = run_ok(&mut headless("--dump-dom"));
    Some(String::from_utf8_lossy(&dom.stdout).into_owned())
}

/// The path of `program` on PATH.
pub fn which(program: &str) -> Result<PathBuf, String> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{program} is not on PATH"))
}

/// Checks what every report page must hold: the verdict, each rank's row, and the charts
/// (each drawn as SVG inside its figure).
pub fn assert_report_holds(dom: &str, ranks: &[u32], charts: &[&str]) {
    assert!(dom.contains("id=\"verdict\""), "no verdict: {dom}");
    for r in ranks {
        assert!(
            dom.contains(&format!("data-rank=\"{r}\"")),
            "rank {r} missing"
        );
    }
    for id in charts {
        let at = dom
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("chart {id} missing"));
        let figure = &dom[at..];
        let end = figure.find("</figure>").unwrap_or(figure.len());
        assert!(figure[..end].contains("<svg"), "chart {id} has no SVG");
    }
}

/// What sampling under load can take from a counter's per-iteration figure: read from the
/// profile's own sample timestamps, not from the wall clock, so an assertion on bytes per
/// iteration holds on a loaded machine and still fails on a wrong figure.
#[derive(Clone, Copy, Debug, Default)]
pub struct SamplingSlack {
    /// ns, the longest a round of the counter's sampler took (`dur_ns`): a sample is stamped
    /// at the start of its round and the counter read within it, so each end of a window
    /// may be off by this much of the counter's rate.
    pub max_lag_ns: u64,
    /// Wraps a `bits`-bit counter moving at the given rate could have made unseen: for each
    /// gap between two reads longer than a wrap period, the wraps that fit in it.
    pub wraps_unseen: u64,
    /// Samples of the counter.
    pub samples: usize,
}

impl SamplingSlack {
    /// The slack of the counter series `name` on GPU `gpu` in the profile at `profile`,
    /// moving at `bytes_per_s` and given in `bits` bits.
    pub fn of_gpu_counter(
        profile: &Path,
        name: &str,
        gpu: &str,
        bytes_per_s: f64,
        bits: u32,
    ) -> SamplingSlack {
        use stallscope_analysis::frame::Frame;
        let read = stallscope_collector::profile::read_profile(profile)
            .unwrap_or_else(|e| panic!("{}: {e}", profile.display()));
        let mut id = None;
        let mut reads: Vec<(u64, u64)> = Vec::new(); // (stamp, round duration), ns
        for f in &read.frames {
            match f {
                Frame::Series(d)
                    if d.name == name
                        && d.label(stallscope_analysis::series::LABEL_GPU) == Some(gpu)
                        && d.label("pid").is_none() =>
                {
                    id = Some(d.id)
                }
                Frame::Samples(b) if id.is_some_and(|id| b.values.iter().any(|v| v.0 == id)) => {
                    reads.push((b.t_ns, u64::from(b.dur_ns)));
                }
                _ => {}
            }
        }
        let wrap_ns = if bits >= 64 {
            f64::INFINITY
        } else {
            (1u64 << bits) as f64 / bytes_per_s * 1e9
        };
        let mut slack = SamplingSlack {
            samples: reads.len(),
            ..SamplingSlack::default()
        };
        for w in reads.windows(2) {
            let ((t0, _), (t1, d1)) = (w[0], w[1]);
            // The later read happened at most its round's duration after its stamp.
            let gap = (t1 + d1).saturating_sub(t0) as f64;
            slack.wraps_unseen += (gap / wrap_ns).floor() as u64;
        }
        slack.max_lag_ns = reads.iter().map(|r| r.1).max().unwrap_or(0);
        slack
    }

    /// The relative error a mean per-iteration figure over `wall_ns` of iterations, `want`
    /// bytes each at `bytes_per_s`, may show from sampling alone: both ends of the window
    /// off by the longest lag, plus every wrap that may have gone unseen.
    pub fn relative(&self, bytes_per_s: f64, wall_ns: f64, bits: u32) -> f64 {
        let lag = 2.0 * self.max_lag_ns as f64 / wall_ns;
        let wraps = if bits >= 64 {
            0.0
        } else {
            self.wraps_unseen as f64 * (1u64 << bits) as f64 / (bytes_per_s * wall_ns / 1e9)
        };
        lag + wraps
    }
}

/// A child process ended (with everything below it, by pid) when dropped, its stderr in a log.
pub struct Reaped(pub std::process::Child);

impl Reaped {
    /// Starts `cmd`, stdout to nowhere and stderr to `log`.
    pub fn spawn(cmd: &mut Command, log: &Path) -> Reaped {
        let f = std::fs::File::create(log).unwrap();
        Reaped(
            cmd.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::from(f))
                .spawn()
                .expect("starts"),
        )
    }

    /// Sends `sig` and waits (bounded) for the exit; true when it exited successfully.
    pub fn stop(&mut self, sig: i32, within: std::time::Duration) -> bool {
        kill(self.0.id(), sig);
        let end = std::time::Instant::now() + within;
        while std::time::Instant::now() < end {
            if let Ok(Some(st)) = self.0.try_wait() {
                return st.success();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }

    /// Waits (bounded) for a successful exit; panics with the end of `log` otherwise.
    pub fn wait_success(&mut self, within: std::time::Duration, what: &str, log: &Path) {
        let end = std::time::Instant::now() + within;
        let tail = || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let start = text.len().saturating_sub(4000);
            let start = (start..text.len())
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(text.len());
            text[start..].to_string()
        };
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                assert!(st.success(), "{what} failed: {st:?}\n{}", tail());
                return;
            }
            if std::time::Instant::now() >= end {
                panic!(
                    "{what} did not finish in {within:?}; its log ends:\n{}",
                    tail()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            kill_tree(self.0.id());
        }
        let _ = self.0.wait();
    }
}

/// `stallscope run -q` around `stallscope launch --nproc-per-node 2` of `python()` running
/// `script` with `args`, the launcher on `master_port`, writing its profile and summary in
/// `dir`: the command's output (successful) and the summary JSON.
pub fn run_two_launched_ranks(
    dir: &Path,
    master_port: u16,
    script: &str,
    args: &[&str],
) -> (Output, Value) {
    let summary = dir.join("s.json");
    let port = master_port.to_string();
    let out = run_ok(
        stallscope()
            .args(["run", "-q", "-o"])
            .arg(dir.join("p.stallscope"))
            .arg("--summary-json")
            .arg(&summary)
            .args(["--", env!("CARGO_BIN_EXE_stallscope"), "launch"])
            .args(["--nproc-per-node", "2", "--master-port", &port])
            .args(["--", &python(), script])
            .args(args),
    );
    (out, read_json(&summary))
}

/// Where scripts/install-perfetto-ui.sh put the Perfetto UI ($STALLSCOPE_PERFETTO_UI, else
/// ~/.cache/stallscope/perfetto-ui); `None` (a skip) when it, Node or Chromium is missing.
pub fn perfetto_ui() -> Option<PathBuf> {
    let dir = std::env::var_os("STALLSCOPE_PERFETTO_UI")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
            cache.join("stallscope/perfetto-ui")
        });
    for (ok, why) in [
        (
            dir.join("index.html").is_file(),
            "the Perfetto UI is not installed (run scripts/install-deps.sh)",
        ),
        (
            which("node").is_ok(),
            "node is not installed (run scripts/install-deps.sh)",
        ),
        (
            which("chromium").is_ok(),
            "chromium is not installed (run scripts/install-deps.sh)",
        ),
    ] {
        if !ok {
            skip(why);
            return None;
        }
    }
    Some(dir)
}

/// Opens `trace` in the Perfetto UI at `ui` (headless Chromium, its own trace_processor
/// engine: scripts/perfetto-query.mjs) and runs each SQL query on what it parsed: the rows
/// of each.
pub fn perfetto_query(ui: &Path, trace: &Path, queries: &[&str]) -> Vec<Vec<Value>> {
    let out = run_ok(
        Command::new("node")
            .arg(repo().join("scripts/perfetto-query.mjs"))
            .arg(ui)
            .arg(trace)
            .args(queries),
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("perfetto-query printed no JSON ({e}): {out:?}"));
    v["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rows| rows.as_array().unwrap().clone())
        .collect()
}

/// SQL: every slice of category `cat` on each thread, with its thread's and process's names.
pub fn perfetto_slices(cat: &str) -> String {
    format!(
        "select s.name, s.ts, s.dur, t.name thread, p.name process from slice s \
         join thread_track tt on s.track_id = tt.id join thread t using(utid) \
         left join process p using(upid) where s.category = '{cat}' order by s.ts"
    )
}

/// SQL: what Perfetto's importer counted as errors or lost data.
pub const PERFETTO_ERRORS: &str =
    "select name, value from stats where value > 0 and severity in ('error', 'data_loss')";

/// SQL: every counter track of a process, with its samples.
pub const PERFETTO_COUNTERS: &str = "select ct.name, p.name process, count(*) n \
     from counter c join process_counter_track ct on c.track_id = ct.id \
     join process p using(upid) group by 1, 2";

/// Checks that the iteration slices of rank 0 and rank 1 (`rows` of [`perfetto_slices`])
/// with the same name overlap in time: the trace put both ranks on one clock. Returns how
/// many pairs were compared.
pub fn assert_iterations_line_up(rows: &[Value]) -> usize {
    let of = |rank: &str| -> std::collections::BTreeMap<String, (f64, f64)> {
        rows.iter()
            .filter(|r| r["thread"] == rank)
            .map(|r| {
                let ts = r["ts"].as_f64().unwrap();
                (
                    r["name"].as_str().unwrap().to_string(),
                    (ts, ts + r["dur"].as_f64().unwrap()),
                )
            })
            .collect()
    };
    let (a, b) = (of("rank 0"), of("rank 1"));
    let mut pairs = 0;
    for (name, (a0, a1)) in &a {
        if name == "iteration 0" {
            continue; // from each rank's first marker: start-up differs
        }
        let Some((b0, b1)) = b.get(name) else {
            continue;
        };
        assert!(
            a0.max(*b0) < a1.min(*b1),
            "{name}: rank 0 [{a0}, {a1}] and rank 1 [{b0}, {b1}] ns do not overlap"
        );
        pairs += 1;
    }
    pairs
}

/// Namespace nodes made by scripts/netns.sh (`up PREFIX OPTIONS…`), taken down when the test
/// ends, however it ends.
pub struct Cluster {
    prefix: String,
}

impl Cluster {
    /// Brings up the nodes of `prefix` with netns.sh's `options` (a rate, `--net N`,
    /// `--collector`, …).
    pub fn up(prefix: &str, options: &[&str]) -> Cluster {
        run_ok(
            Command::new("bash")
                .arg(repo().join("scripts/netns.sh"))
                .arg("up")
                .arg(prefix)
                .args(options),
        );
        Cluster {
            prefix: prefix.into(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/netns.sh"))
            .args(["down", &self.prefix])
            .status();
    }
}
