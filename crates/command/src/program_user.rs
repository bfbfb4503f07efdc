//! `--program-user`: programs run as another user than their runner, the
//! only complete separation from what the runner may read (its settings
//! file, a token file, the rendezvous directory) and from the runner
//! process itself (its `/proc` files, its signals).
//!
//! The user is looked up in `/etc/passwd` and `/etc/group` as files (the
//! binaries may be statically linked, and a static C library cannot load
//! NSS modules: a user known only to LDAP or SSSD is given as `UID[:GID]`).
//! The switch happens in the child, between fork and exec
//! ([`ProgramUser::switch`]): supplementary groups, group, user, then every
//! capability dropped, and only then the parent-death signal, which a
//! change of user clears (`spawner.rs`).
//!
//! The runner needs root's powers for it, and checks it has them at start
//! ([`ProgramUser::check_runner`]): to change user and groups
//! (`CAP_SETUID`, `CAP_SETGID`), to give the program its directories
//! (`CAP_CHOWN`), to read and remove what the program leaves in them
//! (`CAP_DAC_OVERRIDE`) and to signal it (`CAP_KILL`); to find a killed
//! runner's leftover processes of that user by their environment it also
//! needs `CAP_SYS_PTRACE` (without it, a warning). And the kernel must
//! refuse hard links to files one cannot write (`fs.protected_hardlinks`),
//! or a program could link a file only the runner may read as its
//! checkpoint file and have the runner save it where the program reads
//! it back.

use std::io;
use std::path::PathBuf;

/// The user programs run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramUser {
    /// Its name (its uid as text if `/etc/passwd` has none).
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary gids (`/etc/group`), the primary one included.
    pub groups: Vec<u32>,
    /// Its home directory, if `/etc/passwd` names one.
    pub home: Option<PathBuf>,
}

/// Why programs cannot run as the user asked for.
#[derive(Debug, thiserror::Error)]
pub enum ProgramUserError {
    /// Neither a name in `/etc/passwd` nor `UID[:GID]`.
    #[error(
        "no user {0:?} in /etc/passwd (names are looked up there only, not in LDAP or SSSD: give \
         such a user as UID or UID:GID)"
    )]
    Unknown(String),
    /// Root, which separates nothing.
    #[error("programs must not run as root (uid 0): it would separate nothing from the runner")]
    Root,
    /// The runner's own user, which separates nothing.
    #[error(
        "the runner runs as uid {0} already: programs of the same user are not separated from it \
         (leave the program user unset, or run the runner as root)"
    )]
    SameAsRunner(u32),
    /// The runner lacks capabilities it needs.
    #[error(
        "running programs as another user needs the runner to have {0} (run it as root; its \
         capabilities: docs/command.md)"
    )]
    Capabilities(String),
    /// Hard links to others' files are allowed.
    #[error(
        "{0}: a program could hard-link a file only the runner may read as its checkpoint file and \
         have the runner save it; set fs.protected_hardlinks = 1 (sysctl), the default of \
         systemd and most distributions"
    )]
    Hardlinks(String),
    /// `/etc/passwd` or `/etc/group` could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The capabilities the runner needs, by bit and name.
const NEEDED: [(u32, &str); 5] = [
    (7, "CAP_SETUID"),
    (6, "CAP_SETGID"),
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (5, "CAP_KILL"),
];

/// `CAP_SYS_PTRACE`: what reading other users' `/proc/<pid>/environ` takes.
const SYS_PTRACE: u32 = 19;

