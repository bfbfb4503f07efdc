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
//! The directory is shared, so what is in it is read as someone else's
//! (`trust.rs`): only directories and member files of this worker's user
//! or root count, files are opened without following links or blocking
//! and read with a cap, their text is escaped, and the I/O runs off the
//! async runtime under a timeout. Whatever cannot be read that way is
//! *unknown*, and an unknown member holds the approval like a busy one
//! (until the event's deadline): a worker never approves early on what it
//! could not read.
//!
//! The decision itself ([`busy_peers`]) is a pure function of what the
//! directory shows.

mod member;
mod trust;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(crate) use member::Member;

/// The rendezvous directory when none is configured and `/run` is writable
/// (root, or a systemd unit with `RuntimeDirectory=spot-worker`).
pub const DEFAULT_DIR: &str = "/run/spot-worker";

/// The longest the rendezvous's file system calls may take (joining,
/// reading the peers, publishing a state) before their answer is taken as
/// unknown: they run on a blocking thread, so a hung file system stalls
/// neither the drain nor the runtime.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(1);

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

/// What is known of another member file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Its process holds the file's lock; the file says its state.
    Live(MemberState),
    /// Its lock is free: the worker crashed (the file is removed).
    Gone,
    /// It could not be read as a member file of a trusted worker (a FIFO,
    /// a link, another user's file, a lock that cannot be tried).
    Unknown,
}

/// Another worker's member file, as read from the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    /// What its file says about it (process id, queue), escaped; for an
    /// unknown one, what it is and why it is not trusted.
    pub(crate) about: String,
    /// What is known of it.
    pub(crate) seen: Seen,
}

/// The workers that still hold an approval: those alive and not drained,
/// and those that could not be read. A crashed worker (its lock released)
/// never does.
pub(crate) fn busy_peers(peers: &[Peer]) -> Vec<String> {
    peers
        .iter()
        .filter(|p| matches!(p.seen, Seen::Live(MemberState::Working) | Seen::Unknown))
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

/// Why a rendezvous directory could not be joined.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct RendezvousError {
    what: &'static str,
    path: String,
    #[source]
    source: std::io::Error,
}

