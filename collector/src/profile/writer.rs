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
        })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one frame to the buffer (or, when the buffer is full, writes the buffer and
    /// then the frame). A frame is never split between the buffer and the file.
    pub fn write(&mut self, frame: &Frame) -> Result<(), ProfileError> {
        if let Frame::Samples(batch) = frame {
            return self.add_samples(batch);
        }
        self.write_run()?;
        self.write_frame(frame)
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

    fn write_frame(&mut self, frame: &Frame) -> Result<(), ProfileError> {
        let payload = frame.encode();
        if payload.len() > MAX_PAYLOAD as usize {
            return Err(ProfileError::FrameTooLarge {
                path: self.path.clone(),
                bytes: payload.len(),
            });
        }
        let len = (payload.len() as u32).to_le_bytes();
        self.scratch.clear();
        self.scratch.reserve(FRAME_HEADER_LEN + payload.len());
        self.scratch.extend_from_slice(&FRAME_MAGIC);
        self.scratch.push(FORMAT_VERSION);
        self.scratch.extend_from_slice(&len);
        self.scratch
            .extend_from_slice(&frame_crc(FORMAT_VERSION, len, &payload).to_le_bytes());
        self.scratch.extend_from_slice(&payload);
        self.out.write_all(&self.scratch).map_err(|e| self.io(e))
    }

    /// Writes the buffered frames to the file in one write. What is flushed survives the
    /// profiler being killed; it is not yet safe from a crash of the machine (see
    /// [`sync`](Self::sync)).
    pub fn flush(&mut self) -> Result<(), ProfileError> {
        self.write_run()?;
        self.out.flush().map_err(|e| self.io(e))
    }

    /// Flushes, then asks the OS to put the file's data on disk.
    pub fn sync(&mut self) -> Result<(), ProfileError> {
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

    fn flush(&mut self) -> Result<(), String> {
        ProfileWriter::flush(self).map_err(|e| e.to_string())
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
