use super::*;
use crate::marker::parse;

const S: Nanos = 1_000_000_000;

/// A job of two ranks (pids 100 and 101) that both finish iterations 0..=`iters` at 1 s
/// each, with the default group of both.
struct Job {
    log: MarkerLog,
    seq: BTreeMap<u32, u64>,
    iter: BTreeMap<u32, u64>,
}

impl Job {
    fn new(iters: u64) -> Job {
        let mut job = Job {
            log: MarkerLog::default(),
            seq: BTreeMap::new(),
            iter: BTreeMap::new(),
        };
        for pid in [100, 101] {
            job.send(pid, 0, "M - group.0=2/0:1 stacks=/tmp/s.txt");
            for i in 0..=iters {
                job.send(pid, (i + 1) * S, "S iter");
            }
        }
        job
    }

    fn send(&mut self, pid: u32, t_ns: Nanos, tail: &str) {
        let seq = self.seq.entry(pid).or_default();
        let iter = self.iter.entry(pid).or_default();
        let line = format!("SS1 {seq} {t_ns} {pid} {} {iter} {tail}", pid - 100);
        *seq += 1;
        if tail.starts_with('S') {
            *iter += 1;
        }
        self.log.ingest(&parse(line.as_bytes()).unwrap());
    }

    fn check(&self, watch: &mut HangWatch, now: Nanos) -> Option<HangEvent> {
        watch.check(&self.log, &BTreeMap::new(), now, 0)
    }
}

fn declared(event: Option<HangEvent>) -> HangReport {
    match event {
        Some(HangEvent::Declared(r)) => *r,
        other => panic!("no hang declared: {other:?}"),
    }
}

#[test]
fn a_rank_that_never_arrives_is_missing_and_the_other_waits() {
    let mut job = Job::new(11);
    job.send(100, 12 * S + 1, "B comm op=all_reduce g=0 n=12 b=1024");
    job.send(101, 12 * S + 2, "B data");
    job.send(101, 12 * S + 3, "E data");
    let mut watch = HangWatch::new(Some(5 * S));
    assert_eq!(job.check(&mut watch, 16 * S), None, "4 s is not 5 s");
    let hang = declared(job.check(&mut watch, 18 * S));
    assert_eq!(hang.stalled_seconds, 6.0);
    assert_eq!(hang.at_seconds, 18.0);
    assert_eq!(hang.last_iteration, Some(11));
    let all_reduce = Collective {
        op: "all_reduce".into(),
        group: 0,
        seq: 12,
    };
    assert_eq!(hang.collective, Some(all_reduce.clone()));
    assert_eq!(hang.waiting_ranks, vec![0]);
    assert_eq!(hang.missing_ranks, vec![1]);
    assert_eq!(hang.ranks[0].state, "collective");
    assert_eq!(hang.ranks[0].collective, Some(all_reduce));
    assert_eq!(hang.ranks[1].state, "compute_or_unknown");
    assert!(hang.ranks.iter().all(|r| r.has_hook));
    assert_eq!(
        job.check(&mut watch, 30 * S),
        None,
        "declared once per stall"
    );
}

#[test]
fn a_rank_waiting_for_a_batch_is_in_data_loading() {
    let mut job = Job::new(3);
    job.send(100, 4 * S + 1, "B data");
    let mut watch = HangWatch::new(Some(5 * S));
    let hang = declared(job.check(&mut watch, 10 * S));
    assert_eq!(hang.ranks[0].state, "data_loading");
    assert_eq!(hang.collective, None);
    assert!(hang.missing_ranks.is_empty());
}

#[test]
fn the_latest_collective_is_the_highest_seq_and_ended_ones_are_not_open() {
    let mut job = Job::new(2);
    job.send(100, 3 * S + 1, "B comm op=all_reduce g=0 n=3 b=8");
    job.send(101, 3 * S + 2, "B comm op=all_reduce g=0 n=3 b=8");
    job.send(101, 3 * S + 3, "E comm");
    job.send(101, 3 * S + 4, "B comm op=all_reduce g=0 n=4 b=8");
    let mut watch = HangWatch::new(Some(5 * S));
    let hang = declared(job.check(&mut watch, 9 * S));
    assert_eq!(hang.collective.map(|c| c.seq), Some(4));
    assert_eq!(hang.waiting_ranks, vec![1]);
    assert_eq!(hang.missing_ranks, vec![0]);
}

