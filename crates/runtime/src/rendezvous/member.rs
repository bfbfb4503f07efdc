//! One worker's membership of its VM's group: its locked member file,
//! renamed as its state changes, and what it reads of the others'.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use spot_worker_untrusted::{escape_line, read_at_most};

use super::{
    IO_TIMEOUT, MemberState, Peer, Peers, RendezvousError, Seen, busy_peers, group_name, trust,
};

/// The most of a member file's text that is read: a worker writes a line
/// of a few dozen bytes ("pid 4242, queue jobs").
const MAX_ABOUT: usize = 256;

/// A candidate directory passed over, and why.
#[derive(Debug)]
pub(crate) struct PassedOver {
    /// The candidate.
    pub(crate) dir: PathBuf,
    /// Whether something is there (other workers may meet in it).
    pub(crate) exists: bool,
    /// Why it could not be used.
    pub(crate) error: RendezvousError,
}

/// This worker's membership: its locked file, renamed as its state changes
/// and removed when it is dropped (a crash leaves it unlocked, which peers
/// treat the same as gone).
#[derive(Debug)]
pub(crate) struct Member {
    /// The candidate directory it joined.
    base: PathBuf,
    /// Its group's directory in it.
    group: PathBuf,
    id: String,
    /// Held for the lock; the kernel releases it with the process.
    _file: File,
    state: Mutex<MemberState>,
    /// The untrusted files already said in the log, by name: each once.
    warned: Mutex<HashSet<OsString>>,
    /// Set when other workers may meet where this one cannot look (why):
    /// its view is then always unknown.
    pub(crate) blind: Option<String>,
}

impl Member {
    /// Joins the group of `imds_endpoint` in the first usable candidate
    /// directory, as a working member described by `about`; with it, the
    /// candidates before it that were passed over. The error names every
    /// directory tried.
    pub(crate) fn join(
        candidates: &[PathBuf],
        imds_endpoint: &str,
        about: &str,
    ) -> Result<(Member, Vec<PassedOver>), Vec<PassedOver>> {
        let mut passed_over = Vec::new();
        for dir in candidates {
            match Member::join_in(dir, &dir.join(group_name(imds_endpoint)), about) {
                Ok(member) => return Ok((member, passed_over)),
                Err(error) => passed_over.push(PassedOver {
                    dir: dir.clone(),
                    exists: dir.symlink_metadata().is_ok(),
                    error,
                }),
            }
        }
        Err(passed_over)
    }

    fn join_in(base: &Path, group: &Path, about: &str) -> Result<Member, RendezvousError> {
        trust::prepare(base, group)?;
        let id = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        // Locked under a hidden name first, so that no reader ever sees the
        // member unlocked (and removes it as stale).
        let joining = group.join(format!(".{id}.joining"));
        let file = match create_locked(&joining, about) {
            // The group was removed as empty just now: made again, once.
            Err(error) if error.source.kind() == std::io::ErrorKind::NotFound => {
                trust::prepare(base, group)?;
                create_locked(&joining, about).map_err(|e| e.error)?
            }
            made => made.map_err(|e| e.error)?,
        };
        let working = group.join(format!("{id}.{}", MemberState::Working.suffix()));
        if let Err(source) = std::fs::rename(&joining, &working) {
            let _ = std::fs::remove_file(&joining);
            return Err(RendezvousError::new("cannot rename into", &working, source));
        }
        // What crashed workers left, here and in the other groups.
        trust::tidy(base, group);
        Ok(Member {
            base: base.to_owned(),
            group: group.to_owned(),
            id,
            _file: file,
            state: Mutex::new(MemberState::Working),
            warned: Mutex::default(),
            blind: None,
        })
    }

    /// The candidate directory this member joined.
    pub(crate) fn base(&self) -> &Path {
        &self.base
    }

    /// The directory this member and its peers are in.
    pub(crate) fn group(&self) -> &Path {
        &self.group
    }

    fn path(&self, state: MemberState) -> PathBuf {
        self.group.join(format!("{}.{}", self.id, state.suffix()))
    }

