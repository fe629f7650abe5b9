//! The views people look at live: the one-line status `stallscope run` keeps on stderr, and
//! `stallscope top`, the terminal dashboard. Views render a model ([`JobView`]) and never
//! read sources, so they are pure and tested as text.
//!
//! [`JobView`]: stallscope_analysis::view::JobView

pub mod palette;
pub mod status;
pub mod top;
