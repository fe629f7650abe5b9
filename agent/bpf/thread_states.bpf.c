// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0
//
// The job's threads' scheduling events, for stallscope's thread-state source
// (agent/src/sources/thread_states): when a watched thread goes off a CPU (and in which
// state), comes on one, or is woken. User space reads the ring about ten times a second and
// rebuilds each thread's time on the CPU, on a run queue and in state D at any instant, so
// the agent need not poll /proc 100 times a second.
//
// Built by agent/build.rs with `clang -O2 -g -target bpf`; the kernel structures are reached
// through CO-RE (the loader relocates the field offsets against /sys/kernel/btf/vmlinux).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* Only the fields read; CO-RE finds their offsets in the running kernel. */
struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

/* What a process's entry in `watched` says: its main thread only, or all its threads. */
#define WATCH_MAIN 1
#define WATCH_ALL 2

#define EVENT_OFF 0  /* switched out; `state` is its state then (0 when preempted) */
#define EVENT_ON 1   /* switched in */
#define EVENT_WAKE 2 /* woken (made runnable) */

/* 24 bytes; agent/src/sources/thread_states/kernel.rs reads the same layout. */
struct event {
	__u64 ns;    /* CLOCK_MONOTONIC */
	__u32 tid;
	__u32 tgid;
	__u32 state; /* the kernel's task state bits for EVENT_OFF, else 0 */
	__u32 kind;
};

/* Process (tgid) -> WATCH_MAIN or WATCH_ALL, written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} watched SEC(".maps");

/* 1 MiB: ~43,000 events, about 4 s of a busy job's switches at 10 reads a second. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

/* Events dropped because the ring was full; the agent re-reads /proc when it grows. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Looks the thread's process up first: most switches on a machine are of other processes,
 * and for them nothing more is read (not even the clock). */
static __always_inline void note(struct task_struct *task, __u32 kind, __u32 state)
{
	__u32 tgid = task->tgid;
	__u8 *mode = bpf_map_lookup_elem(&watched, &tgid);
	if (!mode)
		return;
	__u32 tid = task->pid;
	if (*mode == WATCH_MAIN && tid != tgid)
		return;
	struct event e = {
		.ns = bpf_ktime_get_ns(), .tid = tid, .tgid = tgid, .state = state, .kind = kind,
	};
	/* No wake-up: the agent reads on its own clock, nobody waits on the ring. */
	if (bpf_ringbuf_output(&events, &e, sizeof(e), BPF_RB_NO_WAKEUP)) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&lost, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
}

/* BTF-typed tracepoints (tp_btf): the verifier knows the arguments' types, so the task's
 * fields are plain loads rather than bpf_probe_read_kernel calls. */

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 *              unsigned int prev_state): the fourth argument since Linux 5.18. */
SEC("tp_btf/sched_switch")
int stallscope_switch(unsigned long long *ctx)
{
	/* A preempted thread stays runnable whatever state it had set. */
	__u32 state = ctx[0] ? 0 : (__u32)ctx[3];
	note((struct task_struct *)ctx[1], EVENT_OFF, state);
	note((struct task_struct *)ctx[2], EVENT_ON, 0);
	return 0;
}

/* sched_wakeup(struct task_struct *p) */
SEC("tp_btf/sched_wakeup")
int stallscope_wakeup(unsigned long long *ctx)
{
	note((struct task_struct *)ctx[0], EVENT_WAKE, 0);
	return 0;
}

/* sched_wakeup_new(struct task_struct *p): a new thread's first time runnable. */
SEC("tp_btf/sched_wakeup_new")
int stallscope_wakeup_new(unsigned long long *ctx)
{
	note((struct task_struct *)ctx[0], EVENT_WAKE, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
