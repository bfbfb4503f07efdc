//! What a program inherits from its runner: stdin, stdout and stderr (the
//! runner's pipes), the environment the contract gives it, and nothing
//! else.
//!
//! `execve(2)` keeps two things a program must not get. Open descriptors
//! without close-on-exec: whatever the runner's own parent left open (a
//! shell's `exec 7<file`, a service manager's socket, a library's file)
//! would reach every program, which could read or write through it. And
//! ignored signals: a runner started by `nohup` or from a background shell
//! ignores SIGHUP (or SIGINT, SIGQUIT), its programs would too, and a
//! `--stop-signal SIGHUP` would then never stop them (only the SIGKILL at
//! the release time would). Handlers are reset by exec; ignored signals
//! and the signal mask are not.
//!
//! So in the child, between fork and exec ([`Inheritance::apply`]), every
//! signal (1 to 64, the C library's own real-time ones included) goes
//! back to its default disposition, the signal mask is
//! emptied, and every descriptor above 2 is marked close-on-exec
//! (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, Linux 5.11; before that, one
//! `fcntl` per descriptor up to the limit). Marked rather than closed: the
//! pipe through which the standard library reports a failed exec is one of
//! them, and must stay open until the exec succeeds.

use std::io;

/// What [`Inheritance::apply`] needs, prepared before the fork: nothing is
/// allocated or looked up in the child.
#[derive(Clone, Copy)]
pub(crate) struct Inheritance {
    /// The highest descriptor number the fallback marks.
    fd_limit: libc::c_int,
}

/// The kernel's `struct sigaction` for `rt_sigaction(2)` (handler, flags,
/// restorer, mask) all zero: the default disposition, no flags, an empty
/// mask, whatever the architecture's order of the fields.
const DEFAULT_ACTION: [u64; 4] = [0; 4];

/// The highest signal number of Linux.
const LAST_SIGNAL: libc::c_int = 64;

impl Inheritance {
    /// Prepared in the runner, before the fork.
    pub(crate) fn new() -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit to a valid place.
        let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        let fd_limit = if got == 0 {
            libc::c_int::try_from(limit.rlim_cur).unwrap_or(libc::c_int::MAX)
        } else {
            1024
        };
        Inheritance { fd_limit }
    }

    /// In the child, before exec: default dispositions, an empty signal
    /// mask, descriptors above 2 close-on-exec.
    ///
    /// # Safety
    ///
    /// Only between fork and exec (it changes the whole process's signal
    /// handling); it calls only async-signal-safe system calls and touches
    /// no memory shared with the parent.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        for signal in 1..=LAST_SIGNAL {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            // SAFETY: rt_sigaction with a valid (all-zero) action, no old
            // one, and the kernel's mask size. The system call, not the C
            // library's sigaction, which refuses the real-time signals it
            // keeps for itself (32 and 33 in glibc): ignored ones survive
            // exec like any other.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    DEFAULT_ACTION.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    8usize,
                )
            };
        }
        // SAFETY: an empty set, built in place, then installed as the mask.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: close_range takes three integers; CLOSE_RANGE_CLOEXEC
        // only sets a flag on each descriptor of the range.
        let marked = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if marked == 0 {
            return Ok(());
        }
        // Before Linux 5.11: each descriptor that is open, one by one.
        for fd in 3..self.fd_limit {
            // SAFETY: fcntl on a descriptor number: EBADF if none is open.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
        Ok(())
    }
}
