//! The regular VM of `spot-worker dev`: the worker command again, on the
//! regular lane (`SPOT_WORKER_LANE=regular`) with an IMDS emulator of its
//! own, scaled from zero as the deployment's regular pool is
//! (docs/deploying.md, "Who keeps the lanes"): it boots once the regular
//! queue holds a job, or once the Spot VM is gone (`dev evict
//! --spot-away`), so that its lane keeper can move the jobs that wait for
//! Spot; then it runs until `dev` stops, as with `regularMinInstances=1`.

use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use spot_worker_imds_emulator::Emulator;

use super::DevEnvironment;
use super::supervise::{self, Interrupted};

/// How often the regular queue and the Spot VM are looked at before the
/// regular VM boots.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Why the regular VM boots, if it must.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The regular queue holds a job.
    JobWaiting,
    /// The Spot VM is gone: an eviction has started and lasts.
    SpotGone,
}

impl std::fmt::Display for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wake::JobWaiting => "a job waits in the regular queue",
            Wake::SpotGone => "the Spot VM is gone: its lane keeper looks after the Spot lane",
        })
    }
}

/// The deployment's scale-out rules for a regular pool at zero: a job in
/// its queue, or no Spot VM (the Spot VM's Scheduled Events, `spot_events`,
/// list an event that has started).
pub fn wake(regular_waiting: u64, spot_events: &Value) -> Option<Wake> {
    let spot_gone = spot_events
        .as_array()
        .is_some_and(|events| events.iter().any(|e| e["EventStatus"] == "Started"));
    if regular_waiting > 0 {
        Some(Wake::JobWaiting)
    } else if spot_gone {
        Some(Wake::SpotGone)
    } else {
        None
    }
}

/// Waits until the regular VM must boot, then runs `command` as its worker
/// until Ctrl-C (or SIGTERM).
pub async fn run(
    environment: &DevEnvironment,
    spot: &Emulator,
    regular: &Emulator,
    command: &[String],
    interrupted: &mut Interrupted,
) -> Result<()> {
    let config =
        spot_worker_azure::StorageConfig::from_connection_string(&environment.connection_string())?;
    let queue = spot_worker_azure::AzureStorage::new(config)?.queue(environment.regular_queue())?;
    let why = loop {
        // A count that cannot be read counts as none: Azurite is local,
        // and the next look reads it again.
        let waiting = queue.approximate_message_count().await.unwrap_or(0);
        if let Some(why) = wake(waiting, &spot.document()["Events"]) {
            break why;
        }
        tokio::select! {
            _ = &mut *interrupted => return Ok(()),
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
    };
    eprintln!(
        "spot-worker dev: booting the regular VM {} ({why})",
        regular.config().vm_name
    );
    supervise::run_worker(
        &environment.regular_variables(),
        regular,
        command,
        interrupted,
    )
    .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_regular_vm_boots_for_a_job_or_when_spot_is_gone() {
        let started = json!([{"EventType": "Preempt", "EventStatus": "Started"}]);
        let notice = json!([{"EventType": "Preempt", "EventStatus": "Scheduled"}]);
        let cases = [
            (0, json!([]), None),
            (0, notice.clone(), None),
            (0, started.clone(), Some(Wake::SpotGone)),
            (1, json!([]), Some(Wake::JobWaiting)),
            (3, started, Some(Wake::JobWaiting)),
            (0, Value::Null, None),
        ];
        for (waiting, events, want) in cases {
            assert_eq!(wake(waiting, &events), want, "{waiting} {events}");
        }
    }
}
