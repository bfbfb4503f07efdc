//! A worker that serves one of two lanes (docs/deploying.md, "The two lanes"): the lanes its
//! consumer moves jobs between, the lane keeper it takes turns at, and d,
//! the switch cost, kept in step with the fleet's measurements.

use std::sync::Arc;
use std::time::Duration;

use spot_worker_consumer::MessageHandler;
use spot_worker_decisions::lanes::{DEFAULT_SWITCH_COST_SEED, Lane};
use spot_worker_lanes::{
    FleetSpotCapacity, FleetSwitchCost, JobKeyFn, KeeperPass, LaneKeeper, Lanes, SpotCapacity,
    SwitchCost,
};
use spot_worker_storage::{CheckpointStore, LeaseStore, MessageQueue};
use tokio_util::sync::CancellationToken;

use super::Worker;

/// The two lanes' queues and the leases the keeper takes turns by.
#[derive(Clone)]
pub(crate) struct LaneQueues {
    pub(crate) spot: Arc<dyn MessageQueue>,
    pub(crate) regular: Arc<dyn MessageQueue>,
    pub(crate) leases: Arc<dyn LeaseStore>,
}

impl Worker {
    /// Serves one of two lanes (`config.lanes.lane`; docs/deploying.md, "The two lanes"): jobs
    /// with a deadline move between `spot`'s and `regular`'s queues where
    /// the lane rule says so, and, with `SPOT_WORKER_LANE_KEEPER` on, this
    /// worker takes turns at the lane keeper, one worker of the fleet at a
    /// time by `leases`. The worker's own queue must be its lane's (the one
    /// [`WorkerConfig::consumed_queue`](crate::WorkerConfig::consumed_queue)
    /// names); moves and the keeper need a checkpoint store
    /// ([`Worker::with_checkpoints`]).
    pub fn with_lanes(
        mut self,
        spot: Arc<dyn MessageQueue>,
        regular: Arc<dyn MessageQueue>,
        leases: Arc<dyn LeaseStore>,
    ) -> Self {
        self.lanes = Some(LaneQueues {
            spot,
            regular,
            leases,
        });
        self
    }

    /// d as this worker knows it: the fleet's measurements over the seed.
    pub fn switch_cost(&self) -> &Arc<SwitchCost> {
        &self.switch_cost
    }

    /// The lanes the consumer serves one of, if this worker has lanes.
    pub(super) fn consumer_lanes(&self) -> Option<Lanes> {
        let queues = self.lanes.as_ref()?;
        Some(Lanes {
            lane: self.config.lanes.lane,
            spot: Arc::clone(&queues.spot),
            regular: Arc::clone(&queues.regular),
            recheck: self.config.lanes.keeper_every,
            switch_cost: Arc::clone(&self.switch_cost),
            spot_capacity: self.spot_capacity()?,
            policy: self.config.lanes.policy,
            price_ratio: self.config.lanes.price_ratio,
        })
    }

    /// This worker's view of the fleet's Spot capacity; `None` without
    /// lanes or a checkpoint store.
    pub(super) fn spot_capacity(&self) -> Option<Arc<SpotCapacity>> {
        self.lanes.as_ref()?;
        let store = self.checkpoints.as_ref()?;
        let view = self.spot_capacity.get_or_init(|| {
            Arc::new(SpotCapacity::new(
                FleetSpotCapacity::new(Arc::clone(store)),
                self.config.lanes.keeper_every,
            ))
        });
        Some(Arc::clone(view))
    }

    /// Keeps this worker's view of the fleet's Spot capacity until `stop`
    /// (the drain's start): a Spot worker also says, every recheck, that
    /// it runs. `None` without lanes.
    pub(super) fn keep_spot_capacity(
        &self,
        stop: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let view = self.spot_capacity()?;
        let spot_worker = self.config.lanes.lane == Lane::Spot;
        let stop = stop.clone();
        Some(tokio::spawn(
            async move { view.keep(spot_worker, stop).await },
        ))
    }

