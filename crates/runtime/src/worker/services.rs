//! What runs beside the consumer for the worker's whole run: the health
//! endpoints, the Scheduled Events watcher, the rendezvous with the other
//! workers on this VM, and the scale-in protection keeper.

use spot_worker_imds::{
    ImdsClient, ImdsConfig, NoticePolicy, NoticeSignal, RunningWatcher, Watcher, WatcherConfig,
};

use tokio_util::sync::CancellationToken;

use crate::error::WorkerError;
use crate::health;
use crate::keeper_retry::KeeperReport;
use crate::rendezvous::Rendezvous;
use crate::scale_in_protection::{Backoff, ProtectionKeeper};

use super::Worker;

impl Worker {
    /// The scale-in protection keeper, running until `stop`, if kept.
    pub(super) fn keep_scale_in_protection(
        &self,
        stop: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (target, idle_grace) = self.scale_in_protection.clone()?;
        let keeper = ProtectionKeeper::new(
            target,
            idle_grace,
            Backoff::default(),
            tokio::time::Instant::now(),
        )
        .with_report(KeeperReport::new(
            self.metrics.clone(),
            self.readiness.clone(),
        ));
        let (activity, stop) = (self.activity.subscribe(), stop.clone());
        Some(tokio::spawn(async move {
            crate::scale_in_protection::keep(keeper, activity, stop).await;
        }))
    }

    pub(super) async fn serve_health(
        &self,
        listener: Option<tokio::net::TcpListener>,
        stop: &CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, WorkerError> {
        let addr = self.config.health_addr;
        let listener = match listener {
            Some(listener) => listener,
            None => health::bind(addr)
                .await
                .map_err(|source| WorkerError::HealthServer { addr, source })?,
        };
        let bound = listener.local_addr().unwrap_or(addr);
        tracing::info!(addr = %bound, "health endpoints: /healthz, /readyz");
        let readiness = self.readiness.subscribe();
        let stop = stop.clone();
        Ok(tokio::spawn(async move {
            if let Err(error) = health::serve(listener, readiness, stop).await {
                tracing::error!(%error, "health endpoint failed");
            }
        }))
    }

    pub(super) fn watch_events(
        &self,
    ) -> Result<(Option<RunningWatcher>, Option<NoticeSignal>), WorkerError> {
        if !self.config.imds.enabled {
            return Ok((None, None));
        }
        let client = ImdsClient::new(self.imds_config()).map_err(WorkerError::Imds)?;
        let mut watcher = Watcher::new(
            client,
            WatcherConfig {
                poll_interval: self.config.imds.poll_interval,
                vm_name: self.config.imds.vm_name.clone(),
                ..WatcherConfig::default()
            },
        );
        let signal = watcher.notice_signal(NoticePolicy::default());
        Ok((Some(watcher.spawn()), Some(signal)))
    }

    /// Joins the other workers on this VM (those watching the same IMDS),
    /// unless Scheduled Events are not watched at all.
    pub(super) async fn join_peers(&self) -> Rendezvous {
        if !self.config.imds.enabled {
            return Rendezvous::Unavailable("Scheduled Events are not watched".into());
        }
        let about = format!("pid {}, queue {}", std::process::id(), self.queue.name());
        Rendezvous::join(
            self.config.drain.runtime_dir.as_deref(),
            &self.config.imds.endpoint,
            &about,
            self.config.drain.approve_events,
        )
        .await
    }

    pub(super) fn imds_config(&self) -> ImdsConfig {
        ImdsConfig::default().with_endpoint(self.config.imds.endpoint.clone())
    }
}
