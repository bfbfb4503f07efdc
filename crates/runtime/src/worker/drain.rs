//! One drain: consume until the first trigger, then stop intake, wind
//! handlers down and release what is left, to the plan.

use std::sync::Arc;

use spot_worker_consumer::{Consumer, DrainSignals, MessageHandler};
use spot_worker_imds::EventType;
use spot_worker_lanes::LaneKeeper;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{DrainReport, RunReport, Worker};
use crate::shutdown::{DrainPlan, DrainTrigger, Triggers, Watchdog};

impl Worker {
    /// Runs the consumer (and its turns at the lane keeper) until the first
    /// trigger, then drains it to the plan.
    pub(super) async fn consume<H: MessageHandler>(
        &self,
        consumer: &Consumer,
        handler: H,
        triggers: &Triggers,
        keeper: Option<&Arc<LaneKeeper>>,
    ) -> Drained {
        let signals = DrainSignals::new();
        let consuming = consumer.run_until(handler, signals.clone());
        tokio::pin!(consuming);
        // The keeper stops as the drain begins: its lease goes to a worker
        // that stays.
        let stop_keeper = CancellationToken::new();
        let _keeper = super::lanes::run_keeper(keeper, &stop_keeper);
        // A Spot worker stops saying it runs as its drain begins.
        let _capacity = self.keep_spot_capacity(&stop_keeper);
        let _stop_keeper = stop_keeper.clone().drop_guard();

        let trigger = tokio::select! {
            // The consumer only returns once told to stop.
            stats = &mut consuming => {
                tracing::error!("the consumer stopped by itself");
                let shutdown = self.stopped_before_start(DrainTrigger::Requested).drain;
                return Drained { report: RunReport { stats, drain: shutdown }, watchdog: None, exit_by: None };
            }
            trigger = triggers.first() => trigger,
        };
        stop_keeper.cancel();
        self.lifetime.draining();
        let noticed_at = Instant::now();
        let plan = DrainPlan::new(&trigger, noticed_at, &self.config.drain);
        self.readiness
            .send_modify(|r| r.shutting_down = Some(trigger.to_string()));
        self.metrics.set_ready(false);
        if let DrainTrigger::Event(notice) = &trigger {
            self.metrics.eviction_notice(notice.event_type.as_str());
            if notice.event_type == EventType::Preempt {
                self.spot_lost();
            }
        }
        tracing::warn!(
            %trigger,
            release_in_ms = plan.release_at.saturating_duration_since(noticed_at).as_millis() as u64,
            hard_deadline_in_ms = plan.hard_deadline.saturating_duration_since(noticed_at).as_millis() as u64,
            "draining: intake stopped, handlers asked to checkpoint"
        );
        let watchdog = self
            .config
            .drain
            .watchdog
            .then(|| Watchdog::arm(plan.hard_deadline));

        if plan.release_at <= noticed_at {
            // No time at all for a wind-down (a late notice keeps half the
            // release floor for it, so only a zero floor gets here).
            signals.release();
        } else {
            signals.wind_down(Some(plan.release_at));
        }
        let mut released_running_handlers = false;
        let stats = tokio::select! {
            biased;
            stats = &mut consuming => stats,
            () = tokio::time::sleep_until(plan.release_at) => {
                tracing::warn!("release time reached; dropping handlers still running and releasing their messages");
                released_running_handlers = true;
                signals.release();
                consuming.await
            }
            () = triggers.hurried() => {
                released_running_handlers = true;
                signals.release();
                consuming.await
            }
        };
        let drained_at = Instant::now();
        let notice_to_drained = drained_at - noticed_at;
        self.metrics.drained(notice_to_drained);
        let met_deadline = drained_at <= plan.hard_deadline;
        tracing::warn!(
            notice_to_drained_ms = notice_to_drained.as_millis() as u64,
            met_deadline,
            released = stats.released,
            "drained"
        );
        Drained {
            report: RunReport {
                stats,
                drain: DrainReport {
                    trigger,
                    notice_to_drained,
                    released_running_handlers,
                    met_deadline,
                    // Set by `run` once the watcher is stopped.
                    approved_event: false,
                    resumed: 0,
                },
            },
            exit_by: watchdog.as_ref().map(|_| plan.hard_deadline),
            watchdog,
        }
    }
}

/// One drain's outcome, with the watchdog still armed.
pub(super) struct Drained {
    pub(super) report: RunReport,
    pub(super) watchdog: Option<Watchdog>,
    /// The watchdog's deadline.
    pub(super) exit_by: Option<Instant>,
}