    /// Publishes this worker's state (a rename; the lock moves with the
    /// file). A failure is logged: peers then see the old state, and wait
    /// for this worker at most until the event's deadline.
    pub(crate) fn set_state(&self, state: MemberState) {
        let mut current = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *current == state {
            return;
        }
        match std::fs::rename(self.path(*current), self.path(state)) {
            Ok(()) => *current = state,
            Err(error) => tracing::warn!(
                %error,
                dir = %self.group.display(),
                "cannot tell the other workers on this VM that this one is {}",
                state.suffix()
            ),
        }
    }

    /// [`Member::set_state`] on a blocking thread, bounded by
    /// [`IO_TIMEOUT`].
    pub(crate) async fn publish(self: &Arc<Self>, state: MemberState) {
        let member = Arc::clone(self);
        let renaming = tokio::task::spawn_blocking(move || member.set_state(state));
        if tokio::time::timeout(IO_TIMEOUT, renaming).await.is_err() {
            tracing::warn!(
                dir = %self.group.display(),
                "telling the other workers on this VM that this one is {} took longer than {IO_TIMEOUT:?}",
                state.suffix()
            );
        }
    }

    /// The other members of the group; stale ones (their lock free) are
    /// removed on the way and reported as gone, and files that cannot be
    /// trusted as members are reported as unknown (and said once in the
    /// log).
    pub(crate) fn peers(&self) -> std::io::Result<Vec<Peer>> {
        let owners = trust::owners();
        let mut peers = Vec::new();
        let mut untrusted = Vec::new();
        for entry in std::fs::read_dir(&self.group)? {
            let entry = entry?;
            let raw_name = entry.file_name();
            let name = raw_name.to_string_lossy();
            let Some((id, suffix)) = name.rsplit_once('.') else {
                continue;
            };
            let Some(state) = MemberState::from_suffix(suffix) else {
                continue;
            };
            if id.starts_with('.') || id == self.id {
                continue;
            }
            let path = entry.path();
            let file = match spot_worker_untrusted::open(&path, &owners) {
                Ok(file) => file,
                // Gone between the listing and now: renamed (read next
                // time) or removed (it left).
                Err(error) if error.is_not_found() => continue,
                Err(error) => {
                    untrusted.push((raw_name, error.to_string()));
                    continue;
                }
            };
            let seen = match file.try_lock_shared() {
                Err(TryLockError::WouldBlock) => Seen::Live(state),
                Ok(()) => Seen::Gone,
                // A lock that cannot be tried is no proof of a crash.
                Err(TryLockError::Error(error)) => {
                    let why = format!("its lock cannot be tried: {error}");
                    untrusted.push((raw_name, why));
                    continue;
                }
            };
            if seen == Seen::Gone {
                let _ = std::fs::remove_file(&path);
            }
            peers.push(Peer {
                about: about(&file, id),
                seen,
            });
        }
        self.say_untrusted(&untrusted);
        peers.extend(untrusted.iter().map(|(name, _)| Peer {
            about: format!(
                "untrusted member file {}",
                escape_line(&name.to_string_lossy())
            ),
            seen: Seen::Unknown,
        }));
        Ok(peers)
    }

    /// Says in one warning the files (with why) found untrusted for the
    /// first time: each file is said once, however often it is read.
    fn say_untrusted(&self, untrusted: &[(OsString, String)]) {
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<&String> = untrusted
            .iter()
            .filter(|(name, _)| warned.insert(name.clone()))
            .map(|(_, why)| why)
            .collect();
        if new.is_empty() {
            return;
        }
        let whys: Vec<&str> = new.iter().map(|why| why.as_str()).collect();
        tracing::warn!(
            dir = %escape_line(&self.group.to_string_lossy()),
            "{} file(s) in the rendezvous directory cannot be trusted as member files ({}); \
             until they are removed, this worker approves events only at their deadline",
            new.len(),
            whys.join("; ")
        );
    }

    /// What the other workers on this VM say, read now.
    pub(crate) fn read_view(&self) -> Peers {
        if let Some(why) = &self.blind {
            return Peers::Unknown(why.clone());
        }
        match self.peers() {
            Ok(peers) => match busy_peers(&peers) {
                busy if busy.is_empty() => Peers::Drained,
                busy => Peers::Busy(busy),
            },
            Err(error) => Peers::Unknown(format!(
                "cannot read the rendezvous directory {}: {error}",
                escape_line(&self.group.to_string_lossy())
            )),
        }
    }

