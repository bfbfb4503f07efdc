//! The checks from storage, with the harness's own reads: every job has
//! exactly one, correct result (against an independent count), the queue is
//! empty, and the poison queue holds exactly the malformed messages.

use std::collections::HashSet;

use anyhow::Result;
use serde_json::Value;
use spot_worker::storage::ResultStore as _;
use spot_worker_primes::PrimesJob;

use super::QUEUE;
use super::lanes::REGULAR_QUEUE;
use super::report::Report;
use super::storage::RunStorage;
use super::workload::Workload;

/// Checks what storage holds once the workers are stopped.
pub(super) async fn check_storage(
    report: &mut Report,
    storage: &RunStorage,
    workload: &Workload,
    expected: &[Value],
) -> Result<()> {
    let jobs = &workload.jobs;
    let progress =
        patiently(|| async { storage.progress(jobs, &mut HashSet::new()).await }).await?;
    for (i, job) in jobs.iter().enumerate() {
        let name = job.result_name();
        match patiently(|| async { Ok(storage.results.get(&name).await?) }).await? {
            None => report.lost += 1,
            Some(bytes) => {
                let got: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                if got != expected[i] {
                    report.wrong += 1;
                    report.fail(format!(
                        "{}: result {got} but {} expected",
                        job.job_id, expected[i]
                    ));
                }
            }
        }
    }
    if progress.queued != 0 {
        report.fail(format!(
            "{} messages left in the queues {QUEUE} and {REGULAR_QUEUE}",
            progress.queued
        ));
    }
    report.poisoned = progress.poison.len();
    for failure in poison_failures(&workload.malformed, &progress.poison, jobs) {
        report.fail(failure);
    }
    Ok(())
}

/// Reads this many times at most before the verdict gives up.
const READ_ATTEMPTS: u32 = 10;

/// `read`, tried again a second later while it fails (a loaded Azurite
/// answers 500 now and then, which the client's own retries can outlast):
/// a verdict must not fail for a slow machine.
async fn patiently<T, F, Fut>(mut read: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 1;
    loop {
        match read().await {
            Ok(value) => return Ok(value),
            Err(error) if attempt >= READ_ATTEMPTS => {
                return Err(error.context(format!("reading storage, {attempt} attempts")));
            }
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// Matches the poison queue's bodies against the malformed messages: each
/// malformed message poisoned once, and nothing else (a job above all).
fn poison_failures(malformed: &[&str], poison: &[String], jobs: &[PrimesJob]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut unmatched: Vec<&str> = malformed.to_vec();
    for body in poison {
        if let Some(at) = unmatched.iter().position(|m| m == body) {
            unmatched.remove(at);
        } else if let Some(job) = jobs.iter().find(|j| j.to_message() == *body) {
            failures.push(format!("job {} was poisoned", job.job_id));
        } else {
            failures.push(format!("unexpected poison record body {body:?}"));
        }
    }
    for body in unmatched {
        failures.push(format!(
            "malformed message {body:?} is not in the poison queue"
        ));
    }
    failures
}

/// The totals that fail a run, checked last so they close the list.
pub(super) fn check_totals(report: &mut Report) {
    if report.lost > 0 {
        report.fail(format!("{} jobs lost (no result)", report.lost));
    }
    if report.duplicates > 0 {
        report.fail(format!("{} conflicting results", report.duplicates));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poison_queue_must_hold_exactly_the_malformed_messages() {
        let job = PrimesJob::new("job-0001", 0, 10).unwrap();
        let jobs = [job.clone()];
        let body = |text: &str| text.to_owned();
        let table: [(&[&str], Vec<String>, Vec<String>); 5] = [
            (&["a", "b"], vec![body("b"), body("a")], vec![]),
            (
                &["a", "b"],
                vec![body("a")],
                vec![r#"malformed message "b" is not in the poison queue"#.to_owned()],
            ),
            (
                &["a"],
                vec![body("a"), body("a")],
                vec![r#"unexpected poison record body "a""#.to_owned()],
            ),
            (
                &[],
                vec![job.to_message()],
                vec!["job job-0001 was poisoned".to_owned()],
            ),
            (&[], vec![], vec![]),
        ];
        for (malformed, poison, failures) in table {
            assert_eq!(
                poison_failures(malformed, &poison, &jobs),
                failures,
                "{malformed:?} {poison:?}"
            );
        }
    }

    #[test]
    fn lost_and_conflicting_results_fail_the_run() {
        for (lost, duplicates, failures) in [
            (0, 0, vec![]),
            (2, 0, vec!["2 jobs lost (no result)"]),
            (
                1,
                3,
                vec!["1 jobs lost (no result)", "3 conflicting results"],
            ),
        ] {
            let mut report = Report {
                lost,
                duplicates,
                ..Report::default()
            };
            check_totals(&mut report);
            assert_eq!(report.failures, failures);
        }
    }
}
