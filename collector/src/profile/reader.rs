//! Reads a profile frame by frame, stepping over damage and stopping cleanly at a torn tail.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use stallscope_analysis::frame::{Frame, FORMAT_VERSION};

use super::{
    frame_crc, ProfileError, FILE_HEADER_LEN, FRAME_HEADER_LEN, FRAME_MAGIC, MAGIC, MAX_PAYLOAD,
};

/// bytes read from the file at a time.
const CHUNK: usize = 64 * 1024;

/// bytes of checksum work a reader may spend on frame headers whose CRC then fails, before
/// any file offset earns more: enough to check one frame of the largest size.
const CRC_WASTE_ALLOWANCE: u64 = MAX_PAYLOAD as u64 + FRAME_HEADER_LEN as u64;

/// bytes of failed checksum work each byte read past earns. Each `SF` + version look-alike
/// may claim up to 16 MiB, so without a bound a file of fake headers costs 16 MiB of CRC per
/// 7 bytes (hours for 100 MiB); with it the work is linear in the file's size.
const CRC_WASTE_PER_BYTE: u64 = 8;

/// Why bytes in the middle of a profile were skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// The bytes where a frame should begin are not a frame header.
    NotAFrame,
    /// A frame header names a format version other than the file's.
    Version(u8),
    /// A frame header claims a payload over [`super::MAX_PAYLOAD`] bytes.
    Oversize(u32),
    /// A frame header claims a payload (bytes) that runs past the end of the file, yet a
    /// good frame follows it: the length is damaged, the file is not merely cut short.
    PastEnd(u32),
    /// The frame's CRC does not match its bytes.
    Crc {
        /// CRC in the frame header.
        stored: u32,
        /// CRC of the bytes as read.
        computed: u32,
    },
    /// The CRC checks but the payload is not a frame this build knows (postcard's message).
    Undecodable(String),
    /// A frame header claims a payload (bytes) whose checksum was not computed: the failed
    /// checks before it already spent what the bytes read so far allow
    /// (`CRC_WASTE_PER_BYTE` per byte). Only a file of many fake frame headers gets here.
    Unchecked(u32),
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::NotAFrame => f.write_str("no frame header where a frame should begin"),
            Corruption::Version(v) => write!(f, "a frame header names format version {v}"),
            Corruption::Oversize(len) => {
                write!(
                    f,
                    "a frame claims {len} bytes, over the {MAX_PAYLOAD}-byte limit"
                )
            }
            Corruption::PastEnd(len) => write!(
                f,
                "a frame claims {len} bytes, more than the file holds, yet good frames follow"
            ),
            Corruption::Crc { stored, computed } => write!(
                f,
                "a frame's checksum does not match (stored {stored:08x}, computed {computed:08x})"
            ),
            Corruption::Undecodable(msg) => write!(
                f,
                "a frame's checksum matches but its contents do not decode ({msg}); \
                 a newer stallscope may have written it"
            ),
            Corruption::Unchecked(len) => write!(
                f,
                "a frame claims {len} bytes, and the damage before it already cost more \
                 checksum work than the file's size allows, so it was not checked"
            ),
        }
    }
}

/// Something wrong inside a profile that reading stepped over. Offsets and sizes are bytes
/// from the start of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadIssue {
    /// The file ends inside a frame: normal when the profiler was killed.
    TornTail {
        /// Where the partial frame begins.
        offset: u64,
        /// bytes of it present.
        bytes: u64,
    },
    /// Damaged bytes were skipped; reading went on at the next good frame after them.
    Corrupt {
        /// Where the damage begins.
        offset: u64,
        /// bytes skipped, up to the next good frame or the end of the file.
        bytes: u64,
        /// What was wrong with the first of them.
        reason: Corruption,
    },
}

impl ReadIssue {
    /// Where in the file the issue begins, bytes.
    pub fn offset(&self) -> u64 {
        match self {
            ReadIssue::TornTail { offset, .. } | ReadIssue::Corrupt { offset, .. } => *offset,
        }
    }

    /// One sentence for a person.
    pub fn describe(&self) -> String {
        match self {
            ReadIssue::TornTail { offset, bytes } => format!(
                "the profile ends in a partial frame at byte {offset} ({bytes} bytes): \
                 stallscope was probably killed; everything before it was read"
            ),
            ReadIssue::Corrupt {
                offset,
                bytes,
                reason,
            } => format!(
                "the profile is damaged at byte {offset} ({reason}): {bytes} bytes up to byte {} \
                 were skipped; every good frame before and after them was read",
                offset + bytes
            ),
        }
    }
}

impl fmt::Display for ReadIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A whole profile in memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadProfile {
    /// Every good frame, in file order.
    pub frames: Vec<Frame>,
    /// What was stepped over, in file order.
    pub issues: Vec<ReadIssue>,
}

/// Reads the whole profile at `path`.
pub fn read_profile(path: impl AsRef<Path>) -> Result<ReadProfile, ProfileError> {
    let mut reader = ProfileReader::open(path)?;
    let frames = reader.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok(ReadProfile {
        frames,
        issues: reader.take_issues(),
    })
}