    /// [`Member::read_view`] on a blocking thread, bounded by
    /// [`IO_TIMEOUT`] (past it: unknown).
    pub(crate) async fn view(self: &Arc<Self>) -> Peers {
        let member = Arc::clone(self);
        let reading = tokio::task::spawn_blocking(move || member.read_view());
        match tokio::time::timeout(IO_TIMEOUT, reading).await {
            Ok(Ok(view)) => view,
            Ok(Err(failed)) => {
                Peers::Unknown(format!("reading the rendezvous directory failed: {failed}"))
            }
            Err(_) => Peers::Unknown(format!(
                "reading the rendezvous directory {} took longer than {IO_TIMEOUT:?}",
                escape_line(&self.group.to_string_lossy())
            )),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let state = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = std::fs::remove_file(self.path(state));
    }
}

/// A member file's text, at most [`MAX_ABOUT`] bytes of it, on one line
/// and escaped; `member <id>` if it says nothing.
fn about(mut file: &File, id: &str) -> String {
    let (bytes, more) = read_at_most(&mut file, MAX_ABOUT).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    if text.is_empty() {
        return format!("member {}", escape_line(id));
    }
    let mut about = escape_line(text).into_owned();
    if more {
        about.push('…');
    }
    about
}

/// Why a member file could not be made, and the I/O error behind it.
struct NotMade {
    error: RendezvousError,
    source: std::io::Error,
}

/// Creates `path` (never through a link, never over anything), locks it
/// and writes `about` into it.
fn create_locked(path: &Path, about: &str) -> Result<File, NotMade> {
    let fail = |what: &'static str| {
        move |source: std::io::Error| NotMade {
            error: RendezvousError::new(
                what,
                path,
                std::io::Error::new(source.kind(), source.to_string()),
            ),
            source,
        }
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(fail("cannot create"))?;
    let locked = file.try_lock().map_err(|e| match e {
        TryLockError::Error(e) => e,
        TryLockError::WouldBlock => std::io::ErrorKind::WouldBlock.into(),
    });
    let made = locked
        .map_err(fail("cannot lock"))
        .and_then(|()| {
            file.write_all(about.as_bytes())
                .map_err(fail("cannot write"))
        })
        // Readable by workers of other users, whatever the umask: they
        // open it to try its lock.
        .and_then(|()| {
            file.set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(fail("cannot open up"))
        });
    if let Err(not_made) = made {
        let _ = std::fs::remove_file(path);
        return Err(not_made);
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn join(dir: &Path, endpoint: &str, about: &str) -> Member {
        Member::join(&[dir.to_owned()], endpoint, about)
            .map(|(member, _)| member)
            .unwrap_or_else(|errors| {
                panic!(
                    "{:?}",
                    errors
                        .iter()
                        .map(|p| p.error.to_string())
                        .collect::<Vec<_>>()
                )
            })
    }

    fn warned(member: &Member) -> usize {
        member.warned.lock().unwrap().len()
    }

    #[test]
    fn members_see_each_other_drain_and_leave() {
        let dir = tempfile::tempdir().unwrap();
        let a = join(dir.path(), "http://e", "pid 1, queue a");
        assert_eq!(a.read_view(), Peers::Drained, "alone");
        let b = join(dir.path(), "http://e", "pid 2, queue b");
        assert_eq!(a.read_view(), Peers::Busy(vec!["pid 2, queue b".into()]));
        assert_eq!(b.read_view(), Peers::Busy(vec!["pid 1, queue a".into()]));
        b.set_state(MemberState::Drained);
        assert_eq!(a.read_view(), Peers::Drained);
        b.set_state(MemberState::Working);
        assert_eq!(a.read_view(), Peers::Busy(vec!["pid 2, queue b".into()]));
        drop(b);
        assert_eq!(a.read_view(), Peers::Drained, "left");
        // Another endpoint is another group.
        let other = join(dir.path(), "http://f", "pid 3");
        assert_eq!(a.read_view(), Peers::Drained);
        assert_ne!(other.group(), a.group());
    }

    #[test]
    fn an_unlocked_member_file_is_stale_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let a = join(dir.path(), "http://e", "pid 1");
        // What a crashed worker leaves: its file, no lock on it.
        let stale = a.group().join("99999-0000abcd.working");
        std::fs::write(&stale, "pid 99999, queue gone").unwrap();
        let peers = a.peers().unwrap();
        assert_eq!(
            peers,
            [Peer {
                about: "pid 99999, queue gone".into(),
                seen: Seen::Gone
            }]
        );
        assert_eq!(a.read_view(), Peers::Drained);
        assert!(!stale.exists(), "removed");
    }

    #[test]
    fn a_file_that_cannot_be_trusted_holds_the_approval_and_is_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = join(dir.path(), "http://e", "pid 1");
        let group = a.group().to_owned();
        // A FIFO no one writes to, a link to /dev/zero, a directory.
        let fifo = group.join("666-fifo\x1b[2J.working");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        symlink("/dev/zero", group.join("667-zero.working")).unwrap();
        std::fs::create_dir(group.join("668-dir.drained")).unwrap();
        for _ in 0..3 {
            let Peers::Busy(busy) = a.read_view() else {
                panic!("not busy: {:?}", a.read_view());
            };
            assert_eq!(busy.len(), 3, "{busy:?}");
            assert!(
                busy.iter().all(|b| b.starts_with("untrusted member file")),
                "{busy:?}"
            );
            assert!(
                busy.iter().any(|b| b.contains("666-fifo\\u{1b}[2J")),
                "{busy:?}"
            );
            assert!(!busy.iter().any(|b| b.contains('\x1b')), "{busy:?}");
        }
        assert_eq!(warned(&a), 3, "each said once");
    }

