//! The operator's commands on a fleet's storage (`enqueue`, `poison`,
//! `checkpoints`, `results`, `status`): they read the same environment contract as
//! the worker ([`AzureSetup`]), so they reach the same queue, poison queue
//! and containers with the same credentials.

#[cfg(test)]
mod bad_input_cases;
pub mod checkpoints;
pub mod enqueue;
pub mod goodput;
pub mod poison;
pub mod results;
mod saved_files;
mod scan;
pub mod status;
pub mod terminal;

use std::io::IsTerminal as _;

use anyhow::{Context as _, Result, bail};
use spot_worker::setup::AzureSetup;
use spot_worker_azure::{AzureQueue, BlobCheckpointStore, BlobResultStore};
use spot_worker_runtime::WorkerConfig;
use spot_worker_runtime::settings::{Source, table};
use spot_worker_storage::MessageEncoding;

/// The worker's settings and storage, as an operator reaches them.
pub struct Fleet {
    pub config: WorkerConfig,
    /// Where the workers store results (`SPOT_WORKER_RESULTS_CONTAINER`).
    pub results_container: String,
    setup: AzureSetup,
}

impl Fleet {
    /// Reads the worker's environment (connection string, or account URL
    /// with a managed identity or the Azure CLI; `SPOT_WORKER_QUEUE`, ...).
    pub fn from_env() -> Result<Self> {
        let setup = AzureSetup::operator_from_env().context(
            "reading the worker's environment (AZURE_STORAGE_CONNECTION_STRING or \
             SPOT_WORKER_STORAGE_ACCOUNT_URL, SPOT_WORKER_QUEUE, ...)",
        )?;
        let results_container = Source::from_env()?
            .get(&table::RESULTS_CONTAINER)?
            .into_owned();
        Ok(Fleet {
            config: setup.config.clone(),
            results_container,
            setup,
        })
    }

    /// The work queue (`SPOT_WORKER_QUEUE`).
    pub fn queue(&self) -> Result<AzureQueue> {
        self.queue_named(&self.config.queue)
    }

    /// Any queue of the account, by name.
    pub fn queue_named(&self, name: &str) -> Result<AzureQueue> {
        self.setup
            .storage
            .queue(name)
            .with_context(|| format!("queue {name:?}"))
    }

    /// The work queue's poison queue (`<queue>-poison`).
    pub fn poison_queue(&self) -> Result<AzureQueue> {
        self.setup
            .storage
            .poison_queue(&self.config.queue)
            .with_context(|| format!("the poison queue of {:?}", self.config.queue))
    }

    /// The checkpoint container (`SPOT_WORKER_CHECKPOINT_CONTAINER`).
    pub fn checkpoints(&self) -> Result<BlobCheckpointStore> {
        let name = &self.config.checkpoint_container;
        self.setup
            .storage
            .checkpoint_store(name)
            .with_context(|| format!("checkpoint container {name:?}"))
    }

    /// A blob container read as a result store (results, claim checks).
    pub fn blobs(&self, container: &str) -> Result<BlobResultStore> {
        self.setup
            .storage
            .result_store(container)
            .with_context(|| format!("blob container {container:?}"))
    }
}

/// Whether a destructive command may go ahead: `--yes`, or a person who
/// typed `y` at the terminal. Without a terminal and without `--yes` it
/// refuses, so a script never deletes by accident.
pub fn confirm(question: &str, yes: bool) -> Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        bail!("{question}: refusing without --yes (stdin is not a terminal to ask on)");
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// A duration as people read it in a table: `42s`, `5m`, `3h`, `2d`.
pub fn age(seconds: i64) -> String {
    let seconds = seconds.max(0);
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// The encoding's name as `SPOT_WORKER_MESSAGE_ENCODING` spells it.
pub fn encoding_name(encoding: MessageEncoding) -> &'static str {
    match encoding {
        MessageEncoding::Text => "text",
        MessageEncoding::Base64 => "base64",
    }
}

/// A time as RFC 3339 (`2026-11-23T10:57:43Z`).
pub fn rfc3339(time: time::OffsetDateTime) -> String {
    time.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| time.to_string())
}

/// Seconds from `then` to now (negative if the clocks disagree).
pub fn seconds_since(then: time::OffsetDateTime) -> i64 {
    (time::OffsetDateTime::now_utc() - then).whole_seconds()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_people_say_them() {
        for (seconds, text) in [
            (-5, "0s"),
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (3599, "59m"),
            (3600, "1h"),
            (86_399, "23h"),
            (86_400, "1d"),
        ] {
            assert_eq!(age(seconds), text, "{seconds}");
        }
    }
}