impl ProgramUser {
    /// Looks `spec` up: a user name of `/etc/passwd`, or `UID` or
    /// `UID:GID`.
    pub fn lookup(spec: &str) -> Result<ProgramUser, ProgramUserError> {
        let read = |path: &'static str| {
            std::fs::read_to_string(path).map_err(|source| ProgramUserError::Read { path, source })
        };
        let passwd = read("/etc/passwd")?;
        // A system without /etc/group (a minimal image) has no supplementary groups.
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        ProgramUser::lookup_in(spec, &passwd, &group)
    }

    /// [`ProgramUser::lookup`] in the text of `/etc/passwd` and
    /// `/etc/group`.
    ///
    /// ```
    /// use spot_worker_command::ProgramUser;
    ///
    /// let passwd = "root:x:0:0:root:/root:/bin/sh\njob:x:1001:1001::/home/job:/bin/sh\n";
    /// let group = "job:x:1001:\nvideo:x:44:job,other\n";
    /// let user = ProgramUser::lookup_in("job", passwd, group)?;
    /// assert_eq!((user.uid, user.gid, user.groups.as_slice()), (1001, 1001, &[1001, 44][..]));
    /// assert_eq!(ProgramUser::lookup_in("2000:3000", passwd, group)?.gid, 3000);
    /// assert!(ProgramUser::lookup_in("root", passwd, group).is_err());
    /// # Ok::<(), spot_worker_command::ProgramUserError>(())
    /// ```
    pub fn lookup_in(
        spec: &str,
        passwd: &str,
        group: &str,
    ) -> Result<ProgramUser, ProgramUserError> {
        let spec = spec.trim();
        let entries: Vec<Vec<&str>> = passwd
            .lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| line.split(':').collect::<Vec<_>>())
            .filter(|fields| fields.len() >= 7)
            .collect();
        let numeric = spec
            .split_once(':')
            .map_or((spec, None), |(u, g)| (u, Some(g)));
        let by_id = match numeric {
            (uid, gid) if !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()) => {
                let uid: u32 = uid
                    .parse()
                    .map_err(|_| ProgramUserError::Unknown(spec.to_owned()))?;
                let gid = match gid {
                    Some(gid) => Some(
                        gid.parse::<u32>()
                            .map_err(|_| ProgramUserError::Unknown(spec.to_owned()))?,
                    ),
                    None => None,
                };
                Some((uid, gid))
            }
            _ => None,
        };
        let entry = match by_id {
            Some((uid, _)) => entries.iter().find(|f| f[2].parse() == Ok(uid)),
            None => entries.iter().find(|f| f[0] == spec),
        };
        let (name, uid, gid, home) = match (entry, by_id) {
            (Some(f), by_id) => {
                let uid = f[2]
                    .parse()
                    .map_err(|_| ProgramUserError::Unknown(spec.to_owned()))?;
                let primary = f[3]
                    .parse()
                    .map_err(|_| ProgramUserError::Unknown(spec.to_owned()))?;
                let gid = by_id.and_then(|(_, gid)| gid).unwrap_or(primary);
                let home = Some(PathBuf::from(f[5])).filter(|h| !h.as_os_str().is_empty());
                (f[0].to_owned(), uid, gid, home)
            }
            (None, Some((uid, gid))) => (uid.to_string(), uid, gid.unwrap_or(uid), None),
            (None, None) => return Err(ProgramUserError::Unknown(spec.to_owned())),
        };
        if uid == 0 {
            return Err(ProgramUserError::Root);
        }
        let mut groups = vec![gid];
        if entry.is_some() {
            for fields in group
                .lines()
                .map(|line| line.split(':').collect::<Vec<_>>())
            {
                let (Some(id), Some(members)) = (fields.get(2), fields.get(3)) else {
                    continue;
                };
                let Ok(id) = id.parse::<u32>() else { continue };
                if members.split(',').any(|member| member.trim() == name) && !groups.contains(&id) {
                    groups.push(id);
                }
            }
        }
        Ok(ProgramUser {
            name,
            uid,
            gid,
            groups,
            home,
        })
    }

    /// Checks that this runner can run programs as this user; with it, a
    /// warning if it can, but without all it would like.
    pub fn check_runner(&self) -> Result<Option<String>, ProgramUserError> {
        // SAFETY: geteuid has no arguments and cannot fail.
        let runner = unsafe { libc::geteuid() };
        if runner == self.uid {
            return Err(ProgramUserError::SameAsRunner(runner));
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let effective = capabilities_in(&status, "CapEff:").unwrap_or(0);
        let missing: Vec<&str> = NEEDED
            .iter()
            .filter(|(bit, _)| effective & (1 << bit) == 0)
            .map(|(_, name)| *name)
            .collect();
        if !missing.is_empty() {
            return Err(ProgramUserError::Capabilities(missing.join(", ")));
        }
        match std::fs::read_to_string("/proc/sys/fs/protected_hardlinks") {
            Ok(value) if value.trim() == "1" => {}
            Ok(value) => {
                return Err(ProgramUserError::Hardlinks(format!(
                    "fs.protected_hardlinks is {}",
                    value.trim()
                )));
            }
            Err(error) => {
                return Err(ProgramUserError::Hardlinks(format!(
                    "fs.protected_hardlinks cannot be read ({error})"
                )));
            }
        }
        Ok((effective & (1 << SYS_PTRACE) == 0).then(|| {
            "without CAP_SYS_PTRACE the runner cannot read the environment of the program \
             user's processes, so a killed runner's leftover processes (not its delivery \
             directories) stay for the service manager to end"
                .to_owned()
        }))
    }

    /// The variables that say who the program is: `HOME` (if known),
    /// `USER` and `LOGNAME`, in place of the runner's.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("USER", self.name.clone()), ("LOGNAME", self.name.clone())];
        if let Some(home) = &self.home {
            env.push(("HOME", home.to_string_lossy().into_owned()));
        }
        env
    }

    /// In the child, before exec: the supplementary groups, the group and
    /// the user (real, effective and saved), then no capability left
    /// (permitted, effective, inheritable and ambient), so that a runner
    /// with capabilities but no root passes none on.
    ///
    /// # Safety
    ///
    /// Only between fork and exec; it calls only async-signal-safe system
    /// calls and reads memory (`groups`) allocated before the fork.
    pub(crate) unsafe fn switch(&self) -> io::Result<()> {
        let check = |done: libc::c_long| {
            if done == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        // The system calls, not the C library's wrappers: those would set
        // the ids of every thread through a signal, and the child has one.
        // SAFETY: setgroups reads `groups.len()` gids from a live vector.
        check(unsafe {
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr())
        })?;
        // SAFETY: setresgid/setresuid take three integers.
        check(unsafe { libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) })?;
        // SAFETY: as above.
        check(unsafe { libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) })?;
        // SAFETY: prctl with integers only.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        };
        // capset(2), version 3 (two 32-bit words per set), all empty.
        let header = [0x2008_0522_u32, 0];
        let data = [0u32; 6];
        // SAFETY: capset reads a header and two data structs of 3 words.
        check(unsafe { libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) })
    }
}

