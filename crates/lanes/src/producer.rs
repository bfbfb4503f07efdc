//! How a producer sends a job: without a deadline, its body as it is, to
//! the Spot lane (as before lanes existed); with one, in an [`Envelope`],
//! to the lane the rule picks for a job that has not started: the Spot
//! lane, unless even running from now on regular capacity leaves less
//! slack than two switches and a recheck (the rule's safety net), when it
//! goes straight to the regular lane.

use std::time::{Duration, SystemTime};

use spot_worker_decisions::lanes::{Deadline, Lane, LaneChoice, Phase, Situation, choose_lane};

use spot_worker_storage::MessageEncoding;
use spot_worker_storage::MessageId;
use spot_worker_storage::StorageError;

use super::Lanes;
use spot_worker_envelope::Envelope;

/// A job ready to send: the lane it goes to, its message text, and, for a
/// job with a deadline, the rule's answer (with where the job stands).
#[derive(Clone, Debug, PartialEq)]
pub struct Enqueued {
    /// The lane whose queue the text goes to.
    pub lane: Lane,
    /// The message text (encoded).
    pub text: String,
    /// The rule's answer; `None` without a deadline.
    pub choice: Option<LaneChoice>,
}

impl Enqueued {
    /// The message for `body`, with `deadline` if it has one, encoded with
    /// `encoding`, its lane chosen with the switch cost `switch_cost` and
    /// the keeper's period `recheck`. A deadline not after its start, or
    /// already past, is refused, and so is a body a worker would read as
    /// its own message ([`refuse_reserved_body`](spot_worker_storage::refuse_reserved_body):
    /// one beginning `spot-worker-probe/` or `spot-worker-job/`).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use spot_worker_decisions::lanes::{Deadline, Lane};
    /// use spot_worker_storage::MessageEncoding;
    /// use spot_worker_lanes::Enqueued;
    ///
    /// let minutes = |m: u64| Duration::from_secs(m * 60);
    /// let start = SystemTime::now();
    /// let d = minutes(6);
    /// // 8 h of work due in 10 h: Spot, with slack to spare.
    /// let roomy = Deadline { start, due: start + minutes(600), work: minutes(480) };
    /// let job = Enqueued::new(b"{}", Some(roomy), MessageEncoding::Text, d, minutes(1))?;
    /// assert_eq!(job.lane, Lane::Spot);
    /// // 8 h of work due in 8 h 10 min: less slack than two switches.
    /// let tight = Deadline { due: start + minutes(490), ..roomy };
    /// let job = Enqueued::new(b"{}", Some(tight), MessageEncoding::Text, d, minutes(1))?;
    /// assert_eq!(job.lane, Lane::Regular);
    /// // No deadline: the body as it is, on Spot.
    /// let plain = Enqueued::new(b"{}", None, MessageEncoding::Text, d, minutes(1))?;
    /// assert_eq!((plain.lane, plain.text.as_str()), (Lane::Spot, "{}"));
    /// // A body a worker reads as its own: refused, with or without a deadline.
    /// assert!(Enqueued::new(b"spot-worker-probe/1", None, MessageEncoding::Text, d, minutes(1)).is_err());
    /// # Ok::<(), spot_worker_storage::StorageError>(())
    /// ```
    pub fn new(
        body: &[u8],
        deadline: Option<Deadline>,
        encoding: MessageEncoding,
        switch_cost: Duration,
        recheck: Duration,
    ) -> Result<Enqueued, StorageError> {
        Enqueued::keyed(body, deadline, None, encoding, switch_cost, recheck)
    }

    /// As [`Enqueued::new`], a job with a deadline also carrying its job
    /// `key` in its envelope (the body's field the workers key by, read by
    /// the producer), so that any reader of the queue (`status`) names the
    /// job without knowing which field that is. A worker keys the job by
    /// its own setting's field first, then this key, then the message id.
    /// An empty key is none; a key where the workers keep their own records
    /// is refused ([`spot_worker_storage::reserved_job_key`]). Without a deadline there is
    /// no envelope and the key is not sent.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use spot_worker_decisions::lanes::Deadline;
    /// use spot_worker_storage::MessageEncoding;
    /// use spot_worker_lanes::{Enqueued, Envelope};
    ///
    /// let start = SystemTime::now();
    /// let deadline = Deadline {
    ///     start,
    ///     due: start + Duration::from_secs(36_000),
    ///     work: Duration::from_secs(3_600),
    /// };
    /// let (d, recheck) = (Duration::from_secs(360), Duration::from_secs(60));
    /// let body = br#"{"job_id":"j1"}"#;
    /// let job = Enqueued::keyed(body, Some(deadline), Some("j1"), MessageEncoding::Text, d, recheck)?;
    /// let (envelope, unwrapped) = Envelope::unwrap(job.text.as_bytes()).unwrap();
    /// assert_eq!(envelope.unwrap().key.as_deref(), Some("j1"));
    /// assert_eq!(unwrapped, body);
    /// # Ok::<(), spot_worker_storage::StorageError>(())
    /// ```
    pub fn keyed(
        body: &[u8],
        deadline: Option<Deadline>,
        key: Option<&str>,
        encoding: MessageEncoding,
        switch_cost: Duration,
        recheck: Duration,
    ) -> Result<Enqueued, StorageError> {
        spot_worker_storage::refuse_reserved_body(body)?;
        let Some(deadline) = deadline else {
            return Ok(Enqueued {
                lane: Lane::Spot,
                text: encoding.encode(body)?,
                choice: None,
            });
        };
        let key = key.filter(|key| !key.is_empty());
        if let Some(reserved) = key.and_then(spot_worker_storage::reserved_job_key) {
            return Err(StorageError::InvalidArgument(format!(
                "the job key {:?}: {}",
                key.unwrap_or_default(),
                reserved.explain()
            )));
        }
        if deadline.due <= deadline.start {
            return Err(StorageError::InvalidArgument(
                "the deadline must come after the job's start".to_owned(),
            ));
        }
        if deadline.due <= SystemTime::now() {
            return Err(StorageError::InvalidArgument(
                "the deadline has passed already".to_owned(),
            ));
        }
        let choice = choose_lane(&Situation {
            deadline: Some(deadline),
            progress: Duration::ZERO,
            lane: Lane::Spot,
            phase: Phase::Waiting,
            now: deadline.start,
            switch_cost,
            recheck,
            // Only the regular lane looks at it: a new job is in the Spot lane.
            spot_there: false,
        });
        let envelope = Envelope {
            lane: Some(choice.lane),
            key: key.map(str::to_owned),
            ..Envelope::new(deadline)
        };
        Ok(Enqueued {
            lane: choice.lane,
            text: encoding.encode(&envelope.wrap(body))?,
            choice: Some(choice),
        })
    }
}

