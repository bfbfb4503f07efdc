//! One delivery's directory: the work directory the program gets, and the
//! checkpoint, result and notice files it is told about. Removed with
//! everything in it when the delivery ends.

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A fresh directory per delivery (mode 0700), removed when dropped.
#[derive(Debug)]
pub struct DeliveryDir {
    dir: TempDir,
    work: PathBuf,
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
        Ok(DeliveryDir { dir, work })
    }

    /// `SPOT_WORKER_WORK_DIR`: the program's scratch space.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// `SPOT_WORKER_CHECKPOINT`.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("checkpoint")
    }

    /// `SPOT_WORKER_PROGRESS`.
    pub fn progress(&self) -> PathBuf {
        self.dir.path().join("progress")
    }

    /// `SPOT_WORKER_RESULT`.
    pub fn result(&self) -> PathBuf {
        self.dir.path().join("result")
    }

    /// `SPOT_WORKER_NOTICE`.
    pub fn notice(&self) -> PathBuf {
        self.dir.path().join("notice")
    }

    /// Writes the notice file (`SPOT_WORKER_DEADLINE=<RFC 3339>`), whole:
    /// a temporary file renamed over it.
    pub fn write_notice(&self, deadline: OffsetDateTime) -> std::io::Result<()> {
        let text = notice_text(deadline);
        let temporary = self.dir.path().join(".notice.tmp");
        std::fs::write(&temporary, text)?;
        std::fs::rename(&temporary, self.notice())
    }
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
}
