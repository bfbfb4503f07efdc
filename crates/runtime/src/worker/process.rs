//! A worker that owns its process: the process ends when the worker stops,
//! whatever its handlers still do.

use super::{RunReport, Worker};
use crate::error::WorkerError;

/// Exit status of a process whose worker could not start.
const START_FAILED_EXIT_CODE: i32 = 1;

impl Worker {
    /// Declares that this worker is what its process is for, so the process
    /// ends when the worker stops: once [`run`](Self::run) returns, the
    /// process gets [`EXIT_GRACE`](crate::EXIT_GRACE) to exit by itself, and is then ended with
    /// [`RunReport::exit_code`] (status 1 if the worker could not start).
    /// This bounds the exit whatever handlers do: dropping a Tokio runtime
    /// waits for every `spawn_blocking` task, and a handler's blocking code
    /// that ignores cancellation would keep the process up (its message
    /// released, its writes fenced) until the service manager's SIGKILL.
    /// With the watchdog on (`SPOT_WORKER_WATCHDOG`, the default), the
    /// process is gone within the drain budget plus [`EXIT_GRACE`](crate::EXIT_GRACE) of a
    /// notice. `spot_worker::Setup::worker` sets it; leave it unset when the
    /// worker shares its process with other work (a test, a demo).
    pub fn owning_the_process(mut self) -> Self {
        self.owns_process = true;
        self
    }
}

/// The status a process exits with after `run` returned `result`.
pub(super) fn exit_code(result: &Result<RunReport, WorkerError>) -> i32 {
    match result {
        Ok(report) => report.exit_code(),
        Err(_) => START_FAILED_EXIT_CODE,
    }
}