/// Streams the frames of a profile, holding at most one frame (and one read chunk) in memory.
///
/// Yields good frames in file order, a [`Frame::SampleRun`] as the [`Frame::Samples`] it
/// packs (unpacked one batch at a time: a few bytes of steps may stand for many batches); damage and a torn tail are not errors but
/// [`ReadIssue`]s, collected in [`issues`](Self::issues) as they are met. Only an I/O error
/// ends the stream with `Err`, after which it yields nothing.
#[derive(Debug)]
pub struct ProfileReader<R = File> {
    src: R,
    path: PathBuf,
    version: u8,
    /// Bytes read from `src` and not yet dropped; `buf[pos..]` is unread.
    buf: Vec<u8>,
    pos: usize,
    /// File offset of `buf[0]`.
    base: u64,
    eof: bool,
    done: bool,
    issues: Vec<ReadIssue>,
    /// The run being read, unpacked one batch at a time.
    unpacked: Option<stallscope_analysis::sample_run::Unpacking>,
    /// The [`Frame::Deflated`] being read, inflated, and where its next frame starts: its
    /// frames are decoded one at a time, as the file's are.
    inflated: Option<(Vec<u8>, usize, u64)>,
    /// The frames of the [`Frame::IterationPack`] last read, not yet given.
    opened: std::collections::VecDeque<Frame>,
    /// bytes, the payload of the frame last read (what a run's width is checked against).
    last_payload: usize,
    /// bytes hashed by CRC checks that failed (the cost of damage and fake headers).
    crc_wasted: u64,
    /// bytes hashed by every CRC check.
    crc_hashed: u64,
}

impl ProfileReader<File> {
    /// Opens `path` and checks its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        ProfileReader::new(file, path)
    }
}

impl<R: Read> ProfileReader<R> {
    /// Reads and checks the header from `src`; `path` names it in errors.
    pub fn new(src: R, path: impl Into<PathBuf>) -> Result<Self, ProfileError> {
        let mut r = ProfileReader {
            src,
            path: path.into(),
            version: 0,
            buf: Vec::new(),
            pos: 0,
            base: 0,
            eof: false,
            done: false,
            issues: Vec::new(),
            unpacked: None,
            inflated: None,
            opened: Default::default(),
            last_payload: 0,
            crc_wasted: 0,
            crc_hashed: 0,
        };
        let got = r.fill(FILE_HEADER_LEN).map_err(|e| r.io(e))?;
        let head = &r.buf[..got.min(FILE_HEADER_LEN)];
        if head.is_empty() {
            return Err(r.not_a_profile("the file is empty".into()));
        }
        if head.len() < FILE_HEADER_LEN && MAGIC.starts_with(&head[..head.len().min(MAGIC.len())]) {
            return Err(r.not_a_profile(format!(
                "the file ends inside its header, after {} bytes",
                head.len()
            )));
        }
        if !head.starts_with(&MAGIC) {
            let shown = r.buf.len().min(16);
            return Err(r.not_a_profile(format!(
                "it begins with b\"{}\" where a profile begins with b\"SSPROF\\r\\n\"",
                r.buf[..shown].escape_ascii()
            )));
        }
        r.version = head[MAGIC.len()];
        if r.version == 0 {
            return Err(r.not_a_profile("its header names format version 0".into()));
        }
        if r.version > FORMAT_VERSION {
            return Err(ProfileError::NewerVersion {
                path: r.path,
                found: r.version,
                supported: FORMAT_VERSION,
            });
        }
        r.pos = FILE_HEADER_LEN;
        Ok(r)
    }

    /// The format version in the file's header.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// File offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// The issues met so far, in file order.
    pub fn issues(&self) -> &[ReadIssue] {
        &self.issues
    }

    /// Takes the issues met so far, leaving none.
    pub fn take_issues(&mut self) -> Vec<ReadIssue> {
        std::mem::take(&mut self.issues)
    }

    fn not_a_profile(&self, detail: String) -> ProfileError {
        ProfileError::NotAProfile {
            path: self.path.clone(),
            detail,
        }
    }

