//! The training's output under `--iter-regex`, without making the training depend on
//! stallscope.
//!
//! `--iter-regex` needs every line the training prints. Read straight from a pipe, the
//! training's next `print` would fail (EPIPE, or SIGPIPE kills it) the moment stallscope died
//! — against the promise that stallscope never harms the training. So the training writes
//! into a pipe read by a forwarder: a separate process (this binary's hidden
//! `forward-output`, in its own process group) that copies everything to the user's stdout
//! (or the dashboard's log) and a copy to stallscope on its fd 3. It ignores SIGINT, SIGTERM,
//! SIGHUP and SIGPIPE; once a copy cannot be written (stallscope is gone) it stops copying and
//! goes on forwarding. It ends when the training (and whatever inherited its stdout) closes
//! the pipe, or when the user's stdout itself is gone: the training then gets the EPIPE it
//! would have got without stallscope.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// The fd on which the forwarder writes the copy.
const COPY_FD: i32 = 3;

/// bytes read at a time: a line is forwarded as soon as the training wrote it.
const CHUNK: usize = 64 * 1024;

/// A running forwarder: where the training writes, and where stallscope reads the copy.
pub struct Forwarder {
    /// The forwarder process (reaped by [`reap`]).
    pub child: Child,
    /// The copy of everything the training wrote.
    pub copies: File,
}

impl Forwarder {
    /// Starts a forwarder that writes to `out`; returns it and the `Stdio` to give the
    /// training as its stdout.
    pub fn spawn(out: Stdio) -> anyhow::Result<(Forwarder, Stdio)> {
        use std::os::unix::process::CommandExt;
        let (training_reads, training_writes) =
            pipe().context("cannot create the training's output pipe")?;
        let (copies, copy_writes) = pipe().context("cannot create the copy pipe")?;
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let copy_fd = copy_writes.as_raw_fd();
        let mut command = Command::new(exe);
        command
            .arg("forward-output")
            .stdin(Stdio::from(training_reads))
            .stdout(out)
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: dup2 is async-signal-safe; it only puts the copy pipe on fd 3 of the child
        // (without close-on-exec) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(copy_fd, COPY_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .context("cannot start the output forwarder")?;
        drop(copy_writes);
        Ok((Forwarder { child, copies }, Stdio::from(training_writes)))
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> std::io::Result<(File, File)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Waits (at most a second) for the forwarder `child` to exit once its copy ended.
pub fn reap(mut child: Child) {
    for _ in 0..100 {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `stallscope forward-output`: copies stdin to stdout and to fd 3 (see the module docs).
/// Exit code 0 at the end of its input, 1 when its stdout is gone.
pub fn forward_output() -> anyhow::Result<i32> {
    // SAFETY: setting signal dispositions to ignore, before any thread exists.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    // SAFETY: fd 3 was put there by `Forwarder::spawn` for this process alone.
    let mut copy = Some(unsafe { File::from_raw_fd(COPY_FD) });
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => return Ok(0),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Ok(0),
        };
        if stdout
            .write_all(&buf[..n])
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return Ok(1);
        }
        if let Some(c) = &mut copy {
            if c.write_all(&buf[..n]).is_err() {
                copy = None;
            }
        }
    }
}
