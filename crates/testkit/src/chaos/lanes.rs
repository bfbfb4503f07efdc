//! The deadline lanes in the chaos run: some jobs carry a deadline (sent
//! last, in an envelope, as `spot-worker enqueue --deadline` sends them),
//! every Spot worker keeps the lanes (the lane keeper on, the regular
//! lane's queue set), and one regular-priority VM serves the regular lane,
//! untouched by the fault schedule (regular capacity is not evicted).
//!
//! The deadline is tight on purpose: enough slack for the Spot lane at
//! enqueue, but the rule's safety net is reached after [`WAIT_ALLOWED`]
//! in the Spot queue. The jobs ahead of them take longer than that, so the
//! lane keeper (or a Spot worker that releases one) moves them to the
//! regular lane, where they finish. The settings are the workers' own
//! (documented in the settings table), only their values are short.

use std::time::{Duration, SystemTime};

use anyhow::Result;
use spot_worker::storage::MessageEncoding;
use spot_worker::storage::lanes::Enqueued;
use spot_worker_decisions::lanes::{Deadline, Lane};

/// The regular lane's queue.
pub(super) const REGULAR_QUEUE: &str = "chaos-regular";
/// `SPOT_WORKER_LANE_KEEPER_EVERY`: the keeper looks at the Spot lane
/// this often (and the rule keeps one such period of slack).
pub(super) const KEEPER_EVERY: Duration = Duration::from_secs(2);
/// `SPOT_WORKER_SWITCH_COST`: d, what a switch of lane is assumed to cost.
pub(super) const SWITCH_COST: Duration = Duration::from_secs(4);
/// `SPOT_WORKER_LANE_POLICY`: the paper's rule, which moves a job behind
/// its line without waiting on the fleet's Spot history.
pub(super) const POLICY: &str = "uniform-progress";
/// The work a deadline job declares: about what a job of the run takes,
/// so that on regular capacity it never looks far enough ahead of its
/// line to be sent back to Spot (and past the safety net it cannot).
const WORK: Duration = Duration::from_secs(5);
/// How long a deadline job can wait in the Spot lane before the safety net
/// sends it to the regular lane.
const WAIT_ALLOWED: Duration = Duration::from_secs(12);

/// The worker settings for a VM of `lane` (besides the queue and the
/// rest every worker gets).
pub(super) fn worker_env(lane: Lane) -> Vec<(&'static str, String)> {
    let seconds = |d: Duration| format!("{}s", d.as_secs());
    let mut env = vec![
        ("SPOT_WORKER_REGULAR_QUEUE", REGULAR_QUEUE.to_owned()),
        ("SPOT_WORKER_LANE_KEEPER_EVERY", seconds(KEEPER_EVERY)),
        ("SPOT_WORKER_SWITCH_COST", seconds(SWITCH_COST)),
        ("SPOT_WORKER_LANE_POLICY", POLICY.to_owned()),
    ];
    if lane == Lane::Regular {
        env.push(("SPOT_WORKER_LANE", "regular".to_owned()));
    }
    env
}

/// The message of a deadline job sent now: its body in an envelope whose
/// deadline leaves [`WAIT_ALLOWED`] of waiting before the safety net.
/// Returns the lane the rule picks (the Spot lane) and the text.
pub(super) fn deadline_message(body: &str) -> Result<(Lane, String)> {
    let start = SystemTime::now();
    // The safety net: time left < work left + 2·d + one recheck.
    let due = start + WORK + 2 * SWITCH_COST + KEEPER_EVERY + WAIT_ALLOWED;
    let deadline = Deadline {
        start,
        due,
        work: WORK,
    };
    let enqueued = Enqueued::new(
        body.as_bytes(),
        Some(deadline),
        MessageEncoding::Text,
        SWITCH_COST,
        KEEPER_EVERY,
    )?;
    Ok((enqueued.lane, enqueued.text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_job_starts_in_the_spot_lane_in_an_envelope() {
        let (lane, text) = deadline_message(r#"{"job_id":"j","start":0,"end":10}"#).unwrap();
        assert_eq!(lane, Lane::Spot);
        let (header, body) = text.split_once('\n').expect("a header line");
        assert!(header.starts_with("spot-worker-job/"), "{header}");
        assert_eq!(body, r#"{"job_id":"j","start":0,"end":10}"#);
    }

    #[test]
    fn regular_workers_serve_the_regular_lane_and_all_keep_the_lanes() {
        let names = |lane| -> Vec<&str> { worker_env(lane).iter().map(|(k, _)| *k).collect() };
        assert!(!names(Lane::Spot).contains(&"SPOT_WORKER_LANE"));
        assert!(names(Lane::Regular).contains(&"SPOT_WORKER_LANE"));
        assert!(names(Lane::Spot).contains(&"SPOT_WORKER_REGULAR_QUEUE"));
    }
}
