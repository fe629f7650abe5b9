//! What the fuzz tests share (analysis/tests/fuzz.rs, and collector/tests/fuzz_profile.rs by
//! path): a global allocator that counts this thread's live bytes and their peak, so that a
//! decode can be held to memory in proportion to its input, and the case count.
//!
//! A decoder runs on the thread that calls it, and proptest runs cases on the test's thread,
//! so thread-local counts see exactly the decode. The file declares the `#[global_allocator]`
//! of the test binary that includes it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::test_runner::Config;

struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    let _ = LIVE.try_with(|l| {
        let now = l.get() + size;
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn note_free(size: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(size)));
}

// SAFETY: every call goes to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_free(layout.size());
        note_alloc(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes `f` held at its peak beyond what was live when it was called, and its result.
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (PEAK.with(Cell::get) - base, out)
}

/// Cases per property (`STALLSCOPE_FUZZ_CASES`, default 256, so CI stays fast; the long run
/// in docs/BENCHMARKS.md sets millions).
pub fn config() -> Config {
    let cases = std::env::var("STALLSCOPE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