    fn io(&self, source: io::Error) -> ProfileError {
        ProfileError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn avail(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Reads until `want` bytes are unread or the file ends; returns how many are unread.
    fn fill(&mut self, want: usize) -> io::Result<usize> {
        if self.avail() >= want || self.eof {
            return Ok(self.avail());
        }
        self.buf.drain(..self.pos);
        self.base += self.pos as u64;
        self.pos = 0;
        while !self.eof && self.buf.len() < want {
            let ask = CHUNK.max(want - self.buf.len());
            let got = (&mut self.src)
                .take(ask as u64)
                .read_to_end(&mut self.buf)?;
            self.eof = got < ask;
        }
        Ok(self.avail())
    }

    /// The frame header prefix (magic and version) at `buf[at..]`, as far as it is present.
    fn header_prefix_matches(&self, at: usize) -> bool {
        let want = [FRAME_MAGIC[0], FRAME_MAGIC[1], self.version];
        let have = &self.buf[at..self.buf.len().min(at + want.len())];
        have == &want[..have.len()]
    }

    /// The payload length of the frame header at `buf[pos..]` (11 bytes must be present).
    fn claimed_len(&self) -> u32 {
        let b = &self.buf[self.pos + 3..self.pos + 7];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Whether the checksum of a frame claiming `len` bytes may be computed: failed checks
    /// may cost [`CRC_WASTE_ALLOWANCE`] plus [`CRC_WASTE_PER_BYTE`] per byte read so far.
    fn may_check(&self, len: u32) -> bool {
        let allowed = CRC_WASTE_ALLOWANCE + CRC_WASTE_PER_BYTE * self.offset();
        self.crc_wasted + u64::from(len) <= allowed
    }

    /// Checks the CRC of the whole frame at `buf[pos..]`; `Ok` or (stored, computed). A
    /// failed check is charged to the waste [`may_check`](Self::may_check) bounds.
    fn check_crc(&mut self, len: u32) -> Result<(), (u32, u32)> {
        let h = &self.buf[self.pos..self.pos + FRAME_HEADER_LEN];
        let payload = &self.buf[self.pos + FRAME_HEADER_LEN..][..len as usize];
        let stored = u32::from_le_bytes([h[7], h[8], h[9], h[10]]);
        let computed = frame_crc(h[2], [h[3], h[4], h[5], h[6]], payload);
        self.crc_hashed += u64::from(len);
        if stored == computed {
            Ok(())
        } else {
            self.crc_wasted += u64::from(len);
            Err((stored, computed))
        }
    }

    /// Moves past the bad byte at `pos` to the next frame whose header and CRC check, or to
    /// the end of the file. Returns whether a good frame was found. A candidate header whose
    /// check the waste bound no longer allows ([`may_check`](Self::may_check)) is passed
    /// over unchecked, so the scan costs at most a constant times the bytes it passes.
    fn resync(&mut self) -> io::Result<bool> {
        self.pos += 1;
        loop {
            if self.fill(FRAME_HEADER_LEN)? < FRAME_HEADER_LEN {
                // Too little is left to hold a frame that could be checked.
                self.pos = self.buf.len();
                return Ok(false);
            }
            let window = &self.buf[self.pos..];
            let want = [FRAME_MAGIC[0], FRAME_MAGIC[1], self.version];
            match window.windows(3).position(|w| w == want) {
                None => {
                    // Keep the last two bytes: they may begin a header that straddles reads.
                    self.pos = self.buf.len() - 2;
                    continue;
                }
                Some(i) => self.pos += i,
            }
            if self.fill(FRAME_HEADER_LEN)? < FRAME_HEADER_LEN {
                self.pos = self.buf.len();
                return Ok(false);
            }
            let len = self.claimed_len();
            if len <= MAX_PAYLOAD && self.may_check(len) {
                let total = FRAME_HEADER_LEN + len as usize;
                if self.fill(total)? >= total && self.check_crc(len).is_ok() {
                    return Ok(true);
                }
            }
            self.pos += 1;
        }
    }

    /// Skips damage that begins at `pos` and records it.
    fn skip_corrupt(&mut self, reason: Corruption) -> io::Result<()> {
        let offset = self.offset();
        self.resync()?;
        self.issues.push(ReadIssue::Corrupt {
            offset,
            bytes: self.offset() - offset,
            reason,
        });
        Ok(())
    }

    fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            let start = self.offset();
            let avail = self.fill(FRAME_HEADER_LEN)?;
            if avail == 0 {
                return Ok(None);
            }
            if !self.header_prefix_matches(self.pos) {
                let h = &self.buf[self.pos..];
                let reason = match h {
                    [b'S', b'F', v, ..] => Corruption::Version(*v),
                    _ => Corruption::NotAFrame,
                };
                self.skip_corrupt(reason)?;
                continue;
            }
            if avail < FRAME_HEADER_LEN {
                self.pos = self.buf.len();
                self.issues.push(ReadIssue::TornTail {
                    offset: start,
                    bytes: avail as u64,
                });
                return Ok(None);
            }
            let len = self.claimed_len();
            if len > MAX_PAYLOAD {
                self.skip_corrupt(Corruption::Oversize(len))?;
                continue;
            }
            let total = FRAME_HEADER_LEN + len as usize;
            if self.fill(total)? < total {
                // Either the file was cut short inside this frame, or its length is damaged
                // and good frames follow: only a scan can tell.
                if self.resync()? {
                    self.issues.push(ReadIssue::Corrupt {
                        offset: start,
                        bytes: self.offset() - start,
                        reason: Corruption::PastEnd(len),
                    });
                    continue;
                }
                self.issues.push(ReadIssue::TornTail {
                    offset: start,
                    bytes: self.offset() - start,
                });
                return Ok(None);
            }
            if !self.may_check(len) {
                self.skip_corrupt(Corruption::Unchecked(len))?;
                continue;
            }
            if let Err((stored, computed)) = self.check_crc(len) {
                self.skip_corrupt(Corruption::Crc { stored, computed })?;
                continue;
            }
            let decoded = Frame::decode(&self.buf[self.pos + FRAME_HEADER_LEN..][..len as usize]);
            self.pos += total;
            self.last_payload = len as usize;
            match decoded {
                Ok(frame) => return Ok(Some(frame)),
                Err(e) => self.issues.push(ReadIssue::Corrupt {
                    offset: start,
                    bytes: total as u64,
                    reason: Corruption::Undecodable(e.to_string()),
                }),
            }
        }
    }
}

impl<R: Read> Iterator for ProfileReader<R> {
    type Item = Result<Frame, ProfileError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(batch) = self.unpacked.as_mut().and_then(Iterator::next) {
                return Some(Ok(Frame::Samples(batch)));
            }
            self.unpacked = None;
            if let Some(frame) = self.opened.pop_front() {
                return Some(Ok(frame));
            }
            if let Some(frame) = self.next_inflated() {
                let offset = self.inflated.as_ref().map_or(0, |(_, _, o)| *o);
                if let Some(frame) = self.open_pack(frame, offset, 0) {
                    return Some(Ok(frame));
                }
                continue;
            }
            if self.done {
                return None;
            }
            let start = self.offset();
            match self.next_frame() {
                Ok(Some(Frame::SampleRun(run))) => match run.into_batches(self.last_payload) {
                    Ok(batches) => self.unpacked = Some(batches),
                    // Its checksum held, so it is whole: it was written so (or crafted).
                    Err(e) => {
                        let end = self.offset();
                        self.issues.push(ReadIssue::Corrupt {
                            offset: start,
                            bytes: end - start,
                            reason: Corruption::Undecodable(e.to_string()),
                        });
                    }
                },
                Ok(Some(Frame::Deflated(packed))) => match inflate(&packed) {
                    Ok(bytes) => self.inflated = Some((bytes, 0, start)),
                    Err(why) => {
                        let end = self.offset();
                        self.issues.push(ReadIssue::Corrupt {
                            offset: start,
                            bytes: end - start,
                            reason: Corruption::Undecodable(why),
                        });
                    }
                },
                Ok(Some(frame)) => {
                    let bytes = self.offset() - start;
                    if let Some(frame) = self.open_pack(frame, start, bytes) {
                        return Some(Ok(frame));
                    }
                }
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(self.io(e)));
                }
            }
        }
    }
}

