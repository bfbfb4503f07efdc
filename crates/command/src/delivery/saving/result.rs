//! A clean exit's result: the result file stored create-only (streamed,
//! within `--result-max-bytes`) and the job marked completed, or found
//! completed by another run.

use serde_json::json;
use spot_worker_consumer::{HandlerError, permanent};
use spot_worker_storage::{PutOutcome, StorageError};

use crate::delivery::Run;

/// Whose result a run's `Run::put_result` left stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    /// This run's (or identical bytes).
    ByThisRun,
    /// Another run's, which completed the job: this run is a duplicate.
    ByAnotherRun,
}

impl Run<'_> {
    /// A clean exit: store the result file create-only (streamed; a file
    /// over `--result-max-bytes`, or not a regular file, is a counted
    /// failure before anything is read), then mark the job completed.
    pub(crate) async fn finish(
        &mut self,
        message_id: &str,
        keyed_by_body: bool,
    ) -> Result<(), HandlerError> {
        let key = self.key.clone();
        let config = &self.handler.config;
        let path = self.dir.result();
        // The program's to put anything at: never through a link, never
        // blocking on a FIFO, a regular file only.
        let opened = tokio::task::spawn_blocking(move || {
            let file = spot_worker_untrusted::open(&path, &spot_worker_untrusted::Owners::Any)?;
            let meta =
                file.metadata()
                    .map_err(|source| spot_worker_untrusted::UntrustedError::Io {
                        path: spot_worker_untrusted::escape_line(&path.to_string_lossy())
                            .into_owned(),
                        source,
                    })?;
            Ok::<_, spot_worker_untrusted::UntrustedError>((file, meta))
        })
        .await
        .map_err(|e| format!("job {key}: opening the result file: {e}"))?;
        let name = match opened {
            Err(missing) if missing.is_not_found() => None,
            Err(error) => {
                return Err(format!(
                    "job {key}: the program exited 0, but the result file {error}; no result stored"
                )
                .into());
            }
            Ok((file, meta)) => {
                let limit = config.result_max_bytes;
                if meta.len() > limit {
                    return Err(format!(
                        "job {key}: the program exited 0, but the result file is {} bytes, over the limit of {limit} bytes (SPOT_WORKER_RESULT_MAX_BYTES); no result stored",
                        meta.len()
                    )
                    .into());
                }
                let name = config.result_name_for(&key, message_id);
                if self.put_result(&name, file, meta.len()).await? == Stored::ByAnotherRun {
                    return Ok(());
                }
                Some(name)
            }
        };
        let Some(checkpoint) = self.checkpoint.as_mut() else {
            return Err(
                format!("job {key}: its checkpoint handle was lost with a failed save").into(),
            );
        };
        // A job keyed by its body is marked completed so duplicates are
        // deleted unrun; one keyed by its message id only if it saved
        // progress (its message is deleted next, nothing else can ask).
        if keyed_by_body || checkpoint.latest().is_some() {
            match checkpoint.complete(json!({ "result": name })).await {
                Ok(()) | Err(StorageError::JobCancelled { .. }) => {}
                Err(error) => {
                    return Err(format!("job {key}: marking it completed: {error}").into());
                }
            }
        }
        tracing::info!(job_key = %key, result = name.as_deref().unwrap_or("(none)"), "job completed");
        Ok(())
    }

    /// Stores the result create-only; the same bytes already there are
    /// success. Other bytes there are another run's result if the job's
    /// checkpoint says that run completed the job (two holders of one job
    /// both finished): this run is then a duplicate, settled as done with
    /// the stored result kept; else a permanent failure.
    async fn put_result(
        &self,
        name: &str,
        file: std::fs::File,
        len: u64,
    ) -> Result<Stored, HandlerError> {
        let key = &self.key;
        let results = &self.handler.results;
        match results.put_new_file(name, file, len).await {
            Ok(PutOutcome::Created) => Ok(Stored::ByThisRun),
            Ok(PutOutcome::AlreadyExistsIdentical) => {
                tracing::info!(job_key = %key, result = %name, "the identical result already existed");
                Ok(Stored::ByThisRun)
            }
            Err(StorageError::Conflict { .. }) => {
                let completed = match self.checkpoint.as_ref() {
                    Some(checkpoint) => checkpoint.completed_in_store().await.map_err(|error| {
                        format!(
                            "job {key}: a different result is already stored as {name}; \
                             reading the job's checkpoint to see whether another run \
                             completed it failed: {error}"
                        )
                    })?,
                    None => None,
                };
                if completed.is_some() {
                    tracing::info!(job_key = %key, result = %name, "another run of this job completed it and stored its result; this run's result is not kept (a duplicate, not a failure)");
                    return Ok(Stored::ByAnotherRun);
                }
                Err(permanent(format!(
                    "job {key}: a different result is already stored as {name} in {}, and \
                     no run of this job completed it; send the job under a new key",
                    results.name()
                )))
            }
            Err(error) => Err(format!("job {key}: writing the result {name}: {error}").into()),
        }
    }
}
