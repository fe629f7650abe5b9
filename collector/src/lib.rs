//! The job side of stallscope.

pub mod profile;
