//! Packs a run's markers and breakdowns into [`Frame::IterationPack`]s on their way to the
//! profile: the per-iteration frames are what is left of a run profile once its samples are
//! thinned, and packed column by column with their times as deltas they take about half the
//! bytes (`crate::iteration_pack`, issue 31).
//!
//! A pack holds only consecutive markers and breakdowns: any other frame (a reading, a
//! process, a sample batch) writes the pack first, so the file keeps every frame's order.
//! A flush writes it too (the caller flushes about once a second), so a pack holds at most a
//! second's frames, or [`PACK_MAX_ITEMS`].

use super::FrameSink;
use crate::frame::Frame;
use crate::iteration_pack::{IterationPackBuilder, PACK_MAX_ITEMS};

/// A [`FrameSink`] that packs markers and breakdowns before `inner` (module docs).
pub struct Packing {
    inner: Box<dyn FrameSink>,
    pack: IterationPackBuilder,
}

impl Packing {
    /// Packs what is written to `inner`.
    pub fn new(inner: Box<dyn FrameSink>) -> Packing {
        Packing {
            inner,
            pack: IterationPackBuilder::default(),
        }
    }

    fn write_pack(&mut self) -> Result<(), String> {
        if self.pack.is_empty() {
            return Ok(());
        }
        let pack = self.pack.take();
        self.inner.write(&Frame::IterationPack(Box::new(pack)))
    }
}

impl FrameSink for Packing {
    fn write(&mut self, frame: &Frame) -> Result<(), String> {
        if self.pack.push(frame) {
            if self.pack.items() >= PACK_MAX_ITEMS {
                self.write_pack()?;
            }
            return Ok(());
        }
        self.write_pack()?;
        self.inner.write(frame)
    }

    fn flush(&mut self) -> Result<(), String> {
        self.write_pack()?;
        self.inner.flush()
    }

    fn flush_all(&mut self) -> Result<(), String> {
        self.write_pack()?;
        self.inner.flush_all()
    }

    fn finish(mut self: Box<Self>) -> Result<(), String> {
        self.write_pack()?;
        self.inner.finish()
    }

    fn wants_totals(&mut self, finishing: bool) -> bool {
        self.inner.wants_totals(finishing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::CollectingSink;
    use crate::marker::{Marker, MarkerEvent};

    fn markers(t_ns: u64) -> Frame {
        Frame::Markers(vec![Marker {
            seq: t_ns,
            t_ns,
            pid: 7,
            rank: Some(0),
            iter: t_ns,
            event: MarkerEvent::Step,
        }])
    }

    /// What reaches the file, packs opened: the frames written, in their order.
    fn unpacked(frames: Vec<Frame>) -> Vec<Frame> {
        frames
            .into_iter()
            .flat_map(|f| match f {
                Frame::IterationPack(p) => p.into_frames().unwrap(),
                f => vec![f],
            })
            .collect()
    }

    #[test]
    fn every_frame_reaches_the_file_in_its_order_and_a_pack_is_cut_by_other_frames() {
        let out = CollectingSink::default();
        let mut p = Box::new(Packing::new(Box::new(out.clone())));
        let mut written = Vec::new();
        for t in 0..3_000u64 {
            let f = if t % 500 == 499 {
                Frame::ProcessExit { pid: 9, t_ns: t }
            } else {
                markers(t)
            };
            p.write(&f).unwrap();
            written.push(f);
            if t == 2_900 {
                p.flush().unwrap();
            }
        }
        p.finish().unwrap();
        let frames = out.0.lock().unwrap().clone();
        let packs = frames
            .iter()
            .filter(|f| matches!(f, Frame::IterationPack(_)))
            .count();
        // 6 stretches of 499 markers cut by 5 exits, one cut by the flush.
        assert_eq!(packs, 7);
        assert_eq!(unpacked(frames), written);
    }

    #[test]
    fn a_pack_is_written_when_full() {
        let out = CollectingSink::default();
        let mut p = Packing::new(Box::new(out.clone()));
        for t in 0..PACK_MAX_ITEMS as u64 {
            p.write(&markers(t)).unwrap();
        }
        assert_eq!(out.0.lock().unwrap().len(), 1);
    }
}
