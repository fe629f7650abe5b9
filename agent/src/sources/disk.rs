//! Block devices: bytes read and written, and how long each had I/O in flight.
//!
//! Whole devices only: a partition's traffic is already in its disk's, and counting both would
//! double it. A name in `diskstats` is a whole device when `<sys>/block/NAME` exists; loop,
//! ram and zram devices are left out (they are memory or files, their traffic is counted again
//! on the device beneath). Slow tier: `diskstats` is a table of every device, and storage stalls
//! last far longer than 100 ms.

use std::fs::File;
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::text::{fields, lines, parse_u64};
use super::{pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// Bytes per `diskstats` sector, whatever the device's own sector size (`block/stat.rst`).
const SECTOR_BYTES: u64 = 512;

/// Names of devices left out: memory or file backed, counted again beneath.
const SKIPPED_PREFIXES: [&str; 3] = ["loop", "ram", "zram"];

/// `<proc>/diskstats` for each whole block device.
pub struct DiskSource {
    diskstats: PathBuf,
    sys_block: PathBuf,
    file: Option<File>,
    buf: Vec<u8>,
    devices: Vec<Device>,
    /// Reads so far, to tell devices gone from the table.
    rounds: u64,
    token: u64,
}

struct Device {
    name: String,
    /// Whether `<sys>/block/NAME` existed when the name was first seen.
    whole: bool,
    /// read, write, busy; valid for the registry of `DiskSource::token`.
    ids: Option<[SeriesId; 3]>,
    /// The last read that listed it.
    seen: u64,
}

impl DiskSource {
    /// Reads `roots.proc/diskstats`, telling whole devices by `roots.sys/block`.
    pub fn new(roots: &Roots) -> Self {
        DiskSource {
            diskstats: roots.proc.join("diskstats"),
            sys_block: roots.sys.join("block"),
            file: None,
            buf: Vec::new(),
            devices: Vec::new(),
            rounds: 0,
            token: 0,
        }
    }
}

/// The table at `path`, read again from offset 0 into `buf` (and opened again after a failed
/// read).
fn read_table<'a>(
    file: &mut Option<File>,
    path: &Path,
    buf: &'a mut Vec<u8>,
) -> Result<&'a [u8], SourceError> {
    let io_err = |source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let open = match file {
        Some(open) => open,
        None => file.insert(File::open(path).map_err(io_err)?),
    };
    pread_all(open, buf).map_err(|e| {
        *file = None;
        io_err(e)
    })
}

/// One line of `diskstats`: `major minor name` and the counters (`block/stat.rst`).
struct DiskLine<'a> {
    name: &'a [u8],
    /// Sectors read (field 6 of the line).
    sectors_read: u64,
    /// Sectors written (field 10).
    sectors_written: u64,
    /// ms with I/O in flight (field 13, `io_ticks`).
    busy_ms: u64,
}

fn parse_line(line: &[u8]) -> Option<DiskLine<'_>> {
    let mut fields = fields(line);
    let name = fields.nth(2)?;
    let sectors_read = parse_u64(fields.nth(2)?)?;
    let sectors_written = parse_u64(fields.nth(3)?)?;
    let busy_ms = parse_u64(fields.nth(2)?)?;
    Some(DiskLine {
        name,
        sectors_read,
        sectors_written,
        busy_ms,
    })
}

impl Source for DiskSource {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn tier(&self) -> Tier {
        Tier::Slow
    }

    fn describe(&self) -> String {
        format!(
            "whole-device bytes and busy time from {}",
            self.diskstats.display()
        )
    }

