//! [`CommandHandler`]: the [`MessageHandler`] that runs a program per
//! message. The job key comes from here; one delivery's run is in
//! `delivery/`.

use std::sync::Arc;

use serde_json::Value;
use spot_worker_consumer::{HandlerError, Job, MessageHandler};
use spot_worker_storage::ResultStore;

use crate::config::CommandConfig;
use crate::throughput::Throughput;

/// Runs [`CommandConfig::program`] once per message under the contract of
/// docs/command.md; results go to `results`. The consumer running it needs
/// a checkpoint store.
///
/// ```no_run
/// use std::sync::Arc;
/// use spot_worker_command::{CommandConfig, CommandHandler};
/// use spot_worker_storage::InMemoryResultStore;
///
/// let config = CommandConfig::new("python3", ["job.py"]).with_job_key("job_id");
/// let handler = CommandHandler::new(config, Arc::new(InMemoryResultStore::new("results")));
/// // worker.run(handler).await?;
/// ```
#[derive(Clone, Debug)]
pub struct CommandHandler {
    pub(crate) config: Arc<CommandConfig>,
    pub(crate) results: Arc<dyn ResultStore>,
    /// The throughput of this worker's checkpoint saves.
    pub(crate) throughput: Arc<Throughput>,
}

impl CommandHandler {
    /// A handler running `config`'s program, storing results in `results`.
    pub fn new(config: CommandConfig, results: Arc<dyn ResultStore>) -> Self {
        CommandHandler {
            config: Arc::new(config),
            results,
            throughput: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CommandConfig {
        &self.config
    }
}

impl MessageHandler for CommandHandler {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.deliver(&job).await
    }

    /// The `--job-key` field of a JSON body (a string, or a number as
    /// written); `None` without `--job-key` or when the body has no such
    /// field (the delivery then fails permanently, see `deliver`).
    fn job_key(&self, body: &[u8]) -> Option<String> {
        let field = self.config.job_key_field.as_deref()?;
        key_of(body, field)
    }
}

/// The value of `field` in the JSON object `body`, as a key: what a worker
/// with `--job-key field` (`SPOT_WORKER_JOB_KEY`) keys the job by; `enqueue`
/// and `status` name a job by it too.
pub fn key_of(body: &[u8], field: &str) -> Option<String> {
    let document: Value = serde_json::from_slice(body).ok()?;
    match document.get(field)? {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_from_a_field() {
        let rows: [(&[u8], Option<&str>); 6] = [
            (br#"{"job_id":"j1","start":0}"#, Some("j1")),
            (br#"{"job_id":42}"#, Some("42")),
            (br#"{"job_id":""}"#, None),
            (br#"{"job_id":null}"#, None),
            (br#"{"other":"x"}"#, None),
            (b"not json", None),
        ];
        for (body, expected) in rows {
            assert_eq!(key_of(body, "job_id").as_deref(), expected, "{body:?}");
        }
    }
}