#[test]
fn no_hang_before_the_first_iteration() {
    let mut job = Job::new(0);
    job.log = MarkerLog::default();
    job.send(100, S, "B comm op=barrier g=0 n=0 b=0");
    let mut watch = HangWatch::new(Some(5 * S));
    assert_eq!(job.check(&mut watch, 600 * S), None);
}

#[test]
fn iterations_that_resume_end_the_hang_and_a_new_stall_is_a_new_hang() {
    let mut job = Job::new(3);
    let mut watch = HangWatch::new(Some(5 * S));
    declared(job.check(&mut watch, 10 * S));
    job.send(100, 12 * S, "S iter");
    assert_eq!(
        job.check(&mut watch, 12 * S),
        Some(HangEvent::Resumed {
            at_seconds: 10.0,
            after_seconds: 2.0
        })
    );
    declared(job.check(&mut watch, 18 * S));
}

#[test]
fn the_default_threshold_is_a_minute_or_twenty_median_iterations() {
    let job = Job::new(5);
    let mut watch = HangWatch::new(None);
    assert_eq!(job.check(&mut watch, 6 * S + 59 * S), None);
    assert_eq!(
        watch.threshold_ns(),
        MIN_HANG_NS,
        "20 × 1 s is under a minute"
    );
    declared(job.check(&mut watch, 6 * S + 61 * S));
    let mut slow = HangWatch::new(None);
    slow.durations.extend([10 * S, 10 * S, 10 * S]);
    assert_eq!(slow.threshold_ns(), 200 * S);
}

#[test]
fn exited_loops_make_no_hang() {
    let job = Job::new(3);
    let mut watch = HangWatch::new(Some(5 * S));
    let exited: BTreeMap<u32, Nanos> = [(100, 5 * S), (101, 5 * S)].into();
    assert_eq!(watch.check(&job.log, &exited, 100 * S, 0), None);
}

#[test]
fn the_words_name_who_never_arrived_and_who_waits() {
    let mut job = Job::new(11);
    job.send(100, 12 * S + 1, "B comm op=all_reduce g=0 n=12 b=1024");
    let mut watch = HangWatch::new(Some(5 * S));
    let mut hang = declared(job.check(&mut watch, 73 * S));
    hang.stacks.insert(
        "1".into(),
        "  File \"t.py\", line 3 in stuck_in_here\n".into(),
    );
    let text = describe(&hang);
    assert!(
        text.starts_with(
            "stallscope: the job hangs: no rank finished an iteration for 61 s (the last: \
             iteration 11); rank 1 never arrived at all_reduce #12 of group 0 (rank 0 waits in it)"
        ),
        "{text}"
    );
    assert!(text.contains("rank 1's Python stacks:\n      File \"t.py\", line 3 in stuck_in_here"));
}

/// Issue 30, item 1, again: a step numbered 10^14 (a token counter taken for the iteration)
/// is reached in one jump, and the checks after it find nothing new to read.
#[test]
fn a_step_with_a_huge_number_is_read_in_one_jump() {
    let mut job = Job::new(3);
    for pid in [100, 101] {
        job.iter.insert(pid, 100_000_000_000_000);
        job.send(pid, 5 * S, "S iter");
    }
    let mut watch = HangWatch::new(Some(5 * S));
    let started = std::time::Instant::now();
    assert_eq!(job.check(&mut watch, 6 * S), None);
    assert_eq!(job.check(&mut watch, 7 * S), None, "nothing new: no walk");
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
}

/// A torch 2 job's teardown may outlast a short threshold: loops that destroyed their default
/// process group (`finishing=1`) or exit (`exit=1`) are ending, not hung; one that did not
/// still makes a hang, and the one ending is said to be finishing.
#[test]
fn loops_that_said_they_finish_make_no_hang() {
    let mut job = Job::new(11);
    job.send(100, 12 * S, "M - finishing=1");
    job.send(101, 12 * S, "M - exit=1");
    let mut watch = HangWatch::new(Some(5 * S));
    assert_eq!(job.check(&mut watch, 30 * S), None);

    let mut job = Job::new(11);
    job.send(100, 12 * S, "M - finishing=1");
    let mut watch = HangWatch::new(Some(5 * S));
    let hang = declared(job.check(&mut watch, 30 * S));
    assert_eq!(hang.ranks[0].state, "finishing");
    assert_eq!(hang.ranks[1].state, "compute_or_unknown");
    assert!(!all_finishing(&hang.ranks));
    assert!(describe(&hang).contains("rank 0 (pid 100): finishing"));
}