    fn sample(&mut self, _watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        if self.token != out.token() {
            self.token = out.token();
            self.devices.iter_mut().for_each(|d| d.ids = None);
        }
        self.rounds += 1;
        let text = read_table(&mut self.file, &self.diskstats, &mut self.buf)?;
        let mut failure = None;
        for line in lines(text).filter(|l| !l.trim_ascii().is_empty()) {
            let Some(stat) = parse_line(line) else {
                let line = String::from_utf8_lossy(line).into_owned();
                failure = Some(SourceError::Parse {
                    path: self.diskstats.clone(),
                    message: format!("not a device line: {line:?}"),
                });
                break;
            };
            if SKIPPED_PREFIXES
                .iter()
                .any(|p| stat.name.starts_with(p.as_bytes()))
            {
                continue;
            }
            let devices = &mut self.devices;
            let at = match devices.iter().position(|d| d.name.as_bytes() == stat.name) {
                Some(at) => at,
                None => {
                    let name = String::from_utf8_lossy(stat.name).into_owned();
                    // sysfs spells a `/` in a device name (`cciss/c0d0`) as `!`.
                    let whole = self.sys_block.join(name.replace('/', "!")).exists();
                    devices.push(Device {
                        name,
                        whole,
                        ids: None,
                        seen: 0,
                    });
                    devices.len() - 1
                }
            };
            let device = &mut devices[at];
            device.seen = self.rounds;
            if !device.whole {
                continue;
            }
            let ids = *device.ids.get_or_insert_with(|| {
                let labels = [("device", device.name.as_str())];
                [
                    out.series(
                        names::DISK_READ_BYTES,
                        "bytes",
                        SeriesKind::Counter,
                        &labels,
                    ),
                    out.series(
                        names::DISK_WRITE_BYTES,
                        "bytes",
                        SeriesKind::Counter,
                        &labels,
                    ),
                    out.series(names::DISK_BUSY_MS, "ms", SeriesKind::Counter, &labels),
                ]
            });
            out.push(ids[0], stat.sectors_read * SECTOR_BYTES);
            out.push(ids[1], stat.sectors_written * SECTOR_BYTES);
            out.push(ids[2], stat.busy_ms);
        }
        let rounds = self.rounds;
        self.devices.retain(|d| d.seen == rounds);
        failure.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use stallscope_analysis::series::names;

    use super::*;
    use crate::sources::fake::{FakeRoots, Round};

    fn fake_disks(sys_block: &[&str]) -> FakeRoots {
        let fake = FakeRoots::new();
        fake.proc("diskstats", "diskstats.txt");
        for name in sys_block {
            fs::create_dir_all(fake.roots.sys.join("block").join(name)).unwrap();
        }
        fake
    }

    #[test]
    fn whole_devices_in_bytes_and_ms() {
        // As on the capture machine: /sys/block has loop*, vda and zram0.
        let fake = fake_disks(&["loop0", "loop1", "vda", "zram0"]);
        let mut source = DiskSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        let vda = ("device", "vda");
        assert_eq!(
            round.get(names::DISK_READ_BYTES, vda),
            Some(3_230_386 * 512)
        );
        assert_eq!(
            round.get(names::DISK_WRITE_BYTES, vda),
            Some(2_967_128 * 512)
        );
        assert_eq!(round.get(names::DISK_BUSY_MS, vda), Some(5416));
        assert_eq!(round.values.len(), 3, "loop and zram devices are left out");
    }

    #[test]
    fn names_without_sys_block_entry_are_partitions() {
        let fake = fake_disks(&[]);
        let mut source = DiskSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&Watched::default(), &mut reg).unwrap();
        assert!(Round::take(&mut reg).values.is_empty());
    }

    #[test]
    fn a_short_line_is_a_parse_error_naming_it() {
        let fake = fake_disks(&["vda"]);
        fake.write(&fake.roots.proc, "diskstats", b" 253 0 vda 1 2 3\n");
        let mut source = DiskSource::new(&fake.roots);
        let err = source
            .sample(&Watched::default(), &mut Registry::default())
            .unwrap_err();
        assert!(
            matches!(&err, SourceError::Parse { message, .. } if message.contains("vda")),
            "{err}"
        );
    }

    #[test]
    fn missing_diskstats_is_an_io_error() {
        let fake = FakeRoots::new();
        let mut source = DiskSource::new(&fake.roots);
        let err = source
            .sample(&Watched::default(), &mut Registry::default())
            .unwrap_err();
        assert!(matches!(err, SourceError::Io { .. }), "{err}");
    }
}
