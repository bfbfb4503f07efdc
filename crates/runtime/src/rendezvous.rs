//! The workers on one VM agree before any of them approves a Scheduled
//! Event: approving starts it for the whole VM, so a worker that drained in
//! no time must not cut short the notice of another one still winding down
//! (its program saving its progress).
//!
//! Each worker joins a rendezvous directory when it starts: one member file
//! per worker, held under an exclusive `flock` for as long as the process
//! lives and named by the worker's state (`<member>.working` or
//! `<member>.drained`; a rename, so a reader never sees half a state). The
//! kernel releases a lock when its process dies, however it dies: a member
//! file whose lock can be taken belongs to a worker that crashed; it is
//! ignored and removed, and never holds an approval. Workers watching
//! different IMDS endpoints meet in different subdirectories: an approval
//! reaches only the workers that see the same Scheduled Events (on a VM,
//! all of them; in tests, those of one emulator).
//!
//! The decision itself ([`busy_peers`]) is a pure function of what the
//! directory shows.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The rendezvous directory when none is configured and `/run` is writable
/// (root, or a systemd unit with `RuntimeDirectory=spot-worker`).
pub const DEFAULT_DIR: &str = "/run/spot-worker";

/// Where a worker's member file says it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberState {
    /// Taking or holding work.
    Working,
    /// Drained: it holds no message and takes none until it resumes.
    Drained,
}

impl MemberState {
    fn suffix(self) -> &'static str {
        match self {
            MemberState::Working => "working",
            MemberState::Drained => "drained",
        }
    }

    fn from_suffix(suffix: &str) -> Option<MemberState> {
        match suffix {
            "working" => Some(MemberState::Working),
            "drained" => Some(MemberState::Drained),
            _ => None,
        }
    }
}

/// Another worker's member file, as read from the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    /// What its file says about it (process id, queue).
    pub(crate) about: String,
    /// Its state.
    pub(crate) state: MemberState,
    /// Whether its process still holds the file's lock.
    pub(crate) alive: bool,
}

/// The workers that still hold an approval: alive and not drained. A
/// crashed worker (its lock released) never does.
pub(crate) fn busy_peers(peers: &[Peer]) -> Vec<String> {
    peers
        .iter()
        .filter(|p| p.alive && p.state == MemberState::Working)
        .map(|p| p.about.clone())
        .collect()
}

/// What a worker knows of the other workers on its VM when it is about to
/// approve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peers {
    /// No other worker, or every other one has drained.
    Drained,
    /// These workers (described) have not drained yet.
    Busy(Vec<String>),
    /// Unknown: the rendezvous could not be joined or read (why).
    Unknown(String),
}

/// Why the rendezvous could not be joined.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct RendezvousError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// The candidate directories, in order: the configured one alone, or
/// [`DEFAULT_DIR`] and then `$XDG_RUNTIME_DIR/spot-worker`.
pub(crate) fn candidate_dirs(
    configured: Option<&Path>,
    xdg_runtime_dir: Option<&str>,
) -> Vec<PathBuf> {
    if let Some(dir) = configured {
        return vec![dir.to_owned()];
    }
    let mut dirs = vec![PathBuf::from(DEFAULT_DIR)];
    if let Some(xdg) = xdg_runtime_dir.filter(|x| !x.is_empty()) {
        dirs.push(Path::new(xdg).join("spot-worker"));
    }
    dirs
}

