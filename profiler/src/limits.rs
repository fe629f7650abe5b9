//! Process limits raised at start.
//!
//! The soft limit on open files is often 1,024 while the hard one is far higher. stallscope
//! holds a file open per watched thread's `schedstat`, per client of its feed socket and
//! `/metrics`, per agent connection on a collector; reaching the soft limit made `/proc`
//! discovery fail with "Too many open files" (issue 30, item 2). Raising the soft limit to the
//! hard one needs no privilege. Children (the training) inherit it.

/// Raises the soft limit on open files (RLIMIT_NOFILE) to the hard limit. Returns the new
/// soft limit, or `None` when it could not be read or changed (then it is left as it was:
/// nothing depends on the raise).
pub fn raise_open_files() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return None;
        }
        limit = raised;
    }
    Some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    /// The soft limit ends at the hard one (the test process's own limits: both are read
    /// back from the kernel, so this holds whatever the machine sets).
    #[test]
    fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
        let raised = super::raise_open_files().expect("the limits are readable");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!((raised, limit.rlim_cur), (limit.rlim_max, limit.rlim_max));
    }
}