/// Sends `body` (with `deadline`, if any) to the lane the rule picks, from
/// a producer of `lanes`' fleet; returns the lane and the message id.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use std::time::{Duration, SystemTime};
/// use spot_worker_decisions::lanes::{Deadline, Lane, LanePolicy, DEFAULT_SWITCH_COST_SEED};
/// use spot_worker_storage::{InMemoryCheckpointStore, InMemoryQueue, MessageEncoding};
/// use spot_worker_lanes::{FleetSpotCapacity, Lanes, SpotCapacity, SwitchCost, enqueue};
///
/// let (spot, regular) = (InMemoryQueue::new("jobs"), InMemoryQueue::new("jobs-regular"));
/// let recheck = Duration::from_secs(60);
/// let sightings = FleetSpotCapacity::new(Arc::new(InMemoryCheckpointStore::new()));
/// let lanes = Lanes {
///     lane: Lane::Spot,
///     spot: Arc::new(spot.clone()),
///     regular: Arc::new(regular.clone()),
///     recheck,
///     switch_cost: Arc::new(SwitchCost::new(DEFAULT_SWITCH_COST_SEED)),
///     spot_capacity: Arc::new(SpotCapacity::new(sightings, recheck)),
///     policy: LanePolicy::Patient,
///     price_ratio: 3.0,
/// };
/// let start = SystemTime::now();
/// let hours = |h: u64| Duration::from_secs(h * 3600);
/// let deadline = Deadline { start, due: start + hours(70), work: hours(48) };
/// let (lane, _id) = enqueue(&lanes, MessageEncoding::Text, b"{\"job_id\":\"j1\"}", Some(deadline)).await?;
/// assert_eq!(lane, Lane::Spot);
/// assert_eq!((spot.len(), regular.len()), (1, 0));
/// # Ok::<(), spot_worker_storage::StorageError>(())
/// # }).unwrap();
/// ```
pub async fn enqueue(
    lanes: &Lanes,
    encoding: MessageEncoding,
    body: &[u8],
    deadline: Option<Deadline>,
) -> Result<(Lane, MessageId), StorageError> {
    let job = Enqueued::new(
        body,
        deadline,
        encoding,
        lanes.switch_cost.d(),
        lanes.recheck,
    )?;
    let id = lanes
        .queue(job.lane)
        .send(&job.text, Duration::ZERO)
        .await?;
    Ok((job.lane, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_carries_a_usable_key_only() {
        let start = SystemTime::now();
        let deadline = Deadline {
            start,
            due: start + Duration::from_secs(36_000),
            work: Duration::from_secs(3_600),
        };
        let minute = Duration::from_secs(60);
        let sent = |key| {
            Enqueued::keyed(
                b"{}",
                Some(deadline),
                key,
                MessageEncoding::Text,
                minute,
                minute,
            )
        };
        let carried = |key| {
            let text = sent(key).unwrap().text;
            let (envelope, _) = Envelope::unwrap(text.as_bytes()).unwrap();
            envelope.unwrap().key
        };
        assert_eq!(carried(Some("j1")), Some("j1".to_owned()));
        assert_eq!(carried(Some("")), None);
        assert_eq!(carried(None), None);
        // A key where the workers keep their records: refused, named.
        let refused = sent(Some(".spot-worker/lanes/j1")).unwrap_err();
        assert!(
            refused.to_string().contains(".spot-worker/lanes/j1"),
            "{refused}"
        );
        // Without a deadline no envelope, and the body exactly.
        let plain = Enqueued::keyed(
            b"{}",
            None,
            Some("j1"),
            MessageEncoding::Text,
            minute,
            minute,
        );
        assert_eq!(plain.unwrap().text, "{}");
    }
}