/// The subdirectory of the workers that watch `imds_endpoint`: its URL with
/// every character other than letters, digits, `.` and `-` as `_`.
pub(crate) fn group_name(imds_endpoint: &str) -> String {
    imds_endpoint
        .trim_end_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// This worker's membership: its locked file, renamed as its state changes
/// and removed when it is dropped (a crash leaves it unlocked, which peers
/// treat the same as gone).
#[derive(Debug)]
pub struct Member {
    group: PathBuf,
    id: String,
    /// Held for the lock; the kernel releases it with the process.
    _file: File,
    state: Mutex<MemberState>,
}

impl Member {
    /// Joins the group of `imds_endpoint` in the first usable candidate
    /// directory, as a working member described by `about`; with it, why
    /// the candidates before it were passed over. The error names every
    /// directory tried.
    pub(crate) fn join(
        candidates: &[PathBuf],
        imds_endpoint: &str,
        about: &str,
    ) -> Result<(Member, Vec<RendezvousError>), Vec<RendezvousError>> {
        let mut errors = Vec::new();
        for dir in candidates {
            match Member::join_in(&dir.join(group_name(imds_endpoint)), about) {
                Ok(member) => return Ok((member, errors)),
                Err(error) => errors.push(error),
            }
        }
        Err(errors)
    }

    fn join_in(group: &Path, about: &str) -> Result<Member, RendezvousError> {
        let fail = |what, path: &Path| {
            let path = path.to_owned();
            move |source| RendezvousError { what, path, source }
        };
        if !group.is_dir() {
            let parent = group.parent().filter(|p| !p.exists());
            std::fs::create_dir_all(group).map_err(fail("cannot create", group))?;
            // Workers of several users (systemd's DynamicUser=) share what
            // this worker made, whatever its umask; the sticky bit keeps
            // each one's files its own.
            let shared = std::fs::Permissions::from_mode(0o1777);
            if let Some(parent) = parent {
                let _ = std::fs::set_permissions(parent, shared.clone());
            }
            std::fs::set_permissions(group, shared).map_err(fail("cannot open up", group))?;
        }
        let id = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        // Locked under a hidden name first, so that no reader ever sees the
        // member unlocked (and removes it as stale).
        let joining = group.join(format!(".{id}.joining"));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&joining)
            .map_err(fail("cannot create", &joining))?;
        file.try_lock().map_err(|e| match e {
            TryLockError::Error(e) => fail("cannot lock", &joining)(e),
            TryLockError::WouldBlock => {
                fail("cannot lock", &joining)(std::io::ErrorKind::WouldBlock.into())
            }
        })?;
        file.write_all(about.as_bytes())
            .map_err(fail("cannot write", &joining))?;
        // Readable by workers of other users, whatever the umask: they
        // open it to try its lock.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(fail("cannot open up", &joining))?;
        let working = group.join(format!("{id}.{}", MemberState::Working.suffix()));
        if let Err(source) = std::fs::rename(&joining, &working) {
            let _ = std::fs::remove_file(&joining);
            return Err(fail("cannot rename into", &working)(source));
        }
        Ok(Member {
            group: group.to_owned(),
            id,
            _file: file,
            state: Mutex::new(MemberState::Working),
        })
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

    /// The other members of the group; stale ones (their lock free) are
    /// removed on the way and reported as not alive.
    pub(crate) fn peers(&self) -> std::io::Result<Vec<Peer>> {
        let mut peers = Vec::new();
        for entry in std::fs::read_dir(&self.group)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((id, suffix)) = name.rsplit_once('.') else {
                continue;
            };
            let Some(state) = MemberState::from_suffix(suffix) else {
                continue;
            };
            if id.starts_with('.') || id == self.id {
                continue;
            }
            // Gone between the listing and now: renamed (read next time)
            // or removed (it left).
            let Ok(file) = File::open(entry.path()) else {
                continue;
            };
            let alive = match file.try_lock_shared() {
                Err(TryLockError::WouldBlock) => true,
                Ok(()) => false,
                // A lock that cannot be tried is no proof of a crash.
                Err(TryLockError::Error(_)) => true,
            };
            let about = std::io::read_to_string(&file)
                .ok()
                .filter(|a| !a.trim().is_empty())
                .unwrap_or_else(|| format!("member {id}"));
            if !alive {
                let _ = std::fs::remove_file(entry.path());
            }
            peers.push(Peer {
                about: about.trim().to_owned(),
                state,
                alive,
            });
        }
        Ok(peers)
    }

    /// What the other workers on this VM say, for the approval.
    pub(crate) fn view(&self) -> Peers {
        match self.peers() {
            Ok(peers) => match busy_peers(&peers) {
                busy if busy.is_empty() => Peers::Drained,
                busy => Peers::Busy(busy),
            },
            Err(error) => Peers::Unknown(format!(
                "cannot read the rendezvous directory {}: {error}",
                self.group.display()
            )),
        }
    }
}

/// This worker's place among the workers on its VM, or why it has none.
#[derive(Debug)]
pub(crate) enum Rendezvous {
    /// A member of its VM's group.
    Joined(Member),
    /// No directory could be used (why): the worker holds every approval
    /// until the event's deadline, since it cannot know its peers.
    Unavailable(String),
}

impl Rendezvous {
    /// Joins the group of `imds_endpoint` in `configured`, else in
    /// [`DEFAULT_DIR`] or `$XDG_RUNTIME_DIR/spot-worker`, saying where (or
    /// why nowhere) in the log: a warning for a worker that `approves`
    /// events (it then approves only at their deadline), a note for one
    /// that does not (its peers cannot wait for it).
    pub(crate) fn join(
        configured: Option<&Path>,
        imds_endpoint: &str,
        about: &str,
        approves: bool,
    ) -> Rendezvous {
        let xdg = std::env::var("XDG_RUNTIME_DIR").ok();
        let candidates = candidate_dirs(configured, xdg.as_deref());
        match Member::join(&candidates, imds_endpoint, about) {
            Ok((member, passed_over)) => {
                for error in &passed_over {
                    tracing::info!(%error, "not meeting the other workers there");
                }
                let peers = member.peers().map(|p| busy_peers(&p).len()).unwrap_or(0);
                tracing::info!(
                    dir = %member.group().display(),
                    other_workers = peers,
                    "joined the workers on this VM: events are approved only once all have drained"
                );
                Rendezvous::Joined(member)
            }
            Err(errors) => {
                let why = errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                let why = format!(
                    "no rendezvous directory for the workers on this VM ({why}); set {}",
                    spot_worker_settings::table::RUNTIME_DIR.key
                );
                if approves {
                    tracing::warn!("{why}; this worker approves events only at their deadline");
                } else {
                    tracing::info!(
                        "{why}; other workers on this VM that approve events cannot wait for this one"
                    );
                }
                Rendezvous::Unavailable(why)
            }
        }
    }

