//! The views people look at: the one-line status `stallscope run` keeps on stderr,
//! `stallscope top`, the terminal dashboard, and `stallscope report`, the post-hoc report.
//! Views render a model ([`JobView`], or the [`Report`] built by replaying it) and never read
//! sources, so they are pure and tested as text.
//!
//! [`JobView`]: stallscope_analysis::view::JobView
//! [`Report`]: stallscope_analysis::report::Report

pub mod palette;
pub mod report;
pub mod status;
pub mod top;
