//! Builds the thread-state source's eBPF object (`bpf/thread_states.bpf.c`) with clang.
//!
//! Without clang the agent still builds: the object is left empty, and the source says at
//! run time that it was built without eBPF, so the agent polls `/proc` as before.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "bpf/thread_states.bpf.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=STALLSCOPE_CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("thread_states.bpf.o");
    let clang = env::var("STALLSCOPE_CLANG").unwrap_or_else(|_| "clang".into());
    // <asm/types.h>, which <linux/bpf.h> includes, lives under the host's multiarch directory.
    let multiarch = Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{}-linux-gnu", env::consts::ARCH));
    let built = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(&object)
        .status();
    match built {
        Ok(status) if status.success() => {}
        outcome => {
            println!(
                "cargo:warning=eBPF thread states not built ({clang}: {outcome:?}); the agent will poll /proc. Install clang and libbpf-dev to build them."
            );
            std::fs::write(&object, b"").expect("OUT_DIR is writable");
            rerun_once_installed();
        }
    }
}

/// Has cargo run this script again once clang or libbpf's headers may have been installed:
/// when a directory of `PATH` or the headers' directory changes. Without it, a build made
/// before `apt install clang libbpf-dev` stayed without eBPF until `cargo clean`, though
/// the warning says to install them.
fn rerun_once_installed() {
    println!("cargo:rerun-if-env-changed=PATH");
    let path = env::var_os("PATH").unwrap_or_default();
    for dir in env::split_paths(&path).filter(|d| d.is_dir()) {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let headers = ["/usr/include/bpf", "/usr/include"]
        .into_iter()
        .find(|d| std::path::Path::new(d).is_dir());
    if let Some(dir) = headers {
        println!("cargo:rerun-if-changed={dir}");
    }
}
