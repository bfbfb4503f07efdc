//! The worker's work between its start and its exit: the warmup gate,
//! then consume and drain (again after every withdrawn notice), with the
//! consumer built from the worker's stores, metrics and lanes.

use std::sync::Arc;
use std::time::Duration;

use spot_worker_consumer::{Consumer, ConsumerConfig, ConsumerStats, MessageHandler};
use spot_worker_imds::RunningWatcher;
use spot_worker_storage::QueueMessage;
use spot_worker_telemetry::message_span;

use crate::after_drain::{Next, wait_after_drain};
use crate::error::WorkerError;
use crate::gate::{self, Checks};
use crate::metered::{
    MeteredCheckpoints, MeteredHandler, MeteredQueue, deadline_observer, goodput_observer,
    settlement_observer,
};
use crate::rendezvous::Rendezvous;
use crate::shutdown::{DrainTrigger, Triggers};

use super::finish::{Finished, wrong_vm_name};
use super::report::{DrainReport, RunReport};

use super::Worker;

impl Worker {
    pub(super) async fn gate_then_serve<H: MessageHandler>(
        &self,
        handler: H,
        triggers: &Triggers,
        watcher: Option<&RunningWatcher>,
        rendezvous: &Rendezvous,
    ) -> Result<Finished, WorkerError> {
        let checks = Checks {
            imds: watcher.map(RunningWatcher::health),
            queue: Arc::clone(&self.queue),
            poison: Arc::clone(&self.poison),
            checkpoints: self.checkpoints.clone(),
            poison_bodies: self.poison_bodies.clone(),
            other_lane: self.other_lane_queue(),
            warmup: self.warmup.clone(),
        };
        let gate = gate::open(checks, &self.readiness);
        let gate_timeout = async {
            match self.config.gate_timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let wrong_name = async {
            match watcher {
                Some(watcher) => wrong_vm_name(watcher.health()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(gate, gate_timeout, wrong_name);
        loop {
            tokio::select! {
                () = &mut gate => break,
                trigger = triggers.first() => {
                    // Nothing was taken yet: there is nothing to drain. An
                    // event is still approved or waited for as after a
                    // drain: exiting would only restart into it.
                    tracing::info!(%trigger, "stopping before the warmup gate opened");
                    let report = self.stopped_before_start(trigger);
                    let next = wait_after_drain(
                        &report.drain.trigger,
                        triggers,
                        watcher,
                        &mut None,
                        &self.readiness,
                        rendezvous,
                        &self.config.drain,
                    )
                    .await;
                    match next {
                        Next::Resume => {
                            tracing::warn!("the notice was withdrawn; waiting for the gate again");
                            self.readiness.send_modify(|r| r.shutting_down = None);
                        }
                        Next::Exit { approve, parked } => {
                            let mut finished = Finished::at_once(report);
                            finished.approve = approve;
                            if parked {
                                finished.rearm(self.config.drain.watchdog);
                            }
                            return Ok(finished);
                        }
                    }
                }
                error = &mut wrong_name => return Err(error.into()),
                () = &mut gate_timeout => {
                    let waiting_for = self.readiness.borrow().waiting_for().join(", ");
                    return Err(WorkerError::GateTimeout {
                        waited: self.config.gate_timeout.unwrap_or_default(),
                        waiting_for,
                    });
                }
            }
        }
        tracing::info!(queue = self.queue.name(), "warmup gate open; taking work");
        // The gate does not wait for instance metadata when the name is
        // configured; if it answers later and contradicts the name, events
        // are being matched against the wrong VM: drain as on a request
        // (nothing in flight is lost), then refuse as before the gate.
        let serving = self.serve(handler, triggers, watcher, rendezvous);
        tokio::pin!(serving);
        tokio::select! {
            finished = &mut serving => finished,
            error = &mut wrong_name => {
                tracing::error!(%error, "draining: the configured VM name is wrong");
                self.requested.cancel();
                let _ = serving.await;
                Err(error.into())
            }
        }
    }

    pub(super) fn stopped_before_start(&self, trigger: DrainTrigger) -> RunReport {
        self.lifetime.draining();
        self.readiness
            .send_modify(|r| r.shutting_down = Some(trigger.to_string()));
        RunReport {
            stats: ConsumerStats::default(),
            drain: DrainReport {
                trigger,
                notice_to_drained: Duration::ZERO,
                released_running_handlers: false,
                met_deadline: true,
                approved_event: false,
                resumed: 0,
            },
        }
    }

    /// Consumes and drains, again after every withdrawn notice, until the
    /// worker is to exit.
    pub(super) async fn serve<H: MessageHandler>(
        &self,
        handler: H,
        triggers: &Triggers,
        watcher: Option<&RunningWatcher>,
        rendezvous: &Rendezvous,
    ) -> Result<Finished, WorkerError> {
        let consumer = self.consumer()?;
        self.gate_opened.cancel();
        // Ends by itself with the consumer (its health sender is dropped).
        tokio::spawn(crate::store_health::reflect(
            consumer.store_health(),
            self.readiness.clone(),
            self.metrics.clone(),
        ));
        let handler = Arc::new(MeteredHandler {
            inner: super::lifetime::Busy {
                inner: self.pod_cost.wrap_handler(handler),
                lifetime: Arc::clone(&self.lifetime),
            },
            metrics: self.metrics.clone(),
            queue: self.queue.name().to_owned(),
            activity: self.activity.clone(),
        });
        let keeper = self.lane_keeper(&handler);
        let mut resumed = 0;
        loop {
            self.lifetime.ready();
            self.readiness.send_modify(|r| r.shutting_down = None);
            // Not while the checkpoint store refuses (see `store_health`).
            self.metrics.set_ready(self.readiness.borrow().is_ready());
            let mut drained = self
                .consume(&consumer, Arc::clone(&handler), triggers, keeper.as_ref())
                .await;
            drained.report.drain.resumed = resumed;
            let next = wait_after_drain(
                &drained.report.drain.trigger,
                triggers,
                watcher,
                &mut drained.watchdog,
                &self.readiness,
                rendezvous,
                &self.config.drain,
            )
            .await;
            match next {
                Next::Resume => {
                    resumed += 1;
                    tracing::warn!(
                        resumed,
                        "the notice was withdrawn before the event started; taking work again"
                    );
                }
                Next::Exit { approve, parked } => {
                    let mut finished = Finished {
                        report: drained.report,
                        watchdog: drained.watchdog,
                        exit_by: drained.exit_by,
                        approve,
                    };
                    if parked {
                        // The drain's deadline is long past: give the last
                        // steps their own.
                        finished.rearm(self.config.drain.watchdog);
                    }
                    return Ok(finished);
                }
            }
        }
    }

    pub(super) fn consumer(&self) -> Result<Consumer, WorkerError> {
        let config = ConsumerConfig {
            max_in_flight: self.config.concurrency,
            batch_size: u8::try_from(self.config.concurrency.min(32)).unwrap_or(32),
            visibility_timeout: self.config.visibility_timeout,
            max_failures: self.config.max_failures,
            max_deliveries: self.config.max_deliveries,
            idle_backoff_max: self.config.idle_poll_max,
            refusal_grace: self.config.storage_refusal_grace,
            encoding: self.config.encoding,
            ..ConsumerConfig::default()
        };
        let metrics = &self.metrics;
        let queue = MeteredQueue::work(Arc::clone(&self.queue), metrics.clone());
        let mut consumer = Consumer::new(Arc::new(queue), Arc::clone(&self.poison), config)
            .map_err(WorkerError::Storage)?
            // One span per delivery, with the messaging conventions' fields.
            .with_message_span(Arc::new(|queue: &str, message: &QueueMessage| {
                message_span(queue, message.id.as_str(), message.dequeue_count)
            }))
            .with_settlement_observer(settlement_observer(
                metrics.clone(),
                self.queue.name().to_owned(),
            ))
            .with_goodput_observer(goodput_observer(
                metrics.clone(),
                self.queue.name().to_owned(),
            ))
            .with_deadline_observer(deadline_observer(
                metrics.clone(),
                self.queue.name().to_owned(),
            ))
            .with_cadence(Arc::clone(&self.cadence));
        consumer = match self.consumer_lanes() {
            Some(lanes) => consumer.with_lanes(lanes),
            // Without lanes a job with a deadline runs where it was sent,
            // and its lane record (a worker with lanes may have left one)
            // is still marked finished when it finishes.
            None => consumer.with_lane_finish(spot_worker_lanes::FinishRecords),
        };
        if let Some(store) = &self.poison_bodies {
            consumer = consumer.with_poison_bodies(Arc::clone(store));
        }
        Ok(match &self.checkpoints {
            Some(store) => consumer.with_checkpoints(Arc::new(MeteredCheckpoints {
                inner: self.pod_cost.wrap_checkpoints(Arc::clone(store)),
                metrics: metrics.clone(),
            })),
            None => consumer,
        })
    }
}