/// The bytes a [`Frame::Deflated`] packs, or why they cannot be read: they inflate past
/// [`super::MAX_INFLATED`].
fn inflate(packed: &[u8]) -> Result<Vec<u8>, String> {
    miniz_oxide::inflate::decompress_to_vec_with_limit(packed, super::MAX_INFLATED).map_err(|e| {
        format!(
            "deflated frames do not inflate within {} bytes: {e}",
            super::MAX_INFLATED
        )
    })
}

/// The next of the frames at `bytes[*at..]` (each a u32-LE length and its payload), or why
/// it cannot be read: its length runs past the end, it does not decode, or it is itself
/// packed (a writer never nests them).
fn next_packed(bytes: &[u8], at: &mut usize) -> Result<Frame, String> {
    let rest = &bytes[*at..];
    let len = rest
        .get(..4)
        .map(|l| u32::from_le_bytes(l.try_into().expect("4 bytes")) as usize)
        .filter(|len| *len <= rest.len() - 4)
        .ok_or("a deflated frame's length runs past the end")?;
    let frame = Frame::decode(&rest[4..4 + len]).map_err(|e| e.to_string())?;
    if matches!(frame, Frame::Deflated(_) | Frame::SampleRun(_)) {
        return Err("a packed frame inside deflated frames".into());
    }
    *at += 4 + len;
    Ok(frame)
}

impl<R: Read> ProfileReader<R> {
    /// `frame`, or, for a [`Frame::IterationPack`], nothing: its frames are queued to be
    /// given one at a time (damage in it, `bytes` at `offset`, is an issue).
    fn open_pack(&mut self, frame: Frame, offset: u64, bytes: u64) -> Option<Frame> {
        let Frame::IterationPack(pack) = frame else {
            return Some(frame);
        };
        match pack.into_frames() {
            Ok(frames) => self.opened.extend(frames),
            Err(why) => self.issues.push(ReadIssue::Corrupt {
                offset,
                bytes,
                reason: Corruption::Undecodable(why),
            }),
        }
        None
    }

    /// The next frame of the [`Frame::Deflated`] being read; damage in it is an issue, and
    /// the rest of it is stepped over (its checksum held, so it was written so).
    fn next_inflated(&mut self) -> Option<Frame> {
        let (bytes, at, offset) = self.inflated.as_mut()?;
        if *at >= bytes.len() {
            self.inflated = None;
            return None;
        }
        match next_packed(bytes, at) {
            Ok(frame) => Some(frame),
            Err(why) => {
                let offset = *offset;
                self.inflated = None;
                self.issues.push(ReadIssue::Corrupt {
                    offset,
                    bytes: 0,
                    reason: Corruption::Undecodable(why),
                });
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{every_variant, ProfileWriter};
    use stallscope_analysis::series::{SampleBatch, SeriesId};

    /// Writes `frames` with the real writer; returns the file's bytes and each frame's
    /// (start, end) offsets.
    fn written(frames: &[Frame]) -> (Vec<u8>, Vec<(usize, usize)>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.ssprof");
        let mut w = ProfileWriter::create(&path).unwrap();
        let mut spans = Vec::new();
        let mut at = FILE_HEADER_LEN;
        for f in frames {
            w.write(f).unwrap();
            let end = at + FRAME_HEADER_LEN + f.encode().len();
            spans.push((at, end));
            at = end;
        }
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), at);
        (bytes, spans)
    }

    fn read_bytes(bytes: &[u8]) -> Result<ReadProfile, ProfileError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.ssprof");
        std::fs::write(&path, bytes).unwrap();
        read_profile(&path)
    }

