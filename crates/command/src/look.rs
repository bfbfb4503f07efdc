//! Looking at the checkpoint (the file and the directory) without holding
//! up the delivery's loop: every walk runs on the blocking pool, never on
//! the runtime thread, and the stop signal is sent without waiting for
//! one. A walk is bounded all the same: it stops reading at
//! [`MAX_ENTRIES`](spot_worker_storage::files::MAX_ENTRIES).
//!
//! What a look finds that no save could ever store (more entries than a
//! checkpoint may hold, a name that is not UTF-8, a path too long to
//! restore) is the program's fault, said at the first look rather than at
//! the program's exit ([`programs_fault`]).

use spot_worker_storage::files::{CheckpointFiles, SaveFilesError};
use tokio::task::JoinHandle;

/// What a look at the checkpoint found: its fingerprint (`None` if
/// nothing is there), or why it could not be looked at.
pub(crate) type Look = Result<Option<[u8; 32]>, SaveFilesError>;

/// Starts a look at `roots` on the blocking pool.
pub(crate) fn spawn_look(roots: CheckpointFiles) -> JoinHandle<Look> {
    tokio::task::spawn_blocking(move || roots.fingerprint())
}

/// A look at `roots`, on the blocking pool.
pub(crate) async fn look(roots: CheckpointFiles) -> Look {
    joined(spawn_look(roots).await)
}

/// A look's end: a task that died is an I/O error (tried again later).
pub(crate) fn joined(joined: Result<Look, tokio::task::JoinError>) -> Look {
    joined.unwrap_or_else(|e| {
        Err(SaveFilesError::Io(std::io::Error::other(format!(
            "a look at the checkpoint ended: {e}"
        ))))
    })
}

/// The size of the regular files under `roots`, on the blocking pool.
pub(crate) async fn size(roots: CheckpointFiles) -> Result<u64, SaveFilesError> {
    tokio::task::spawn_blocking(move || roots.size())
        .await
        .unwrap_or_else(|e| Err(SaveFilesError::Io(std::io::Error::other(e.to_string()))))
}

/// The reason a delivery fails, if `error` says the checkpoint holds what
/// no save can store (it will not clear by itself while the program keeps
/// it so); `None` for what may pass (a file changing, an I/O error).
pub(crate) fn programs_fault(error: &SaveFilesError) -> Option<String> {
    match error {
        SaveFilesError::TooMany { .. } | SaveFilesError::BadPath { .. } => Some(error.to_string()),
        SaveFilesError::TooBig { .. } => {
            Some(format!("{error} (SPOT_WORKER_CHECKPOINT_MAX_BYTES)"))
        }
        _ => None,
    }
}

/// How soon a look is tried again after a file went while it was read.
pub(crate) const VANISHED_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a look failed because a file went between the walk's listing
/// and its read (the program renamed or removed it meanwhile).
pub(crate) fn vanished(error: &SaveFilesError) -> bool {
    matches!(error, SaveFilesError::Io(io) if io.kind() == std::io::ErrorKind::NotFound)
}

/// Starts `look` on the blocking pool, then calls `stop` (which sends the
/// stop signal) at once, without waiting for the look: however long a
/// walk takes, the program hears of the notice first. The look reads the
/// checkpoint as the signal is sent, or a version written just after it:
/// taken for the version before the signal, it makes a save credit the
/// program with less work kept, never more.
pub(crate) fn stop_beside_look<T>(
    look: impl FnOnce() -> Look + Send + 'static,
    stop: impl FnOnce() -> T,
) -> (JoinHandle<Look>, T) {
    let looking = tokio::task::spawn_blocking(look);
    (looking, stop())
}

/// A look started with the stop signal, and what it found once known.
pub(crate) enum StopLook {
    Running(JoinHandle<Look>),
    Done(Option<[u8; 32]>),
}

impl StopLook {
    /// What it found, waiting for it if it still runs (a look that failed
    /// found nothing).
    pub(crate) async fn fingerprint(&mut self) -> Option<[u8; 32]> {
        if let StopLook::Running(handle) = self {
            *self = StopLook::Done(joined(handle.await).ok().flatten());
        }
        match self {
            StopLook::Done(fingerprint) => *fingerprint,
            StopLook::Running(_) => None,
        }
    }

    /// What it found, if known already.
    pub(crate) fn found(&self) -> Option<Option<[u8; 32]>> {
        match self {
            StopLook::Done(fingerprint) => Some(*fingerprint),
            StopLook::Running(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// The order, not the time: the look waits for the signal, which
    /// it can only see if the signal is sent while it runs. A stop that
    /// waited for its look would leave the look to give up (bounded).
    #[tokio::test]
    async fn the_stop_signal_is_sent_without_waiting_for_the_look() {
        let (signal, heard) = mpsc::channel::<()>();
        let look = move || match heard.recv_timeout(Duration::from_secs(30)) {
            Ok(()) => Ok(None),
            Err(_) => Err(SaveFilesError::Unstable),
        };
        let (looking, sent) = stop_beside_look(look, move || signal.send(()).is_ok());
        assert!(sent, "the look was waited for before the signal");
        let found = joined(looking.await);
        assert!(
            matches!(found, Ok(None)),
            "the look ran to its end before the signal: {found:?}"
        );
    }

    #[test]
    fn only_what_will_not_clear_is_the_programs_fault() {
        let cases: [(SaveFilesError, bool); 5] = [
            (SaveFilesError::TooMany { limit: 10_000 }, true),
            (
                SaveFilesError::BadPath {
                    path: "dir/caf\\xe9".to_owned(),
                    why: "is not UTF-8 text",
                },
                true,
            ),
            (
                SaveFilesError::TooBig {
                    size: 2048,
                    limit: 1024,
                },
                true,
            ),
            (SaveFilesError::Unstable, false),
            (SaveFilesError::Io(std::io::Error::other("EIO")), false),
        ];
        for (error, fault) in cases {
            assert_eq!(programs_fault(&error).is_some(), fault, "{error}");
        }
        let text = programs_fault(&SaveFilesError::BadPath {
            path: "dir/caf\\xe9".to_owned(),
            why: "is not UTF-8 text",
        })
        .unwrap();
        assert!(text.contains("dir/caf\\xe9 is not UTF-8 text"), "{text}");
    }
}