/// A dump as the hook's `faulthandler` writes it: a DataLoader thread of its own (not the
/// script's) and the main thread, inside `__next__` (CI: the `data` begin was held in the
/// process behind a full socket, so the markers said nothing).
const LOADING_DUMP: &str = "Thread 0x00007f0000000001 (most recent call first):
  File \"/usr/lib/python3.11/threading.py\", line 327 in wait
  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1200 in __next__
  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap

Current thread 0x00007fd874086740 (most recent call first):
  File \"/tmp/train.py\", line 11 in __getitem__
  File \"/usr/lib/python3/dist-packages/torch/utils/data/_utils/fetch.py\", line 58 in fetch
  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 671 in _next_data
  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 628 in __next__
  File \"/tmp/stallscope-x/pkg/stallscope/_torch_hook.py\", line 190 in __next__
  File \"/tmp/train.py\", line 16 in <module>
";

fn rank_in(state: &str, rank: u32) -> RankAtHang {
    RankAtHang {
        rank,
        pid: 100 + rank,
        last_iteration: Some(1),
        state: state.into(),
        collective: None,
        has_hook: true,
        node: None,
    }
}

#[test]
fn a_rank_whose_main_thread_is_in_a_dataloader_is_data_loading_whatever_its_markers_said() {
    let mut ranks = vec![
        rank_in("compute_or_unknown", 0),
        rank_in("compute_or_unknown", 1),
    ];
    let stacks: BTreeMap<String, String> = [
        ("0".to_string(), LOADING_DUMP.to_string()),
        (
            "1".to_string(),
            "Current thread 0x1 (most recent call first):\n  File \"/tmp/train.py\", line 9 in \
             forward\n  File \"/tmp/train.py\", line 16 in <module>\n"
                .to_string(),
        ),
    ]
    .into();
    refine_by_stacks(&mut ranks, &stacks);
    assert_eq!(ranks[0].state, "data_loading");
    assert_eq!(
        ranks[1].state, "compute_or_unknown",
        "computing: no loader frame"
    );
}

#[test]
fn only_the_scripts_thread_and_only_unplaced_ranks_are_refined() {
    // A loader frame on another thread only (the main thread computes) says nothing; a rank
    // the markers placed in a collective stays there.
    let other_thread_only = LOADING_DUMP
        .replace("line 628 in __next__", "line 628 in _get_batch")
        .replace("line 190 in __next__", "line 190 in step");
    let mut ranks = vec![rank_in("compute_or_unknown", 0), rank_in("finishing", 1)];
    let stacks: BTreeMap<String, String> = [
        ("0".to_string(), other_thread_only),
        ("1".to_string(), LOADING_DUMP.to_string()),
    ]
    .into();
    refine_by_stacks(&mut ranks, &stacks);
    assert_eq!(ranks[0].state, "compute_or_unknown");
    assert_eq!(ranks[1].state, "finishing");
}

#[test]
fn a_rank_the_markers_left_in_an_earlier_collective_is_data_loading_by_its_stack() {
    // CI, loaded: rank 1's markers ended at all_reduce #10 (its end and two iterations were
    // held in the process), while its stack sat in the DataLoader of iteration 12.
    let mut stale = rank_in("collective", 1);
    stale.collective = Some(Collective {
        op: "all_reduce".into(),
        group: 0,
        seq: 10,
    });
    let mut inside = stale.clone();
    inside.rank = 0;
    let in_collective = LOADING_DUMP.replace(
        "  File \"/tmp/train.py\", line 11 in __getitem__",
        "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", \
         line 1 in all_reduce",
    );
    let mut ranks = vec![inside, stale];
    let stacks: BTreeMap<String, String> = [
        ("0".to_string(), in_collective),
        ("1".to_string(), LOADING_DUMP.to_string()),
    ]
    .into();
    refine_by_stacks(&mut ranks, &stacks);
    assert_eq!(
        ranks[0].state, "collective",
        "a collective called from a loader stays one"
    );
    assert!(ranks[0].collective.is_some());
    assert_eq!(ranks[1].state, "data_loading");
    assert_eq!(ranks[1].collective, None);
}
