//! Which processes serve a local Azurite's services. Azure's blob and queue
//! services are separate front ends, but one `azurite` process serves both
//! on one Node thread, so a blob request there waits behind queue requests
//! (and steals their CPU). [`Azurite::start_separate`] runs `azurite-blob`
//! and `azurite-queue` (installed beside `azurite`) as two processes on the
//! same data dir instead, for measurements where that matters; the
//! endpoints and the connection string are the same either way.

use std::process::Command;

use super::{ACCOUNT_KEY, ACCOUNT_NAME, Azurite, HarnessError};

/// How a local Azurite's services are spread over processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One `azurite` process serves blob, queue and table.
    Shared,
    /// `azurite-blob` and `azurite-queue`: one process per service (no
    /// table service).
    Separate,
}

/// One of the programs Azurite ships.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Program {
    /// `azurite`: every service.
    All,
    /// `azurite-blob`.
    Blob,
    /// `azurite-queue`.
    Queue,
}

impl Topology {
    pub(crate) fn programs(self) -> &'static [Program] {
        match self {
            Topology::Shared => &[Program::All],
            Topology::Separate => &[Program::Blob, Program::Queue],
        }
    }
}

impl Program {
    /// Its name, as in `node_modules/.bin`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Program::All => "azurite",
            Program::Blob => "azurite-blob",
            Program::Queue => "azurite-queue",
        }
    }
}

/// One running Azurite process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AzuriteProcess {
    /// `azurite`, `azurite-blob` or `azurite-queue`.
    pub name: &'static str,
    /// Its id, to read its CPU time with [`procfs`](crate::procfs).
    pub pid: u32,
}

impl Azurite {
    /// Like [`Azurite::start`], but blob and queue each in a process of
    /// their own (`azurite-blob`, `azurite-queue`) on one data dir, as
    /// Azure's separate front ends are; see the [module docs](self).
    pub fn start_separate() -> Result<Self, HarnessError> {
        Self::start_with(Topology::Separate, false)
    }

    /// The running processes (none while stopped).
    pub fn processes(&self) -> Vec<AzuriteProcess> {
        self.children
            .iter()
            .map(|(program, child)| AzuriteProcess {
                name: program.name(),
                pid: child.id(),
            })
            .collect()
    }

    /// The program's binary: `binary` itself for `azurite` (it may be
    /// `AZURITE_BIN`), its siblings for the others.
    pub(crate) fn program_path(&self, program: Program) -> std::path::PathBuf {
        match program {
            Program::All => self.binary.clone(),
            _ => self.binary.with_file_name(program.name()),
        }
    }

    /// The command line of `program` serving plain HTTP on loopback.
    pub(crate) fn local_command(&self, program: Program) -> Command {
        let mut command = Command::new(self.program_path(program));
        command
            .args([
                "--silent",
                "--disableTelemetry",
                // The 1.x SDK may send an x-ms-version newer than this
                // Azurite knows; the operations we use are unchanged.
                "--skipApiVersionCheck",
            ])
            .arg("--location")
            .arg(self.workspace.path());
        if self.debug {
            command.arg("--debug").arg(self.debug_log_path());
        }
        let blob = ["--blobHost", "127.0.0.1", "--blobPort"];
        let queue = ["--queueHost", "127.0.0.1", "--queuePort"];
        let table = ["--tableHost", "127.0.0.1", "--tablePort"];
        let services = match program {
            Program::All => vec![
                (blob, self.blob_port),
                (queue, self.queue_port),
                (table, self.table_port),
            ],
            Program::Blob => vec![(blob, self.blob_port)],
            Program::Queue => vec![(queue, self.queue_port)],
        };
        for (flags, port) in services {
            command.args(flags).arg(port.to_string());
        }
        // The well-known account, and one only this instance knows.
        command.env(
            "AZURITE_ACCOUNTS",
            format!(
                "{ACCOUNT_NAME}:{ACCOUNT_KEY};{}:{ACCOUNT_KEY}",
                self.probe_account
            ),
        );
        command
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spot_worker::azure::{AzureStorage, StorageConfig};
    use spot_worker_storage::{Checkpoint, CheckpointStore, MessageQueue, WritePrecondition};

    use super::*;

    fn names(azurite: &Azurite) -> Vec<&'static str> {
        azurite.processes().iter().map(|p| p.name).collect()
    }

    #[test]
    fn the_default_is_one_process_for_every_service() {
        let azurite = Azurite::start().expect("azurite starts");
        assert_eq!(names(&azurite), ["azurite"]);
    }

    #[tokio::test]
    async fn separate_processes_serve_blob_and_queue_on_one_data_dir() {
        let azurite = tokio::task::spawn_blocking(Azurite::start_separate)
            .await
            .unwrap()
            .expect("azurite-blob and azurite-queue start");
        assert_eq!(names(&azurite), ["azurite-blob", "azurite-queue"]);
        let processes = azurite.processes();
        assert_ne!(processes[0].pid, processes[1].pid);

        // The same connection string reaches both services.
        let config = StorageConfig::from_connection_string(&azurite.connection_string()).unwrap();
        let storage = AzureStorage::new(config).unwrap();
        let queue = storage.queue("jobs").unwrap();
        queue.prepare().await.unwrap();
        queue.send("job", Duration::ZERO).await.unwrap();
        let store = storage.checkpoint_store("checkpoints").unwrap();
        store.prepare().await.unwrap();
        let saved = Checkpoint::InProgress { progress: 7.into() };
        store
            .write("job", &saved, WritePrecondition::Create, None)
            .await
            .unwrap();

        // Stopped, both are gone; started again, both serve their data.
        let azurite = tokio::task::spawn_blocking(move || {
            let mut azurite = azurite;
            azurite.stop().unwrap();
            assert!(azurite.processes().is_empty());
            azurite.start_again().unwrap();
            azurite
        })
        .await
        .unwrap();
        assert_eq!(names(&azurite), ["azurite-blob", "azurite-queue"]);
        let read = store
            .read("job")
            .await
            .unwrap()
            .expect("the checkpoint is kept");
        assert_eq!(read.checkpoint, saved);
        let received = queue.receive(1, Duration::from_secs(30)).await.unwrap();
        assert_eq!(received.len(), 1);
        assert_eq!(received[0].body, "job");
    }
}