/// The capability set on the line `key` of `/proc/<pid>/status` (hex).
fn capabilities_in(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(key))?;
    u64::from_str_radix(line[key.len()..].trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash
# a comment
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
job:x:1001:1002:the job:/home/job:/bin/sh
broken:x:notanumber:1:::
";
    const GROUP: &str = "root:x:0:
video:x:44:job,other
render:x:105:other
jobs:x:1002:
gpu:x:300: job ,x
";

    #[test]
    fn users_by_name_or_id() {
        let user = |spec| ProgramUser::lookup_in(spec, PASSWD, GROUP);
        let job = user("job").unwrap();
        assert_eq!(
            job,
            ProgramUser {
                name: "job".into(),
                uid: 1001,
                gid: 1002,
                groups: vec![1002, 44, 300],
                home: Some("/home/job".into()),
            }
        );
        assert_eq!(user("1001").unwrap(), job, "by uid, with its entry");
        assert_eq!(user("1001:5").unwrap().gid, 5, "another group given");
        let anon = user("4242").unwrap();
        assert_eq!(
            (
                anon.name.as_str(),
                anon.uid,
                anon.gid,
                anon.groups,
                anon.home
            ),
            ("4242", 4242, 4242, vec![4242], None),
            "no entry: the uid as its group, no supplementary group"
        );
        assert_eq!(user("4242:100").unwrap().gid, 100);
        assert_eq!(user("nobody").unwrap().uid, 65534);
        // (spec, error text)
        for (spec, text) in [
            ("root", "must not run as root"),
            ("0", "must not run as root"),
            ("0:1000", "must not run as root"),
            ("nosuch", "no user \"nosuch\""),
            ("broken", "no user"),
            ("12:x", "no user"),
            ("", "no user"),
            ("99999999999", "no user"),
        ] {
            let error = user(spec).unwrap_err().to_string();
            assert!(error.contains(text), "{spec}: {error}");
        }
    }

    #[test]
    fn capability_sets_from_status_lines() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(capabilities_in(status, "CapEff:"), Some(0x1ff_ffff_ffff));
        assert_eq!(capabilities_in(status, "CapBnd:"), None);
    }

    #[test]
    fn the_program_is_told_who_it_is() {
        let job = ProgramUser::lookup_in("job", PASSWD, GROUP).unwrap();
        assert_eq!(
            job.env(),
            [
                ("USER", "job".to_owned()),
                ("LOGNAME", "job".to_owned()),
                ("HOME", "/home/job".to_owned())
            ]
        );
    }
}
