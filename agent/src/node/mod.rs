//! The node's core, composed: the recorder (events → frames → the journal → the live model),
//! the NVML thread, what an agent ships per attributed iteration, and the live feed.
//!
//! `stallscope run` and `stallscope agent` are both built from these; the binary keeps only
//! its arguments, the training's child process and the terminal.

pub mod feed;
pub mod gpu_thread;
pub mod recorder;
pub mod report;

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// The directory for this user's feed sockets: `/run/stallscope` for root,
/// `$XDG_RUNTIME_DIR/stallscope` otherwise, or `/tmp/stallscope-UID`; created owner-only and
/// refused when it is a symbolic link, belongs to another user, or others may write in it.
pub fn feed_dir() -> std::io::Result<PathBuf> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = if uid == 0 {
        PathBuf::from("/run/stallscope")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        PathBuf::from(x).join("stallscope")
    } else {
        std::env::temp_dir().join(format!("stallscope-{uid}"))
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    let refuse = |why: &str| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} {why}", dir.display()),
        ))
    };
    if !meta.file_type().is_dir() {
        return refuse("is not a directory (a symbolic link?)");
    }
    if meta.uid() != uid {
        return refuse(&format!("belongs to uid {}, not {uid}", meta.uid()));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return refuse("can be written by other users");
    }
    Ok(dir)
}