    /// A Spot worker got an eviction notice: the fleet's Spot capacity may
    /// be going (the fleet judges its evictions together). Written in the
    /// background, within [`EVICTION_NOTE_WITHIN`], so that the drain never
    /// waits for it; `run` waits for it at exit.
    pub(super) fn spot_lost(&self) {
        if self.config.lanes.lane != Lane::Spot {
            return;
        }
        let Some(view) = self.spot_capacity() else {
            return;
        };
        let at = std::time::SystemTime::now();
        let note = tokio::spawn(async move {
            match tokio::time::timeout(EVICTION_NOTE_WITHIN, view.evicted(at)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "could not note the eviction in the fleet's Spot sightings")
                }
                Err(_) => tracing::warn!(
                    "noting the eviction in the fleet's Spot sightings took longer than {EVICTION_NOTE_WITHIN:?}"
                ),
            }
        });
        *self
            .eviction_note
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(note);
    }

    /// The note of this worker's eviction, if one is being written.
    pub(super) fn take_eviction_note(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.eviction_note
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The other lane's queue, which the warmup gate prepares too.
    pub(super) fn other_lane_queue(&self) -> Option<Arc<dyn MessageQueue>> {
        let queues = self.lanes.as_ref()?;
        Some(match self.config.lanes.lane {
            Lane::Spot => Arc::clone(&queues.regular),
            Lane::Regular => Arc::clone(&queues.spot),
        })
    }

    /// The lane keeper of this worker, if it takes turns at it.
    pub(super) fn lane_keeper<H: MessageHandler>(
        &self,
        handler: &Arc<H>,
    ) -> Option<Arc<LaneKeeper>> {
        if !self.config.lanes.keeper {
            return None;
        }
        let (lanes, queues, store) = (
            self.consumer_lanes()?,
            self.lanes.as_ref()?,
            self.checkpoints.as_ref()?,
        );
        let keys = Arc::clone(handler);
        let job_key: JobKeyFn = Arc::new(move |body: &[u8]| keys.job_key(body));
        let metrics = self.metrics.clone();
        let keeper = LaneKeeper::new(
            lanes,
            Arc::clone(store),
            Arc::clone(&queues.leases),
            self.config.encoding,
            job_key,
            self.config.visibility_timeout,
        )
        .observed_by(Arc::new(move |pass: &KeeperPass| {
            metrics.lane_keeper_pass(pass.moved.len() as u64, pass.at_risk as u64);
        }));
        Some(Arc::new(keeper))
    }

    /// Keeps this worker's d in step with the fleet's measurements until
    /// `stop`, once the gate opened; `None` without lanes.
    pub(super) fn keep_switch_cost(
        &self,
        stop: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        self.lanes.as_ref()?;
        let store: Arc<dyn CheckpointStore> = Arc::clone(self.checkpoints.as_ref()?);
        let fleet = FleetSwitchCost::new(store);
        let cost = Arc::clone(&self.switch_cost);
        let every = self.config.lanes.keeper_every;
        let gate_opened = self.gate_opened.clone();
        let observed = Arc::clone(&cost);
        self.metrics
            .observe_switch_cost(move || observed.d().as_secs_f64());
        Some(tokio::spawn(async move {
            if !super::gate_opened_before(&gate_opened, &stop).await {
                return;
            }
            fleet.keep(cost, every, stop, LAST_ADD).await;
        }))
    }
}

/// The longest the last addition to the fleet's switch cost may take as
/// the worker stops.
const LAST_ADD: Duration = Duration::from_secs(1);

/// The longest noting a Spot worker's eviction in the fleet's sightings
/// may take: well within the 30 s notice, and long enough for a whole
/// pool's notes to queue on the shards with backoff (docs/deadlines.md).
const EVICTION_NOTE_WITHIN: Duration = Duration::from_secs(20);

/// A worker's d, seeded from `SPOT_WORKER_SWITCH_COST` (split like the
/// default seed).
pub(super) fn seeded_switch_cost(seed: Duration) -> Arc<SwitchCost> {
    Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED.scaled_to(seed)))
}

/// Runs `keeper` until `stop` (the drain's start).
pub(super) fn run_keeper(
    keeper: Option<&Arc<LaneKeeper>>,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let keeper = Arc::clone(keeper?);
    let stop = stop.clone();
    Some(tokio::spawn(async move { keeper.run(stop).await }))
}
