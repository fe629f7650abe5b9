//! Appends frames to a profile, buffered, whole frames at a time.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use stallscope_analysis::frame::{Frame, FORMAT_VERSION};
use stallscope_analysis::sample_run::{SampleRunBuilder, RUN_MAX_BATCHES};
use stallscope_analysis::series::SampleBatch;

use super::{
    frame_crc, ProfileError, FILE_HEADER_LEN, FRAME_HEADER_LEN, FRAME_MAGIC, MAGIC, MAX_PAYLOAD,
};

/// bytes, the write buffer: far more than a second of frames at the usual rates, so the
/// caller's once-a-second [`ProfileWriter::flush`] is what normally sends frames to the file.
const BUFFER: usize = 1 << 20;

/// bytes of frames (encoded, with their lengths) a [`Frame::Deflated`] packs at most (one
/// frame alone may take 4 more); a frame larger than this is written plain. A reader inflates
/// at most [`super::MAX_INFLATED`].
pub const DEFLATE_MAX: usize = 32 << 10;

/// How long frames wait to be deflated together: markers and breakdowns deflate 1.4× in
/// the chunks of a second, 1.8× in chunks of 10 s (the 2-rank example, issue 31). A
/// profiler killed with SIGKILL loses up to this much of them; every other end writes them.
pub const DEFLATE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// miniz's compression level (0–10): 6 is zlib's default; the frames of a second are a few
/// kB, so the level costs microseconds either way.
const DEFLATE_LEVEL: u8 = 6;

/// Writes a profile: the file header at once, then frames into a buffer that reaches the
/// file on [`flush`](Self::flush) (or when it fills), always as whole frames.
///
/// Consecutive [`Frame::Samples`] are packed into one [`Frame::SampleRun`] (at most
/// [`RUN_MAX_BATCHES`]), written when another frame comes, at a flush, or when the run is
/// full, so the frames keep their order in the file.
#[derive(Debug)]
pub struct ProfileWriter {
    out: BufWriter<File>,
    path: PathBuf,
    /// One encoded frame, header and payload, reused between frames.
    scratch: Vec<u8>,
    /// Sample batches not yet written, being packed.
    run: Option<SampleRunBuilder>,
    /// Whether frames other than samples are packed into [`Frame::Deflated`].
    deflate: bool,
    /// Those not yet written: each a u32-LE length and its payload.
    pending: Vec<u8>,
    /// When the first of them came.
    pending_since: Option<std::time::Instant>,
}

