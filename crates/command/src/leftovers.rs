//! What a runner killed with SIGKILL left behind, cleaned up by the next
//! runner's start: a program dies with its runner (`spawner.rs`), but what
//! the program started itself (a background child, an orphan) has no
//! parent-death signal and is re-parented away, still running, and the
//! delivery directory with its files stays on disk.
//!
//! Each delivery directory names its runner (the file `runner`,
//! `runner_id.rs`). A directory is a leftover only if that file is a
//! regular file of this runner's user, names a runner of the same boot,
//! PID namespace and user, and that runner no longer runs; then every
//! process whose environment still says it works there
//! (`SPOT_WORKER_WORK_DIR`, inherited from the program unless a process
//! cleared it) gets SIGKILL, and the directory is removed. Anything else is
//! never touched: another container's or namespace's runner sharing the
//! work root, another boot's, another user's, a file of an earlier layout,
//! or everything, when `/proc` is not this runner's namespace's.
//!
//! A process is killed through a pidfd (`pidfd_open`, then its environment
//! read again, then `pidfd_send_signal`): a pid freed and reused between
//! the look and the kill can never be signalled.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use spot_worker_untrusted::{Owners, read_whole};

use crate::runner_id::{MAX_RUNNER_FILE, RunnerId, proc_is_ours};

/// The file of a delivery directory that names its runner.
pub(crate) const RUNNER_FILE: &str = "runner";

/// What [`sweep_leftovers`] cleaned up, and what it left alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Delivery directories of runners no longer running, removed.
    pub directories: usize,
    /// Processes still working in them, killed.
    pub processes: usize,
    /// Delivery directories left alone because they name a runner of
    /// another PID namespace, boot or user (another container's runner
    /// sharing the work root, say), or are not this user's.
    pub foreign: usize,
    /// Why nothing at all was looked at, if so: this runner cannot tell
    /// its own leftovers from another's.
    pub blind: Option<&'static str>,
}

/// This runner's file for its delivery directories.
pub(crate) fn runner_file_text() -> String {
    RunnerId::current().map_or_else(String::new, RunnerId::to_text)
}

/// Kills what runners that are gone left running in their delivery
/// directories under `root` (the system's temporary directory if `None`,
/// as for [`CommandConfig::work_root`](crate::CommandConfig::work_root)),
/// and removes those directories. Call once at start, before the first
/// delivery.
pub fn sweep_leftovers(root: Option<&Path>) -> Leftovers {
    let Some(me) = RunnerId::current() else {
        return Leftovers {
            blind: Some("/proc does not say who this runner is"),
            ..Leftovers::default()
        };
    };
    if !proc_is_ours() {
        return Leftovers {
            blind: Some(
                "/proc shows another PID namespace than this runner's (give the namespace a \
                 /proc of its own: unshare --pid --fork --mount-proc)",
            ),
            ..Leftovers::default()
        };
    }
    let root = root.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Leftovers::default();
    };
    let mut swept = Leftovers::default();
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        let is_delivery = entry
            .file_name()
            .to_string_lossy()
            .starts_with("spot-worker-")
            && entry.file_type().is_ok_and(|kind| kind.is_dir());
        if !is_delivery {
            continue;
        }
        let Some(named) = runner_of(&dir, me) else {
            swept.foreign += 1;
            continue;
        };
        if !named.is_judged_by(me) {
            swept.foreign += 1;
            continue;
        }
        if named.is_running() {
            continue;
        }
        swept.processes += kill_working_in(&dir.join("work"));
        if std::fs::remove_dir_all(&dir).is_ok() {
            swept.directories += 1;
        }
    }
    swept
}

/// The runner `dir` names, if `dir` and its runner file are `me`'s user's
/// and the file is one: a link, a FIFO, a file too long or of another
/// owner or layout names nobody.
fn runner_of(dir: &Path, me: &RunnerId) -> Option<RunnerId> {
    let owner = dir.symlink_metadata().ok()?.uid();
    if owner != me.uid {
        return None;
    }
    let bytes = read_whole(
        &dir.join(RUNNER_FILE),
        &Owners::Only(vec![me.uid]),
        MAX_RUNNER_FILE,
    )
    .ok()?;
    RunnerId::parse(std::str::from_utf8(&bytes).ok()?)
}

/// SIGKILL to every process whose environment has
/// `SPOT_WORKER_WORK_DIR=<work>`, each verified through its pidfd; how
/// many.
fn kill_working_in(work: &Path) -> usize {
    let marker = format!("SPOT_WORKER_WORK_DIR={}", work.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid > 1 && pid.unsigned_abs() != std::process::id())
        .filter(|&pid| works_in(pid, &marker))
        .filter(|&pid| kill_verified(pid, &marker))
        .count()
}