    fn raw_frame(payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_le_bytes();
        let mut out = FRAME_MAGIC.to_vec();
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&len);
        out.extend_from_slice(&frame_crc(FORMAT_VERSION, len, payload).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn without(frames: &[Frame], i: usize) -> Vec<Frame> {
        let mut v = frames.to_vec();
        v.remove(i);
        v
    }

    /// Every variant, then a large sample batch last so the last frame spans many bytes.
    fn frames() -> Vec<Frame> {
        let mut v = every_variant();
        v.push(Frame::Samples(SampleBatch {
            t_ns: 99,
            dur_ns: 5,
            values: (0..300).map(|i| (SeriesId(i), 1u64 << (i % 64))).collect(),
        }));
        v
    }

    #[test]
    fn every_variant_round_trips() {
        let frames = frames();
        let (bytes, _) = written(&frames);
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.frames, frames);
        assert!(read.issues.is_empty());
    }

    #[test]
    fn the_streaming_reader_reads_many_frames_across_chunks() {
        let all = frames();
        let frames: Vec<Frame> = (0..6000).map(|i| all[i % all.len()].clone()).collect();
        let (bytes, _) = written(&frames);
        assert!(bytes.len() > 10 * CHUNK);
        let mut r = ProfileReader::new(io::Cursor::new(&bytes), "mem").unwrap();
        assert_eq!(r.version(), FORMAT_VERSION);
        let got: Vec<Frame> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(got, frames);
        assert!(r.issues().is_empty());
        assert_eq!(r.offset(), bytes.len() as u64);
        assert!(r.buf.capacity() < 4 * CHUNK, "{}", r.buf.capacity());
    }

    #[test]
    fn a_header_only_profile_is_empty_and_clean() {
        let (bytes, _) = written(&[]);
        assert_eq!(bytes.len(), FILE_HEADER_LEN);
        assert_eq!(read_bytes(&bytes).unwrap(), ReadProfile::default());
    }

