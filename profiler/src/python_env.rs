//! The Python side of `stallscope run`: the marker package and the `sitecustomize` hook,
//! embedded in the binary and written to the run's directory, then put on `PYTHONPATH`.
//!
//! Embedding keeps the binary self-contained: a user copies one file to a node and every
//! Python process the command starts is instrumented with no install and no code change.

use std::path::{Path, PathBuf};

const PACKAGE: &[(&str, &str)] = &[
    (
        "stallscope/__init__.py",
        include_str!("../python/stallscope/__init__.py"),
    ),
    (
        "stallscope/_torch_hook.py",
        include_str!("../python/stallscope/_torch_hook.py"),
    ),
    (
        "stallscope/_experiment.py",
        include_str!("../python/stallscope/_experiment.py"),
    ),
    (
        "stallscope/_cuda_timing.py",
        include_str!("../python/stallscope/_cuda_timing.py"),
    ),
    (
        "stallscope/_comm_release.py",
        include_str!("../python/stallscope/_comm_release.py"),
    ),
    (
        "stallscope/_dist_ops.py",
        include_str!("../python/stallscope/_dist_ops.py"),
    ),
    (
        "stallscope/_stacks.py",
        include_str!("../python/stallscope/_stacks.py"),
    ),
];
const SITECUSTOMIZE: &str = include_str!("../python/sitecustomize.py");

/// Writes the package and the hook under `dir` for every user of the node (directories 0755,
/// files 0644, whatever the umask), and returns the directories to put on `PYTHONPATH`: what
/// a node's agent tells its users to start their trainings with.
pub fn install_shared(dir: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    install(dir, true)?;
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(dir, 0o755)?;
    for sub in ["site", "pkg", "pkg/stallscope"] {
        mode(&dir.join(sub), 0o755)?;
    }
    mode(&dir.join("site/sitecustomize.py"), 0o644)?;
    for (rel, _) in PACKAGE {
        mode(&dir.join("pkg").join(rel), 0o644)?;
    }
    Ok(format!(
        "{}:{}",
        dir.join("site").display(),
        dir.join("pkg").display()
    ))
}

/// Writes the package (and, with `auto`, the hook) under `dir` and returns the
/// `PYTHONPATH` to give the command, ahead of what it had.
pub fn install(dir: &Path, auto: bool) -> std::io::Result<String> {
    let pkg = dir.join("pkg");
    for (rel, text) in PACKAGE {
        let path = pkg.join(rel);
        std::fs::create_dir_all(path.parent().expect("relative path has a parent"))?;
        std::fs::write(&path, text)?;
    }
    let mut parts: Vec<PathBuf> = Vec::new();
    if auto {
        let site = dir.join("site");
        std::fs::create_dir_all(&site)?;
        std::fs::write(site.join("sitecustomize.py"), SITECUSTOMIZE)?;
        parts.push(site);
    }
    parts.push(pkg);
    let mut path = parts
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    if let Ok(existing) = std::env::var("PYTHONPATH") {
        if !existing.is_empty() {
            path.push(':');
            path.push_str(&existing);
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17, item 12: what an agent installs for its users is readable by all of them.
    #[test]
    fn the_shared_install_is_readable_by_every_user() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("python");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = install_shared(&dir).unwrap();
        let parts: Vec<&str> = path.split(':').collect();
        assert_eq!(parts.len(), 2, "only the installed directories: {path}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dir.join("pkg/stallscope")), 0o755);
        assert_eq!(mode(&dir.join("site/sitecustomize.py")), 0o644);
        assert_eq!(mode(&dir.join("pkg/stallscope/__init__.py")), 0o644);
    }

    #[test]
    fn every_module_of_the_package_is_embedded() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/stallscope");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".py") {
                let rel = format!("stallscope/{name}");
                assert!(
                    PACKAGE.iter().any(|(p, _)| *p == rel),
                    "{rel} is not embedded in python_env.rs: the hook would fail to import it"
                );
            }
        }
    }
}
