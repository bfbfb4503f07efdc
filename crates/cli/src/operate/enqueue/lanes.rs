//! `enqueue --deadline WHEN --work DURATION`: each job goes in an envelope
//! with its deadline (docs/deploying.md, "The two lanes"), to the lane the rule picks for a job
//! that has not started: the Spot lane's queue (`SPOT_WORKER_QUEUE`),
//! unless the time left leaves less slack than two switches and a recheck,
//! when it goes straight to the regular lane's (`SPOT_WORKER_REGULAR_QUEUE`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, bail};
use spot_worker_azure::AzureQueue;
use spot_worker_decisions::lanes::{DEFAULT_SWITCH_COST_SEED, Deadline, Lane, Reason, switch_cost};
use spot_worker_lanes::{Enqueued, FleetSwitchCost};
use spot_worker_runtime::parse_duration;
use spot_worker_runtime::settings::{Source, table};
use spot_worker_storage::{CheckpointStore, MessageEncoding};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::super::Fleet;

/// Where a job's message goes: the lanes' queues, and the deadline every
/// job of this run carries, if any.
pub(super) struct Routing {
    pub(super) spot: AzureQueue,
    regular: Option<AzureQueue>,
    encoding: MessageEncoding,
    deadline: Option<Deadline>,
    switch_cost: Duration,
    recheck: Duration,
    /// The body's field the workers key jobs by (`SPOT_WORKER_JOB_KEY`):
    /// a job with a deadline carries its key in its envelope, so that
    /// `status` names it however it is run.
    key_field: Option<String>,
}

/// A message ready to send, and its queue.
pub(super) struct Routed<'a> {
    pub(super) queue: &'a AzureQueue,
    pub(super) lane: Lane,
    pub(super) text: String,
    /// A job whose work no longer fits before its deadline even on regular
    /// capacity from now on.
    pub(super) late: bool,
}

/// `--deadline`: an RFC 3339 time, or a duration from now.
pub(super) fn parse_deadline(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    if let Ok(at) = OffsetDateTime::parse(text.trim(), &Rfc3339) {
        return Ok(SystemTime::from(at));
    }
    let after = parse_duration(text).map_err(|_| {
        format!(
            "{text:?} is neither a time (2026-12-01T18:00:00Z) nor a duration from now (52h, 90m)"
        )
    })?;
    // `now + after` panics past what a clock can hold.
    now.checked_add(after)
        .ok_or_else(|| format!("{text:?} from now is past any time a clock can hold"))
}

impl Routing {
    /// The routing for this run: the queue `fleet` names (the Spot lane's)
    /// and, with a deadline, the regular lane's; d from the fleet's
    /// measurements if they can be read, else the configured seed.
    pub(super) async fn new(fleet: &Fleet, deadline: Option<Deadline>) -> Result<Routing> {
        let spot = fleet.queue()?;
        let lanes = &fleet.config.lanes;
        let Some(deadline) = deadline else {
            return Ok(Routing {
                spot,
                regular: None,
                encoding: fleet.config.encoding,
                deadline: None,
                switch_cost: lanes.switch_cost,
                recheck: lanes.keeper_every,
                key_field: None,
            });
        };
        let Some(regular) = &lanes.regular_queue else {
            bail!(
                "--deadline needs the regular lane to fall back to: set SPOT_WORKER_REGULAR_QUEUE \
                 (docs/deploying.md, \"The two lanes\")"
            );
        };
        if deadline.due <= SystemTime::now() {
            bail!("--deadline {} has passed already", rfc3339(deadline.due));
        }
        let seed = DEFAULT_SWITCH_COST_SEED.scaled_to(lanes.switch_cost);
        let store: Arc<dyn CheckpointStore> = Arc::new(fleet.checkpoints()?);
        let measured = match FleetSwitchCost::new(store).read().await {
            Ok(samples) => samples,
            Err(error) => {
                tracing::debug!(%error, "the fleet's switch cost does not read; using the seed");
                Default::default()
            }
        };
        Ok(Routing {
            spot,
            regular: Some(fleet.queue_named(regular)?),
            encoding: fleet.config.encoding,
            deadline: Some(deadline),
            switch_cost: switch_cost(&seed, &measured).total(),
            recheck: lanes.keeper_every,
            key_field: Source::from_env()
                .and_then(|settings| {
                    settings
                        .get(&table::JOB_KEY)
                        .map(|f| f.map(Cow::into_owned))
                })
                .context("reading SPOT_WORKER_JOB_KEY")?,
        })
    }

