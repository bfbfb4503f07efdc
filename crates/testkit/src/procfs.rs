//! Readers of Linux's `/proc` for benchmarks: how much CPU a process has
//! used, how much memory it holds, and how loaded the machine is. Figures
//! are set against each other within a run (before/after a measurement), so
//! the clock-tick resolution of `/proc/<pid>/stat` is enough.

use std::time::Duration;

/// Which process to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// The calling process (`/proc/self`).
    This,
    /// Another process, by its id.
    Id(u32),
}

impl Process {
    fn file(self, name: &str) -> String {
        match self {
            Process::This => format!("/proc/self/{name}"),
            Process::Id(pid) => format!("/proc/{pid}/{name}"),
        }
    }
}

/// Why a `/proc` file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcfsError {
    /// The file is missing (the process exited) or unreadable.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file does not hold what Linux documents.
    #[error("{path}: {what}")]
    Malformed {
        /// The file.
        path: String,
        /// What was missing or unparsable.
        what: String,
    },
}

fn read(path: &str) -> Result<String, ProcfsError> {
    std::fs::read_to_string(path).map_err(|source| ProcfsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn malformed(path: &str, what: impl Into<String>) -> ProcfsError {
    ProcfsError::Malformed {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// User + system CPU time `process` has used (`/proc/<pid>/stat`).
pub fn cpu_time(process: Process) -> Result<Duration, ProcfsError> {
    let path = process.file("stat");
    let ticks = cpu_ticks(&read(&path)?).ok_or_else(|| malformed(&path, "no utime/stime"))?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).unwrap_or(100).max(1);
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// utime + stime, in clock ticks, of a `/proc/<pid>/stat` line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses; the fields after
    // its last `)` do not.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `fields` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory of `process` (`VmRSS` of `/proc/<pid>/status`), in KiB.
pub fn rss_kib(process: Process) -> Result<u64, ProcfsError> {
    let path = process.file("status");
    vm_rss_kib(&read(&path)?).ok_or_else(|| malformed(&path, "no VmRSS"))
}

/// Peak resident memory of `process` so far (`VmHWM` of
/// `/proc/<pid>/status`, the kernel's high-water mark), in KiB.
pub fn peak_rss_kib(process: Process) -> Result<u64, ProcfsError> {
    let path = process.file("status");
    status_kib(&read(&path)?, "VmHWM:").ok_or_else(|| malformed(&path, "no VmHWM"))
}

fn vm_rss_kib(status: &str) -> Option<u64> {
    status_kib(status, "VmRSS:")
}

fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A process's peak resident memory over its whole life: its high-water
/// mark (`VmHWM`) read every few milliseconds on a thread of its own until
/// the process is gone (an exited process has no memory to read), so the
/// peak of a process that exits on its own is known too. What it misses is
/// a peak reached in its last few milliseconds.
#[derive(Debug)]
pub struct PeakRss {
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl PeakRss {
    /// How often the high-water mark is read.
    pub const EVERY: Duration = Duration::from_millis(5);

    /// Starts watching the process `pid`.
    pub fn watch(pid: u32) -> PeakRss {
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let kept = std::sync::Arc::clone(&peak);
        std::thread::spawn(move || {
            while let Ok(kib) = peak_rss_kib(Process::Id(pid)) {
                kept.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Self::EVERY);
            }
        });
        PeakRss { peak }
    }

    /// The highest mark read so far, in KiB (0 before the first read).
    pub fn kib(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), as printed in
/// a benchmark's banner; `?` if unreadable.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_cpu_as_it_works() {
        let before = cpu_time(Process::This).unwrap();
        // Bounded busy work: a billion-step loop is far more than a tick.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut spins = 0u64;
        while cpu_time(Process::This).unwrap() <= before && std::time::Instant::now() < deadline {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
        assert!(cpu_time(Process::This).unwrap() > before, "{spins} spins");
    }

    #[test]
    fn own_pid_and_self_read_alike() {
        let pid = Process::Id(std::process::id());
        assert!(rss_kib(pid).unwrap() > 0);
        assert!(rss_kib(Process::This).unwrap() > 0);
        assert!(cpu_time(pid).is_ok());
    }

    #[test]
    fn memory_grows_with_what_the_process_touches() {
        let before = rss_kib(Process::This).unwrap();
        // 64 MiB, written so every page is resident.
        let block = vec![1u8; 64 << 20];
        let after = rss_kib(Process::This).unwrap();
        assert!(
            std::hint::black_box(&block)
                .iter()
                .step_by(4096)
                .all(|b| *b == 1)
        );
        assert!(after >= before + 32 * 1024, "{before} KiB → {after} KiB");
    }

    #[test]
    fn the_peak_stays_after_memory_is_given_back() {
        let block = vec![1u8; 32 << 20];
        assert_eq!(
            std::hint::black_box(&block).iter().step_by(4096).count(),
            8192
        );
        drop(block);
        // The kernel's counters are per CPU, so two reads of the same mark
        // may differ by a few pages: compared with what was touched.
        let peak = peak_rss_kib(Process::This).unwrap();
        assert!(peak >= 32 * 1024, "{peak} KiB");
        let watched = PeakRss::watch(std::process::id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while watched.kib() == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(PeakRss::EVERY);
        }
        assert!(watched.kib() >= 32 * 1024, "{} KiB", watched.kib());
    }

    #[test]
    fn a_gone_process_is_a_read_error() {
        // Pid 0 is never a /proc entry.
        let error = cpu_time(Process::Id(0)).unwrap_err();
        assert!(matches!(error, ProcfsError::Read { .. }), "{error}");
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 300 45 0 0";
        assert_eq!(cpu_ticks(stat), Some(345));
        assert_eq!(cpu_ticks("42 (x) S 1"), None);
        assert_eq!(vm_rss_kib("Name:\tx\nVmRSS:\t  1234 kB\n"), Some(1234));
        assert_eq!(vm_rss_kib("Name:\tx\n"), None);
    }

    #[test]
    fn the_load_average_has_three_figures() {
        assert_eq!(load_average().split(' ').count(), 3);
    }
}
