//! The work a run enqueues, drawn from its seed: the valid jobs (the long
//! one first), the malformed messages that must end up poisoned, the order
//! they are sent in, and each job's result as counted independently of the
//! worker.

use std::collections::HashMap;

use rand::Rng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use serde_json::Value;
use spot_worker_primes::{PrimesJob, expected_result};

use super::Options;

/// Messages that are not valid jobs: each must end up in the poison queue,
/// and nothing else may.
pub const MALFORMED: [&str; 4] = [
    "this is not JSON",
    r#"{"job_id":"bad-range","start":5000,"end":100}"#,
    r#"{"job_id":"no-end","start":0}"#,
    r#"{"job_id":"../escape","start":0,"end":10}"#,
];

/// What a run enqueues.
pub(super) struct Workload {
    /// The valid jobs; with a long job, it is `jobs[0]`.
    pub(super) jobs: Vec<PrimesJob>,
    /// The malformed messages enqueued.
    pub(super) malformed: Vec<&'static str>,
    /// Every message in the order it is sent, with the index of its job
    /// (`None`: malformed); the deadline jobs come last.
    pub(super) messages: Vec<(Option<usize>, String)>,
    /// The jobs sent with a deadline.
    pub(super) deadline_jobs: Vec<usize>,
}

impl Workload {
    /// Draws the jobs and the order of the messages from `rng`.
    pub(super) fn draw(rng: &mut StdRng, options: &Options) -> Workload {
        // Jobs draw their ranges from a pool a third their number: the
        // independent check recounts each distinct range once, so it costs a
        // third of the work instead of as much again.
        let ranges: Vec<(u64, u64)> = (0..options.jobs.div_ceil(3))
            .map(|_| {
                let span = rng.random_range(options.job_span.0..=options.job_span.1);
                let start = rng.random_range(0..1_000_000_000);
                (start, start + span)
            })
            .collect();
        let mut jobs: Vec<PrimesJob> = (0..options.jobs)
            .map(|i| {
                let (start, end) = ranges[rng.random_range(0..ranges.len())];
                PrimesJob::new(format!("job-{i:04}"), start, end).expect("a valid job")
            })
            .collect();
        // The long job is jobs[0], enqueued before the rest.
        if let Some(long) = &options.long_job {
            jobs.insert(0, long.job(rng));
        }
        let malformed: Vec<&str> = MALFORMED[..options.malformed.min(MALFORMED.len())].to_vec();
        let mut messages: Vec<(Option<usize>, String)> = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| (Some(i), job.to_message()))
            .chain(malformed.iter().map(|body| (None, (*body).to_owned())))
            .collect();
        let first = usize::from(options.long_job.is_some());
        messages[first..].shuffle(rng);
        // The last valid jobs sent carry a deadline (never the long one):
        // moved to the end, they wait the longest in the Spot lane.
        let mut deadline_jobs = Vec::new();
        for at in (first..messages.len()).rev() {
            if deadline_jobs.len() == options.deadline_jobs {
                break;
            }
            if let (Some(job), _) = messages[at] {
                deadline_jobs.push(job);
            }
        }
        messages.sort_by_key(|(job, _)| job.is_some_and(|job| deadline_jobs.contains(&job)));
        Workload {
            jobs,
            malformed,
            messages,
            deadline_jobs,
        }
    }

    /// Numbers in all the jobs' ranges.
    pub(super) fn numbers(&self) -> u64 {
        self.jobs.iter().map(|j| j.end - j.start).sum()
    }
}

/// Each job's result, counted here rather than by the worker (each distinct
/// range once): slow, so run it on a blocking thread.
pub(super) fn expected_results(jobs: &[PrimesJob]) -> Vec<Value> {
    let mut counted: HashMap<(u64, u64), Value> = HashMap::new();
    jobs.iter()
        .map(|job| {
            let primes = counted
                .entry((job.start, job.end))
                .or_insert_with(|| expected_result(job)["primes"].clone())
                .clone();
            serde_json::json!({
                "job_id": job.job_id, "start": job.start, "end": job.end, "primes": primes
            })
        })
        .collect()
}
