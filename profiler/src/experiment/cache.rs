//! The page cache of the dataset: emptied before the cold-cache run (R2), filled before the
//! warm one (R3), and measured, so that "cold" and "warm" are facts rather than hopes.
//!
//! Emptying drops the whole page cache where allowed (`/proc/sys/vm/drop_caches`, root), as
//! the Stash paper does, else evicts the dataset's own pages with
//! `posix_fadvise(POSIX_FADV_DONTNEED)`. Filling reads every file once; timed right after an
//! eviction, that read also measures the storage throughput the what-if model needs.

use std::fs::File;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

/// How to empty the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColdCache {
    /// `sync; echo 1 > /proc/sys/vm/drop_caches` where allowed, else `fadvise`.
    Drop,
    /// Evict only the dataset's pages (`posix_fadvise(DONTNEED)` per file).
    Fadvise,
}

/// The dataset's files and their sizes.
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    /// Regular files under the directory, bytes each.
    pub files: Vec<(PathBuf, u64)>,
}

impl Dataset {
    /// Lists the regular files under `dir`, recursively (symbolic links are not followed).
    pub fn scan(dir: &Path) -> anyhow::Result<Dataset> {
        let mut files = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let entries =
                std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))?;
            for entry in entries {
                let entry = entry.with_context(|| format!("cannot list {}", d.display()))?;
                let kind = entry.file_type()?;
                if kind.is_dir() {
                    stack.push(entry.path());
                } else if kind.is_file() {
                    files.push((entry.path(), entry.metadata()?.len()));
                }
            }
        }
        files.sort();
        if files.is_empty() {
            anyhow::bail!("the dataset directory {} holds no files", dir.display());
        }
        Ok(Dataset { files })
    }

    /// bytes, all files together.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.1).sum()
    }

    /// Empties the cache of the dataset; returns how it was done.
    pub fn evict(&self, how: ColdCache) -> anyhow::Result<&'static str> {
        // SAFETY: sync takes no arguments and cannot fail.
        unsafe { libc::sync() };
        if how == ColdCache::Drop && std::fs::write("/proc/sys/vm/drop_caches", "1\n").is_ok() {
            return Ok("drop_caches");
        }
        for (path, _) in &self.files {
            let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            // Dirty pages cannot be dropped: write them out first.
            let _ = f.sync_data();
            // SAFETY: an advisory call on a descriptor we own, whole file.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                anyhow::bail!(
                    "posix_fadvise on {}: {}",
                    path.display(),
                    std::io::Error::from_raw_os_error(rc)
                );
            }
        }
        Ok("posix_fadvise(DONTNEED)")
    }

    /// Reads every file once; returns (bytes, seconds).
    pub fn read_all(&self) -> anyhow::Result<(u64, f64)> {
        let started = Instant::now();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        for (path, _) in &self.files {
            let mut f =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            loop {
                let n = f
                    .read(&mut buf)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
        }
        Ok((total, started.elapsed().as_secs_f64()))
    }

    /// Share of the dataset's pages in the page cache now, 0–1 (`mincore` over each file).
    pub fn resident_fraction(&self) -> anyhow::Result<f64> {
        let page = page_size();
        let (mut resident, mut pages) = (0u64, 0u64);
        for (path, len) in &self.files {
            if *len == 0 {
                continue;
            }
            let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let n = len.div_ceil(page);
            let mut vec = vec![0u8; n as usize];
            // SAFETY: a read-only shared mapping of a file we hold open, of its length; mincore
            // fills one byte per page into a vector of that many bytes; unmapped at once.
            unsafe {
                let addr = libc::mmap(
                    std::ptr::null_mut(),
                    *len as usize,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                if addr == libc::MAP_FAILED {
                    anyhow::bail!(
                        "cannot map {}: {}",
                        path.display(),
                        std::io::Error::last_os_error()
                    );
                }
                let rc = libc::mincore(addr, *len as usize, vec.as_mut_ptr());
                libc::munmap(addr, *len as usize);
                if rc != 0 {
                    anyhow::bail!(
                        "mincore on {}: {}",
                        path.display(),
                        std::io::Error::last_os_error()
                    );
                }
            }
            resident += vec.iter().filter(|b| *b & 1 == 1).count() as u64;
            pages += n;
        }
        Ok(if pages == 0 {
            1.0
        } else {
            resident as f64 / pages as f64
        })
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// bytes the kernel says it could give without swapping (`MemAvailable`), when readable.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_and_reading_move_the_resident_share() {
        // A directory on the disk the sources are on (not a tmpfs, where nothing is evicted).
        let dir = tempfile::Builder::new()
            .prefix(".cache-test")
            .tempdir_in(env!("CARGO_MANIFEST_DIR"))
            .unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("a.bin"), &data).unwrap();
        std::fs::write(dir.path().join("sub/b.bin"), &data[..1 << 20]).unwrap();
        let ds = Dataset::scan(dir.path()).unwrap();
        assert_eq!(ds.files.len(), 2);
        assert_eq!(ds.bytes(), 5 << 20);
        ds.evict(ColdCache::Fadvise).unwrap();
        let cold = ds.resident_fraction().unwrap();
        let (bytes, secs) = ds.read_all().unwrap();
        assert_eq!(bytes, 5 << 20);
        assert!(secs > 0.0);
        let warm = ds.resident_fraction().unwrap();
        assert!(warm > 0.99, "after reading, {warm} resident");
        assert!(cold < 0.5, "after eviction, {cold} resident");
    }

    #[test]
    fn an_empty_or_missing_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = Dataset::scan(dir.path()).unwrap_err();
        assert!(e.to_string().contains("holds no files"), "{e}");
        let e = Dataset::scan(&dir.path().join("nope")).unwrap_err();
        assert!(e.to_string().contains("cannot list"), "{e}");
    }
}
