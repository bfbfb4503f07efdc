//! Reaping orphans that left their program's process group (`setsid`, a
//! daemon's double fork): as a child subreaper the runner inherits them,
//! and when they exit nobody else can reap them.
//!
//! Tokio reaps the programs themselves, by pid; taking one of their
//! statuses first would lose a program's exit status. So the sweep reaps
//! only zombies that are the runner's children, are not a running
//! program's main process ([`Programs`]), and are not in the runner's own
//! process group (where anything the runner itself spawns outside this
//! crate lives).

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How often [`spawn_orphan_reaper`] sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The pids of programs whose status Tokio has yet to collect.
fn programs() -> &'static Mutex<HashSet<u32>> {
    static PROGRAMS: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    PROGRAMS.get_or_init(Mutex::default)
}

/// Marks `pid` as a program Tokio waits for.
pub(crate) fn program_started(pid: u32) {
    programs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(pid);
}

/// Tokio has collected `pid`'s status.
pub(crate) fn program_reaped(pid: u32) {
    programs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&pid);
}

/// Sweeps for orphans every [`SWEEP_EVERY`] for as long as the runtime
/// runs. Call once per process, after [`become_subreaper`](crate::become_subreaper).
pub fn spawn_orphan_reaper() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            reap_orphans();
        }
    })
}

/// Reaps every exited orphan the sweep may take; returns how many.
pub fn reap_orphans() -> usize {
    // SAFETY: getpid and getpgrp take no arguments and cannot fail.
    let (own_pid, own_group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let zombies: Vec<i32> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| orphan_zombie(&stat, own_pid, own_group))
                .is_some()
        })
        .collect();
    let running = programs().lock().unwrap_or_else(|p| p.into_inner()).clone();
    zombies
        .into_iter()
        .filter(|pid| !running.contains(&pid.unsigned_abs()))
        .filter(|&pid| {
            let mut status = 0;
            // SAFETY: reaps one exited child by pid; `status` is a valid
            // place to write to.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
        })
        .count()
}

/// `Some(())` if a `/proc/<pid>/stat` line is a zombie child of `own_pid`
/// outside the group `own_group`.
fn orphan_zombie(stat: &str, own_pid: i32, own_group: i32) -> Option<()> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let parent: i32 = fields.next()?.parse().ok()?;
    let group: i32 = fields.next()?.parse().ok()?;
    (state == "Z" && parent == own_pid && group != own_group).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_zombie_children_of_other_groups() {
        // (stat line, is an orphan zombie of pid 10 in group 10)
        let rows = [
            ("99 (sleep) Z 10 99 99 0", true),
            ("99 (sleep) S 10 99 99 0", false),
            ("99 (sleep) Z 11 99 99 0", false),
            ("99 (az) Z 10 10 10 0", false),
            ("99 (a) Z) Z 10 99 99", true),
            ("nonsense", false),
        ];
        for (stat, expected) in rows {
            assert_eq!(orphan_zombie(stat, 10, 10).is_some(), expected, "{stat}");
        }
    }
}