    #[test]
    fn a_cut_anywhere_in_the_last_frame_is_a_torn_tail() {
        let frames = frames();
        let n = frames.len();
        let (bytes, spans) = written(&frames);
        let (start, end) = spans[n - 1];
        assert!(end - start > 300);

        let read = read_bytes(&bytes[..start]).unwrap();
        assert_eq!(read.frames, frames[..n - 1]);
        assert!(read.issues.is_empty());

        for cut in start + 1..end {
            let read = read_bytes(&bytes[..cut]).unwrap();
            assert_eq!(read.frames, frames[..n - 1], "cut at {cut}");
            assert_eq!(
                read.issues,
                vec![ReadIssue::TornTail {
                    offset: start as u64,
                    bytes: (cut - start) as u64
                }],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_flipped_byte_anywhere_in_a_middle_frame_costs_that_frame_only() {
        let frames = frames();
        let (bytes, spans) = written(&frames);
        let victim = 3; // the markers
        let (start, end) = spans[victim];
        for at in start..end {
            let mut bad = bytes.clone();
            bad[at] ^= 0xff;
            let read = read_bytes(&bad).unwrap();
            assert_eq!(read.frames, without(&frames, victim), "flip at {at}");
            let [ReadIssue::Corrupt {
                offset,
                bytes: skipped,
                reason,
            }] = read.issues.as_slice()
            else {
                panic!("flip at {at}: {:?}", read.issues);
            };
            assert_eq!((*offset, *skipped), (start as u64, (end - start) as u64));
            match at - start {
                0 | 1 => assert_eq!(*reason, Corruption::NotAFrame),
                2 => assert_eq!(*reason, Corruption::Version(FORMAT_VERSION ^ 0xff)),
                3..=5 => assert!(matches!(
                    reason,
                    Corruption::Crc { .. } | Corruption::PastEnd(_)
                )),
                6 => assert!(matches!(reason, Corruption::Oversize(_))),
                _ => assert!(matches!(reason, Corruption::Crc { .. }), "{reason:?}"),
            }
        }
    }

    #[test]
    fn a_garbage_length_loses_no_frame_after_it() {
        let frames = frames();
        let (bytes, spans) = written(&frames);
        let victim = 4;
        let (start, end) = spans[victim];
        let true_len = (end - start - FRAME_HEADER_LEN) as u32;
        let cases = [
            (0, "crc"),
            (1, "crc"),
            (true_len - 1, "crc"),
            (true_len + 1, "crc"),
            (1000, "crc"),
            (10 << 20, "past end"),
            (MAX_PAYLOAD, "past end"),
            (MAX_PAYLOAD + 1, "oversize"),
            (u32::MAX, "oversize"),
        ];
        for (len, kind) in cases {
            let mut bad = bytes.clone();
            bad[start + 3..start + 7].copy_from_slice(&len.to_le_bytes());
            let read = read_bytes(&bad).unwrap();
            assert_eq!(read.frames, without(&frames, victim), "length {len}");
            assert_eq!(read.issues.len(), 1, "length {len}: {:?}", read.issues);
            let ReadIssue::Corrupt { offset, reason, .. } = &read.issues[0] else {
                panic!("length {len}: {:?}", read.issues);
            };
            assert_eq!(*offset, start as u64);
            let got = match reason {
                Corruption::Crc { .. } => "crc",
                Corruption::PastEnd(_) => "past end",
                Corruption::Oversize(_) => "oversize",
                other => panic!("length {len}: {other:?}"),
            };
            assert_eq!(got, kind, "length {len}");
        }
    }

    #[test]
    fn an_oversize_frame_is_rejected_even_when_its_bytes_are_all_there() {
        let frames = frames();
        let (good, spans) = written(&frames);
        let (start, _) = spans[2];
        // A frame of 16 MiB + 1 with a correct CRC, as a buggy writer might leave it.
        let huge = raw_frame(&vec![0u8; MAX_PAYLOAD as usize + 1]);
        let mut bytes = good[..start].to_vec();
        bytes.extend_from_slice(&huge);
        bytes.extend_from_slice(&good[start..]);

        let mut r = ProfileReader::new(io::Cursor::new(&bytes), "mem").unwrap();
        let got: Vec<Frame> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(got, frames);
        assert_eq!(
            r.issues(),
            [ReadIssue::Corrupt {
                offset: start as u64,
                bytes: huge.len() as u64,
                reason: Corruption::Oversize(MAX_PAYLOAD + 1)
            }]
        );
    }

    #[test]
    fn a_long_run_of_garbage_is_skipped_to_the_next_frame() {
        let frames = frames();
        let (good, spans) = written(&frames);
        let (start, _) = spans[5];
        let garbage_len = 3 * CHUNK + 7;
        let mut bytes = good[..start].to_vec();
        // Frame-header look-alikes throughout, some straddling read boundaries.
        bytes.extend((0..garbage_len).map(|i| b"xSF\x01"[i % 4]));
        bytes.extend_from_slice(&good[start..]);
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.frames, frames);
        assert_eq!(
            read.issues,
            vec![ReadIssue::Corrupt {
                offset: start as u64,
                bytes: garbage_len as u64,
                reason: Corruption::NotAFrame
            }]
        );
    }

    /// A crafted file of many fake frame headers, each claiming a megabyte that is there to
    /// check: the checksum work stays linear in the file's size (it was 1 MiB per fake), and
    /// every good frame around them is read.
    #[test]
    fn many_fake_frame_headers_cost_checksum_work_linear_in_the_file() {
        let frames = frames();
        let (good, spans) = written(&frames);
        let (start, _) = spans[5];
        let fake_len: u32 = 1 << 20;
        let fakes = 500;
        let mut bytes = good[..start].to_vec();
        for _ in 0..fakes {
            bytes.extend_from_slice(&FRAME_MAGIC);
            bytes.push(FORMAT_VERSION);
            bytes.extend_from_slice(&fake_len.to_le_bytes());
            bytes.extend_from_slice(&[0xee; 4]);
        }
        let damage = bytes.len() - start + fake_len as usize;
        bytes.resize(start + damage, b'x');
        bytes.extend_from_slice(&good[start..]);

        let mut r = ProfileReader::new(io::Cursor::new(&bytes), "mem").unwrap();
        let got: Vec<Frame> = r.by_ref().map(Result::unwrap).collect();
        assert_eq!(got, frames);
        assert_eq!(
            r.issues(),
            [ReadIssue::Corrupt {
                offset: start as u64,
                bytes: damage as u64,
                reason: Corruption::Crc {
                    stored: 0xeeee_eeee,
                    computed: frame_crc(
                        FORMAT_VERSION,
                        fake_len.to_le_bytes(),
                        &bytes[start + FRAME_HEADER_LEN..][..fake_len as usize]
                    ),
                },
            }]
        );
        let generous = 2 * u64::from(MAX_PAYLOAD) + 16 * bytes.len() as u64;
        assert!(
            r.crc_hashed <= generous,
            "{} bytes hashed for a file of {}",
            r.crc_hashed,
            bytes.len()
        );
    }

    #[test]
    fn a_zeroed_tail_after_a_crash_keeps_everything_before_it() {
        let frames = frames();
        let (mut bytes, _) = written(&frames);
        let end = bytes.len();
        bytes.extend_from_slice(&[0u8; 4096]);
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.frames, frames);
        assert_eq!(
            read.issues,
            vec![ReadIssue::Corrupt {
                offset: end as u64,
                bytes: 4096,
                reason: Corruption::NotAFrame
            }]
        );
    }

    #[test]
    fn a_frame_this_build_cannot_decode_is_skipped_whole() {
        let frames = frames();
        let (good, spans) = written(&frames);
        let (start, _) = spans[1];
        let unknown = raw_frame(&[200, 1, 2, 3]); // variant 200: a newer writer's frame
        let mut bytes = good[..start].to_vec();
        bytes.extend_from_slice(&unknown);
        bytes.extend_from_slice(&good[start..]);
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.frames, frames);
        assert!(matches!(
            read.issues.as_slice(),
            [ReadIssue::Corrupt { offset, bytes, reason: Corruption::Undecodable(_) }]
                if *offset == start as u64 && *bytes == unknown.len() as u64
        ));
    }

