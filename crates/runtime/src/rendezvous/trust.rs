//! What a worker may trust in a rendezvous directory other users can
//! reach, and the housekeeping that keeps it clean.
//!
//! A directory counts only if it is a real directory (not a link) of this
//! worker's user or root, and if others can write to it, only with the
//! sticky bit, so that no one can remove or rename another's member file:
//! hiding a busy worker's file is how an approval would come early. A
//! member file counts only if it is a regular file of this worker's user
//! or root ([`owners`]); anything else is unknown, which holds approvals.
//!
//! The directories a worker makes are its user's alone (0755), unless the
//! directory above is shared on purpose (world-writable and sticky, like a
//! `tmpfiles.d` line for several users): then the group directory is too,
//! so every worker can join and be seen, if not trusted.

use std::fs::{Metadata, TryLockError};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use spot_worker_untrusted::Owners;

use super::{MemberState, RendezvousError};

/// How old an unlocked `.joining` file or an empty group directory must be
/// before it is removed: a worker joining holds its file's lock a few
/// microseconds after making it, and its group directory's a few
/// microseconds after that.
const STALE_AFTER: Duration = Duration::from_secs(10);

/// This process's effective uid.
fn me() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The uids whose member files and directories count: this worker's user
/// and root.
fn trusted_uids() -> Vec<u32> {
    let me = me();
    if me == 0 { vec![0] } else { vec![me, 0] }
}

/// [`trusted_uids`], for [`spot_worker_untrusted::open`].
pub(super) fn owners() -> Owners {
    Owners::Only(trusted_uids())
}

/// Why the directory `meta` describes cannot be trusted, if it cannot.
fn distrust(meta: &Metadata) -> Option<String> {
    if meta.file_type().is_symlink() {
        return Some("it is a symbolic link".to_owned());
    }
    if !meta.is_dir() {
        return Some("it is not a directory".to_owned());
    }
    if !trusted_uids().contains(&meta.uid()) {
        return Some(format!(
            "it belongs to uid {}, neither this worker's user (uid {}) nor root",
            meta.uid(),
            me()
        ));
    }
    let mode = meta.mode();
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Some(format!(
            "other users may write to it (mode {:o}) without the sticky bit, so they could remove \
             the member files in it",
            mode & 0o7777
        ));
    }
    None
}

/// The directory at `path`, made if missing (with its parents, if
/// `parents`; then with `mode`), and checked: an error says why it cannot
/// be used. Returns its metadata.
fn ensure_dir(path: &Path, mode: u32, parents: bool) -> Result<Metadata, RendezvousError> {
    let meta = match path.symlink_metadata() {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let made = if parents {
                std::fs::create_dir_all(path)
            } else {
                std::fs::create_dir(path)
            };
            match made {
                Ok(()) => {}
                // Another worker made it meanwhile: checked below.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(RendezvousError::new("cannot create", path, error)),
            }
            let meta = path
                .symlink_metadata()
                .map_err(|error| RendezvousError::new("cannot read", path, error))?;
            // Whatever the umask: the mode is the directory's sharing.
            if meta.is_dir() && meta.uid() == me() {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                    .map_err(|error| RendezvousError::new("cannot set the mode of", path, error))?;
            }
            path.symlink_metadata()
                .map_err(|error| RendezvousError::new("cannot read", path, error))?
        }
        Err(error) => return Err(RendezvousError::new("cannot read", path, error)),
    };
    match distrust(&meta) {
        Some(why) => Err(RendezvousError::new(
            "cannot trust",
            path,
            io::Error::new(io::ErrorKind::PermissionDenied, why),
        )),
        None => Ok(meta),
    }
}

/// Makes or checks `base` and its subdirectory `group`, so that a member
/// file can be made in `group`.
pub(super) fn prepare(base: &Path, group: &Path) -> Result<(), RendezvousError> {
    let base_meta = ensure_dir(base, 0o755, true)?;
    let shared = base_meta.mode() & 0o002 != 0;
    ensure_dir(group, if shared { 0o1777 } else { 0o755 }, false)?;
    Ok(())
}

/// Whether `meta` was last changed at least [`STALE_AFTER`] ago.
fn is_old(meta: &Metadata) -> bool {
    meta.modified()
        .ok()
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .is_some_and(|age| age >= STALE_AFTER)
}