/// Whether process `pid`'s environment holds `marker` (a whole variable).
fn works_in(pid: i32, marker: &str) -> bool {
    std::fs::read(PathBuf::from(format!("/proc/{pid}/environ"))).is_ok_and(|environ| {
        environ
            .split(|&b| b == 0)
            .any(|var| var == marker.as_bytes())
    })
}

/// SIGKILL to process `pid` if, once held by a pidfd, it still works in
/// `marker`'s directory: the pidfd names the process, not the number, so
/// if `pid` was freed and reused after the look, the signal reaches no
/// one. False where pidfds are missing (Linux before 5.3): nothing is
/// killed unverified.
fn kill_verified(pid: i32, marker: &str) -> bool {
    let Some(pidfd) = pidfd_open(pid) else {
        return false;
    };
    // Still the process looked at: while it lives its pid is not reused,
    // and if it died, the pidfd's signal below reaches no one.
    if !works_in(pid, marker) {
        return false;
    }
    pidfd_kill(&pidfd)
}

/// A pidfd for process `pid`.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, no pointers; it returns a
    // new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one
    // else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// SIGKILL to the process `pidfd` holds; false if it is gone.
fn pidfd_kill(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a pidfd we own, a signal number, no
    // siginfo (null) and no flags.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    sent == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_of_this_runners_namespace_boot_and_user_are_swept() {
        let me = RunnerId::current().unwrap();
        let root = tempfile::tempdir().unwrap();
        let make = |name: &str, runner: Option<String>| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(dir.join("work")).unwrap();
            if let Some(runner) = runner {
                std::fs::write(dir.join(RUNNER_FILE), runner).unwrap();
            }
            dir
        };
        let gone = RunnerId {
            pid: 4_194_304,
            start: 1,
            ..me.clone()
        };
        let dead = make("spot-worker-gone", Some(gone.to_text()));
        let mine = make("spot-worker-mine", Some(me.to_text()));
        let unnamed = make("spot-worker-unnamed", None);
        let old_layout = make("spot-worker-old", Some("4194304 1".to_owned()));
        let other_ns = make(
            "spot-worker-other-ns",
            Some(
                RunnerId {
                    pidns: me.pidns + 1,
                    ..gone.clone()
                }
                .to_text(),
            ),
        );
        let other_boot = make(
            "spot-worker-other-boot",
            Some(
                RunnerId {
                    boot: "00000000-0000-0000-0000-000000000000".to_owned(),
                    ..gone.clone()
                }
                .to_text(),
            ),
        );
        let other_user = make(
            "spot-worker-other-user",
            Some(
                RunnerId {
                    uid: me.uid + 1,
                    ..gone.clone()
                }
                .to_text(),
            ),
        );
        // A link where the runner file should be: never followed.
        let linked = make("spot-worker-linked", None);
        std::fs::write(root.path().join("elsewhere"), gone.to_text()).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), linked.join(RUNNER_FILE))
            .unwrap();
        let other = make("other", Some(gone.to_text()));

        let swept = sweep_leftovers(Some(root.path()));
        assert_eq!(
            swept,
            Leftovers {
                directories: 1,
                processes: 0,
                foreign: 6,
                blind: None,
            }
        );
        assert!(!dead.exists());
        for kept in [
            mine, unnamed, old_layout, other_ns, other_boot, other_user, linked, other,
        ] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    #[test]
    fn a_fifo_as_the_runner_file_neither_blocks_nor_counts() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("spot-worker-fifo");
        std::fs::create_dir(&dir).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join(RUNNER_FILE))
            .status()
            .unwrap();
        assert!(made.success());
        // Would block for ever on a FIFO no one writes to, were it opened
        // as a file is.
        let swept = sweep_leftovers(Some(root.path()));
        assert_eq!(swept.foreign, 1);
        assert!(dir.exists());
    }

    #[test]
    fn a_process_is_killed_only_while_it_still_works_there() {
        let marker = "SPOT_WORKER_WORK_DIR=/nowhere/spot-worker-test";
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .env("SPOT_WORKER_WORK_DIR", "/nowhere/spot-worker-test")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // The parent of a vfork-style spawn resumes as the child's exec
        // begins, before the kernel has laid out its new environment.
        let since = std::time::Instant::now();
        while !works_in(pid, marker) && since.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(works_in(pid, marker));
        assert!(!kill_verified(pid, "SPOT_WORKER_WORK_DIR=/elsewhere"));
        assert!(kill_verified(pid, marker));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: its pidfd (a new one cannot be had) signals no one.
        assert!(pidfd_open(pid).is_none() || !kill_verified(pid, marker));
    }
}