impl ProfileWriter {
    /// Creates (or truncates) `path` and writes the file header, so the file is a valid,
    /// empty profile from the start.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| ProfileError::Io {
            path: path.clone(),
            source,
        };
        let mut file = File::create(&path).map_err(io)?;
        let mut header = [0u8; FILE_HEADER_LEN];
        header[..MAGIC.len()].copy_from_slice(&MAGIC);
        header[MAGIC.len()] = FORMAT_VERSION;
        file.write_all(&header).map_err(io)?;
        Ok(ProfileWriter {
            out: BufWriter::with_capacity(BUFFER, file),
            path,
            scratch: Vec::new(),
            run: None,
            deflate: false,
            pending: Vec::new(),
            pending_since: None,
        })
    }

    /// Opens `path` to add frames after the ones it holds (a collector restarted on the same
    /// job), or creates it when it does not exist or is empty. A file that is not a profile of
    /// this format is refused, never overwritten.
    pub fn append(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref().to_path_buf();
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len == 0 {
            return Self::create(&path);
        }
        let io = |source| ProfileError::Io {
            path: path.clone(),
            source,
        };
        let mut head = [0u8; FILE_HEADER_LEN];
        let n = {
            use std::io::Read;
            let mut f = File::open(&path).map_err(io)?;
            f.read(&mut head).map_err(io)?
        };
        if n < FILE_HEADER_LEN
            || head[..MAGIC.len()] != MAGIC
            || head[MAGIC.len()] != FORMAT_VERSION
        {
            return Err(ProfileError::NotAProfile {
                path: path.clone(),
                detail: format!(
                    "it does not begin with a format-{FORMAT_VERSION} profile header; not appending"
                ),
            });
        }
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io)?;
        Ok(ProfileWriter {
            out: BufWriter::with_capacity(BUFFER, file),
            path,
            scratch: Vec::new(),
            run: None,
            deflate: false,
            pending: Vec::new(),
            pending_since: None,
        })
    }

    /// Packs consecutive frames other than samples (and the header, end and notes, written
    /// plain) into [`Frame::Deflated`], written at the first flush [`DEFLATE_EVERY`] after
    /// the first of them, at a sync, before a sample or every [`DEFLATE_MAX`] bytes: a run profile's markers and breakdowns shrink ~3× (issue 31). A reader older
    /// than the variant steps over them as damage.
    pub fn deflating(mut self) -> Self {
        self.deflate = true;
        self
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one frame to the buffer (or, when the buffer is full, writes the buffer and
    /// then the frame). A frame is never split between the buffer and the file.
    pub fn write(&mut self, frame: &Frame) -> Result<(), ProfileError> {
        if let Frame::Samples(batch) = frame {
            self.write_pending()?;
            return self.add_samples(batch);
        }
        self.write_run()?;
        let packed = self.deflate
            && !matches!(
                frame,
                Frame::Header(_)
                    | Frame::End(_)
                    | Frame::SamplesThinned(_)
                    | Frame::Deflated(_)
                    | Frame::SampleRun(_)
            );
        if packed {
            let payload = frame.encode();
            if payload.len() <= DEFLATE_MAX {
                // A pack never inflates past MAX_INFLATED: when one more frame would take it
                // over DEFLATE_MAX, what is packed goes first.
                if self.pending.len() + 4 + payload.len() > DEFLATE_MAX {
                    self.write_pending()?;
                }
                self.pending_since
                    .get_or_insert_with(std::time::Instant::now);
                self.pending
                    .extend_from_slice(&(payload.len() as u32).to_le_bytes());
                self.pending.extend_from_slice(&payload);
                return Ok(());
            }
        }
        self.write_pending()?;
        self.write_frame(frame)
    }

    /// Writes the frames being packed, if any, as one [`Frame::Deflated`].
    fn write_pending(&mut self) -> Result<(), ProfileError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let packed = miniz_oxide::deflate::compress_to_vec(&self.pending, DEFLATE_LEVEL);
        self.pending.clear();
        self.pending_since = None;
        self.write_frame(&Frame::Deflated(packed))
    }

    /// Adds a batch to the run being packed, or starts a new run with it.
    fn add_samples(&mut self, batch: &SampleBatch) -> Result<(), ProfileError> {
        if let Some(run) = &mut self.run {
            if run.len() < RUN_MAX_BATCHES && run.push(batch) {
                return Ok(());
            }
        }
        self.write_run()?;
        self.run = Some(SampleRunBuilder::new(batch.clone()));
        Ok(())
    }

    /// Writes the run being packed, if any: a lone batch as the plain frame it was.
    fn write_run(&mut self) -> Result<(), ProfileError> {
        let Some(run) = self.run.take().map(SampleRunBuilder::finish) else {
            return Ok(());
        };
        if run.steps.is_empty() {
            self.write_frame(&Frame::Samples(run.first))
        } else {
            self.write_frame(&Frame::SampleRun(Box::new(run)))
        }
    }

    /// [`ProfileWriter::write`] of a frame whose encoding the caller has: `payload`, which
    /// must be `frame.encode()` (the collector has an agent's frame as it came, its node name
    /// put in), so the frame is not encoded again. A writer packing frames
    /// ([`ProfileWriter::deflating`]) encodes as usual.
    pub fn write_encoded(&mut self, frame: &Frame, payload: &[u8]) -> Result<(), ProfileError> {
        debug_assert_eq!(payload, &frame.encode()[..], "not the frame's encoding");
        if self.deflate || matches!(frame, Frame::Samples(_)) {
            return self.write(frame);
        }
        self.write_run()?;
        self.write_pending()?;
        self.write_payload(payload)
    }

    fn write_frame(&mut self, frame: &Frame) -> Result<(), ProfileError> {
        self.write_payload(&frame.encode())
    }

    /// Writes one frame's encoding with its header.
    fn write_payload(&mut self, payload: &[u8]) -> Result<(), ProfileError> {
        if payload.len() > MAX_PAYLOAD as usize {
            return Err(ProfileError::FrameTooLarge {
                path: self.path.clone(),
                bytes: payload.len(),
            });
        }
        let len = (payload.len() as u32).to_le_bytes();
        let mut header = [0u8; FRAME_HEADER_LEN];
        header[..2].copy_from_slice(&FRAME_MAGIC);
        header[2] = FORMAT_VERSION;
        header[3..7].copy_from_slice(&len);
        header[7..].copy_from_slice(&frame_crc(FORMAT_VERSION, len, payload).to_le_bytes());
        // Where the whole frame fits in the buffer, its two pieces go there one after the
        // other (no copy through `scratch`); otherwise the buffer could be written between
        // them, and a frame is never split between two writes.
        if self.out.capacity() - self.out.buffer().len() >= FRAME_HEADER_LEN + payload.len() {
            self.out.write_all(&header).map_err(|e| self.io(e))?;
            return self.out.write_all(payload).map_err(|e| self.io(e));
        }
        self.scratch.clear();
        self.scratch.reserve(FRAME_HEADER_LEN + payload.len());
        self.scratch.extend_from_slice(&header);
        self.scratch.extend_from_slice(payload);
        self.out.write_all(&self.scratch).map_err(|e| self.io(e))
    }

    /// Writes the buffered frames to the file in one write. What is flushed survives the
    /// profiler being killed; it is not yet safe from a crash of the machine (see
    /// [`sync`](Self::sync)).
    /// Frames being deflated wait up to [`DEFLATE_EVERY`].
    pub fn flush(&mut self) -> Result<(), ProfileError> {
        self.write_run()?;
        if self
            .pending_since
            .is_some_and(|t| t.elapsed() >= DEFLATE_EVERY)
        {
            self.write_pending()?;
        }
        self.out.flush().map_err(|e| self.io(e))
    }

    /// Writes every frame so far to the file, the ones waiting to be deflated included (no
    /// sync): for a reader of the file while it is written, such as the flight recorder.
    pub fn flush_all(&mut self) -> Result<(), ProfileError> {
        self.write_run()?;
        self.write_pending()?;
        self.out.flush().map_err(|e| self.io(e))
    }

    /// Flushes everything, then asks the OS to put the file's data on disk.
    pub fn sync(&mut self) -> Result<(), ProfileError> {
        self.write_run()?;
        self.write_pending()?;
        self.flush()?;
        self.out.get_ref().sync_data().map_err(|e| self.io(e))
    }

    /// Flushes and syncs, and closes the file, reporting what dropping the writer would
    /// swallow.
    pub fn finish(mut self) -> Result<(), ProfileError> {
        self.sync()
    }

    fn io(&self, source: std::io::Error) -> ProfileError {
        ProfileError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

impl stallscope_analysis::journal::FrameSink for ProfileWriter {
    fn write(&mut self, frame: &Frame) -> Result<(), String> {
        ProfileWriter::write(self, frame).map_err(|e| e.to_string())
    }

    fn write_encoded(&mut self, frame: &Frame, payload: &[u8]) -> Result<(), String> {
        ProfileWriter::write_encoded(self, frame, payload).map_err(|e| e.to_string())
    }

    fn flush(&mut self) -> Result<(), String> {
        ProfileWriter::flush(self).map_err(|e| e.to_string())
    }

    fn flush_all(&mut self) -> Result<(), String> {
        ProfileWriter::flush_all(self).map_err(|e| e.to_string())
    }

    fn finish(self: Box<Self>) -> Result<(), String> {
        ProfileWriter::finish(*self).map_err(|e| e.to_string())
    }
}

impl Drop for ProfileWriter {
    /// Puts the batches still being packed into the buffer, which dropping then flushes, as
    /// it flushes every other frame written.
    fn drop(&mut self) {
        let _ = self.write_run();
        let _ = self.write_pending();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{every_variant, read_profile};
    use stallscope_analysis::series::{SeriesDecl, SeriesId, SeriesKind};

    #[test]
    fn a_new_profile_is_readable_and_frames_arrive_on_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ssprof");
        let mut w = ProfileWriter::create(&path).unwrap();
        assert_eq!(read_profile(&path).unwrap(), Default::default());

        let frames = every_variant();
        for f in &frames {
            w.write(f).unwrap();
        }
        // Not yet flushed: a kill -9 now would lose them, and the file says so cleanly.
        let before = read_profile(&path).unwrap();
        assert!(before.frames.is_empty() && before.issues.is_empty());

        w.flush().unwrap();
        assert_eq!(read_profile(&path).unwrap().frames, frames);
        w.write(&frames[0]).unwrap();
        w.finish().unwrap();
        assert_eq!(read_profile(&path).unwrap().frames.len(), frames.len() + 1);
    }

    #[test]
    fn deflated_frames_read_back_as_written_and_are_smaller() {
        use stallscope_analysis::marker::{Marker, MarkerEvent};
        let dir = tempfile::tempdir().unwrap();
        let (plain, packed) = (dir.path().join("plain"), dir.path().join("packed"));
        // Every variant, then a minute of a rank's markers every 100 ms, in order.
        let mut frames = every_variant();
        for tick in 0..600u64 {
            let t = 1_000_000_000_000 + tick * 100_000_000;
            let mark = |seq: u64, dt: u64, event: MarkerEvent| Marker {
                seq,
                t_ns: t + dt,
                pid: 4242,
                rank: Some(0),
                iter: tick,
                event,
            };
            frames.push(Frame::Markers(vec![
                mark(3 * tick, 0, MarkerEvent::Begin("comm".into())),
                mark(3 * tick + 1, 31_234_567, MarkerEvent::End("comm".into())),
                mark(3 * tick + 2, 31_300_001, MarkerEvent::Step),
            ]));
        }
        let mut a = ProfileWriter::create(&plain).unwrap();
        let mut b = ProfileWriter::create(&packed).unwrap().deflating();
        for (i, f) in frames.iter().enumerate() {
            a.write(f).unwrap();
            b.write(f).unwrap();
            if i % 10 == 0 {
                b.flush().unwrap();
            }
        }
        a.finish().unwrap();
        b.finish().unwrap();
        let read = read_profile(&packed).unwrap();
        assert!(read.issues.is_empty(), "{:?}", read.issues);
        assert_eq!(read.frames, frames);
        let (plain, packed) = (
            std::fs::metadata(&plain).unwrap().len(),
            std::fs::metadata(&packed).unwrap().len(),
        );
        assert!(packed * 2 < plain, "{packed} bytes deflated, {plain} plain");
    }

    #[test]
    fn flush_all_puts_the_frames_waiting_to_be_deflated_in_the_file() {
        use stallscope_analysis::marker::{Marker, MarkerEvent};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ssprof");
        let header = every_variant().remove(0);
        assert!(matches!(header, Frame::Header(_)));
        let markers = Frame::Markers(vec![Marker {
            seq: 0,
            t_ns: 1,
            pid: 7,
            rank: Some(0),
            iter: 0,
            event: MarkerEvent::Step,
        }]);
        let mut w = ProfileWriter::create(&path).unwrap().deflating();
        w.write(&header).unwrap();
        w.write(&markers).unwrap();
        let has_markers = || {
            read_profile(&path)
                .unwrap()
                .frames
                .iter()
                .any(|f| matches!(f, Frame::Markers(_)))
        };
        w.flush().unwrap();
        assert!(
            !has_markers(),
            "flush waits to deflate them with the next ones"
        );
        w.flush_all().unwrap();
        assert!(has_markers(), "a reader of the file sees them now");
        w.finish().unwrap();
    }

    #[test]
    fn create_truncates_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ssprof");
        std::fs::write(&path, vec![b'x'; 1000]).unwrap();
        let mut w = ProfileWriter::create(&path).unwrap();
        w.write(&every_variant()[0]).unwrap();
        w.finish().unwrap();
        let read = read_profile(&path).unwrap();
        assert_eq!(read.frames, vec![every_variant()[0].clone()]);
        assert!(read.issues.is_empty());
    }

    #[test]
    fn an_oversized_frame_is_refused_and_writing_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ssprof");
        let mut w = ProfileWriter::create(&path).unwrap();
        let huge = Frame::Series(SeriesDecl {
            id: SeriesId(1),
            name: "x".repeat(MAX_PAYLOAD as usize + 1),
            unit: "bytes".into(),
            kind: SeriesKind::Gauge,
            labels: vec![],
        });
        let err = w.write(&huge).unwrap_err();
        assert!(
            matches!(err, ProfileError::FrameTooLarge { bytes, .. } if bytes > MAX_PAYLOAD as usize)
        );
        assert!(err.to_string().contains("run.ssprof"), "{err}");
        let small = every_variant().remove(1);
        w.write(&small).unwrap();
        w.finish().unwrap();
        let read = read_profile(&path).unwrap();
        assert_eq!(read.frames, vec![small]);
        assert!(read.issues.is_empty());
    }

    #[test]
    fn an_unwritable_path_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("run.ssprof");
        let err = ProfileWriter::create(&path).unwrap_err();
        assert!(matches!(err, ProfileError::Io { .. }));
        assert!(err.to_string().contains("no-such-dir"), "{err}");
    }
}