/// Removes, in every trusted group directory of `base`, what crashed
/// workers left: member files and `.joining` files whose lock is free (a
/// `.joining` file only once [`STALE_AFTER`] old), then the group
/// directories left empty (other than `own_group`, and only once old).
/// Best effort: what cannot be removed stays, and is read as before.
pub(super) fn tidy(base: &Path, own_group: &Path) {
    let Ok(groups) = std::fs::read_dir(base) else {
        return;
    };
    for group in groups.flatten() {
        let path = group.path();
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if distrust(&meta).is_some() {
            continue;
        }
        tidy_group(&path);
        if path != own_group && is_old(&meta) {
            // Fails, harmlessly, if a member is still there.
            let _ = std::fs::remove_dir(&path);
        }
    }
}

/// The stale member and `.joining` files of one group, removed.
fn tidy_group(group: &Path) {
    let Ok(entries) = std::fs::read_dir(group) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let joining = name.starts_with('.') && name.ends_with(".joining");
        let member = !name.starts_with('.')
            && name
                .rsplit_once('.')
                .is_some_and(|(_, suffix)| MemberState::from_suffix(suffix).is_some());
        if !joining && !member {
            continue;
        }
        let path = entry.path();
        let Ok(file) = spot_worker_untrusted::open(&path, &owners()) else {
            continue;
        };
        let free = !matches!(
            file.try_lock_shared(),
            Err(TryLockError::WouldBlock | TryLockError::Error(_))
        );
        let old_enough = member || file.metadata().is_ok_and(|meta| is_old(&meta));
        if free && old_enough {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn mode(path: &Path) -> u32 {
        path.symlink_metadata().unwrap().mode() & 0o7777
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn directories_made_are_this_users_alone_unless_shared_on_purpose() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("rv");
        prepare(&base, &base.join("g")).unwrap();
        assert_eq!((mode(&base), mode(&base.join("g"))), (0o755, 0o755));
        // A base shared on purpose (tmpfiles.d: 1777) shares its groups.
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        set_mode(&shared, 0o1777);
        prepare(&shared, &shared.join("g")).unwrap();
        assert_eq!(mode(&shared.join("g")), 0o1777);
    }

    #[test]
    fn a_directory_others_could_empty_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        set_mode(&open, 0o777);
        let error = prepare(&open, &open.join("g")).unwrap_err().to_string();
        assert!(error.contains("without the sticky bit"), "{error}");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, dir.path().join("link")).unwrap();
        let error = prepare(&dir.path().join("link"), &dir.path().join("link/g"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if me() != 0 {
            eprintln!("skipped: only root can give a directory to another user (CI runs as root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("rv");
        std::fs::create_dir(&base).unwrap();
        std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
        let error = prepare(&base, &base.join("g")).unwrap_err().to_string();
        assert!(error.contains("belongs to uid 65534"), "{error}");
    }

    #[test]
    fn what_crashed_workers_left_is_removed_once_stale() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("rv");
        let (own, other, empty) = (base.join("own"), base.join("other"), base.join("empty"));
        for group in [&own, &other, &empty] {
            prepare(&base, group).unwrap();
        }
        let long_ago = SystemTime::now() - STALE_AFTER * 2;
        let file = |path: &Path, old: bool| {
            let made = std::fs::File::create(path).unwrap();
            if old {
                made.set_modified(long_ago).unwrap();
            }
            made
        };
        let stale_joining = own.join(".1-a.joining");
        let fresh_joining = own.join(".2-b.joining");
        let stale_member = other.join("3-c.working");
        let live_member = other.join("4-d.working");
        let unrelated = other.join("notes.txt");
        file(&stale_joining, true);
        file(&fresh_joining, false);
        file(&stale_member, false);
        let held = file(&live_member, true);
        held.lock().unwrap();
        file(&unrelated, true);
        std::fs::File::open(&empty)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        let fresh_empty = base.join("fresh");
        prepare(&base, &fresh_empty).unwrap();

        tidy(&base, &own);
        for (path, kept) in [
            (&stale_joining, false),
            (&fresh_joining, true),
            (&stale_member, false),
            (&live_member, true),
            (&unrelated, true),
            (&empty, false),
            (&fresh_empty, true),
            (&own, true),
        ] {
            assert_eq!(path.exists(), kept, "{}", path.display());
        }
    }
}