    #[test]
    fn what_is_not_a_profile_is_named() {
        let err = read_bytes(b"PK\x03\x04\x14\x00\x00\x00rest of a zip").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ProfileError::NotAProfile { .. }));
        assert!(msg.contains("p.ssprof"), "{msg}");
        assert!(msg.contains(r"PK\x03\x04\x14\x00"), "{msg}");

        let msg = read_bytes(b"").unwrap_err().to_string();
        assert!(msg.contains("the file is empty"), "{msg}");
        let msg = read_bytes(b"SSPROF").unwrap_err().to_string();
        assert!(msg.contains("ends inside its header"), "{msg}");
        let msg = read_bytes(b"SSPROF\n\n\x01").unwrap_err().to_string();
        assert!(msg.contains("not a stallscope profile"), "{msg}");
    }

    #[test]
    fn a_newer_profile_asks_for_an_upgrade() {
        let (mut bytes, _) = written(&frames());
        bytes[MAGIC.len()] = FORMAT_VERSION + 1;
        let err = read_bytes(&bytes).unwrap_err();
        assert!(
            matches!(err, ProfileError::NewerVersion { found, supported, .. }
                if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION)
        );
        let msg = err.to_string();
        assert!(msg.contains("upgrade stallscope"), "{msg}");
        assert!(msg.contains("p.ssprof"), "{msg}");
    }

    #[test]
    fn a_missing_file_is_an_io_error_naming_it() {
        let err = read_profile("/nonexistent/stallscope/p.ssprof").unwrap_err();
        assert!(matches!(err, ProfileError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/stallscope/p.ssprof"));
    }

    #[test]
    fn issues_read_as_sentences() {
        let torn = ReadIssue::TornTail {
            offset: 12345,
            bytes: 412,
        };
        assert_eq!(
            torn.describe(),
            "the profile ends in a partial frame at byte 12345 (412 bytes): stallscope was \
             probably killed; everything before it was read"
        );
        let corrupt = ReadIssue::Corrupt {
            offset: 100,
            bytes: 40,
            reason: Corruption::Crc {
                stored: 0xdeadbeef,
                computed: 0x12345678,
            },
        };
        assert_eq!(
            corrupt.describe(),
            "the profile is damaged at byte 100 (a frame's checksum does not match (stored \
             deadbeef, computed 12345678)): 40 bytes up to byte 140 were skipped; every good \
             frame before and after them was read"
        );
        assert_eq!(corrupt.offset(), 100);
    }

    /// A second of the fast tier on a busy rank: counters that move every batch, gauges that
    /// rarely do, and a process that exits part-way.
    fn fast_tier(batches: u64) -> Vec<SampleBatch> {
        (0..batches)
            .map(|k| {
                let mut values = vec![
                    (SeriesId(1), 900_000_000_000 + k * 9_400_000),
                    (SeriesId(2), 41_000_000 + k * 3_100),
                    (SeriesId(3), u64::from(k % 17 == 0)),
                    (SeriesId(4), 1_234_567_890 + (k / 7) * 1_448),
                    (SeriesId(5), 77),
                ];
                if k < batches / 2 {
                    values.push((SeriesId(6), 5_000_000 + k * 20_000));
                }
                SampleBatch {
                    t_ns: 50_000_000_000 + k * 10_000_000 + k % 3 * 1_000,
                    dur_ns: 20_000 + (k % 5) as u32 * 1_000,
                    values,
                }
            })
            .collect()
    }

    #[test]
    fn samples_are_packed_and_read_back() {
        let marker = every_variant().remove(3);
        let mut frames: Vec<Frame> = fast_tier(250).into_iter().map(Frame::Samples).collect();
        // A frame between batches ends the run: the order in the file is the order written.
        frames.insert(120, marker.clone());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.ssprof");
        let mut w = ProfileWriter::create(&path).unwrap();
        for f in &frames {
            w.write(f).unwrap();
        }
        w.finish().unwrap();
        let read = read_profile(&path).unwrap();
        assert!(read.issues.is_empty(), "{:?}", read.issues);
        assert_eq!(read.frames, frames);
        let packed = std::fs::metadata(&path).unwrap().len() as usize;
        let single: usize = frames
            .iter()
            .map(|f| FRAME_HEADER_LEN + f.encode().len())
            .sum();
        assert!(
            packed * 2 < single,
            "packed {packed} bytes against {single} one batch per frame"
        );
    }

    #[test]
    fn damage_inside_a_run_costs_that_run_only() {
        let batches = fast_tier(300);
        let frames: Vec<Frame> = batches.iter().cloned().map(Frame::Samples).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.ssprof");
        let mut w = ProfileWriter::create(&path).unwrap();
        for f in &frames {
            w.write(f).unwrap();
        }
        w.finish().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        // Runs of 100 batches: damage the middle one.
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.issues.len(), 1, "{:?}", read.issues);
        let mut expected = frames.clone();
        expected.drain(100..200);
        assert_eq!(read.frames, expected);
    }

    /// A checksummed run of one wide batch and steps repeating it (50 values per byte) is
    /// stepped over as damage, and the frames around it are read.
    #[test]
    fn a_run_unpacking_to_far_more_values_than_its_bytes_is_stepped_over() {
        use stallscope_analysis::sample_run::{SampleRun, SampleStep};
        let frames = frames();
        let (good, spans) = written(&frames);
        let (start, _) = spans[2];
        let run = SampleRun {
            first: SampleBatch {
                t_ns: 0,
                dur_ns: 0,
                values: (0..10_000).map(|i| (SeriesId(i), 0)).collect(),
            },
            steps: vec![
                SampleStep {
                    dt_ns: 1,
                    ..SampleStep::default()
                };
                99
            ],
        };
        let wide = raw_frame(&Frame::SampleRun(Box::new(run)).encode());
        let mut bytes = good[..start].to_vec();
        bytes.extend_from_slice(&wide);
        bytes.extend_from_slice(&good[start..]);
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.frames, frames);
        let [ReadIssue::Corrupt {
            offset,
            bytes: skipped,
            reason: Corruption::Undecodable(why),
        }] = read.issues.as_slice()
        else {
            panic!("{:?}", read.issues);
        };
        assert_eq!((*offset, *skipped), (start as u64, wide.len() as u64));
        assert!(
            why.contains("unpacks to more than 4 sample values per byte"),
            "{why}"
        );
    }

    #[test]
    fn deflated_frames_that_inflate_too_far_or_hold_damage_are_stepped_over() {
        let frames = every_variant();
        let packed = |inner: &[u8]| {
            raw_frame(&Frame::Deflated(miniz_oxide::deflate::compress_to_vec(inner, 6)).encode())
        };
        let mut bytes = MAGIC.to_vec();
        bytes.push(FORMAT_VERSION);
        // A megabyte of zeros deflates to about a kilobyte: refused, not inflated.
        bytes.extend(packed(&vec![0u8; 1 << 20]));
        bytes.extend(raw_frame(&frames[1].encode()));
        // A good frame, then a length that runs past the end: the first is read.
        let good = frames[2].encode();
        let mut inner = (good.len() as u32).to_le_bytes().to_vec();
        inner.extend_from_slice(&good);
        inner.extend_from_slice(&1000u32.to_le_bytes());
        bytes.extend(packed(&inner));
        bytes.extend(raw_frame(&frames[3].encode()));
        let read = read_bytes(&bytes).unwrap();
        assert_eq!(read.frames, frames[1..4].to_vec());
        let why: Vec<String> = read
            .issues
            .iter()
            .map(|i| match i {
                ReadIssue::Corrupt {
                    reason: Corruption::Undecodable(why),
                    ..
                } => why.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].contains("do not inflate within"), "{why:?}");
        assert!(why[1].contains("runs past the end"), "{why:?}");
    }

    /// Markers and breakdowns packed ([`Frame::IterationPack`]) read back as the frames they
    /// were, plain or deflated; a pack whose columns disagree is an issue, and the frames
    /// around it read.
    #[test]
    fn iteration_packs_read_back_as_written() {
        use stallscope_analysis::iteration_pack::IterationPackBuilder;
        let frames = every_variant();
        let mut pack = IterationPackBuilder::default();
        let packed: Vec<Frame> = frames.iter().filter(|f| pack.push(f)).cloned().collect();
        assert!(
            packed.len() >= 2,
            "every variant holds markers and a breakdown"
        );
        let pack = pack.take();
        let mut broken = pack.clone();
        broken.m_t.clear();
        let around = frames[0].clone();
        let dir = tempfile::tempdir().unwrap();
        for deflating in [false, true] {
            let path = dir.path().join(format!("p{deflating}"));
            let mut w = ProfileWriter::create(&path).unwrap();
            if deflating {
                w = w.deflating();
            }
            w.write(&Frame::IterationPack(Box::new(pack.clone())))
                .unwrap();
            w.write(&around).unwrap();
            w.write(&Frame::IterationPack(Box::new(broken.clone())))
                .unwrap();
            w.write(&around).unwrap();
            w.finish().unwrap();
            let read = read_profile(&path).unwrap();
            let mut expected = packed.clone();
            expected.extend([around.clone(), around.clone()]);
            assert_eq!(read.frames, expected, "deflating: {deflating}");
            let [ReadIssue::Corrupt {
                reason: Corruption::Undecodable(why),
                ..
            }] = read.issues.as_slice()
            else {
                panic!("{:?}", read.issues);
            };
            assert!(why.contains("m_t"), "{why}");
        }
    }

    #[test]
    fn a_format_1_profile_still_reads() {
        let frames = every_variant();
        let mut bytes = MAGIC.to_vec();
        bytes.push(1);
        for f in &frames {
            let payload = f.encode();
            let len = (payload.len() as u32).to_le_bytes();
            bytes.extend_from_slice(&FRAME_MAGIC);
            bytes.push(1);
            bytes.extend_from_slice(&len);
            bytes.extend_from_slice(&frame_crc(1, len, &payload).to_le_bytes());
            bytes.extend_from_slice(&payload);
        }
        let read = read_bytes(&bytes).unwrap();
        assert!(read.issues.is_empty(), "{:?}", read.issues);
        assert_eq!(read.frames, frames);
    }
}
