//! The last steps after a drain: approve the event, and what bounds them.

use std::time::Duration;

use spot_worker_imds::{ApprovalScope, ImdsClient, ScheduledEvent, WatcherHealth};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{RunReport, Worker};
use crate::after_drain::ToApprove;
use crate::config::EXIT_MARGIN;
use crate::error::ConfigError;
use crate::shutdown::Watchdog;

impl Worker {
    /// Approves the event that caused the drain, so Azure need not wait for
    /// `NotBefore`; [`after_drain`] chose it and its scope, and the client
    /// checks the scope again. One request: the event is taken from the
    /// watcher's last document.
    pub(super) async fn approve(
        &self,
        event: &ScheduledEvent,
        scope: &ApprovalScope,
        limit: Duration,
    ) -> bool {
        let client = match ImdsClient::new(self.imds_config()) {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%error, "not approving: no IMDS client");
                return false;
            }
        };
        let approval = client.approve_event(event, scope);
        match tokio::time::timeout(limit, approval).await {
            Ok(Ok(outcome)) => {
                tracing::info!(event_id = %event.id, ?outcome, "approved the event after draining");
                true
            }
            Ok(Err(error)) => {
                tracing::warn!(error = %error.chain(), "approving the event failed");
                false
            }
            Err(_) => {
                tracing::warn!("approving the event timed out");
                false
            }
        }
    }
}

/// Resolves with a configuration error if this VM's name was configured
/// (`SPOT_WORKER_VM_NAME`) and instance metadata says otherwise: events
/// would then be matched against the wrong name, silently.
pub(super) async fn wrong_vm_name(mut health: watch::Receiver<WatcherHealth>) -> ConfigError {
    let mismatch = health
        .wait_for(|h| h.vm_name_mismatch().is_some())
        .await
        .ok()
        .and_then(|h| {
            h.vm_name_mismatch()
                .map(|(configured, metadata)| (configured.to_owned(), metadata.to_owned()))
        });
    match mismatch {
        Some((configured, metadata)) => ConfigError::Invalid {
            setting: spot_worker_settings::table::VM_NAME.key.to_owned(),
            value: configured,
            reason: format!(
                "instance metadata (compute.name) says this VM is {metadata:?}; events would \
                 be matched against the wrong name (leave it unset to use instance metadata)"
            ),
        },
        None => std::future::pending().await,
    }
}

/// A bound for one of the last steps: at most `cap_secs`, and within what is
/// left before the watchdog's deadline, if one is armed.
pub(super) fn final_step(exit_by: Option<Instant>, cap_secs: u64) -> Duration {
    let cap = Duration::from_secs(cap_secs);
    match exit_by {
        Some(at) => cap.min(at.saturating_duration_since(Instant::now()) / 2),
        None => cap,
    }
}

/// Everything `run` needs for its last steps.
pub(super) struct Finished {
    pub(super) report: RunReport,
    /// Held until `run` returns: the last steps are guarded too.
    pub(super) watchdog: Option<Watchdog>,
    pub(super) exit_by: Option<Instant>,
    pub(super) approve: Option<Box<ToApprove>>,
}

impl Finished {
    pub(super) fn at_once(report: RunReport) -> Finished {
        Finished {
            report,
            watchdog: None,
            exit_by: None,
            approve: None,
        }
    }

    /// A fresh watchdog for the last steps only.
    pub(super) fn rearm(&mut self, enabled: bool) {
        let deadline = Instant::now() + EXIT_MARGIN;
        self.watchdog = enabled.then(|| Watchdog::arm(deadline));
        self.exit_by = self.watchdog.as_ref().map(|_| deadline);
    }
}
