//! Block devices: bytes read and written, and how long each had I/O in flight.
//!
//! Whole devices only: a partition's traffic is already in its disk's, and counting both would
//! double it. A name in `diskstats` is a whole device when `<sys>/block/NAME` exists; loop,
//! ram and zram devices are left out (they are memory or files, their traffic is counted again
//! on the device beneath). Meter tier (every 500 ms): `diskstats` is a table of every device,
//! and only the node's one-second readings read it (the attribution tells a fetch from the
//! loader's own threads and reads, not from the disks).

use std::fs::File;
use std::path::PathBuf;

use procfs_core::{DiskStats, FromRead};
use stallscope_analysis::series::{names, SeriesId, SeriesKind};

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
    token: u64,
}

struct Device {
    name: String,
    /// Whether `<sys>/block/NAME` existed when the name was first seen.
    whole: bool,
    /// read, write, busy; valid for the registry of `DiskSource::token`.
    ids: Option<[SeriesId; 3]>,
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
            token: 0,
        }
    }

    fn read(&mut self) -> Result<DiskStats, SourceError> {
        let io_err = |source| SourceError::Io {
            path: self.diskstats.clone(),
            source,
        };
        let file = match &self.file {
            Some(file) => file,
            None => self
                .file
                .insert(File::open(&self.diskstats).map_err(io_err)?),
        };
        let bytes = match pread_all(file, &mut self.buf) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.file = None;
                return Err(io_err(e));
            }
        };
        DiskStats::from_read(bytes).map_err(|e| SourceError::Parse {
            path: self.diskstats.clone(),
            message: e.to_string(),
        })
    }
}

impl Source for DiskSource {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn tier(&self) -> Tier {
        Tier::Meter
    }

    fn describe(&self) -> String {
        format!(
            "whole-device bytes and busy time from {}",
            self.diskstats.display()
        )
    }

    fn sample(&mut self, _watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let DiskStats(stats) = self.read()?;
        if self.token != out.token() {
            self.token = out.token();
            self.devices.iter_mut().for_each(|d| d.ids = None);
        }
        self.devices
            .retain(|d| stats.iter().any(|s| s.name == d.name));
        for stat in &stats {
            if SKIPPED_PREFIXES.iter().any(|p| stat.name.starts_with(p)) {
                continue;
            }
            let at = match self.devices.iter().position(|d| d.name == stat.name) {
                Some(at) => at,
                None => {
                    // sysfs spells a `/` in a device name (`cciss/c0d0`) as `!`.
                    let whole = self.sys_block.join(stat.name.replace('/', "!")).exists();
                    self.devices.push(Device {
                        name: stat.name.clone(),
                        whole,
                        ids: None,
                    });
                    self.devices.len() - 1
                }
            };
            let device = &mut self.devices[at];
            if !device.whole {
                continue;
            }
            let ids = *device.ids.get_or_insert_with(|| {
                let labels = [("device", stat.name.as_str())];
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
            out.push(ids[2], stat.time_in_progress);
        }
        Ok(())
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
    fn missing_diskstats_is_an_io_error() {
        let fake = FakeRoots::new();
        let mut source = DiskSource::new(&fake.roots);
        let err = source
            .sample(&Watched::default(), &mut Registry::default())
            .unwrap_err();
        assert!(matches!(err, SourceError::Io { .. }), "{err}");
    }
}
