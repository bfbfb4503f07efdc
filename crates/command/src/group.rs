//! Process hygiene: each program leads its own process group; whatever is
//! left in the group when a delivery ends is killed and reaped, and the
//! runner is a child subreaper so orphaned grandchildren come back to it
//! (also as PID 1 in a container) instead of to init.
//!
//! Why not `process-wrap` (watchexec's crate for groups, sessions and
//! kill-on-drop): what it would give here is one line each with std and
//! Tokio alone (`process_group(0)`, `kill_on_drop`). Its group child's wait
//! reaps the whole group with `waitpid(-pgid)` itself, which cannot tell
//! the orphan sweep which statuses Tokio still waits for (`reaper.rs`),
//! and it has no subreaper, no bounded kill-and-reap for the drain's last
//! second, and no parent-death signal forked from a thread that lives as
//! long as the runner (`spawner.rs`). So the handful of system calls stay
//! here, each with its reason.

use std::time::Duration;

use tokio::time::Instant;

/// How long a delivery's end waits for its group to be gone after SIGKILL
/// (well inside the second kept before the release time).
const REAP_WITHIN: Duration = Duration::from_millis(500);

/// How often the group is looked at meanwhile.
const REAP_EVERY: Duration = Duration::from_millis(5);

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`):
/// descendants whose parent dies are re-parented to it, so the runner can
/// reap them. Linux only; elsewhere a no-op that reports an error.
pub fn become_subreaper() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer
        // argument and touches no memory of ours.
        let done = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if done == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::other("a child subreaper needs Linux"))
    }
}

/// Keeps the runner's memory and initial environment from processes of the
/// same user (`PR_SET_DUMPABLE` 0): a program cannot read the runner's
/// credentials from `/proc/<runner>/environ` or `/proc/<runner>/mem`, nor
/// trace it. Programs started afterwards are dumpable again (it is reset
/// on exec). It also turns off the runner's core dumps.
pub fn hide_from_programs() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with PR_SET_DUMPABLE takes one integer argument and
        // touches no memory of ours.
        let done = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        if done == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::other("hiding the runner needs Linux"))
    }
}

/// Sends `signal` to every process of the group `pgid`; false if none is
/// left.
pub fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; it takes
    // no pointers. `pgid > 1` keeps it from ever meaning "every process".
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// Kills whatever is left of the group `pgid` and reaps those of its
/// processes that are the runner's children (the re-parented orphans; the
/// program itself must have been awaited already, so this never takes a
/// status Tokio waits for). Returns once no live process of the group is
/// left (zombies whose parent is not the runner are their parent's to
/// reap), or after [`REAP_WITHIN`] (then false).
pub async fn kill_and_reap(pgid: i32) -> bool {
    let until = Instant::now() + REAP_WITHIN;
    loop {
        let any_left = signal_group(pgid, libc::SIGKILL);
        reap_group(pgid);
        if !any_left || !group_alive(pgid) {
            reap_group(pgid);
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(REAP_EVERY).await;
    }
}

/// Whether a process of the group `pgid` is still running (not a zombie),
/// from `/proc/<pid>/stat`; true where `/proc` cannot tell.
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| live_member_of(&stat))
        .any(|group| group == pgid)
}

/// The process group of a `/proc/<pid>/stat` line, if the process is not a
/// zombie: the fields after the command's closing parenthesis are state,
/// parent, group.
fn live_member_of(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let group = fields.nth(1)?.parse().ok()?;
    (!matches!(state, "Z" | "X")).then_some(group)
}

/// Reaps every exited child of the runner in the group `pgid`, without
/// waiting.
fn reap_group(pgid: i32) {
    if pgid <= 1 {
        return;
    }
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a negative pid reaps a child of ours in that
        // group; `status` is a valid place for it to write to.
        let reaped = unsafe { libc::waitpid(-pgid, &mut status, libc::WNOHANG) };
        if reaped <= 0 {
            return;
        }
    }
}

/// Kills what is left of the program's group if the delivery is dropped
/// (the release time passed), and reaps it in the background.
pub(crate) struct GroupGuard {
    pub(crate) pgid: i32,
    pub(crate) armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        signal_group(self.pgid, libc::SIGKILL);
        let pgid = self.pgid;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                kill_and_reap(pgid).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_live_groups() {
        let rows = [
            ("123 (sleep) S 1 123 123 0 -1", Some(123)),
            ("124 (a) b) c) R 1 77 77 0", Some(77)),
            ("125 (sh) Z 1 123 123 0", None),
            ("garbage", None),
        ];
        for (stat, expected) in rows {
            assert_eq!(live_member_of(stat), expected, "{stat}");
        }
        // The scan finds this very process's group.
        // SAFETY: getpgrp has no arguments and cannot fail.
        let own = unsafe { libc::getpgrp() };
        assert!(group_alive(own));
    }
}
