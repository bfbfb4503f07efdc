//! Process hygiene: each program leads its own process group; whatever is
//! left in the group when a delivery ends is killed and reaped, and the
//! runner is a child subreaper so orphaned grandchildren come back to it
//! (also as PID 1 in a container) instead of to init.

use std::time::Duration;

use tokio::time::Instant;

/// How long a delivery's end waits for its group to be gone after SIGKILL.
const REAP_WITHIN: Duration = Duration::from_secs(2);

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
/// status Tokio waits for). Returns once no process of the group is left,
/// or after [`REAP_WITHIN`] (then false).
pub async fn kill_and_reap(pgid: i32) -> bool {
    let until = Instant::now() + REAP_WITHIN;
    loop {
        let any_left = signal_group(pgid, libc::SIGKILL);
        reap_group(pgid);
        if !any_left {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(REAP_EVERY).await;
    }
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
