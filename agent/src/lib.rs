//! The node side of stallscope: everything that reads the machine.
//!
//! Sources ([`sources`]) read /proc and /sys under a configurable root, so tests run them on
//! captured text; the sampler ([`sampler`]) runs them on a dedicated thread at the configured
//! rate; the marker listener ([`markers`]) receives the training processes' datagrams.
//! What they produce is handed on as [`stallscope_analysis::frame::Frame`]s. On a multi-node
//! job the shipper ([`shipper`]) streams the node's attributed iterations to the collector.

pub mod clock;
pub mod gpu;
pub mod markers;
pub mod node;
pub mod proctree;
pub mod sampler;
pub mod shipper;
pub mod sink;
pub mod sources;
pub mod tls;