impl RendezvousError {
    /// `what` went wrong with `path` (shown escaped: a path in a shared
    /// directory may hold any byte).
    fn new(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        let path = spot_worker_untrusted::escape_line(&path.to_string_lossy()).into_owned();
        RendezvousError { what, path, source }
    }
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

/// Why a worker that joined a later candidate directory cannot know its
/// peers: an earlier candidate exists (other workers may meet there) but
/// could not be used. `passed_over` holds each earlier candidate, whether
/// it exists, and why it was passed over.
pub(crate) fn unseen_peers(
    joined: &Path,
    passed_over: &[(PathBuf, bool, String)],
) -> Option<String> {
    let unseen: Vec<String> = passed_over
        .iter()
        .filter(|(_, exists, _)| *exists)
        .map(|(dir, _, why)| format!("{} exists but could not be used: {why}", dir.display()))
        .collect();
    (!unseen.is_empty()).then(|| {
        format!(
            "this worker met the others in {}, but {}; workers meeting there cannot be seen from here",
            joined.display(),
            unseen.join("; ")
        )
    })
}

/// This worker's place among the workers on its VM, or why it has none.
#[derive(Debug)]
pub(crate) enum Rendezvous {
    /// A member of its VM's group.
    Joined(Arc<Member>),
    /// No directory could be used (why): the worker holds every approval
    /// until the event's deadline, since it cannot know its peers.
    Unavailable(String),
}

impl Rendezvous {
    /// Joins the group of `imds_endpoint` in `configured`, else in
    /// [`DEFAULT_DIR`] or `$XDG_RUNTIME_DIR/spot-worker`, saying where (or
    /// why nowhere) in the log: a warning for a worker that `approves`
    /// events (it then approves only at their deadline), a note for one
    /// that does not (its peers cannot wait for it). A worker that joins
    /// `$XDG_RUNTIME_DIR` while [`DEFAULT_DIR`] exists cannot see the
    /// workers there: it joins (so that those of its own directory wait
    /// for it), but holds every approval until the event's deadline, and
    /// warns.
    pub(crate) async fn join(
        configured: Option<&Path>,
        imds_endpoint: &str,
        about: &str,
        approves: bool,
    ) -> Rendezvous {
        let xdg = std::env::var("XDG_RUNTIME_DIR").ok();
        let candidates = candidate_dirs(configured, xdg.as_deref());
        let (endpoint, about_text) = (imds_endpoint.to_owned(), about.to_owned());
        let joining = tokio::task::spawn_blocking(move || {
            Member::join(&candidates, &endpoint, &about_text).map(|(member, passed_over)| {
                let others = member.peers().map(|p| busy_peers(&p).len()).unwrap_or(0);
                (member, passed_over, others)
            })
        });
        let joined = match tokio::time::timeout(IO_TIMEOUT, joining).await {
            Ok(Ok(joined)) => joined.map_err(|passed_over| {
                passed_over
                    .iter()
                    .map(|passed| passed.error.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            }),
            Ok(Err(panicked)) => Err(format!("joining failed: {panicked}")),
            Err(_) => Err(format!(
                "joining took longer than {IO_TIMEOUT:?} (a file system that does not answer?)"
            )),
        };
        match joined {
            Ok((mut member, passed_over, others)) => {
                for passed in &passed_over {
                    tracing::info!(error = %passed.error, "not meeting the other workers there");
                }
                let passed: Vec<(PathBuf, bool, String)> = passed_over
                    .into_iter()
                    .map(|passed| (passed.dir, passed.exists, passed.error.to_string()))
                    .collect();
                if let Some(why) = unseen_peers(member.base(), &passed) {
                    tracing::warn!(
                        "{why}: this worker approves events only at their deadline (set {} to \
                         one directory all workers on this VM can use)",
                        spot_worker_settings::table::RUNTIME_DIR.key
                    );
                    member.blind = Some(why);
                } else {
                    tracing::info!(
                        dir = %member.group().display(),
                        other_workers = others,
                        "joined the workers on this VM: events are approved only once all have drained"
                    );
                }
                Rendezvous::Joined(Arc::new(member))
            }
            Err(why) => {
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
    pub(crate) async fn view(&self) -> Peers {
        match self {
            Rendezvous::Joined(member) => member.view().await,
            Rendezvous::Unavailable(why) => Peers::Unknown(why.clone()),
        }
    }

    /// Publishes this worker's state, if it is a member.
    pub(crate) async fn set_state(&self, state: MemberState) {
        if let Rendezvous::Joined(member) = self {
            member.publish(state).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(about: &str, seen: Seen) -> Peer {
        Peer {
            about: about.into(),
            seen,
        }
    }

    #[test]
    fn only_live_working_peers_and_unknown_ones_hold_the_approval() {
        use MemberState::{Drained, Working};
        use Seen::{Gone, Live, Unknown};
        // (case, peers, busy)
        let table: [(&str, Vec<Peer>, Vec<&str>); 6] = [
            ("alone", vec![], vec![]),
            ("a working peer", vec![peer("b", Live(Working))], vec!["b"]),
            ("a drained peer", vec![peer("b", Live(Drained))], vec![]),
            ("a crashed peer", vec![peer("b", Gone)], vec![]),
            ("an unknown file", vec![peer("fifo", Unknown)], vec!["fifo"]),
            (
                "one of each",
                vec![
                    peer("b", Live(Working)),
                    peer("c", Live(Drained)),
                    peer("d", Gone),
                    peer("e", Live(Working)),
                    peer("f", Unknown),
                ],
                vec!["b", "e", "f"],
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
    fn a_worker_that_falls_back_while_the_first_directory_exists_cannot_see_its_peers() {
        let xdg = Path::new("/run/user/1000/spot-worker");
        let run = || PathBuf::from(DEFAULT_DIR);
        // (case, passed over: (dir, exists, why), blind)
        let table = [
            ("the first one joined", vec![], false),
            (
                "/run not writable, no /run/spot-worker",
                vec![(run(), false, "cannot create: Permission denied".to_owned())],
                false,
            ),
            (
                "/run/spot-worker another user's",
                vec![(run(), true, "not trusted: owned by uid 0".to_owned())],
                true,
            ),
        ];
        for (case, passed, blind) in table {
            let why = unseen_peers(xdg, &passed);
            assert_eq!(why.is_some(), blind, "{case}: {why:?}");
            if let Some(why) = why {
                assert!(
                    why.contains(DEFAULT_DIR) && why.contains("owned by uid 0"),
                    "{why}"
                );
            }
        }
    }
}
