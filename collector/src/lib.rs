//! The job side of stallscope: the profile file, and for multi-node jobs the ingest server
//! that agents stream to, their clock alignment, and the job task that joins the ranks'
//! iterations, writes the job profile and publishes live updates.

pub mod clock;
pub mod events;
pub mod hang;
pub mod job;
pub mod profile;
pub mod server;
pub mod tls;

pub use stallscope_analysis::clock::monotonic_ns;