    /// What the other workers on this VM say, for the approval.
    pub(crate) fn view(&self) -> Peers {
        match self {
            Rendezvous::Joined(member) => member.view(),
            Rendezvous::Unavailable(why) => Peers::Unknown(why.clone()),
        }
    }

    /// Publishes this worker's state, if it is a member.
    pub(crate) fn set_state(&self, state: MemberState) {
        if let Rendezvous::Joined(member) = self {
            member.set_state(state);
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let state = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = std::fs::remove_file(self.path(state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(about: &str, state: MemberState, alive: bool) -> Peer {
        Peer {
            about: about.into(),
            state,
            alive,
        }
    }

    #[test]
    fn only_live_working_peers_hold_the_approval() {
        use MemberState::{Drained, Working};
        // (case, peers, busy)
        let table: [(&str, Vec<Peer>, Vec<&str>); 5] = [
            ("alone", vec![], vec![]),
            ("a working peer", vec![peer("b", Working, true)], vec!["b"]),
            ("a drained peer", vec![peer("b", Drained, true)], vec![]),
            ("a crashed peer", vec![peer("b", Working, false)], vec![]),
            (
                "one of each",
                vec![
                    peer("b", Working, true),
                    peer("c", Drained, true),
                    peer("d", Working, false),
                    peer("e", Working, true),
                ],
                vec!["b", "e"],
            ),
        ];
        for (case, peers, busy) in table {
            assert_eq!(busy_peers(&peers), busy, "{case}");
        }
    }

    #[test]
    fn the_configured_directory_alone_else_run_then_xdg() {
        let configured = Path::new("/srv/rv");
        assert_eq!(
            candidate_dirs(Some(configured), Some("/run/user/1000")),
            [PathBuf::from("/srv/rv")]
        );
        assert_eq!(
            candidate_dirs(None, Some("/run/user/1000")),
            [
                PathBuf::from(DEFAULT_DIR),
                PathBuf::from("/run/user/1000/spot-worker")
            ]
        );
        assert_eq!(candidate_dirs(None, Some("")), [PathBuf::from(DEFAULT_DIR)]);
        assert_eq!(candidate_dirs(None, None), [PathBuf::from(DEFAULT_DIR)]);
    }

    #[test]
    fn one_group_per_imds_endpoint() {
        assert_eq!(
            group_name("http://169.254.169.254"),
            "http___169.254.169.254"
        );
        assert_eq!(
            group_name("http://169.254.169.254/"),
            "http___169.254.169.254"
        );
        assert_eq!(group_name("http://127.0.0.1:8089"), "http___127.0.0.1_8089");
        assert_ne!(
            group_name("http://127.0.0.1:8089"),
            group_name("http://127.0.0.1:8090")
        );
    }

    #[test]
    fn members_see_each_other_drain_and_leave() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().to_owned()];
        let (a, _) = Member::join(&dirs, "http://e", "pid 1, queue a").unwrap();
        assert_eq!(a.view(), Peers::Drained, "alone");
        let (b, _) = Member::join(&dirs, "http://e", "pid 2, queue b").unwrap();
        assert_eq!(a.view(), Peers::Busy(vec!["pid 2, queue b".into()]));
        assert_eq!(b.view(), Peers::Busy(vec!["pid 1, queue a".into()]));
        b.set_state(MemberState::Drained);
        assert_eq!(a.view(), Peers::Drained);
        b.set_state(MemberState::Working);
        assert_eq!(a.view(), Peers::Busy(vec!["pid 2, queue b".into()]));
        drop(b);
        assert_eq!(a.view(), Peers::Drained, "left");
        // Another endpoint is another group.
        let (other, _) = Member::join(&dirs, "http://f", "pid 3").unwrap();
        assert_eq!(a.view(), Peers::Drained);
        assert_ne!(other.group(), a.group());
    }

    #[test]
    fn an_unlocked_member_file_is_stale_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().to_owned()];
        let (a, _) = Member::join(&dirs, "http://e", "pid 1").unwrap();
        // What a crashed worker leaves: its file, no lock on it.
        let stale = a.group().join("99999-0000abcd.working");
        std::fs::write(&stale, "pid 99999, queue gone").unwrap();
        let peers = a.peers().unwrap();
        assert_eq!(
            peers,
            [peer("pid 99999, queue gone", MemberState::Working, false)]
        );
        assert_eq!(a.view(), Peers::Drained);
        assert!(!stale.exists(), "removed");
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let errors = Member::join(&[file.join("below")], "http://e", "x").unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].to_string().contains("a-file/below"),
            "{}",
            errors[0]
        );
    }
}
