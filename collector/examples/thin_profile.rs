//! Writes a run profile again as the sample flight recorder would have written it
//! (`stallscope_analysis::journal::retention`): the same run's frames, the raw samples kept
//! only around what matters, the other frames deflated (as `stallscope run` writes). For checking that a thinned profile gives the figures of the
//! whole one (`bench/thinned_figures.sh`).
//!
//!     cargo run -p stallscope-collector --example thin_profile -- WHOLE.stallscope THIN.stallscope

use stallscope_analysis::frame::Frame;
use stallscope_analysis::journal::retention::Retention;
use stallscope_analysis::journal::FrameSink;
use stallscope_collector::profile::{ProfileReader, ProfileWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [from, to] = args.as_slice() else {
        return Err("usage: thin_profile WHOLE.stallscope THIN.stallscope".into());
    };
    let mut sink: Box<dyn FrameSink> = Box::new(Retention::new(Box::new(
        ProfileWriter::create(to)?.deflating(),
    )));
    for frame in ProfileReader::open(from)? {
        let frame = frame?;
        if matches!(frame, Frame::SamplesThinned(_)) {
            return Err(format!("{from} is thinned already").into());
        }
        sink.write(&frame)?;
    }
    sink.finish()?;
    Ok(())
}
