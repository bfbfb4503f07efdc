//! What the lane tests share: two lanes of in-memory queues over one
//! store, deadlines placed against the wall clock the lane rule reads, and
//! a handler that records every run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use spot_worker_consumer::{Consumer, HandlerError, Job, MessageHandler};
use spot_worker_decisions::lanes::{DEFAULT_SWITCH_COST_SEED, Deadline, Lane, LanePolicy};
use spot_worker_lanes::{FleetSpotCapacity, Lanes, SpotCapacity, SwitchCost, enqueue};
use spot_worker_storage::{InMemoryCheckpointStore, InMemoryQueue, MessageEncoding, MessageQueue};

pub use crate::common::*;

/// The fleet: both lanes' queues and their one poison queue (as the
/// deployed workers have it) over one store.
#[derive(Clone)]
pub struct Fleet {
    pub spot: InMemoryQueue,
    pub regular: InMemoryQueue,
    pub poison: InMemoryQueue,
    pub store: Arc<InMemoryCheckpointStore>,
    pub switch_cost: Arc<SwitchCost>,
    /// The fleet's Spot sightings, as every worker of the test sees them
    /// (nothing seen until a test says a Spot worker runs).
    pub spot_capacity: Arc<SpotCapacity>,
}

impl Fleet {
    /// Empty queues; d of `d` (split like the default seed).
    pub fn new(d: Duration) -> Fleet {
        let store = Arc::new(InMemoryCheckpointStore::new());
        Fleet {
            spot: InMemoryQueue::new("jobs"),
            regular: InMemoryQueue::new("jobs-regular"),
            poison: InMemoryQueue::new("jobs-poison"),
            spot_capacity: Arc::new(SpotCapacity::new(
                FleetSpotCapacity::new(store.clone()),
                Duration::from_secs(1),
            )),
            store,
            switch_cost: Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED.scaled_to(d))),
        }
    }

    /// A Spot worker runs now: the fleet's sightings say so, and every
    /// worker of the test sees it.
    pub async fn spot_worker_runs(&self) {
        let sightings = self
            .spot_capacity
            .fleet()
            .heard("a Spot worker", Duration::ZERO)
            .await
            .unwrap();
        self.spot_capacity.set(sightings);
    }

    pub fn lanes(&self, lane: Lane, recheck: Duration) -> Lanes {
        Lanes {
            lane,
            spot: Arc::new(self.spot.clone()),
            regular: Arc::new(self.regular.clone()),
            recheck,
            switch_cost: Arc::clone(&self.switch_cost),
            spot_capacity: Arc::clone(&self.spot_capacity),
            policy: LanePolicy::default(),
            price_ratio: 3.0,
        }
    }

    /// A consumer of `lane`'s queue.
    pub fn consumer(&self, lane: Lane, recheck: Duration) -> Consumer {
        let queue = match lane {
            Lane::Spot => &self.spot,
            Lane::Regular => &self.regular,
        };
        consumer(queue, &self.poison, config())
            .with_checkpoints(self.store.clone())
            .with_lanes(self.lanes(lane, recheck))
    }

    /// Every message in both lanes' queues and the poison queue.
    pub fn messages(&self) -> usize {
        self.spot.len() + self.regular.len() + self.poison.len()
    }
}

/// A deadline that started `ago` seconds ago, is due in `due_in` seconds,
/// for `work` seconds of work (the wall clock: what the rule reads).
pub fn deadline(ago: u64, due_in: u64, work: u64) -> Deadline {
    let now = SystemTime::now();
    Deadline {
        start: now - Duration::from_secs(ago),
        due: now + Duration::from_secs(due_in),
        work: Duration::from_secs(work),
    }
}

/// One run of a handler: the job's key, the body it read, its lane.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub key: String,
    pub body: Vec<u8>,
    pub lane: Option<Lane>,
}

/// Records each run; keyed by the body's `job` field if it has one. While
/// `hold` is set, a run reports `progress`, saves, and waits for its
/// cancellation (then returns an error, as on an eviction); otherwise it
/// finishes at once.
#[derive(Clone, Default)]
pub struct Recorder {
    pub runs: Arc<Mutex<Vec<Run>>>,
    pub hold: Arc<AtomicBool>,
    pub progress: Arc<Mutex<Option<f64>>>,
}

impl Recorder {
    pub fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }
}

impl MessageHandler for Recorder {
    async fn handle(&self, job: Job) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push(Run {
            key: job.key().to_owned(),
            body: job.body().to_vec(),
            lane: job.lane(),
        });
        if !self.hold.load(Ordering::SeqCst) {
            return Ok(());
        }
        let progress = *self.progress.lock().unwrap();
        if let Some(progress) = progress {
            job.report_progress(progress);
        }
        let mut checkpoint = job.checkpoint().await?;
        checkpoint
            .save_progress(serde_json::json!({ "step": 1 }))
            .await?;
        job.cancellation().cancelled().await;
        Err("interrupted".into())
    }

    fn job_key(&self, body: &[u8]) -> Option<String> {
        body_key(body)
    }
}

/// The `job` field of a JSON body: the key [`Recorder`] reads.
pub fn body_key(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(value["job"].as_str()?.to_owned())
}

/// Enqueues the text `body` with `deadline` through `lanes`, as a producer
/// does, expecting it to be taken.
pub async fn enqueue_text(lanes: &Lanes, body: &[u8], deadline: Deadline) {
    enqueue(lanes, MessageEncoding::Text, body, Some(deadline))
        .await
        .expect("the job is enqueued");
}

/// Sends `body` to `queue` as it is.
pub async fn send_plain(queue: &InMemoryQueue, body: &str) {
    queue.send(body, Duration::ZERO).await.unwrap();
}
