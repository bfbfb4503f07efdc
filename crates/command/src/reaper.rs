//! Reaping orphans that left their program's process group (`setsid`, a
//! daemon's double fork): as a child subreaper the runner inherits them,
//! and when they exit nobody else can reap them.
//!
//! Tokio reaps the programs themselves, by pid; taking one of their
//! statuses first would lose a program's exit status. So the sweep reaps
//! only zombies that are the runner's children, are not a running
//! program's main process (the set of [`programs`]), and are not in the
//! runner's own process group (where anything the runner itself spawns
//! outside this crate lives).
//!
//! A program is in that set from the moment it exists: it is started
//! ([`spawn_program`]) under the lock the sweep takes before it decides
//! whom to reap and holds to its last `waitpid`, and entered before the
//! lock is let go. Marked any later, a program that exits at once could be
//! a zombie the sweep sees (and reaps) before it is marked.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How often [`spawn_orphan_reaper`] sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The pids of programs whose status Tokio has yet to collect, each with
/// how many programs hold it (a pid reused by a new program before the
/// old one was marked collected stays marked for the new one).
fn programs() -> &'static Mutex<HashMap<u32, usize>> {
    static PROGRAMS: OnceLock<Mutex<HashMap<u32, usize>>> = OnceLock::new();
    PROGRAMS.get_or_init(Mutex::default)
}

/// Starts a program with `spawn`, the sweep held off until it is marked
/// as one Tokio waits for.
pub(crate) fn spawn_program(
    spawn: impl FnOnce() -> std::io::Result<tokio::process::Child>,
) -> std::io::Result<tokio::process::Child> {
    let mut programs = programs().lock().unwrap_or_else(|p| p.into_inner());
    let child = spawn()?;
    if let Some(pid) = child.id() {
        *programs.entry(pid).or_default() += 1;
    }
    Ok(child)
}

/// Tokio has collected `pid`'s status.
pub(crate) fn program_reaped(pid: u32) {
    let mut programs = programs().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(count) = programs.get_mut(&pid) {
        *count -= 1;
        if *count == 0 {
            programs.remove(&pid);
        }
    }
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
    // The look at /proc runs without the lock (it takes milliseconds, and
    // programs start meanwhile): a zombie seen here may be a program whose
    // start has not returned yet, but by the time the lock is taken below
    // its start has marked it.
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
    if zombies.is_empty() {
        return 0;
    }
    // Held to the last waitpid: no program starts meanwhile unmarked.
    let running = programs().lock().unwrap_or_else(|p| p.into_inner());
    zombies
        .into_iter()
        .filter(|pid| !running.contains_key(&pid.unsigned_abs()))
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Programs that exit at once, started while a sweep runs without
    /// pause: every exit status still reaches Tokio (a sweep that took one
    /// would make `wait` fail with ECHILD).
    #[test]
    fn the_sweep_never_takes_a_programs_exit_status() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sweeping = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut reaped = 0;
                while !stop.load(Ordering::Relaxed) {
                    reaped += reap_orphans();
                }
                reaped
            }
        });
        let statuses = runtime.block_on(async {
            let mut statuses = Vec::new();
            for _ in 0..300 {
                let mut command = tokio::process::Command::new("true");
                // Out of this process's group, as every program is.
                command.process_group(0);
                let mut child = crate::spawner::spawn_tied_to_runner(command, None)
                    .await
                    .unwrap();
                let pid = child.id().unwrap();
                let status = child.wait().await;
                program_reaped(pid);
                statuses.push(status.map(|s| s.code()).map_err(|e| e.to_string()));
            }
            statuses
        });
        stop.store(true, Ordering::Relaxed);
        let reaped = sweeping.join().unwrap();
        let lost: Vec<_> = statuses.iter().filter(|s| **s != Ok(Some(0))).collect();
        assert!(
            lost.is_empty(),
            "{} of 300 statuses lost: {lost:?}",
            lost.len()
        );
        assert_eq!(reaped, 0, "the sweep reaped a program");
    }

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
