//! How a delivery directory names the runner that made it, so that the
//! next runner's start can tell its own leftovers from another's.
//!
//! A process id alone names nothing outside its PID namespace: runners in
//! two containers (or `unshare --pid`) that share a work root both run as
//! pid 1, and from the host the pid in a container's file names some other
//! process. So the file `runner` holds the runner's pid *and* start time
//! (which tell a running runner from a pid reused since), the PID
//! namespace they are numbers in (the inode of `/proc/self/ns/pid`), the
//! boot (`/proc/sys/kernel/random/boot_id`: pids and start times restart
//! with each boot, and a work root on a network file system may be another
//! machine's) and the runner's uid. Only a runner that matches the last
//! three may judge the first two.

use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

/// The first line of a runner file: what it is, and which layout.
const HEADER: &str = "spot-worker runner 2";

/// The most a runner file may hold: its five short lines take about 120
/// bytes.
pub(crate) const MAX_RUNNER_FILE: usize = 512;

/// A runner, as its delivery directories name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunnerId {
    /// Its pid, in `pidns`.
    pub(crate) pid: u32,
    /// Its start time, in clock ticks after boot (field 22 of
    /// `/proc/<pid>/stat`).
    pub(crate) start: u64,
    /// The boot it runs in.
    pub(crate) boot: String,
    /// The inode of its PID namespace.
    pub(crate) pidns: u64,
    /// Its effective uid.
    pub(crate) uid: u32,
}

impl RunnerId {
    /// This process, or `None` where `/proc` cannot say (then its
    /// directories are never swept, and it sweeps nothing).
    pub(crate) fn current() -> Option<&'static RunnerId> {
        static CURRENT: OnceLock<Option<RunnerId>> = OnceLock::new();
        CURRENT
            .get_or_init(|| {
                Some(RunnerId {
                    pid: std::process::id(),
                    start: start_time_in(&std::fs::read_to_string("/proc/self/stat").ok()?)?,
                    boot: boot_id()?,
                    pidns: std::fs::metadata("/proc/self/ns/pid").ok()?.ino(),
                    // SAFETY: geteuid has no arguments and cannot fail.
                    uid: unsafe { libc::geteuid() },
                })
            })
            .as_ref()
    }

    /// The runner file's text.
    pub(crate) fn to_text(&self) -> String {
        format!(
            "{HEADER}\npid={}\nstart={}\nboot={}\npidns={}\nuid={}\n",
            self.pid, self.start, self.boot, self.pidns, self.uid
        )
    }

    /// A runner file's text, read back; `None` if it is not one (another
    /// layout, such as the `<pid> <start>` of earlier runners, or a part
    /// missing).
    pub(crate) fn parse(text: &str) -> Option<RunnerId> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let (mut pid, mut start, mut boot, mut pidns, mut uid) = (None, None, None, None, None);
        for line in lines {
            let (key, value) = line.split_once('=')?;
            match key {
                "pid" => pid = value.parse().ok(),
                "start" => start = value.parse().ok(),
                "boot" => boot = Some(value).filter(|b| is_boot_id(b)).map(str::to_owned),
                "pidns" => pidns = value.parse().ok(),
                "uid" => uid = value.parse().ok(),
                _ => {}
            }
        }
        Some(RunnerId {
            pid: pid?,
            start: start?,
            boot: boot?,
            pidns: pidns?,
            uid: uid?,
        })
    }

    /// Whether `self` (a runner file's) is a runner whose pid and start
    /// time `me` can judge: the same boot, PID namespace and user.
    pub(crate) fn is_judged_by(&self, me: &RunnerId) -> bool {
        self.boot == me.boot && self.pidns == me.pidns && self.uid == me.uid
    }

    /// Whether this runner still runs, read in this process's `/proc`
    /// (which must be of this runner's namespace: see [`proc_is_ours`]).
    pub(crate) fn is_running(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

/// Whether `/proc` is a view of this process's own PID namespace: in a
/// namespace made without a `/proc` of its own (`unshare --pid` without
/// `--mount-proc`), `/proc/<pid>` names the processes of another
/// namespace, and a pid from this one names there some other process.
pub(crate) fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|link| link.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// This boot's id.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| is_boot_id(id))
}

/// Whether `id` looks like a boot id (a UUID: hex digits and dashes).
fn is_boot_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The start time (clock ticks after boot) of process `pid`.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
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

    const BOOT: &str = "f4c5b58b-934b-4235-a8d0-2a414e8c3727";

    fn runner(pid: u32, start: u64, pidns: u64, uid: u32) -> RunnerId {
        RunnerId {
            pid,
            start,
            boot: BOOT.to_owned(),
            pidns,
            uid,
        }
    }

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
    }

    #[test]
    fn a_runner_file_reads_back_or_is_not_one() {
        let me = runner(7, 99, 4026531836, 1000);
        assert_eq!(RunnerId::parse(&me.to_text()), Some(me.clone()));
        // (case, text)
        let refused = [
            ("the earlier layout", "4242 987654".to_owned()),
            ("empty", String::new()),
            ("no header", me.to_text().replace(HEADER, "")),
            ("a part missing", me.to_text().replace("uid=1000\n", "")),
            ("not a number", me.to_text().replace("pid=7", "pid=seven")),
            ("not a boot id", me.to_text().replace(BOOT, "../../etc")),
            ("a line without =", format!("{}junk\n", me.to_text())),
        ];
        for (case, text) in refused {
            assert_eq!(RunnerId::parse(&text), None, "{case}");
        }
    }

    #[test]
    fn only_a_runner_of_the_same_boot_namespace_and_user_is_judged() {
        let me = runner(1, 100, 10, 0);
        let rows = [
            ("mine", runner(1, 50, 10, 0), true),
            ("another namespace", runner(1, 50, 11, 0), false),
            ("another user", runner(1, 50, 10, 65534), false),
            (
                "another boot",
                RunnerId {
                    boot: BOOT.replace('f', "0"),
                    ..runner(1, 50, 10, 0)
                },
                false,
            ),
        ];
        for (case, named, judged) in rows {
            assert_eq!(named.is_judged_by(&me), judged, "{case}");
        }
    }

    #[test]
    fn this_process_names_itself_and_runs() {
        let me = RunnerId::current().expect("/proc says who this process is");
        assert_eq!(me.pid, std::process::id());
        assert!(me.is_running());
        assert!(
            proc_is_ours(),
            "the test runs with a /proc of its namespace"
        );
        let reused = RunnerId {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(
            !reused.is_running(),
            "a pid reused since is another process"
        );
    }
}