    /// The deadline every job of this run carries.
    pub(super) fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }

    /// The regular lane's queue, if jobs carry a deadline.
    pub(super) fn regular(&self) -> Option<&AzureQueue> {
        self.regular.as_ref()
    }

    /// `body`'s message and its queue; a body a worker would read as its
    /// own message (a probe, an envelope) is refused.
    pub(super) fn route(&self, body: &[u8]) -> Result<Routed<'_>> {
        spot_worker_storage::refuse_reserved_body(body)?;
        if self.deadline.is_none() {
            // Exactly the body, as always.
            return Ok(Routed {
                queue: &self.spot,
                lane: Lane::Spot,
                text: super::raw_message(body, self.encoding)?,
                late: false,
            });
        }
        let key = self
            .key_field
            .as_deref()
            .and_then(|field| spot_worker_command::key_of(body, field));
        let job = Enqueued::keyed(
            body,
            self.deadline,
            key.as_deref(),
            self.encoding,
            self.switch_cost,
            self.recheck,
        )
        .map_err(|error| {
            if self.encoding == MessageEncoding::Text && std::str::from_utf8(body).is_err() {
                super::encoding_refused(error)
            } else {
                error.into()
            }
        })?;
        let late = job.choice.is_some_and(|choice| {
            choice.reason == Reason::SafetyNet
                && choice.standing.is_some_and(|s| s.slack_secs() < 0.0)
        });
        let queue = match (job.lane, &self.regular) {
            (Lane::Regular, Some(regular)) => regular,
            _ => &self.spot,
        };
        Ok(Routed {
            queue,
            lane: job.lane,
            text: job.text,
            late,
        })
    }
}

/// `time` as RFC 3339, UTC.
pub(super) fn rfc3339(time: SystemTime) -> String {
    OffsetDateTime::from(time)
        .format(&Rfc3339)
        .unwrap_or_else(|_| format!("{time:?}"))
}

/// What `--deadline` and `--work` give (both or neither): the deadline of
/// jobs starting now.
pub(super) fn deadline_of(
    deadline: Option<&str>,
    work: Option<Duration>,
) -> Result<Option<Deadline>> {
    match (deadline, work) {
        (None, None) => Ok(None),
        (Some(deadline), Some(work)) => {
            let start = SystemTime::now();
            let due = parse_deadline(deadline, start)
                .map_err(anyhow::Error::msg)
                .context("--deadline")?;
            if work.is_zero() {
                bail!("--work must be more than nothing");
            }
            Ok(Some(Deadline { start, due, work }))
        }
        (Some(_), None) => {
            bail!("--deadline needs --work, the job's work as time on one VM (e.g. 48h)")
        }
        (None, Some(_)) => bail!("--work goes with --deadline"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_a_time_or_a_duration_from_now() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // (given, seconds after now, or the start of the error)
        let rows: [(&str, Result<i64, &str>); 7] = [
            ("52h", Ok(52 * 3600)),
            ("90m", Ok(5400)),
            ("2027-01-15T09:00:00Z", Ok(3600)),
            ("2027-01-15T10:00:00+01:00", Ok(3600)),
            ("tomorrow", Err("\"tomorrow\" is neither a time")),
            ("2027-01-15", Err("\"2027-01-15\" is neither a time")),
            // Found by `a_deadline_is_a_time_a_duration_or_an_error`: it
            // panicked adding the duration to the clock.
            (
                "18446744073709551615s",
                Err("\"18446744073709551615s\" from now is past any time"),
            ),
        ];
        for (given, expected) in rows {
            let got = parse_deadline(given, now).map(|due| match due.duration_since(now) {
                Ok(after) => after.as_secs() as i64,
                Err(before) => -(before.duration().as_secs() as i64),
            });
            match (got, expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{given}"),
                (Err(why), Err(start)) => assert!(why.starts_with(start), "{given}: {why}"),
                (got, want) => panic!("{given}: {got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn deadline_and_work_go_together() {
        let hour = Some(Duration::from_secs(3600));
        assert!(deadline_of(None, None).unwrap().is_none());
        assert!(deadline_of(Some("52h"), hour).unwrap().is_some());
        for (deadline, work, says) in [
            (Some("52h"), None, "needs --work"),
            (None, hour, "goes with --deadline"),
            (Some("52h"), Some(Duration::ZERO), "more than nothing"),
            (Some("soon"), hour, "--deadline"),
        ] {
            let error = format!("{:#}", deadline_of(deadline, work).unwrap_err());
            assert!(error.contains(says), "{error}");
        }
    }
}
