//! One delivery's directory: the work directory the program gets, and the
//! checkpoint, result, progress and notice files it is told about. Removed
//! with everything in it when the delivery ends.
//!
//! ```text
//! spot-worker-XXXXXX/   the runner's (0700; 0711 with a program user)
//!   runner              the runner's: which runner made it (leftovers.rs)
//!   work/               SPOT_WORKER_WORK_DIR
//!   files/              checkpoint, result, progress, notice, and the
//!                       program's temporary files beside them
//!     checkpoint.d/     SPOT_WORKER_CHECKPOINT_DIR
//! ```
//!
//! With `--program-user`, `work/` and `files/` are handed to the program's
//! user ([`DeliveryDir::hand_over`]) and the directory above stays the
//! runner's: the program can do as it likes in its two directories, but
//! cannot rename them, nor touch the `runner` file. What it leaves in
//! `files/` is opened by the runner without following links or blocking
//! (`spot-worker-untrusted`), and the notice file is written under a name
//! it can have put nothing at.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tempfile::TempDir;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::program_user::ProgramUser;

/// The checkpoint directory's name in `files/`.
const CHECKPOINT_DIR: &str = "checkpoint.d";

/// A fresh directory per delivery (mode 0700), removed when dropped.
#[derive(Debug)]
pub struct DeliveryDir {
    dir: TempDir,
    work: PathBuf,
    files: PathBuf,
}

impl DeliveryDir {
    /// Creates it under `root` (the system's temporary directory if `None`).
    pub fn create(root: Option<&Path>) -> std::io::Result<Self> {
        let builder = {
            let mut builder = tempfile::Builder::new();
            builder.prefix("spot-worker-");
            builder
        };
        let dir = match root {
            Some(root) => builder.tempdir_in(root)?,
            None => builder.tempdir()?,
        };
        // Names its runner, so that if the runner is killed outright the
        // next one knows this directory and its processes are leftovers.
        std::fs::write(
            dir.path().join(crate::leftovers::RUNNER_FILE),
            crate::leftovers::runner_file_text(),
        )?;
        let work = dir.path().join("work");
        std::fs::create_dir(&work)?;
        let files = dir.path().join("files");
        std::fs::create_dir(&files)?;
        let checkpoint_dir = files.join(CHECKPOINT_DIR);
        std::fs::create_dir(&checkpoint_dir)?;
        for made in [&work, &files, &checkpoint_dir] {
            std::fs::set_permissions(made, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(DeliveryDir { dir, work, files })
    }

    /// Gives `work/` and `files/` (and all that is in `files/`, such as a
    /// restored checkpoint file and directory) to `user`, and lets it
    /// through the directory above (0711), which stays the runner's. Call
    /// once the runner has written what the program starts with, before
    /// the program runs (nothing in `files/` is the program's yet: its
    /// directories are walked without a link being followed all the same).
    pub fn hand_over(&self, user: &ProgramUser) -> std::io::Result<()> {
        give_tree(&self.work, user)?;
        give_tree(&self.files, user)?;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o711))
    }

    /// The directory itself: the runner's, never the program's (copies
    /// the runner makes for a save go here, and with it).
    pub fn runners(&self) -> &Path {
        self.dir.path()
    }

    /// `SPOT_WORKER_WORK_DIR`: the program's scratch space.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// `SPOT_WORKER_CHECKPOINT`.
    pub fn checkpoint(&self) -> PathBuf {
        self.files.join("checkpoint")
    }

    /// `SPOT_WORKER_CHECKPOINT_DIR`: a directory the program fills (what
    /// ML frameworks write), saved and restored with the file.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.files.join(CHECKPOINT_DIR)
    }

    /// `SPOT_WORKER_PROGRESS`.
    pub fn progress(&self) -> PathBuf {
        self.files.join("progress")
    }

    /// `SPOT_WORKER_RESULT`.
    pub fn result(&self) -> PathBuf {
        self.files.join("result")
    }

    /// `SPOT_WORKER_NOTICE`.
    pub fn notice(&self) -> PathBuf {
        self.files.join("notice")
    }

    /// Writes the notice file (`SPOT_WORKER_DEADLINE=<RFC 3339>`), whole:
    /// a temporary file renamed over it. The temporary file is made new
    /// (`O_CREAT | O_EXCL`, never through a link), after removing whatever
    /// the program may have put at its name.
    pub fn write_notice(&self, deadline: OffsetDateTime) -> std::io::Result<()> {
        let text = notice_text(deadline);
        let temporary = self.files.join(".notice.tmp");
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&temporary)
        };
        let mut file = match create() {
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                // Unlinking removes a link itself, never its target.
                std::fs::remove_file(&temporary)?;
                create()?
            }
            made => made?,
        };
        file.write_all(text.as_bytes())?;
        drop(file);
        std::fs::rename(&temporary, self.notice())
    }
}

/// Gives `path` and, if it is a directory, everything under it to `user`
/// (`lchown`: a link itself, never its target; links are not descended).
fn give_tree(path: &Path, user: &ProgramUser) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            give_tree(&entry?.path(), user)?;
        }
    }
    Ok(())
}

/// The notice file's text.
pub fn notice_text(deadline: OffsetDateTime) -> String {
    let at = deadline
        .format(&Rfc3339)
        .unwrap_or_else(|_| deadline.unix_timestamp().to_string());
    format!("SPOT_WORKER_DEADLINE={at}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_goes_with_its_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = DeliveryDir::create(Some(root.path())).unwrap();
        std::fs::write(dir.work().join("scratch"), b"x").unwrap();
        std::fs::write(dir.checkpoint(), b"x").unwrap();
        dir.write_notice(time::macros::datetime!(2026-11-25 01:02:03.5 UTC))
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.notice()).unwrap(),
            "SPOT_WORKER_DEADLINE=2026-11-25T01:02:03.5Z\n"
        );
        drop(dir);
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_link_the_program_left_at_the_notices_temporary_name_is_not_written_through() {
        let root = tempfile::tempdir().unwrap();
        let dir = DeliveryDir::create(Some(root.path())).unwrap();
        let target = root.path().join("not-the-programs");
        std::fs::write(&target, b"kept").unwrap();
        std::os::unix::fs::symlink(&target, dir.files.join(".notice.tmp")).unwrap();
        dir.write_notice(time::macros::datetime!(2026-11-25 01:02:03 UTC))
            .unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"kept");
        assert!(
            std::fs::read_to_string(dir.notice())
                .unwrap()
                .starts_with("SPOT_WORKER_DEADLINE=")
        );
    }

    #[test]
    fn a_program_user_gets_its_two_directories_and_nothing_else() {
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can give a directory to another user (CI runs as root)");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let dir = DeliveryDir::create(Some(root.path())).unwrap();
        std::fs::write(dir.checkpoint(), b"restored").unwrap();
        let nobody = ProgramUser::lookup_in("65534", "", "").unwrap();
        dir.hand_over(&nobody).unwrap();
        let owner = |path: &Path| {
            let meta = path.symlink_metadata().unwrap();
            (meta.uid(), meta.mode() & 0o7777)
        };
        assert_eq!(owner(dir.dir.path()), (0, 0o711));
        assert_eq!(owner(&dir.dir.path().join("runner")).0, 0);
        assert_eq!(owner(dir.work()), (65534, 0o700));
        assert_eq!(owner(&dir.files), (65534, 0o700));
        assert_eq!(owner(&dir.checkpoint()).0, 65534);
    }
}
