//! The Trace Event Format's JSON, written one event at a time: the file opens with
//! `{"displayTimeUnit":"ms","otherData":…,"traceEvents":[`, each event follows as it is
//! made, and [`TraceJson::finish`] closes the array, so a trace of any length is never held.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::Value;

use crate::Nanos;

/// One trace event (`ph`: `X` complete, `C` counter, `i` instant, `M` metadata).
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    /// Slice, counter or metadata name.
    pub name: &'a str,
    /// Category (the viewers' filter), when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cat: Option<&'static str>,
    /// Phase: `X`, `C`, `i` or `M`.
    pub ph: &'static str,
    /// µs, the event's time.
    pub ts: f64,
    /// µs, how long (`X` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    /// Process (a node).
    pub pid: u32,
    /// Thread (a rank's track).
    pub tid: u32,
    /// Scope of an instant: `g` (global), `p` (process) or `t` (thread).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s: Option<&'static str>,
    /// What the viewer shows on selection (or the counter's values, the metadata's name).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub args: Value,
}

/// µs of `ns`, as the format's `ts` and `dur` take them (fractions keep the ns).
pub fn micros(ns: Nanos) -> f64 {
    ns as f64 / 1e3
}

/// A trace being written to `W`.
pub struct TraceJson<W: Write> {
    out: W,
    events: u64,
}

impl<W: Write> TraceJson<W> {
    /// Starts the file: `other` goes to `otherData` (what the trace is of).
    pub fn start(mut out: W, other: &Value) -> io::Result<Self> {
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"otherData\":")?;
        serde_json::to_writer(&mut out, other)?;
        out.write_all(b",\"traceEvents\":[\n")?;
        Ok(TraceJson { out, events: 0 })
    }

    /// Writes one event.
    pub fn event(&mut self, e: &Event<'_>) -> io::Result<()> {
        if self.events > 0 {
            self.out.write_all(b",\n")?;
        }
        serde_json::to_writer(&mut self.out, e)?;
        self.events += 1;
        Ok(())
    }

    /// Events written so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Closes the array and the object and flushes; gives the writer back.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}
