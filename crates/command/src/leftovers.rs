//! What a runner killed with SIGKILL left behind, cleaned up by the next
//! runner's start: a program dies with its runner (`spawner.rs`), but what
//! the program started itself (a background child, an orphan) has no
//! parent-death signal and is re-parented away, still running, and the
//! delivery directory with its files stays on disk.
//!
//! Each delivery directory names its runner (pid and start time, in the
//! file `runner`). A directory whose runner is no longer running is a
//! leftover: every process whose environment still says it works there
//! (`SPOT_WORKER_WORK_DIR`, inherited from the program unless a process
//! cleared it) gets SIGKILL, and the directory is removed. A directory
//! without that file, or of a runner still running, is never touched.

use std::path::{Path, PathBuf};

/// The file of a delivery directory that names its runner.
pub(crate) const RUNNER_FILE: &str = "runner";

/// What [`sweep_leftovers`] cleaned up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Delivery directories of runners no longer running, removed.
    pub directories: usize,
    /// Processes still working in them, killed.
    pub processes: usize,
}

/// This process as a delivery directory names it: `"<pid> <start time>"`.
pub(crate) fn runner_identity() -> &'static str {
    static IDENTITY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(|| {
        let pid = std::process::id();
        let started = start_time(pid).unwrap_or(0);
        format!("{pid} {started}")
    })
}

/// Kills what runners that are gone left running in their delivery
/// directories under `root` (the system's temporary directory if `None`,
/// as for [`CommandConfig::work_root`](crate::CommandConfig::work_root)),
/// and removes those directories. Call once at start, before the first
/// delivery.
pub fn sweep_leftovers(root: Option<&Path>) -> Leftovers {
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
        let Ok(named) = std::fs::read_to_string(dir.join(RUNNER_FILE)) else {
            continue;
        };
        if runner_alive(&named) {
            continue;
        }
        swept.processes += kill_working_in(&dir.join("work"));
        if std::fs::remove_dir_all(&dir).is_ok() {
            swept.directories += 1;
        }
    }
    swept
}

/// Whether the runner `"<pid> <start time>"` still runs (a pid taken by
/// another process since has another start time).
fn runner_alive(named: &str) -> bool {
    if start_time(std::process::id()).is_none() {
        // Without /proc nothing can be told apart: touch nothing.
        return true;
    }
    let mut parts = named.split_whitespace();
    let (Some(pid), Some(started)) = (parts.next(), parts.next()) else {
        // Unreadable: leave it alone rather than guess.
        return true;
    };
    let (Ok(pid), Ok(started)) = (pid.parse::<u32>(), started.parse::<u64>()) else {
        return true;
    };
    start_time(pid) == Some(started)
}

/// SIGKILL to every process whose environment has
/// `SPOT_WORKER_WORK_DIR=<work>`; how many.
fn kill_working_in(work: &Path) -> usize {
    let marker = format!("SPOT_WORKER_WORK_DIR={}", work.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid > 1 && pid.unsigned_abs() != std::process::id())
        .filter(|pid| {
            std::fs::read(PathBuf::from(format!("/proc/{pid}/environ"))).is_ok_and(|environ| {
                environ
                    .split(|&b| b == 0)
                    .any(|var| var == marker.as_bytes())
            })
        })
        // SAFETY: kill(2) on one positive pid found above; no pointers.
        .filter(|&pid| unsafe { libc::kill(pid, libc::SIGKILL) } == 0)
        .count()
}

/// The start time (clock ticks after boot) of process `pid`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    start_time_in(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line (the 20th after the command's
/// closing parenthesis).
fn start_time_in(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_from_stat_lines() {
        let rows = [
            (
                "42 (sh) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10",
                Some(987_654),
            ),
            (
                "43 (a) b) S 1 43 43 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 1 1",
                Some(5),
            ),
            ("44 (short) S 1", None),
            ("garbage", None),
        ];
        for (stat, expected) in rows {
            assert_eq!(start_time_in(stat), expected, "{stat}");
        }
        assert!(runner_alive(runner_identity()), "this process runs");
        assert!(!runner_alive("4194304999 1"), "no such pid");
        assert!(runner_alive("not a runner"), "unreadable: left alone");
    }

    #[test]
    fn only_directories_of_runners_that_are_gone_are_swept() {
        let root = tempfile::tempdir().unwrap();
        let make = |name: &str, runner: Option<&str>| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(dir.join("work")).unwrap();
            if let Some(runner) = runner {
                std::fs::write(dir.join(RUNNER_FILE), runner).unwrap();
            }
            dir
        };
        let gone = make("spot-worker-gone", Some("4194304999 1"));
        let mine = make("spot-worker-mine", Some(runner_identity()));
        let unnamed = make("spot-worker-unnamed", None);
        let other = make("other", Some("4194304999 1"));
        let swept = sweep_leftovers(Some(root.path()));
        assert_eq!(
            swept,
            Leftovers {
                directories: 1,
                processes: 0
            }
        );
        assert!(!gone.exists());
        for kept in [mine, unnamed, other] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }
}
