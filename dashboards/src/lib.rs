//! The views people look at live. For now: the one-line status `stallscope run` keeps on
//! stderr while the training runs. Views render a model and never read sources, so they are
//! pure and tested as text.

pub mod status;