    #[test]
    fn another_users_member_file_is_unknown() {
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can give a file to another user (CI runs as root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let a = join(dir.path(), "http://e", "pid 1");
        let foreign = a.group().join("5-x.drained");
        std::fs::write(&foreign, "pid 5, queue forged").unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        let Peers::Busy(busy) = a.read_view() else {
            panic!("{:?}", a.read_view());
        };
        assert_eq!(busy, ["untrusted member file 5-x.drained"]);
        assert!(
            foreign.exists(),
            "not removed: it is not this worker's to remove"
        );
    }

    #[test]
    fn a_member_says_at_most_a_line_of_escaped_text() {
        let dir = tempfile::tempdir().unwrap();
        let a = join(dir.path(), "http://e", "pid 1");
        let b = join(dir.path(), "http://e", "x");
        // b's text, as a worker of the same user could write it.
        let long = format!("pid 2\n\x1b[31m{}", "y".repeat(1000));
        std::fs::write(b.path(MemberState::Working), &long).unwrap();
        let Peers::Busy(busy) = a.read_view() else {
            panic!("{:?}", a.read_view());
        };
        assert!(busy[0].starts_with("pid 2\\u{a}\\u{1b}[31myyy"), "{busy:?}");
        assert!(busy[0].ends_with('…'), "{busy:?}");
        assert!(busy[0].len() < MAX_ABOUT + 32, "{}", busy[0].len());
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let errors = Member::join(&[file.join("below")], "http://e", "x").unwrap_err();
        assert_eq!(errors.len(), 1);
        let error = errors[0].error.to_string();
        assert!(error.contains("a-file/below"), "{error}");
        assert!(!errors[0].exists);
    }

    #[test]
    fn a_later_candidate_is_joined_when_an_earlier_one_cannot_be_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("run"), dir.path().join("xdg"));
        std::fs::create_dir(&first).unwrap();
        std::fs::set_permissions(&first, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (member, passed) =
            Member::join(&[first.clone(), second.clone()], "http://e", "x").unwrap();
        assert_eq!(member.base(), second);
        assert_eq!(passed.len(), 1);
        assert!(passed[0].exists, "the first exists: workers may meet there");
        assert!(
            passed[0].error.to_string().contains("sticky"),
            "{}",
            passed[0].error
        );
    }
}
